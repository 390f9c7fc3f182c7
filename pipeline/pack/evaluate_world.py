"""World-model evaluation of a model pack on held-out synthetic episodes: the full video loop, scored against the
world's exact ceilings and the simulator's own drawing.

    python -m pipeline.pack.evaluate_world --data DATA --out DIR [--pack offline_pack] [--episodes N] [--steps 5]
        [--observe 4] [--render-episodes N] [--four-tensor-seeds DIR ...] [--flat-baseline-seeds DIR ...]
        [--cache DIR] [--strength 0.6] [--seed S] [--device D] [--storyboard-episodes 4] [--overwrite]

``DATA`` holds ``train/`` (the count floors are counted on its sentences) and ``heldout/`` (clips and sentences, from
``python -m world_model.data.synthetic.generator generate``). For each held-out episode: clip -> state strips ->
the pack's captioner -> captions. Then the world report (``world_model.evaluation.world_report``) with every
forecaster reading the captions instead of the true sentences, at every cut of every episode, k = 1..steps seconds
ahead: both ceilings and the entropy (of the true sentences), copy-last and Markov-1/-2/-3 floors, the pack's
4-tensor predictor and flat baseline (with ``--*-seeds``, other training seeds of each beside them: means and 95%
intervals over seeds, and the paired difference). Then, for the first ``--render-episodes``, the pack's 4-tensor
rollout from the captions of the first ``--observe`` seconds, and the true and predicted futures rendered by the
pack's renderer (each strip continuing the one before when the renderer reads it) and captioned back: objects
counted in every frame of the true renders against the simulator's drawing, their positions, the round trip, and
the first strip drawn four ways (``pipeline.pack.world_loop.FIRST_STRIP_VARIANTS``).

``DIR`` gets ``results.json``, ``results.md`` and ``storyboard.png``, written beside it and renamed into place when
complete:

    results.json  {"command", "pack", "data", "settings", "caption_accuracy", "points", "train_episodes", "targets",
                   "scenes": {SCENE or "all": {"episodes", "points", "needs_memory", "k": {"1".."5":
                       {"ceiling_full_state", "ceiling_from_sentences", "entropy_from_sentences",
                        "predictors": {four_tensor, flat_baseline, copy_last, markov1, markov2, markov3:
                                       {"accuracy", "log_loss", "ece", ...}}, "four_tensor_minus_flat_baseline"}}}},
                   "renders": {SCENE or "all": {"object_count_accuracy", "position_error", "round_trip",
                                                "round_trip_predicted", "first_strip": {VARIANT: {...}}, ...}},
                   "timings", "storyboard", "episodes"}

``evaluate_world(...)`` is the same as a Python function.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import sys
from dataclasses import replace
from pathlib import Path

from pipeline.pack.pack_folder import EvaluationError, WorldEvaluation, read_heldout, resolve_pack
from pipeline.pack.world_loop import episode_entries, run_loop
from pipeline.pack.world_report import markdown, storyboard_rows, write_storyboard
from pipeline.run_folder import run_folder
from world_model.data.synthetic.episodes import episode_sentences
from world_model.utils.files import replace_dir, repo_path, write_json_atomic, write_text_atomic
from world_model.utils.flags import SettingsParser, add_verbose, settings_main
from world_model.utils.hub import default_device


def evaluate_world(settings: WorldEvaluation, command: str | None = None) -> dict:
    """Run the full loop on ``settings.data``'s held-out episodes with the models of ``settings.pack`` and write
    ``results.json``, ``results.md`` and ``storyboard.png`` to ``settings.out``; ``command`` is recorded as the
    command that made them.

    Returns the content of results.json. Raises ``EvaluationError`` for a pack or data folder that lacks pieces or
    for bad settings, before any model work.
    """
    s = settings
    parts = resolve_pack(s.pack)
    records, scenes = read_heldout(s.data, s.episodes, s.observe + s.steps)
    for folder in (*s.four_tensor_seeds, *s.flat_baseline_seeds):
        if not (Path(folder) / "config.json").is_file():
            raise EvaluationError(f"predictor folder {folder} not found (no config.json)")
    s = replace(s, device=str(default_device(s.device)))
    inputs = {"pack": s.pack, "data folder": s.data, "cache": s.cache}
    with run_folder(Path(s.out), s.overwrite, inputs=inputs) as (out, staging):
        scores, captions, rendered = run_loop(parts, records, scenes, s)
        shown = storyboard_rows([e.record for e in rendered], s.storyboard_episodes)
        if shown:
            rows = [
                (e.record, e.observed, captions[i][: s.observe], episode_sentences(e.record), e.predicted,
                 e.predicted_renders)
                for i, e in ((i, rendered[i]) for i in shown)
            ]  # fmt: skip
            write_storyboard(staging / "storyboard.png", rows, s.observe)
        temperatures = scores.pop("temperatures")
        folders = scores.pop("predictor_folders")
        results = {
            "command": command or f"evaluate_world(pack={str(s.pack)!r}, data={str(s.data)!r}, ...)",
            "pack": {"path": repo_path(parts.root), "size_mb": parts.size_mb()},
            "data": {
                "path": repo_path(s.data),
                "episodes": len(records),
                "scene_types": scenes,
                "scene_counts": {k: sum(r["scene"] == k for r in records) for k in dict.fromkeys(scenes)},
            },
            "settings": {
                "steps": s.steps,
                "observe": s.observe,
                "seed": s.seed,
                "strength": s.strength,
                "device": s.device,
                "predictors": {n: [repo_path(f) for f in fs] for n, fs in folders.items()},
                "temperatures": temperatures,
                "captioner_options": parts.captioner_options,
                "renderer_options": parts.renderer_options,
            },
            **scores,
            "storyboard": [rendered[i].record["id"] for i in shown],
            "episodes": episode_entries(records, captions, rendered),
        }
        write_json_atomic(staging / "results.json", results)
        write_text_atomic(staging / "results.md", markdown(results))
        replace_dir(staging, out)
    return results


def main(argv: list[str] | None = None) -> int:
    return settings_main(
        WorldEvaluation,
        "pipeline.pack.evaluate_world",
        __doc__.split("\n\n")[0],
        lambda settings, args, command: evaluate_command(settings, command),
        argv,
        arguments=add_debug_and_verbose,
    )


def add_debug_and_verbose(parser: SettingsParser) -> None:
    """The command's flags beside its settings: --debug and --verbose, which both show an error's traceback."""
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (as --verbose does)")
    add_verbose(parser)


def evaluate_command(settings: WorldEvaluation, command: str) -> None:
    """The command's work: the full loop, then its headline figures."""
    results = evaluate_world(settings, command)
    four = results["targets"]["four_tensor"]
    renders = results["renders"]["all"]
    print(
        f"caption accuracy {results['caption_accuracy']['overall']:.4f}; 4-tensor from captions: "
        f"{four['fraction_of_ceiling']:.3f} of the from-sentences ceiling, log-loss "
        f"{four['log_loss_minus_entropy']:+.3f} nats above the entropy (scenes and k = 1..{settings.steps}); renders: "
        f"objects right {renders['object_count_accuracy']:.4f}, round trip {renders['round_trip']:.4f}; "
        f"wrote {settings.out}/"
    )


if __name__ == "__main__":
    sys.exit(main())

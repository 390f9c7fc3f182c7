"""World-model evaluation of a model pack on held-out synthetic episodes: the full video loop, scored.

    python -m pipeline.pack.evaluate_world --pack offline_pack --data DATA/heldout --episodes 100 --observe 3 \\
        --steps 5 --out runs/world_eval [--seed S] [--device D] [--storyboard-episodes 4] [--overwrite]

For each episode: clip -> state strips (``encoders.world_dataset.episode_strips``) -> captioner ->
predictor rollout of ``--steps`` seconds from the captions of the first ``--observe`` seconds ->
renderer -> captioner again. Scores, next to what is attainable:

* caption accuracy: captions that are exactly the true sentence (``world_model.text.vocab.tokenize``), over
  every strip of the episodes, overall and per scene;
* next-state accuracy ``k`` seconds ahead (k = 1..steps) of the 4-tensor predictor (PACK/predictor), the
  flat baseline (PACK/baseline) and copy-the-last-state, each from the captions (the full loop) and from
  the true sentences (oracle context), beside the exact k-step ceiling of the simulator
  (``world_model.data.synthetic.ceilings.k_step_ceilings``) and as a fraction of it. A predictor folder with
  known_sentences.txt predicts with the closed-set readout (``world_model.models.decoding``), as the pipeline
  does; its own token readout is then scored beside it;
* round trip: the fraction of rendered strips captioned back to exactly the sentence they were
  rendered from, for the true sentences and for the full loop's predicted ones. An image depends only
  on (sentence, seed), so each distinct sentence is rendered once with ``--seed`` and counted as often
  as it occurs;
* timings and the pack's size.

The pack folder (resolved like the presets' model entries, ``pipeline.presets.resolve_model_path``)
holds the folders ``configs/pipeline/offline.yaml`` names (captioner, renderer, predictor) and
``baseline``; the captioner and renderer options come from that preset. ``DIR`` gets
``results.json``, ``results.md`` and ``storyboard.png``; it is written beside its destination and
renamed into place when complete. ``evaluate_world(...)`` is the same as a Python function.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import json
import sys
from dataclasses import replace
from pathlib import Path

from pipeline.pack.pack_folder import EvaluationError, WorldEvaluation, read_heldout, resolve_pack
from pipeline.pack.world_loop import run_loop
from pipeline.pack.world_report import markdown
from pipeline.run_folder import run_folder
from world_model.utils.files import replace_dir
from world_model.utils.flags import SettingsParser, add_verbose, settings_main
from world_model.utils.hub import default_device


def evaluate_world(settings: WorldEvaluation, command: str | None = None) -> dict:
    """Run the full loop on the first ``settings.episodes`` episodes of the split folder ``settings.data`` with the
    models of ``settings.pack`` and write ``results.json``, ``results.md`` and ``storyboard.png`` to ``settings.out``;
    ``command`` is recorded as the command that made them.

    Returns the content of results.json. Raises ``EvaluationError`` for a pack or data folder that lacks
    pieces or for bad settings, before any model work.
    """
    s = settings
    if s.episodes < 1 or s.observe < 1 or s.steps < 1 or s.storyboard_episodes < 0:
        raise EvaluationError(
            f"need episodes, observe and steps >= 1 and storyboard episodes >= 0; got {s.episodes}, "
            f"{s.observe}, {s.steps}, {s.storyboard_episodes}"
        )
    parts = resolve_pack(s.pack)
    records, scenes = read_heldout(s.data, s.episodes, s.observe + s.steps)
    s = replace(s, device=str(default_device(s.device)))
    with run_folder(Path(s.out), s.overwrite, inputs={"pack": s.pack, "data folder": s.data}) as (out, staging):
        scores = run_loop(parts, records, scenes, s, staging)
        results = {
            "command": command
            or f"evaluate_world(pack={str(s.pack)!r}, data={str(s.data)!r}, episodes={s.episodes}, ...)",
            "pack": {"path": str(parts.root), "size_mb": parts.size_mb()},
            "data": {
                "path": str(s.data),
                "episodes": len(records),
                "scene_types": scenes,
                "scene_counts": {
                    k: sum(r["scene"] == k for r in records) for k in sorted({r["scene"] for r in records})
                },
            },
            "settings": {
                "observe": s.observe,
                "steps": s.steps,
                "seed": s.seed,
                "device": s.device,
                "captioner_options": parts.captioner_options,
                "renderer_options": parts.renderer_options,
            },
            **scores,
        }
        (staging / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
        (staging / "results.md").write_text(markdown(results))
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
    loop = results["next_state"]["four_tensor"]["captions"]["accuracy"]
    print(
        f"caption accuracy {results['caption_accuracy']['overall']:.4f}; next-state accuracy (full loop) "
        + ", ".join(f"k={k + 1} {a:.3f}" for k, a in enumerate(loop))
        + f"; round trip {results['round_trip']['true_sentences']['overall']:.4f}; wrote {settings.out}/"
    )


if __name__ == "__main__":
    sys.exit(main())

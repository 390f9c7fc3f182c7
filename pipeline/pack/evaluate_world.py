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

import argparse
import json
import shlex
import shutil
import sys
import textwrap
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from encoders.captioner import HFCaptioner
from encoders.world_dataset import episode_strips
from pipeline.presets import PresetError, load_preset, resolve_model_path
from pipeline.rollout import RolloutError, pick_device, prepare_run_dir
from renderers.text_to_image import DiffusersRenderer
from world_model.data.rocstories import DataError
from world_model.data.synthetic.ceilings import k_step_ceilings
from world_model.data.synthetic.scenes import SCENE_TYPES
from world_model.data.synthetic.sentences import (
    copy_last_predictions,
    episode_sentences,
    predict_ahead,
    read_episodes,
    rounded,
    score_predictions,
)
from world_model.models.checkpoint import CheckpointError
from world_model.models.decoding import readout_name
from world_model.models.registry import load_predictor
from world_model.text.vocab import same_sentence
from world_model.utils.files import replace_dir
from world_model.utils.hub import ModelLoadError

BASELINE_FOLDER = "baseline"
INDEX_FILES = {
    "captioner": "config.json",
    "renderer": "model_index.json",
    "predictor": "config.json",
    "baseline": "config.json",
}
PREDICTORS = {
    "four_tensor": "4-tensor",
    "four_tensor_tokens": "4-tensor, per-slot readout",
    "baseline": "flat baseline",
    "baseline_tokens": "flat baseline, token readout",
    "copy_last": "copy-last",
}
CONTEXTS = {"captions": "captions (full loop)", "truth": "true sentences (oracle)"}
MB = 1e6


class EvaluationError(ValueError):
    """The pack, the data or the settings cannot be evaluated; the message says what is missing or wrong."""


@dataclass
class Pack:
    """A model pack's component folders and the options the offline preset gives its captioner and renderer."""

    root: Path
    folders: dict[str, Path]  # captioner, renderer, predictor, baseline
    captioner_options: dict
    renderer_options: dict

    def size_mb(self) -> dict:
        """Bytes of every file under the pack and under each component, in MB (10^6 bytes)."""

        def size(folder: Path) -> float:
            return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / MB

        return {"total": round(size(self.root), 3), **{c: round(size(f), 3) for c, f in self.folders.items()}}


def resolve_pack(pack: str | Path) -> Pack:
    """The pack's folders: those the offline preset names (by their last path component) and ``baseline``.

    Raises ``EvaluationError`` listing every missing folder or index file.
    """
    root = Path(resolve_model_path(str(pack)))
    if not root.is_dir():
        raise EvaluationError(f"model pack {pack} not found (looked for the folder {root})")
    preset = load_preset("offline")
    names = {c: Path(preset[c]).name for c in ("captioner", "renderer", "predictor")} | {"baseline": BASELINE_FOLDER}
    folders = {c: root / name for c, name in names.items()}
    missing = [
        f"{c} ({folders[c]}: {'no folder' if not folders[c].is_dir() else f'no {INDEX_FILES[c]}'})"
        for c in folders
        if not (folders[c] / INDEX_FILES[c]).is_file()
    ]
    if missing:
        raise EvaluationError(f"model pack {root} is missing: {'; '.join(missing)}")
    return Pack(root, folders, dict(preset.get("captioner_options") or {}), dict(preset.get("renderer_options") or {}))


def read_heldout(data: str | Path, episodes: int, seconds: int) -> tuple[list[dict], list[str]]:
    """The first ``episodes`` records of the split folder ``data`` (each with its clip's ``path``) and the
    scene types they were generated with (``summary.json``, default all). Each must last ``seconds``."""
    data = Path(data)
    if not (data / "episodes.jsonl").is_file() and (data / "heldout" / "episodes.jsonl").is_file():
        raise EvaluationError(f"{data} is a data folder; pass its split folder {data / 'heldout'}")
    try:
        records = read_episodes(data)
    except DataError as err:
        raise EvaluationError(str(err)) from err
    if len(records) < episodes:
        raise EvaluationError(f"{data} holds {len(records)} episodes, fewer than --episodes {episodes}")
    records = records[:episodes]
    short = [r["id"] for r in records if len(r["sentences"]) < seconds]
    if short:
        raise EvaluationError(
            f"episode(s) {', '.join(short[:5])} of {data} last fewer than observe + steps = {seconds} seconds"
        )
    clips = [r["path"] for r in records if not Path(r["path"]).is_file()]
    if clips:
        raise EvaluationError(f"{len(clips)} clip(s) named in {data / 'episodes.jsonl'} are missing, e.g. {clips[0]}")
    summary = data / "summary.json"
    scenes = (
        json.loads(summary.read_text()).get("scene_types", list(SCENE_TYPES))
        if summary.is_file()
        else list(SCENE_TYPES)
    )
    return records, scenes


def exact_fraction(texts: Sequence[str], truths: Sequence[str], weights: Sequence[int] | None = None) -> float:
    """Weighted fraction of ``texts`` equal to their ``truths`` (each weight 1 by default)."""
    weights = [1] * len(texts) if weights is None else weights
    return sum(w for t, g, w in zip(texts, truths, weights, strict=True) if same_sentence(t, g)) / sum(weights)


@contextmanager
def timed(timings: dict, stage: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start


def render_all(
    renderer: DiffusersRenderer, sentences: Sequence[str], seed: int, desc: str, progress: bool
) -> dict[str, np.ndarray]:
    """One (H, W, 3) uint8 image per distinct sentence, each rendered from ``seed``."""
    distinct = list(dict.fromkeys(sentences))
    return {s: renderer([s], seed=seed)[0] for s in tqdm(distinct, desc=desc, unit="image", disable=not progress)}


def accuracy_by_scene(texts: Sequence[str], truths: Sequence[str], kinds: Sequence[str]) -> dict:
    """Exact-match accuracy of ``texts`` against ``truths`` overall and per scene type (``kinds``, one per text)."""
    by_scene = {
        k: exact_fraction([t for t, x in zip(texts, kinds) if x == k], [g for g, x in zip(truths, kinds) if x == k])
        for k in sorted(set(kinds))
    }
    return {
        "strips": len(texts),
        "overall": round(exact_fraction(texts, truths), 4),
        "per_scene": {k: round(v, 4) for k, v in by_scene.items()},
    }


def round_trip(recaptions: dict[str, str], sentences: Sequence[str], kinds: Sequence[str]) -> dict:
    """How many rendered ``sentences`` (counted with repeats; overall and per scene type ``kinds``) and how many of
    the distinct ones were captioned back exactly; ``recaptions`` maps each sentence to the caption of its render."""
    back = [recaptions[s] for s in sentences]
    distinct = list(dict.fromkeys(sentences))
    return {
        **accuracy_by_scene(back, sentences, kinds),
        "distinct_sentences": len(distinct),
        "distinct_accuracy": round(exact_fraction([recaptions[s] for s in distinct], distinct), 4),
    }


def evaluate_world(
    pack: str | Path,
    data: str | Path,
    episodes: int,
    out_dir: str | Path,
    observe: int = 3,
    steps: int = 5,
    seed: int = 0,
    device: str | None = None,
    storyboard_episodes: int = 4,
    overwrite: bool = False,
    command: str | None = None,
    progress: bool = True,
) -> dict:
    """Run the full loop on the first ``episodes`` episodes of the split folder ``data`` with the models of
    ``pack`` and write ``results.json``, ``results.md`` and ``storyboard.png`` to ``out_dir``.

    Returns the content of results.json. Raises ``EvaluationError`` for a pack or data folder that lacks
    pieces or for bad settings, before any model work.
    """
    if episodes < 1 or observe < 1 or steps < 1 or storyboard_episodes < 0:
        raise EvaluationError(
            f"need episodes, observe and steps >= 1 and storyboard episodes >= 0; got {episodes}, "
            f"{observe}, {steps}, {storyboard_episodes}"
        )
    parts = resolve_pack(pack)
    records, scenes = read_heldout(data, episodes, observe + steps)
    device = pick_device(device)
    try:
        staging = prepare_run_dir(Path(out_dir), overwrite)
    except RolloutError as err:
        raise EvaluationError(str(err)) from err
    try:
        scores = run_loop(parts, records, scenes, observe, steps, seed, device, storyboard_episodes, staging, progress)
        results = {
            "command": command or f"evaluate_world({str(pack)!r}, {str(data)!r}, {episodes}, ...)",
            "pack": {"path": str(parts.root), "size_mb": parts.size_mb()},
            "data": {
                "path": str(data),
                "episodes": len(records),
                "scene_types": scenes,
                "scene_counts": {
                    k: sum(r["scene"] == k for r in records) for k in sorted({r["scene"] for r in records})
                },
            },
            "settings": {
                "observe": observe,
                "steps": steps,
                "seed": seed,
                "device": device,
                "captioner_options": parts.captioner_options,
                "renderer_options": parts.renderer_options,
            },
            **scores,
        }
        (staging / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
        (staging / "results.md").write_text(markdown(results))
        replace_dir(staging, Path(out_dir))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return results


def run_loop(
    parts: Pack,
    records: list[dict],
    scenes: list[str],
    observe: int,
    steps: int,
    seed: int,
    device: str,
    storyboard_episodes: int,
    folder: Path,
    progress: bool,
) -> dict:
    """The model work of ``evaluate_world``; draws ``folder``/storyboard.png and returns the scores."""
    timings: dict[str, float] = {}
    with timed(timings, "load_models"):
        try:
            captioner = HFCaptioner.from_pretrained(
                parts.folders["captioner"], device=device, **parts.captioner_options
            )
            renderer = DiffusersRenderer.from_pretrained(
                parts.folders["renderer"], device=device, **parts.renderer_options
            )
            models = {name: load_predictor(parts.folders[name], device=device) for name in ("predictor", "baseline")}
        except (ModelLoadError, CheckpointError) as err:
            raise EvaluationError(f"cannot load the pack {parts.root}: {err}") from err

    with timed(timings, "decode_strips"):
        strips = [
            episode_strips(r["path"]) for r in tqdm(records, desc="decoding clips", unit="clip", disable=not progress)
        ]
    bad = [r["id"] for r, s in zip(records, strips) if len(s) != len(r["sentences"])]
    if bad:
        raise EvaluationError(
            f"episode(s) {', '.join(bad[:5])}: the clip's strip count differs from its sentence count"
        )
    truths = [episode_sentences(r) for r in records]
    kinds = [r["scene"] for r in records]
    flat = [image for episode in strips for image in episode]
    with timed(timings, "caption_strips"):
        flat_captions = iter(captioner(flat, progress="captioning strips" if progress else None))
    captions = [[next(flat_captions) for _ in episode] for episode in strips]
    flat_truths = [s for t in truths for s in t]
    flat_kinds = [k for k, t in zip(kinds, truths) for _ in t]
    caption_accuracy = accuracy_by_scene([c for e in captions for c in e], flat_truths, flat_kinds)

    with timed(timings, "ceilings"):
        episode_ceilings = np.array([k_step_ceilings(r, observe, steps, scenes) for r in records])  # (episodes, steps)
    ceilings = episode_ceilings.mean(axis=0).tolist()
    ceiling_by_scene = {k: episode_ceilings[np.array(kinds) == k].mean(axis=0).tolist() for k in set(kinds)}

    futures = [t[observe : observe + steps] for t in truths]
    contexts = {"captions": [c[:observe] for c in captions], "truth": [t[:observe] for t in truths]}
    predictions: dict[str, dict[str, list[list[str]]]] = {}
    readouts = {}
    for name, label in (("four_tensor", "predictor"), ("baseline", "baseline")):
        model, vocab, known = models[label]
        readouts[name] = readout_name(known)
        with timed(timings, f"predict_{name}"):
            predictions[name] = {c: predict_ahead(model, vocab, contexts[c], steps, candidates=known) for c in CONTEXTS}
        if known is not None:  # the model's own readout beside it
            predictions[f"{name}_tokens"] = {c: predict_ahead(model, vocab, contexts[c], steps) for c in CONTEXTS}
    predictions["copy_last"] = {c: copy_last_predictions(contexts[c], steps) for c in CONTEXTS}
    next_state = {
        name: {c: score_predictions(predictions[name][c], futures, kinds, ceilings) for c in CONTEXTS}
        for name in PREDICTORS
        if name in predictions
    }

    loop_predictions = [s for p in predictions["four_tensor"]["captions"] for s in p]
    with timed(timings, "render"):
        renders = render_all(renderer, flat_truths + loop_predictions, seed, "rendering sentences", progress)
    with timed(timings, "caption_renders"):
        recaptions = dict(
            zip(renders, captioner(list(renders.values()), progress="captioning renders" if progress else None))
        )
    trip = {
        "true_sentences": round_trip(recaptions, flat_truths, flat_kinds),
        "predicted_sentences": round_trip(recaptions, loop_predictions, [k for k in kinds for _ in range(steps)]),
    }

    shown = storyboard_rows(records, storyboard_episodes)
    if shown:
        with timed(timings, "storyboard"):
            write_storyboard(
                folder / "storyboard.png",
                [
                    (
                        records[i],
                        strips[i][:observe],
                        captions[i][:observe],
                        truths[i],
                        predictions["four_tensor"]["captions"][i],
                        [renders[s] for s in predictions["four_tensor"]["captions"][i]],
                    )
                    for i in shown
                ],
                observe,
            )
    rollouts = {
        f"predict_{n}": (len(CONTEXTS) * len(records) * (1 if r == "tokens" else 2), "rollouts")
        for n, r in readouts.items()
    }  # with known sentences, the token readout runs too
    counts = {
        "load_models": (1, "load"),
        "decode_strips": (len(flat), "strips"),
        "caption_strips": (len(flat), "strips"),
        "ceilings": (len(records), "episodes"),
        **rollouts,
        "render": (len(renders), "images"),
        "caption_renders": (len(renders), "images"),
        "storyboard": (1, "figure"),
    }
    return {
        "caption_accuracy": caption_accuracy,
        "ceiling": {"per_step": [round(c, 4) for c in ceilings], "per_scene": rounded(ceiling_by_scene)},
        "readout": readouts,
        "next_state": next_state,
        "round_trip": trip,
        "timings": {
            k: {
                "seconds": round(v, 3),
                "items": counts[k][0],
                "unit": counts[k][1],
                "ms_per_item": round(1000 * v / counts[k][0], 2),
            }
            for k, v in timings.items()
        },
        "storyboard": [records[i]["id"] for i in shown],
        "episodes": [
            {
                "id": r["id"],
                "scene": r["scene"],
                "seed": r["seed"],
                "captions": c,
                "truths": t,
                "ceilings": [round(float(x), 4) for x in ec],
                "predictions": {
                    n: {ctx: predictions[n][ctx][i] for ctx in CONTEXTS} for n in ("four_tensor", "baseline")
                },
                "round_trip": {s: recaptions[s] for s in dict.fromkeys(t + predictions["four_tensor"]["captions"][i])},
            }
            for i, (r, c, t, ec) in enumerate(zip(records, captions, truths, episode_ceilings))
        ],
    }


def storyboard_rows(records: list[dict], count: int) -> list[int]:
    """Indices of ``count`` episodes to draw, in order: the first of each scene type, then the earliest others."""
    firsts = sorted({r["scene"]: i for i, r in reversed(list(enumerate(records)))}.values())
    rest = [i for i in range(len(records)) if i not in firsts]
    return sorted((firsts + rest)[:count])


def write_storyboard(path: Path, rows: list[tuple], observe: int) -> None:
    """One row per episode: the observed strips with their captions, then the predicted sentences with
    their rendered strips; a red label and frame mark a caption or prediction that is not the true sentence.
    ``rows``: (record, observed strips, captions, true sentences, predicted sentences, rendered strips)."""
    columns = observe + len(rows[0][4])
    figure = Figure(figsize=(2.6 * columns, 1.9 * len(rows)), dpi=100, layout="constrained")
    axes = figure.subplots(len(rows), columns, squeeze=False)
    for r, (record, observed, captions, truths, predicted, rendered) in enumerate(rows):
        cells = [(img, f"t={t} caption", c, truths[t]) for t, (img, c) in enumerate(zip(observed, captions))]
        cells += [
            (img, f"+{k + 1} predicted", p, truths[observe + k]) for k, (img, p) in enumerate(zip(rendered, predicted))
        ]
        for c, (ax, (image, what, text, truth)) in enumerate(zip(axes[r], cells)):
            wrong = not same_sentence(text, truth)
            ax.imshow(image)
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_edgecolor("firebrick" if wrong else "0.75")
                spine.set_linewidth(2.5 if wrong else 1)
            lines = textwrap.wrap(f"{what}: {text}", 34) + (textwrap.wrap(f"true: {truth}", 34) if wrong else [])
            ax.set_xlabel("\n".join(lines), fontsize=7, color="firebrick" if wrong else "black")
            if r == 0:
                ax.set_title("observed" if c < observe else "predicted, rendered", fontsize=9)
        axes[r, 0].set_ylabel(f"{record['id']}\n{record['scene']}", fontsize=8)
    figure.suptitle(
        "held-out episodes: captions of the observed seconds, then the predicted sentences rendered "
        "(red: differs from the true sentence)",
        fontsize=10,
    )
    figure.savefig(path, format="png")


def markdown(results: dict) -> str:
    """results.json as tables a person reads."""
    s = results["settings"]
    steps = range(1, s["steps"] + 1)
    size = results["pack"]["size_mb"]
    ceiling = results["ceiling"]["per_step"]
    data = results["data"]
    lines = [
        "# World-model evaluation",
        "",
        "```",
        results["command"],
        "```",
        "",
        f"Pack `{results['pack']['path']}`: **{size['total']:.2f} MB** ("
        + ", ".join(f"{c} {v:.2f}" for c, v in size.items() if c != "total")
        + "). "
        f"Data `{data['path']}`: the first {data['episodes']} episodes ("
        + ", ".join(f"{k} {v}" for k, v in data["scene_counts"].items())
        + f"). Observe seconds 0-{s['observe'] - 1}, "
        f"predict the next {s['steps']}; device {s['device']}, seed {s['seed']}.",
        "",
        "## Caption accuracy",
        "",
        "Captions of the held-out state strips that are exactly the true sentence.",
        "",
        "| scene | accuracy |",
        "|---|---:|",
        f"| all ({results['caption_accuracy']['strips']} strips) | **{results['caption_accuracy']['overall']:.4f}** |",
        *(f"| {k} | {v:.4f} |" for k, v in results["caption_accuracy"]["per_scene"].items()),
        "",
        "## Next-state accuracy k seconds ahead",
        "",
        f"Exact match of the predicted sentence of second {s['observe']} + k - 1 (greedy rollout). The ceiling is the "
        "accuracy of the Bayes-optimal predictor that knows the simulator's full state after the observed seconds; "
        "in brackets, the accuracy as a fraction of it. Readout: "
        + "; ".join(f"{PREDICTORS[n]}: {r}" for n, r in results["readout"].items())
        + " (with known sentences, each "
        "predicted state is the known sentence the model scores highest, `world_model.models.decoding`; the rows marked "
        "per-slot / token readout are the same models reading tokens off freely).",
        "",
        "| predictor | context | " + " | ".join(f"k={k}" for k in steps) + " |",
        "|---|---|" + "---:|" * len(steps),
        "| ceiling | | " + " | ".join(f"{c:.4f}" for c in ceiling) + " |",
    ]
    for name in results["next_state"]:
        for context, context_label in CONTEXTS.items():
            row, label = results["next_state"][name][context], PREDICTORS[name]
            cells = [f"{a:.4f} ({f:.0%})" for a, f in zip(row["accuracy"], row["fraction_of_ceiling"])]
            lines.append(f"| {label} | {context_label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Per scene:",
        "",
        "| scene | predictor | context | " + " | ".join(f"k={k}" for k in steps) + " |",
        "|---|---|---|" + "---:|" * len(steps),
    ]
    for kind, values in results["ceiling"]["per_scene"].items():
        lines.append(f"| {kind} | ceiling | | " + " | ".join(f"{v:.4f}" for v in values) + " |")
        for name in results["next_state"]:
            for context, context_label in CONTEXTS.items():
                values, label = results["next_state"][name][context]["per_scene"][kind], PREDICTORS[name]
                lines.append(f"| {kind} | {label} | {context_label} | " + " | ".join(f"{v:.4f}" for v in values) + " |")
    trip = results["round_trip"]
    scenes = list(results["caption_accuracy"]["per_scene"])
    lines += [
        "",
        "## Round trip",
        "",
        "Rendered strips captioned back to exactly the sentence they were rendered from (each distinct sentence "
        f"is rendered once, seed {s['seed']}, and counted as often as it occurs).",
        "",
        "| rendered from | strips | captioned back exactly | " + " | ".join(scenes) + " | distinct sentences "
        "| of those, exactly |",
        "|---|---:|---:|" + "---:|" * len(scenes) + "---:|---:|",
    ]
    for key, label in (
        ("true_sentences", "true held-out sentences"),
        ("predicted_sentences", "predicted sentences (4-tensor, full loop)"),
    ):
        t = trip[key]
        lines.append(
            f"| {label} | {t['strips']} | **{t['overall']:.4f}** | "
            + " | ".join(f"{t['per_scene'][k]:.4f}" if k in t["per_scene"] else "" for k in scenes)
            + f" | {t['distinct_sentences']} | {t['distinct_accuracy']:.4f} |"
        )
    lines += ["", "## Timings", "", "| stage | seconds | items | ms per item |", "|---|---:|---:|---:|"]
    lines += [
        f"| {k} | {t['seconds']:.2f} | {t['items']} {t['unit']} | {t['ms_per_item']:.1f} |"
        for k, t in results["timings"].items()
    ]
    if results["storyboard"]:
        lines += [
            "",
            "## Storyboard",
            "",
            f"Episodes {', '.join(results['storyboard'])}.",
            "",
            "![storyboard](storyboard.png)",
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.pack.evaluate_world", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pack", default="offline_pack", help="model pack folder (default offline_pack)")
    parser.add_argument(
        "--data", type=Path, required=True, help="held-out split folder (with episodes.jsonl and clips)"
    )
    parser.add_argument("--episodes", type=int, required=True, help="evaluate the first N episodes")
    parser.add_argument("--observe", type=int, default=3, help="observed seconds (default 3)")
    parser.add_argument("--steps", type=int, default=5, help="predicted seconds (default 5)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="rendering seed (default 0)")
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--storyboard-episodes", type=int, default=4, help="episodes drawn in storyboard.png (default 4)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m pipeline.pack.evaluate_world " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        results = evaluate_world(
            args.pack,
            args.data,
            args.episodes,
            args.out,
            args.observe,
            args.steps,
            args.seed,
            args.device,
            args.storyboard_episodes,
            args.overwrite,
            command,
        )
    except (EvaluationError, PresetError, OSError) as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    loop = results["next_state"]["four_tensor"]["captions"]["accuracy"]
    print(
        f"caption accuracy {results['caption_accuracy']['overall']:.4f}; next-state accuracy (full loop) "
        + ", ".join(f"k={k + 1} {a:.3f}" for k, a in enumerate(loop))
        + f"; round trip {results['round_trip']['true_sentences']['overall']:.4f}; wrote {args.out}/"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

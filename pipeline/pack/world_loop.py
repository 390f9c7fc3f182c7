"""The model work of the world-model evaluation: captions of every held-out second, rollouts of every predictor
from captions and from true sentences, renders captioned back, each stage timed."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from encoders.captioner import HFCaptioner
from encoders.world_dataset import episode_strips
from pipeline.pack.pack_folder import EvaluationError, Pack, WorldEvaluation
from pipeline.pack.world_report import CONTEXTS, PREDICTORS, storyboard_rows, write_storyboard
from renderers.text_to_image import DiffusersRenderer
from world_model.data.synthetic.ceilings import k_step_ceilings
from world_model.data.synthetic.episodes import episode_sentences
from world_model.data.synthetic.sentences import (
    copy_last_predictions,
    predict_ahead,
    rounded,
    score_predictions,
)
from world_model.models.checkpoint import CheckpointError
from world_model.models.decoding import readout_name
from world_model.models.registry import load_predictor
from world_model.text.vocab import same_sentence
from world_model.utils.hub import ModelLoadError
from world_model.utils.timing import timed


def exact_fraction(texts: Sequence[str], truths: Sequence[str], weights: Sequence[int] | None = None) -> float:
    """Weighted fraction of ``texts`` equal to their ``truths`` (each weight 1 by default)."""
    weights = [1] * len(texts) if weights is None else weights
    return sum(w for t, g, w in zip(texts, truths, weights, strict=True) if same_sentence(t, g)) / sum(weights)


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


def run_loop(
    parts: Pack,
    records: list[dict],
    scenes: list[str],
    settings: WorldEvaluation,
    folder: Path,
) -> dict:
    """The model work of ``evaluate_world`` with its ``settings`` (observe, steps, seed, device, storyboard episodes,
    progress); draws ``folder``/storyboard.png and returns the scores."""
    observe, steps, seed, progress = settings.observe, settings.steps, settings.seed, settings.progress
    timings: dict[str, float] = {}
    with timed(timings, "load_models"):
        captioner, renderer, models = load_pack(parts, settings.device)
    strips, captions = caption_episodes(captioner, records, timings, progress)
    truths = [episode_sentences(r) for r in records]
    kinds = [r["scene"] for r in records]
    flat_truths = [s for t in truths for s in t]
    flat_kinds = [k for k, t in zip(kinds, truths) for _ in t]
    caption_accuracy = accuracy_by_scene([c for e in captions for c in e], flat_truths, flat_kinds)

    with timed(timings, "ceilings"):
        episode_ceilings = np.array([k_step_ceilings(r, observe, steps, scenes) for r in records])  # (episodes, steps)
    ceilings = episode_ceilings.mean(axis=0).tolist()
    ceiling_by_scene = {k: episode_ceilings[np.array(kinds) == k].mean(axis=0).tolist() for k in set(kinds)}

    contexts = {"captions": [c[:observe] for c in captions], "truth": [t[:observe] for t in truths]}
    predictions, readouts = predict_all(models, contexts, steps, timings)
    futures = [t[observe : observe + steps] for t in truths]
    next_state = {
        name: {c: score_predictions(predictions[name][c], futures, kinds, ceilings) for c in CONTEXTS}
        for name in PREDICTORS
        if name in predictions
    }

    loop = predictions["four_tensor"]["captions"]
    renders, recaptions, trip = round_trips(captioner, renderer, truths, loop, kinds, seed, timings, progress)
    shown = storyboard_rows(records, settings.storyboard_episodes)
    if shown:
        with timed(timings, "storyboard"):
            rows = [
                (
                    records[i],
                    strips[i][:observe],
                    captions[i][:observe],
                    truths[i],
                    loop[i],
                    [renders[s] for s in loop[i]],
                )
                for i in shown
            ]
            write_storyboard(folder / "storyboard.png", rows, observe)
    counts = timing_counts(readouts, len(records), sum(len(s) for s in strips), len(renders))
    return {
        "caption_accuracy": caption_accuracy,
        "ceiling": {"per_step": [round(c, 4) for c in ceilings], "per_scene": rounded(ceiling_by_scene)},
        "readout": readouts,
        "next_state": next_state,
        "round_trip": trip,
        "timings": timing_report(timings, counts),
        "storyboard": [records[i]["id"] for i in shown],
        "episodes": episode_records(records, captions, truths, episode_ceilings, predictions, recaptions),
    }


def timing_report(timings: dict[str, float], counts: dict[str, tuple[int, str]]) -> dict:
    """Each stage's seconds beside its item count and unit (from ``timing_counts``) and the milliseconds per item."""
    return {
        k: {
            "seconds": round(v, 3),
            "items": counts[k][0],
            "unit": counts[k][1],
            "ms_per_item": round(1000 * v / counts[k][0], 2),
        }
        for k, v in timings.items()
    }


def round_trips(
    captioner,
    renderer,
    truths: list[list[str]],
    loop: list[list[str]],
    kinds: list[str],
    seed: int,
    timings: dict,
    progress: bool,
) -> tuple[dict, dict, dict]:
    """Render every true and every full-loop predicted sentence once (`seed`) and caption the renders back.

    Returns ({sentence: (H, W, 3) render}, {sentence: caption of its render}, the round-trip scores)."""
    flat_truths = [s for t in truths for s in t]
    flat_loop = [s for p in loop for s in p]
    with timed(timings, "render"):
        renders = render_all(renderer, flat_truths + flat_loop, seed, "rendering sentences", progress)
    with timed(timings, "caption_renders"):
        backs = captioner(list(renders.values()), progress="captioning renders" if progress else None)
    recaptions = dict(zip(renders, backs))
    trip = {
        "true_sentences": round_trip(recaptions, flat_truths, [k for k, t in zip(kinds, truths) for _ in t]),
        "predicted_sentences": round_trip(recaptions, flat_loop, [k for k, p in zip(kinds, loop) for _ in p]),
    }
    return renders, recaptions, trip


def load_pack(parts: Pack, device: str) -> tuple[HFCaptioner, DiffusersRenderer, dict]:
    """The pack's captioner, renderer and the two predictors ("predictor", "baseline": (model, vocab, known))."""
    try:
        captioner = HFCaptioner.from_pretrained(parts.folders["captioner"], device=device, **parts.captioner_options)
        renderer = DiffusersRenderer.from_pretrained(parts.folders["renderer"], device=device, **parts.renderer_options)
        models = {name: load_predictor(parts.folders[name], device=device) for name in ("predictor", "baseline")}
    except (ModelLoadError, CheckpointError) as err:
        raise EvaluationError(f"cannot load the pack {parts.root}: {err}") from err
    return captioner, renderer, models


def caption_episodes(
    captioner: HFCaptioner, records: list[dict], timings: dict, progress: bool
) -> tuple[list[list[np.ndarray]], list[list[str]]]:
    """Every episode's state strips (H, W, 3) and their captions, one per second."""
    with timed(timings, "decode_strips"):
        strips = [
            episode_strips(r["path"]) for r in tqdm(records, desc="decoding clips", unit="clip", disable=not progress)
        ]
    bad = [r["id"] for r, s in zip(records, strips) if len(s) != len(r["sentences"])]
    if bad:
        raise EvaluationError(
            f"episode(s) {', '.join(bad[:5])}: the clip's strip count differs from its sentence count"
        )
    flat = [image for episode in strips for image in episode]
    with timed(timings, "caption_strips"):
        flat_captions = iter(captioner(flat, progress="captioning strips" if progress else None))
    return strips, [[next(flat_captions) for _ in episode] for episode in strips]


def predict_all(
    models: dict, contexts: dict[str, list[list[str]]], steps: int, timings: dict
) -> tuple[dict[str, dict[str, list[list[str]]]], dict[str, str]]:
    """Rollouts of `steps` sentences from each context by each predictor (and copy-last); also each model's readout.

    Returns ({predictor: {context: [episode's predicted sentences]}}, {model: readout name})."""
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
    return predictions, readouts


def timing_counts(readouts: dict[str, str], episodes: int, strips: int, renders: int) -> dict[str, tuple[int, str]]:
    """What each timed stage processed: {stage: (items, unit)}."""
    rollouts = {  # with known sentences, the token readout runs too
        f"predict_{n}": (len(CONTEXTS) * episodes * (1 if r == "tokens" else 2), "rollouts")
        for n, r in readouts.items()
    }
    return {
        "load_models": (1, "load"),
        "decode_strips": (strips, "strips"),
        "caption_strips": (strips, "strips"),
        "ceilings": (episodes, "episodes"),
        **rollouts,
        "render": (renders, "images"),
        "caption_renders": (renders, "images"),
        "storyboard": (1, "figure"),
    }


def episode_records(records, captions, truths, episode_ceilings, predictions, recaptions) -> list[dict]:
    """results.json's per-episode entries: captions, truths, ceilings, predictions and the round trip."""
    return [
        {
            "id": r["id"],
            "scene": r["scene"],
            "seed": r["seed"],
            "captions": c,
            "truths": t,
            "ceilings": [round(float(x), 4) for x in ec],
            "predictions": {n: {ctx: predictions[n][ctx][i] for ctx in CONTEXTS} for n in ("four_tensor", "baseline")},
            "round_trip": {s: recaptions[s] for s in dict.fromkeys(t + predictions["four_tensor"]["captions"][i])},
        }
        for i, (r, c, t, ec) in enumerate(zip(records, captions, truths, episode_ceilings))
    ]

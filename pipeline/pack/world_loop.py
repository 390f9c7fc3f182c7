"""The model work of the world-model evaluation: captions of every held-out second, the world report's forecasts read
from those captions, and the predicted and true futures rendered and measured against the simulator's own drawing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from encoders.captioner import HFCaptioner
from encoders.world_dataset import episode_strips
from pipeline.pack.pack_folder import EvaluationError, Pack, WorldEvaluation
from pipeline.pack.render_scores import StripScore, frames_of, score_strip, simulator_strips
from renderers.text_to_image import DiffusersRenderer
from world_model.data.synthetic.episodes import episode_sentences
from world_model.data.synthetic.sentences import predict_ahead
from world_model.evaluation.world_report import world_report
from world_model.models.checkpoint import CheckpointError
from world_model.models.decoding import load_confidence_temperature
from world_model.models.registry import load_predictor
from world_model.text.vocab import same_sentence
from world_model.utils.hub import ModelLoadError
from world_model.utils.timing import timed

# How the first rendered strip may start from the last observed one: as the renderer draws it (reading that strip
# when it continues one), image-to-image from it without reading it, from noise without it, and no render at all:
# the last observed frame held still (what a frozen video would show).
FIRST_STRIP_VARIANTS = ("as_rendered", "from_last_strip", "without_context", "last_frame_held")


def exact_fraction(texts: Sequence[str], truths: Sequence[str]) -> float:
    """The fraction of ``texts`` equal to their ``truths`` (``same_sentence``)."""
    return sum(same_sentence(t, g) for t, g in zip(texts, truths, strict=True)) / len(texts)


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


@dataclass
class EpisodeRenders:
    """One episode's rendered futures after its first ``observe`` seconds: observed strips (renderer size), the true
    and the predicted (full loop) sentences with their renders, the simulator's strips of those seconds, each true
    render's score, the first strip's variants' scores, and the captions of every render."""

    record: dict
    observed: list[np.ndarray] = field(repr=False)
    truths: list[str]
    predicted: list[str]
    true_renders: list[np.ndarray] = field(repr=False)
    predicted_renders: list[np.ndarray] = field(repr=False)
    scores: list[StripScore] = field(default_factory=list)
    first: dict[str, StripScore] = field(default_factory=dict)
    true_back: list[str] = field(default_factory=list)
    predicted_back: list[str] = field(default_factory=list)


def run_loop(
    parts: Pack, records: list[dict], scenes: list[str], settings: WorldEvaluation
) -> tuple[dict, list[list[str]], list[EpisodeRenders]]:
    """The model work of ``evaluate_world``: returns (the scores, every episode's captions, the rendered episodes)."""
    s = settings
    timings: dict[str, float] = {}
    with timed(timings, "load_models"):
        captioner, renderer, (model, vocab, known) = load_pack(parts, s.device)
    captions = caption_episodes(captioner, records, timings, s.progress)
    truths = [episode_sentences(r) for r in records]
    kinds = [r["scene"] for r in records]
    flat_kinds = [k for k, t in zip(kinds, truths) for _ in t]
    caption_accuracy = accuracy_by_scene([c for e in captions for c in e], [t for e in truths for t in e], flat_kinds)
    predictors = {
        "four_tensor": [parts.folders["predictor"], *s.four_tensor_seeds],
        "flat_baseline": [parts.folders["baseline"], *s.flat_baseline_seeds],
    }
    with timed(timings, "forecasts"):
        contexts = {r["id"]: c for r, c in zip(records, captions)}
        report = world_report(s.data, s.steps, len(records), predictors, s.progress, s.cache, contexts)
    shown = records[: s.render_episodes]
    with timed(timings, "rollouts"):
        loop = predict_ahead(model, vocab, [c[: s.observe] for c in captions[: len(shown)]], s.steps, candidates=known)
    with timed(timings, "render"):
        rendered = [
            render_episode(renderer, r, t[s.observe : s.observe + s.steps], p, scenes, s)
            for r, t, p in tqdm(
                list(zip(shown, truths, loop)), desc="rendering", unit="episode", disable=not s.progress
            )
        ]
    with timed(timings, "caption_renders"):
        caption_renders(captioner, rendered)
    temperatures = {n: [load_confidence_temperature(f) for f in folders] for n, folders in predictors.items()}
    scores = {
        "caption_accuracy": caption_accuracy,
        **report,
        "predictor_folders": {n: [str(f) for f in folders] for n, folders in predictors.items()},
        "temperatures": temperatures,
        "renders": render_report(rendered),
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }
    return scores, captions, rendered


def load_pack(parts: Pack, device: str) -> tuple[HFCaptioner, DiffusersRenderer, tuple]:
    """The pack's captioner, renderer and 4-tensor predictor (model, vocabulary, known sentences)."""
    try:
        captioner = HFCaptioner.from_pretrained(parts.folders["captioner"], device=device, **parts.captioner_options)
        renderer = DiffusersRenderer.from_pretrained(parts.folders["renderer"], device=device, **parts.renderer_options)
        predictor = load_predictor(parts.folders["predictor"], device=device)
    except (ModelLoadError, CheckpointError) as err:
        raise EvaluationError(f"cannot load the pack {parts.root}: {err}") from err
    if predictor[2] is None:
        raise EvaluationError(
            f"{parts.folders['predictor']} has no known_sentences.txt: the world evaluation reads them"
        )
    return captioner, renderer, predictor


def caption_episodes(captioner: HFCaptioner, records: list[dict], timings: dict, progress: bool) -> list[list[str]]:
    """Every episode's captions, one a second, of the strips the captioner reads."""
    with timed(timings, "decode_strips"):
        strips = [
            episode_strips(r["path"]) for r in tqdm(records, desc="decoding clips", unit="clip", disable=not progress)
        ]
    bad = [r["id"] for r, s in zip(records, strips) if len(s) != len(r["sentences"])]
    if bad:
        raise EvaluationError(
            f"episode(s) {', '.join(bad[:5])}: the clip's strip count differs from its sentence count"
        )
    with timed(timings, "caption_strips"):
        flat = iter(captioner([i for e in strips for i in e], progress="captioning strips" if progress else None))
    return [[next(flat) for _ in episode] for episode in strips]


def render_episode(
    renderer: DiffusersRenderer,
    record: dict,
    truths: list[str],
    predicted: list[str],
    scenes: list[str],
    settings: WorldEvaluation,
) -> EpisodeRenders:
    """Render ``record``'s true and predicted futures after ``settings.observe`` seconds, each strip continuing the
    one before it (the last observed strip first) when the renderer continues strips; score the true renders and
    the first strip's ``FIRST_STRIP_VARIANTS`` against the simulator's drawing."""
    height, width = renderer.pipeline.check_size(None, None)
    observed = episode_strips(record["path"], (height, width))[: settings.observe]
    drawn = simulator_strips(record, scenes, height)[settings.observe : settings.observe + len(truths)]
    episode = EpisodeRenders(
        record,
        observed,
        truths,
        predicted,
        chain(renderer, truths, observed[-1], settings.seed),
        chain(renderer, predicted, observed[-1], settings.seed),
    )
    episode.scores = [score_strip(image, true) for image, true in zip(episode.true_renders, drawn)]
    firsts = first_strips(renderer, truths[0], observed[-1], settings)
    episode.first = {name: score_strip(image, drawn[0]) for name, image in firsts.items()}
    episode.first["as_rendered"] = episode.scores[0]
    return episode


def chain(renderer: DiffusersRenderer, sentences: list[str], start: np.ndarray, seed: int) -> list[np.ndarray]:
    """One render a sentence; a renderer that continues strips reads ``start``, then each render, before the next."""
    renders, before = [], start
    for sentence in sentences:
        image = renderer([sentence], seed=seed, init_images=[before] if renderer.continues else None)[0]
        renders.append(image)
        before = image
    return renders


def first_strips(
    renderer: DiffusersRenderer, sentence: str, start: np.ndarray, settings: WorldEvaluation
) -> dict[str, np.ndarray]:
    """The first strip drawn the other ways of ``FIRST_STRIP_VARIANTS`` (the renderer's own is scored already)."""
    pipe = renderer.pipeline

    def draw(**options) -> np.ndarray:
        generator = torch.Generator("cpu").manual_seed(settings.seed)
        image = pipe([sentence], generator=generator, output_type="np", **options).images[0]
        return (image * 255).round().astype(np.uint8)

    last = frames_of(start)[-1]
    return {
        "from_last_strip": draw(image=[start], strength=settings.strength),
        "without_context": draw(),
        "last_frame_held": np.concatenate([last] * len(frames_of(start)), axis=1),
    }


def caption_renders(captioner: HFCaptioner, rendered: list[EpisodeRenders]) -> None:
    """Caption every render back (the round trip), into each episode's ``true_back`` and ``predicted_back``."""
    images = [i for e in rendered for i in (*e.true_renders, *e.predicted_renders)]
    backs = iter(captioner(images) if images else [])
    for e in rendered:
        e.true_back = [next(backs) for _ in e.true_renders]
        e.predicted_back = [next(backs) for _ in e.predicted_renders]


def render_report(rendered: list[EpisodeRenders]) -> dict:
    """Per scene and over all ("all"): the true renders' object count accuracy and position error, the round trip of
    the true and the predicted renders, and the first strip's variants (each frame counted once)."""
    groups = {"all": rendered}
    for e in rendered:
        groups.setdefault(e.record["scene"], []).append(e)
    report = {}
    for name, episodes in groups.items():
        scores = [s for e in episodes for s in e.scores]
        report[name] = {
            "episodes": len(episodes),
            "renders": len(scores),
            "object_count_accuracy": round(float(np.mean([s.counts_right for s in scores])), 4),
            "position_error": mean_or_none([s.position_error for s in scores]),
            "round_trip": round(exact_fraction(*pairs(episodes, "true")), 4),
            "round_trip_predicted": round(exact_fraction(*pairs(episodes, "predicted")), 4),
            "first_strip": {
                v: {
                    "object_count_accuracy": round(float(np.mean([e.first[v].counts_right for e in episodes])), 4),
                    "position_error": mean_or_none([e.first[v].position_error for e in episodes]),
                    "pixel_error": round(float(np.mean([e.first[v].pixel_error for e in episodes])), 4),
                }
                for v in FIRST_STRIP_VARIANTS
            },
        }
    return report


def pairs(episodes: list[EpisodeRenders], which: str) -> tuple[list[str], list[str]]:
    """(captions of the renders, the sentences they were rendered from) of the ``which`` ("true", "predicted")."""
    backs = [b for e in episodes for b in getattr(e, f"{which}_back")]
    sentences = [s for e in episodes for s in (e.truths if which == "true" else e.predicted)]
    return backs, sentences


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None, to 2 decimals (None when every one is)."""
    kept = [v for v in values if v is not None]
    return round(float(np.mean(kept)), 2) if kept else None


def episode_entries(records: list[dict], captions: list[list[str]], rendered: list[EpisodeRenders]) -> list[dict]:
    """results.json's per-episode entries: captions, and for the rendered ones the predicted future and the round
    trip."""
    entries = [
        {"id": r["id"], "scene": r["scene"], "seed": r["seed"], "captions": c} for r, c in zip(records, captions)
    ]
    for entry, e in zip(entries, rendered):
        entry.update(
            predicted=e.predicted,
            true_renders_captioned=e.true_back,
            predicted_renders_captioned=e.predicted_back,
            objects_right=[round(s.counts_right, 4) for s in e.scores],
        )
    return entries

"""Round trip of a renderer alone: render sentences, caption the images back, count exact matches.

    python -m pipeline.pack.round_trip --renderer RUN/pipeline --sentences offline_pack/predictor/known_sentences.txt \\
        [--captioner offline_pack/captioner] [--seeds 0 1] [--steps 15] [--guidance 3] [--solver S] [--json FILE]

Each sentence (one per line) is rendered once per seed with the pixel pipeline of the offline pack
(``renderers.pixel_pipeline``) and captioned with the offline preset's captioner options; the result is the
fraction captioned back to exactly the sentence (``world_model.text.vocab.same_sentence``), overall and per scene
type of the synthetic world. It compares renderer runs on the same footing, without a held-out video split
(``pipeline.pack.evaluate_world`` measures the shipped pack on held-out episodes).
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from encoders.captioner import HFCaptioner
from pipeline.pack.world_loop import accuracy_by_scene, exact_fraction
from pipeline.presets import load_preset
from renderers.pixel_scheduler import SOLVERS, set_solver
from renderers.text_to_image import DiffusersRenderer
from world_model.data.synthetic.scenes import scene_of
from world_model.utils.cli import check_output
from world_model.utils.files import write_json_atomic
from world_model.utils.flags import settings_main

PIPELINE_CLASS = "renderers.pixel_pipeline:PixelTextToImagePipeline"


def render_all(
    renderer: DiffusersRenderer, sentences: Sequence[str], seed: int, desc: str, progress: bool
) -> dict[str, np.ndarray]:
    """One (H, W, 3) uint8 image per distinct sentence, each rendered from ``seed``."""
    distinct = list(dict.fromkeys(sentences))
    return {s: renderer([s], seed=seed)[0] for s in tqdm(distinct, desc=desc, unit="image", disable=not progress)}


def round_trip(recaptions: dict[str, str], sentences: Sequence[str], kinds: Sequence[str]) -> dict:
    """How many rendered ``sentences`` (counted with repeats; overall and per scene type ``kinds``) and how many of
    the distinct ones were captioned back exactly; ``recaptions`` maps each sentence to the caption of its render."""
    distinct = list(dict.fromkeys(sentences))
    return {
        **accuracy_by_scene([recaptions[s] for s in sentences], sentences, kinds),
        "distinct_sentences": len(distinct),
        "distinct_accuracy": round(exact_fraction([recaptions[s] for s in distinct], distinct), 4),
    }


def renderer_round_trip(
    renderer: str | Path,
    sentences: Sequence[str],
    captioner: str | Path = "offline_pack/captioner",
    seeds: Sequence[int] = (0,),
    steps: int | None = None,
    guidance: float | None = None,
    solver: str | None = None,
    progress: bool = True,
) -> dict:
    """Render every sentence once per seed, caption the images, and score them (`round_trip`'s
    fields per seed and pooled); "captions" maps each seed to {sentence: caption of its render}. ``steps``,
    ``guidance`` and ``solver`` (one of ``pixel_pipeline.SOLVERS``) left ``None`` are the pipeline's own."""
    if not sentences:
        raise ValueError("no sentences to render")
    cap = HFCaptioner.from_pretrained(str(captioner), device="cpu", **load_preset("offline").captioner_options)
    ren = DiffusersRenderer.from_pretrained(
        str(renderer), device="cpu", num_inference_steps=steps, guidance_scale=guidance, pipeline_class=PIPELINE_CLASS
    )
    if solver is not None:
        set_solver(ren.pipeline, solver)
    kinds = [scene_of(s) for s in sentences]
    captions, per_seed = {}, {}
    for seed in seeds:
        images = render_all(ren, sentences, seed, f"rendering (seed {seed})", progress)
        captions[seed] = dict(zip(images, cap(list(images.values()))))
        per_seed[seed] = round_trip(captions[seed], sentences, kinds)
    texts = [s for _ in seeds for s in sentences]  # every render once, pooled over the seeds
    back = [captions[seed][s] for seed in seeds for s in sentences]
    overall = accuracy_by_scene(back, texts, kinds * len(seeds))
    return {
        "renderer": str(renderer),
        "captioner": str(captioner),
        "seeds": list(seeds),
        "steps": steps,
        "guidance": guidance,
        "solver": ren.pipeline.scheduler.config.algorithm_type,
        "overall": overall,
        "per_seed": per_seed,
        "captions": captions,
    }


@dataclass
class RoundTripSettings:
    """Which renderer renders which sentences, how, and which captioner reads the renders back."""

    renderer: str = field(metadata={"help": "pixel pipeline folder (e.g. a training run's pipeline/)"})
    sentences: Path = field(metadata={"help": "text file, one sentence per line"})
    captioner: str = field(default="offline_pack/captioner", metadata={"help": "captioner folder (default the pack's)"})
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "render seeds (default 0)"})
    steps: int | None = field(default=None, metadata={"help": "sampling steps (default: the pipeline's)"})
    guidance: float | None = field(default=None, metadata={"help": "guidance scale (default: the pipeline's)"})
    solver: str | None = field(
        default=None, metadata={"choices": SOLVERS, "help": "DPM-Solver++ variant (default: the pipeline's)"}
    )
    json: Path | None = field(
        default=None, metadata={"help": "also write the results, with every caption, to this file"}
    )
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --json file"})


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        RoundTripSettings,
        "pipeline.pack.round_trip",
        __doc__.split("\n\n")[0],
        round_trip_command,
        argv,
    )


def round_trip_command(settings: RoundTripSettings, command: str) -> None:
    """The command's work: render the sentences, caption the renders, print the scores (and write them, with
    `command`, this command's own line, to --json)."""
    if settings.json:
        inputs = {"renderer": settings.renderer, "captioner": settings.captioner, "sentences": settings.sentences}
        check_output(settings.json, "--json", inputs, settings.overwrite)
    sentences = [line.strip() for line in settings.sentences.read_text().splitlines() if line.strip()]
    result = renderer_round_trip(
        settings.renderer,
        sentences,
        settings.captioner,
        settings.seeds,
        settings.steps,
        settings.guidance,
        settings.solver,
    )
    o = result["overall"]
    print(
        f"round trip {o['overall']:.3f} over {o['strips']} renders ("
        + ", ".join(f"{k} {v:.3f}" for k, v in o["per_scene"].items())
        + ")"
    )
    if settings.json:
        write_json_atomic(settings.json, {**result, "command": command})


if __name__ == "__main__":
    sys.exit(main())

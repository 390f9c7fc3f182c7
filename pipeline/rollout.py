"""The video rollout: clip -> captions -> 4-tensor rollout -> rendered frames.

    python -m pipeline.rollout video.mp4 --steps 5 [--preset auto|hub|offline] [--out DIR]
                                [--interval S | --frames K] [--device D] [--samples K --temperature X --seed S]
                                [--readout auto|sentences|bank|tokens] [--on-unknown warn|stop] [--verbose]

`run_rollout(...)` is the Python API that the command and the demo both call. A run folder holds the
observed and rendered frames, `rollout.json`, `storyboard.png`, `rollout.mp4` and `rollout.gif`. It is
written beside its destination and renamed into place only when complete (also on Ctrl-C or SIGTERM, which
remove it). Every caption carries a grounding score (`encoders.grounding`) and the clip a verdict; frames
outside the captioner's world are warned about, or refused with `--on-unknown stop`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from encoders.frames import VideoError, sample_frames
from encoders.grounding import clip_verdict
from pipeline.presets import PresetError, available_presets, choose_preset, resolve_model_path
from world_model.generation.sentence_bank import BANK_READOUTS as READOUTS
from world_model.generation.sentence_bank import Readout, resolve_readout
from world_model.models.checkpoint import CheckpointError
from world_model.models.generation_config import GenerationConfig
from world_model.models.registry import Predictor
from world_model.models.registry import load_predictor as load_predictor_folder
from world_model.text.windows import caption_window, decode_states
from world_model.utils.files import replace_dir

Progress = Callable[[float, str], None]
ON_UNKNOWN = ("warn", "stop")
MAX_STEPS = 64  # predicted states per run
MAX_SAMPLES = 16  # alternative futures per run
MAX_FRAMES = 256  # sampled frames per run
MAX_SEED = 2**32 - 1


class RolloutError(RuntimeError):
    """A run cannot go ahead or finish; the message says why and nothing is left half-written."""


@dataclass
class RolloutResult:
    """What a run produced; `record` is the content of rollout.json."""

    run_dir: Path
    record: dict
    observed: list[np.ndarray] = field(repr=False)  # (H, W, 3) uint8 sampled frames
    rendered: list[list[np.ndarray]] = field(repr=False)  # [sample][step] (H, W, 3) uint8

    @property
    def predicted_sentences(self) -> list[list[str]]:
        return [s["sentences"] for s in self.record["predictions"]]


@lru_cache(maxsize=4)
def load_captioner(name: str, device: str | None, options: tuple):
    from encoders.captioner import HFCaptioner

    return HFCaptioner.from_pretrained(name, device=device, **dict(options))


@lru_cache(maxsize=4)
def load_renderer(name: str, device: str | None, options: tuple):
    from renderers.text_to_image import DiffusersRenderer

    return DiffusersRenderer.from_pretrained(name, device=device, **dict(options))


@lru_cache(maxsize=4)
def load_predictor(name: str, device: str) -> Predictor:
    """The predictor, its vocabulary and its known sentences (or None) from a checkpoint folder."""
    return load_predictor_folder(name, device=device)


@lru_cache(maxsize=4)
def load_readout(name: str, device: str, readout: str) -> Readout:
    """How the predictor reads its states off (`world_model.generation.sentence_bank.resolve_readout`); a bank is encoded once."""
    predictor = load_predictor(name, device)
    return resolve_readout(name, predictor.known_sentences, readout, predictor.vocab, predictor.model.config.n_tokens)


def pick_device(device: str | None) -> str:
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def prepare_run_dir(out_dir: Path, overwrite: bool) -> Path:
    """Check the destination now, before any model work, and make a staging folder beside it."""
    if out_dir.exists() and not out_dir.is_dir():
        raise RolloutError(f"{out_dir} is a file, not a folder; choose another --out")
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise RolloutError(f"{out_dir} already holds files; choose another --out or pass --overwrite")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.partial-"))
        staging.chmod(0o755)  # mkdtemp makes it private; a run folder is for reading
        return staging
    except OSError as err:
        raise RolloutError(f"cannot write the run folder {out_dir}: {err.strerror or err}") from err


def default_out_dir(video: Path) -> Path:
    return Path("runs") / f"{video.stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_rollout(
    video: str | Path,
    steps: int = 5,
    out_dir: str | Path | None = None,
    preset: str = "auto",
    interval: float = 1.0,
    num_frames: int | None = None,
    max_frames: int = 32,
    frames_per_state: int | None = None,
    captioner: str | None = None,
    renderer: str | None = None,
    predictor: str | None = None,
    device: str | None = None,
    samples: int = 1,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    readout: str = "auto",
    init_from_last_frame: bool = False,
    fps: float = 2.0,
    overwrite: bool = False,
    on_unknown: str = "warn",
    progress: Progress | None = None,
) -> RolloutResult:
    """Read a clip, predict its next `steps` states and render them.

    Args:
        video: the clip (any container OpenCV/FFmpeg reads).
        steps: predicted states (one per `interval` seconds of the future), >= 1.
        out_dir: the run folder; default `runs/<clip>-<time>`. Refused if it holds files, unless `overwrite`.
        preset: `auto` (hub models when cached or reachable, otherwise the offline pack), `hub` or `offline`.
        interval: seconds between sampled frames; `num_frames` instead takes that many evenly spaced.
        max_frames: cap on sampled frames (long clips are thinned evenly).
        frames_per_state: read each `interval` as a strip of this many frames tiled left to right (the
            offline pack's captioner reads 3-frame strips that show motion); default: the preset's
            `sampling.frames_per_state`, else 1 (single frames).
        captioner, renderer, predictor: override one component with a hub id or a local folder.
        device: torch device for the models; default CUDA when available, else CPU.
        samples: alternative futures; greedy when `temperature` is 0 (then one sample is enough).
        temperature, top_k, seed: sampling of the predicted tokens (of the known sentences with the
            closed-set readout); `seed` also seeds the renderer.
        readout: `auto` (default) picks each predicted state from the predictor folder's known sentences
            when it has known_sentences.txt (`world_model.models.decoding`), else from its sentence bank when it has
            sentence_bank.json.gz (`world_model.generation.sentence_bank`; the ROCStories predictor of the hub preset),
            else reads tokens off freely; `sentences` and `bank` require their file; `tokens` always reads
            tokens off freely (the paper's per-slot readout).
        init_from_last_frame: render each state image-to-image from the last observed frame.
        fps: frame rate of rollout.mp4 / rollout.gif.
        on_unknown: what to do when frames are outside the captioner's world (`encoders.grounding`):
            `warn` (default) records and prints a warning, `stop` raises RolloutError before predicting.
        progress: optional callback `progress(fraction, message)` (the demo passes gr.Progress).
    """
    timings: dict[str, float] = {}
    report = progress or (lambda fraction, message: None)
    if not 1 <= steps <= MAX_STEPS:
        raise RolloutError(f"--steps must be between 1 and {MAX_STEPS}, got {steps}")
    if not 1 <= samples <= MAX_SAMPLES:
        raise RolloutError(f"--samples must be between 1 and {MAX_SAMPLES}, got {samples}")
    check_settings(interval, num_frames, max_frames, temperature, top_k, fps)
    if not 0 <= seed <= MAX_SEED:
        raise RolloutError(f"--seed must be between 0 and {MAX_SEED}, got {seed}")
    if on_unknown not in ON_UNKNOWN:
        raise RolloutError(f"--on-unknown must be one of {', '.join(ON_UNKNOWN)}, got {on_unknown!r}")
    if readout not in READOUTS:
        raise RolloutError(f"--readout must be one of {', '.join(READOUTS)}, got {readout!r}")
    video = Path(video)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(video)
    chosen, reason = (
        choose_preset(preset)
        if not (captioner and renderer and predictor)
        else ({"name": "custom"}, "all components named")
    )
    if frames_per_state is None:
        frames_per_state = int(chosen.get("sampling", {}).get("frames_per_state", 1))
    if frames_per_state < 1 or (frames_per_state > 1 and num_frames is not None):
        raise RolloutError(
            f"frames per state must be at least 1, and 1 with --frames (evenly spaced frames); "
            f"got {frames_per_state} (preset {chosen['name']!r}); sample with --interval instead"
        )
    names = {
        c: resolve_model_path(override) if override else chosen[c]
        for c, override in (("captioner", captioner), ("renderer", renderer), ("predictor", predictor))
    }
    device = pick_device(device)
    staging = prepare_run_dir(out_dir, overwrite)
    try:
        start = time.perf_counter()
        report(0.0, "sampling frames")
        clip = sample_frames(
            video, interval=interval, num_frames=num_frames, max_frames=max_frames, frames_per_state=frames_per_state
        )
        timings["sample_frames"] = time.perf_counter() - start

        start = time.perf_counter()
        report(0.15, "loading models")
        cap = load_captioner(names["captioner"], device, tuple(sorted(chosen.get("captioner_options", {}).items())))
        predictor = load_predictor(names["predictor"], device)
        model, vocab = predictor.model, predictor.vocab
        chosen_readout = load_readout(names["predictor"], device, readout)
        ren = load_renderer(names["renderer"], device, tuple(sorted(chosen.get("renderer_options", {}).items())))
        timings["load_models"] = time.perf_counter() - start

        start = time.perf_counter()
        report(0.3, f"captioning {len(clip)} frames")
        images = [f.image for f in clip]
        if hasattr(cap, "caption_and_ground"):
            captions, groundings = cap.caption_and_ground(images)
        else:  # a captioner that gives no score
            captions, groundings = cap(images), [None] * len(images)
        verdict = clip_verdict(groundings)
        unknown = unknown_warning(verdict, groundings, names["captioner"])
        if unknown and on_unknown == "stop":
            raise RolloutError(f"{unknown} (--on-unknown stop)")
        timings["caption"] = time.perf_counter() - start

        start = time.perf_counter()
        report(0.5, "predicting")
        c = model.config
        window = caption_window(captions, vocab, c.n_states, c.n_tokens)
        generation = GenerationConfig(
            temperature=temperature, top_k=top_k, end_ids=vocab.end_ids, samples=samples, seed=seed, readout=readout
        )
        generator = generation.generator()
        predictions = []
        for _ in range(generation.futures):
            ids = chosen_readout.rollout(model, window.token_ids.to(device), steps, generation, generator)
            ids = ids[0].cpu()  # (steps, N)
            predictions.append({"sentences": decode_states(ids, vocab), "token_ids": ids.tolist()})
        timings["predict"] = time.perf_counter() - start

        start = time.perf_counter()
        rendered = render_states(
            ren, [p["sentences"] for p in predictions], seed, images[-1] if init_from_last_frame else None, report
        )
        timings["render"] = time.perf_counter() - start

        start = time.perf_counter()
        report(0.9, "writing outputs")
        record = {
            "video": str(video),
            "clip": {
                "fps": clip.info.fps,
                "duration_s": clip.info.duration,
                "width": clip.info.width,
                "height": clip.info.height,
                "rotation": clip.info.rotation,
            },
            "preset": chosen["name"],
            "preset_reason": reason,
            "models": {**names, "device": device},
            "sampling": {
                "interval_s": interval,
                "num_frames": num_frames,
                "max_frames": max_frames,
                "frames_per_state": frames_per_state,
                "steps": steps,
                "temperature": temperature,
                "top_k": top_k,
                "seed": seed,
                "readout": chosen_readout.name,
                "samples": len(predictions),
                "init_from_last_frame": init_from_last_frame,
            },
            "observed": [
                {
                    "timestamp_s": round(f.timestamp, 3),
                    "frame_index": f.index,
                    "caption": text,
                    "grounding": g.as_dict() if g else None,
                    "image": f"observed/{i:03d}.png",
                }
                for i, (f, text, g) in enumerate(zip(clip, captions, groundings))
            ],
            "grounding": verdict,
            "window": {"states": window.states, "token_ids": window.token_ids[0].tolist()},
            "oov": {
                "tokens": window.tokens,
                "unknown": window.unknown,
                "rate": round(window.oov_rate, 4),
                "unknown_words": window.unknown_words,
            },
            "predictions": [
                {**p, "images": [f"rendered/sample{k}_step{s + 1:02d}.png" for s in range(steps)]}
                for k, p in enumerate(predictions)
            ],
            "warnings": [unknown] * bool(unknown) + list(clip.warnings),
        }
        if window.tokens and window.unknown == window.tokens:
            record["warnings"].append(
                "every caption word is outside the predictor's vocabulary: "
                "the prediction rests on sentence positions alone"
            )
        write_outputs(staging, record, images, rendered, captions, fps)
        timings["write_outputs"] = time.perf_counter() - start
        record["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
        write_json(staging / "rollout.json", record)
        replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report(1.0, "done")
    return RolloutResult(out_dir, record, images, rendered)


def render_states(
    ren, futures: list[list[str]], seed: int, init: np.ndarray | None, report: Progress
) -> list[list[np.ndarray]]:
    """Render each sample's sentences one state at a time (sample k with seed + k), with a progress bar
    on stderr and `report` after every state; (H, W, 3) uint8 images per [sample][step]."""
    total = sum(len(f) for f in futures)
    rendered, done = [], 0
    with tqdm(total=total, desc="rendering", unit="state", disable=None) as bar:
        for k, sentences in enumerate(futures):
            images = []
            for sentence in sentences:
                report(0.6 + 0.3 * done / total, f"rendering predicted state {done + 1} of {total}")
                images += ren([sentence], seed=seed + k, init_images=None if init is None else [init])
                done += 1
                bar.update()
            rendered.append(images)
    return rendered


def unknown_warning(verdict: dict, groundings: list, captioner: str) -> str:
    """The warning for frames outside the captioner's world, or "" when every frame is grounded (or unscored)."""
    if not verdict["flagged"]:
        return ""
    threshold = next(g.threshold for g in groundings if g is not None)
    where = "the clip is" if verdict["verdict"] == "outside" else "part of the clip is"
    return (
        f"{where} outside the captioner's world: {verdict['flagged']} of {verdict['frames']} frames lie far from "
        f"what {captioner} was trained on (feature distance to its training frames above {threshold:.1f}); "
        "their captions, the prediction and the renders describe that world, not this clip"
    )


def check_settings(
    interval: float, num_frames: int | None, max_frames: int, temperature: float, top_k: int | None, fps: float
) -> None:
    """Refuse settings that would fail late (after the model work) or obscurely, before anything runs."""
    if not (math.isfinite(interval) and interval > 0):
        raise RolloutError(f"--interval must be a positive number of seconds, got {interval}")
    if num_frames is not None and num_frames < 1:
        raise RolloutError(f"--frames must be at least 1, got {num_frames}")
    if not 1 <= max_frames <= MAX_FRAMES:
        raise RolloutError(f"--max-frames must be between 1 and {MAX_FRAMES}, got {max_frames}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise RolloutError(f"--temperature must be 0 (greedy) or positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise RolloutError(f"--top-k must be at least 1, got {top_k}")
    if not (math.isfinite(fps) and fps > 0):
        raise RolloutError(f"--fps must be a positive number, got {fps}")


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_outputs(
    folder: Path,
    record: dict,
    observed: list[np.ndarray],
    rendered: list[list[np.ndarray]],
    captions: list[str],
    fps: float,
) -> None:
    """Frames as PNG, the storyboard, and the video (observed frames, then the first sample's future)."""
    from renderers.outputs import write_storyboard
    from world_model.utils.video import write_gif, write_video

    for entry, image in zip(record["observed"], observed):
        save_png(folder / entry["image"], image)
    for prediction, images in zip(record["predictions"], rendered):
        for name, image in zip(prediction["images"], images):
            save_png(folder / name, image)
    first = record["predictions"][0]
    observed_cells = [
        (img, f"t={e['timestamp_s']:.1f}s: {e['caption']}") for img, e in zip(observed, record["observed"])
    ]
    predicted_cells = [
        (img, f"step {s + 1}: {text}") for s, (img, text) in enumerate(zip(rendered[0], first["sentences"]))
    ]
    write_storyboard(observed_cells, predicted_cells, folder / "storyboard.png", title=Path(record["video"]).name)
    size = observed[0].shape[:2]
    frames = [fit(img, size) for img in observed + rendered[0]]
    write_video(frames, folder / "rollout.mp4", fps=fps)
    write_gif(frames, folder / "rollout.gif", fps=fps)


def save_png(path: Path, image: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)


def fit(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize an (H, W, 3) frame to (height, width) = size, so observed and rendered frames share a video."""
    if image.shape[:2] == size:
        return image
    return np.asarray(Image.fromarray(image).resize((size[1], size[0]), Image.BICUBIC))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("video", type=Path, help="the clip to read")
    parser.add_argument(
        "--steps", type=int, default=5, help=f"predicted future states (default 5, at most {MAX_STEPS})"
    )
    parser.add_argument(
        "--preset", default="auto", help=f"model preset: {', '.join(available_presets())} (default auto)"
    )
    parser.add_argument("--out", type=Path, help="run folder (default runs/<clip>-<time>)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    sampling = parser.add_mutually_exclusive_group()
    sampling.add_argument("--interval", type=float, default=1.0, help="seconds between sampled frames (default 1.0)")
    sampling.add_argument("--frames", type=int, help="sample this many evenly spaced frames instead")
    parser.add_argument(
        "--max-frames", type=int, default=32, help=f"cap on sampled frames (default 32, at most {MAX_FRAMES})"
    )
    parser.add_argument(
        "--frames-per-state", type=int, help="frames tiled into each state strip (default: the preset's, else 1)"
    )
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--captioner", help="image-to-text model: hub id or folder (overrides the preset)")
    parser.add_argument("--renderer", help="text-to-image model: hub id or folder (overrides the preset)")
    parser.add_argument("--predictor", help="4-tensor checkpoint folder (overrides the preset)")
    parser.add_argument(
        "--samples", type=int, default=1, help=f"alternative futures (needs --temperature > 0; at most {MAX_SAMPLES})"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, help="sample only among the k likeliest words")
    parser.add_argument("--seed", type=int, default=0, help="seed for sampling and rendering")
    parser.add_argument(
        "--readout",
        choices=READOUTS,
        default="auto",
        help="sentences: pick each state from the predictor's known sentences; bank: from its "
        "sentence bank; tokens: read tokens off freely (the paper's per-slot readout); auto "
        "(default): known sentences, else the bank, else tokens",
    )
    parser.add_argument(
        "--init-from-last-frame", action="store_true", help="image-to-image from the last observed frame"
    )
    parser.add_argument("--fps", type=float, default=2.0, help="frame rate of rollout.mp4 (default 2)")
    parser.add_argument(
        "--on-unknown",
        choices=ON_UNKNOWN,
        default="warn",
        help="frames outside the captioner's world: warn (default) or stop before predicting",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="keep the libraries' loading bars and advisory warnings on stderr"
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    return parser.parse_args(argv)


def summary(result: RolloutResult) -> str:
    r = result.record
    lines = [f"preset: {r['preset']} ({r['preset_reason']})"]
    lines += [
        f"  t={o['timestamp_s']:>6.1f}s  {o['caption']}"
        + ("  [outside the captioner's world]" if (o["grounding"] or {}).get("grounded") is False else "")
        for o in r["observed"]
    ]
    for k, p in enumerate(r["predictions"]):
        lines.append(f"predicted{'' if len(r['predictions']) == 1 else f' (sample {k + 1})'}:")
        lines += [f"  step {s + 1}: {text}" for s, text in enumerate(p["sentences"])]
    lines.append(f"out-of-vocabulary rate: {r['oov']['rate']:.1%}")
    lines += [f"warning: {w}" for w in r["warnings"]]
    lines.append("timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in r["timings_s"].items()))
    lines.append(f"wrote {result.run_dir}/ (rollout.json, storyboard.png, rollout.mp4, rollout.gif)")
    return "\n".join(lines)


def stop_on_sigterm(signum, frame) -> None:
    """SIGTERM ends a run as Ctrl-C does: the exception unwinds through run_rollout, which removes its staging folder."""
    raise SystemExit(128 + signum)


def quiet_libraries() -> None:
    """Silence transformers', diffusers' and huggingface_hub's loading bars and advisory warnings, OpenCV's
    and FFmpeg's decoder messages and the frame sampler's log (its warnings reach the summary anyway)."""
    import diffusers
    import huggingface_hub
    import transformers

    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET, read when a capture opens
    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    diffusers.logging.set_verbosity_error()
    diffusers.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    logging.getLogger("encoders").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.verbose:
        quiet_libraries()
    in_main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm) if in_main_thread else None
    try:
        result = run_rollout(
            args.video,
            steps=args.steps,
            out_dir=args.out,
            preset=args.preset,
            interval=args.interval,
            num_frames=args.frames,
            max_frames=args.max_frames,
            frames_per_state=args.frames_per_state,
            captioner=args.captioner,
            renderer=args.renderer,
            predictor=args.predictor,
            device=args.device,
            samples=args.samples,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
            readout=args.readout,
            init_from_last_frame=args.init_from_last_frame,
            fps=args.fps,
            overwrite=args.overwrite,
            on_unknown=args.on_unknown,
        )
        print(summary(result))
    except (RolloutError, PresetError, VideoError, CheckpointError, ValueError, OSError) as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug or a failure nobody foresaw: one line, not a traceback
        if args.debug:
            raise
        print(
            f"error: unexpected failure ({type(err).__name__}: {err}); rerun with --debug for the traceback",
            file=sys.stderr,
        )
        return 1
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())

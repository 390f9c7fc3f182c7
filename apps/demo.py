"""Gradio demo of the video rollout: upload a clip, see its captions, the predicted sentences and their frames.

    python -m apps.demo [--port 7860] [--host 127.0.0.1] [--preset auto|hub|offline]
                        [--captioner X --renderer Y --predictor Z] [--device D] [--concurrency 1]
                        [--max-file-mb 200] [--max-minutes 10]

`build_demo(defaults)` returns the `gr.Blocks` app (tests build it with tiny local models) and
`launch_demo(demo, defaults, ...)` serves it with the upload limit. Every request runs `run_rollout`
in its own folder under a temporary root, so two people never see each other's files; the folder is
offered as a zip. Rollouts go through Gradio's queue, `concurrency` at a time (default 1).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import gradio as gr

from encoders.frames import VideoError, VideoInfo, probe_video
from pipeline.presets import COMPONENTS, PROJECT_ROOT, PresetError, available_presets, choose_preset
from pipeline.rollout import MAX_SEED, RolloutError, RolloutResult, run_rollout
from world_model.models.checkpoint import CheckpointError

logger = logging.getLogger(__name__)

MAX_STEPS = 10
MAX_FILE_MB = 200  # uploads larger than this are refused (by Gradio before the upload, and by us after)
MAX_DURATION_S = 600.0  # clips longer than this are refused before any model work
MAX_FRAMES = 32
RUN_MAX_AGE_S = 2 * 3600  # request folders older than this are deleted when a new request starts
EXAMPLES_DIR = PROJECT_ROOT / "examples"
CUSTOM = "custom"  # the preset choice meaning "the models named on the command line"
EMPTY_MESSAGE = "Upload a clip or pick an example first."
FAILED_MESSAGE = "**The rollout failed**: the error box (top right) says why. Nothing was kept from this run."
READY_MESSAGE = "Upload a clip (or pick an example) and press **Run rollout**."
KNOWN_ERRORS = (RolloutError, PresetError, VideoError, CheckpointError, ValueError, OSError)


def default_temp_root() -> Path:
    return Path(tempfile.gettempdir()) / "world-model-demo"


def overrides(defaults: dict) -> dict[str, str]:
    """The components named on the command line (hub id or folder)."""
    return {c: str(defaults[c]) for c in COMPONENTS if defaults.get(c)}


def preset_choices(defaults: dict) -> list[str]:
    named = overrides(defaults)
    return ([CUSTOM] if len(named) == len(COMPONENTS) else []) + available_presets()


def example_clips(defaults: dict) -> list[Path]:
    folder = Path(defaults.get("examples_dir") or EXAMPLES_DIR)
    return sorted(folder.glob("*.mp4")) if folder.is_dir() else []


def fail(message: str) -> gr.Error:
    """A message for the person at the browser: shown until closed, no traceback in the server log."""
    return gr.Error(message, duration=None, print_exception=False)


def md_escape(text: str) -> str:
    """Text shown literally inside Markdown (captions and sentences come from models)."""
    return re.sub(r"([\\`*_{}\[\]<>()#+\-!|~])", r"\\\1", text)


def check_clip(video: str | Path | None, defaults: dict) -> tuple[Path, VideoInfo]:
    """The upload as a path and its stream properties, or gr.Error saying why it cannot be used (missing,
    too big, too long, not a video)."""
    if video is None or (isinstance(video, str) and not video.strip()):
        raise fail(EMPTY_MESSAGE)
    path = Path(video)
    name = path.name
    max_mb = float(defaults.get("max_file_mb", MAX_FILE_MB))
    try:
        size = path.stat().st_size
    except OSError:
        raise fail(f"The upload {name} is no longer on the server; upload it again.") from None
    if size > max_mb * 1024 * 1024:
        raise fail(
            f"{name} is {size / 1024 / 1024:.1f} MB; the limit is {max_mb:g} MB. "
            "Trim or re-encode the clip and upload it again."
        )
    try:
        info = probe_video(path)
    except VideoError as err:
        raise fail(readable(err, path)) from None
    max_s = float(defaults.get("max_duration_s", MAX_DURATION_S))
    if info.duration > max_s:
        raise fail(
            f"{name} is {format_duration(info.duration)} long; the limit is {format_duration(max_s)}. "
            "Trim the clip and upload it again."
        )
    return path, info


def describe_clip(path: Path, info: VideoInfo) -> str:
    return f"{md_escape(path.name)}: {format_duration(info.duration)}, {info.width}×{info.height}, {info.fps:g} fps"


def on_upload(video: str | None, defaults: dict) -> str:
    """The status line right after an upload: the clip's properties, or why it cannot be used."""
    if video is None:
        return READY_MESSAGE
    try:
        return f"Clip {describe_clip(*check_clip(video, defaults))}. Press **Run rollout**."
    except gr.Error as err:
        return f"**Cannot use this clip:** {md_escape(err.message)}"


def on_check(video: str | None, steps: float, defaults: dict, seed: float = 0) -> tuple[str, str, float]:
    """The quick first step of a run: refuse a bad request at once; else the status, an empty out-of-world
    banner and the time of the click (the rollout may then wait in the queue, and its reported time counts that)."""
    if video is None:
        raise fail(EMPTY_MESSAGE)
    check_steps(steps)
    check_seed(seed)
    return f"**Running** on {describe_clip(*check_clip(video, defaults))} …", "", time.time()


def check_steps(steps) -> int:
    try:
        steps_int = int(steps)
    except (TypeError, ValueError):
        raise fail(f"Steps must be a whole number from 1 to {MAX_STEPS}; got {steps!r}.") from None
    if steps_int != steps or not 1 <= steps_int <= MAX_STEPS:
        raise fail(f"Steps must be a whole number from 1 to {MAX_STEPS}; got {steps}.")
    return steps_int


def check_seed(seed) -> int:
    try:
        seed_int = int(seed or 0)
    except (TypeError, ValueError, OverflowError):
        raise fail(f"The seed must be a whole number from 0 to {MAX_SEED}; got {seed!r}.") from None
    if seed_int != (seed or 0) or not 0 <= seed_int <= MAX_SEED:
        raise fail(f"The seed must be a whole number from 0 to {MAX_SEED}; got {seed:g}.")
    return seed_int


def format_duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f"{seconds:.1f} s"
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def readable(err: BaseException, video: Path | None = None) -> str:
    """The error's message with the server's upload path shortened to the file name."""
    message = str(err) or type(err).__name__
    if video is not None:
        message = message.replace(str(video), video.name)
    return message


def new_request_dir(root: Path) -> Path:
    """A fresh folder for one request; old ones (from earlier requests) are pruned first."""
    root.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - RUN_MAX_AGE_S
    for old in root.iterdir():
        try:
            if old.is_dir() and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return Path(tempfile.mkdtemp(dir=root, prefix=time.strftime("%Y%m%d-%H%M%S-")))


def safe_stem(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", path.stem).strip("_")
    return stem[:40] or "clip"


def handle_run(
    video: str | Path | None,
    steps: float = 3,
    interval: float = 1.0,
    preset: str = "auto",
    seed: float = 0,
    temperature: float = 0.0,
    samples: float = 1,
    *,
    defaults: dict | None = None,
    progress: Callable[[float, str], None] | None = None,
    clicked_at: float | None = None,
) -> tuple:
    """One request: check the inputs, run the rollout in a new folder, and return the outputs
    (observed gallery, captions and predicted sentences, rendered gallery, video, zip, status, out-of-world
    banner). `clicked_at` (time.time() of the click) makes the reported time include the wait in the queue.
    Raises gr.Error with a readable message for anything that goes wrong."""
    defaults = defaults or {}
    if video is None:
        raise fail(EMPTY_MESSAGE)
    steps_int = check_steps(steps)
    seed_int = check_seed(seed)
    if not interval or interval <= 0:
        raise fail(f"The sampling interval must be a positive number of seconds; got {interval}.")
    if samples is None or samples != samples or int(samples) < 1:
        raise fail(f"Samples must be at least 1; got {samples}.")
    path, _ = check_clip(video, defaults)

    named = overrides(defaults)
    if preset == CUSTOM:
        if len(named) < len(COMPONENTS):
            raise fail("The 'custom' preset needs --captioner, --renderer and --predictor on the command line.")
        models = named
    elif len(named) == len(COMPONENTS):
        models = {}  # a named preset chosen instead of the command-line models
    else:
        models = named  # a partial override on top of the preset

    request = new_request_dir(Path(defaults.get("temp_root") or default_temp_root()))
    run_dir = request / f"{safe_stem(path)}-rollout"
    report = progress or (lambda fraction, message: None)
    started = time.time()
    waited = max(started - clicked_at, 0.0) if clicked_at else 0.0
    try:
        result = run_rollout(
            path,
            steps=steps_int,
            out_dir=run_dir,
            preset=preset if preset != CUSTOM else "auto",
            interval=float(interval),
            max_frames=int(defaults.get("max_frames", MAX_FRAMES)),
            device=defaults.get("device"),
            samples=int(samples),
            temperature=float(temperature or 0.0),
            seed=seed_int,
            progress=report,
            **models,
        )
        report(1.0, "packing the run folder")
        archive = Path(shutil.make_archive(str(run_dir), "zip", root_dir=request, base_dir=run_dir.name))
    except KNOWN_ERRORS as err:
        shutil.rmtree(request, ignore_errors=True)
        raise fail(readable(err, path)) from None
    except Exception as err:  # a bug: keep the traceback in the server log, show a sentence
        logger.exception("rollout failed")
        shutil.rmtree(request, ignore_errors=True)
        raise fail(
            f"The rollout failed unexpectedly ({type(err).__name__}: {readable(err, path)}). "
            "The server log has the details."
        ) from None
    return outputs(result, archive, request.name, time.time() - started, int(samples), float(temperature or 0), waited)


def unknown_banner(record: dict) -> str:
    """A banner when frames are outside the captioner's world (`encoders.grounding`), else ""."""
    grounding = record.get("grounding") or {}
    if not grounding.get("flagged"):
        return ""
    where = "This clip is" if grounding["verdict"] == "outside" else "Part of this clip is"
    return (
        f"## ⚠️ {where} outside the models' world\n"
        f"{grounding['flagged']} of {grounding['frames']} frames look like nothing the captioner "
        f"(`{md_escape(Path(record['models']['captioner']).name)}`) was trained on, so their captions, the "
        "predicted sentences and the rendered frames describe that world, not this clip. The offline pack knows "
        "only its synthetic ball, box and elevator; real footage needs the hub models."
    )


def outputs(
    result: RolloutResult,
    archive: Path,
    request_id: str,
    seconds: float,
    samples: int,
    temperature: float,
    waited: float = 0.0,
) -> tuple:
    record, run_dir = result.record, result.run_dir
    observed = [(str(run_dir / o["image"]), f"t={o['timestamp_s']:.1f}s: {o['caption']}") for o in record["observed"]]
    predictions = record["predictions"]
    several = len(predictions) > 1
    rendered = [
        (str(run_dir / image), f"{f'sample {k + 1}, ' if several else ''}step {s + 1}: {sentence}")
        for k, p in enumerate(predictions)
        for s, (image, sentence) in enumerate(zip(p["images"], p["sentences"]))
    ]
    lines = ["### Captions", "", "| time | caption | in the captioner's world |", "|---:|---|:---:|"]
    lines += [
        f"| {o['timestamp_s']:.1f} s | {md_escape(o['caption']) or '*(empty)*'} | "
        f"{ {True: 'yes', False: '**no**', None: '?'}[(o.get('grounding') or {}).get('grounded')] } |"
        for o in record["observed"]
    ]
    lines += ["", "### Predicted sentences"]
    for k, p in enumerate(predictions):
        if several:
            lines.append(f"**Sample {k + 1}**")
        lines += ["", "| step | predicted sentence |", "|---:|---|"]
        lines += [f"| {s + 1} | {md_escape(sentence) or '*(empty)*'} |" for s, sentence in enumerate(p["sentences"])]
        lines.append("")
    took = (
        f"{waited + seconds:.1f} s ({waited:.1f} s waiting in the queue, {seconds:.1f} s running)"
        if waited >= 0.5
        else f"{seconds:.1f} s"
    )
    status = [
        f"**Done** in {took}: {len(record['observed'])} frames captioned, "
        f"{len(predictions[0]['sentences'])} steps predicted.",
        "",
        f"- Run folder: `{request_id}/{run_dir.name}`",
        f"- Preset: **{md_escape(record['preset'])}** ({md_escape(record['preset_reason'])})",
        f"- Readout: {md_escape(record.get('sampling', {}).get('readout', 'unknown'))}",
        f"- Caption words outside the predictor's vocabulary: {record['oov']['rate']:.0%}",
    ]
    if samples > 1 and temperature <= 0:
        status.append("- Temperature 0 is greedy, so one sample was made; raise the temperature for alternatives.")
    status += [f"- Warning: {md_escape(w)}" for w in record["warnings"]]
    video = str(run_dir / "rollout.mp4")
    return observed, "\n".join(lines), rendered, video, str(archive), "\n".join(status), unknown_banner(record)


def build_demo(defaults: dict | None = None) -> gr.Blocks:
    """The Blocks app. `defaults` keys (all optional): preset, captioner, renderer, predictor, device,
    temp_root, examples_dir, concurrency (default 1), queue_size, max_file_mb, max_duration_s, max_frames,
    steps, interval, seed."""
    defaults = dict(defaults or {})
    choices = preset_choices(defaults)
    preset = defaults.get("preset") or (CUSTOM if CUSTOM in choices else "auto")
    if preset not in choices:
        raise PresetError(f"unknown preset {preset!r}; choose one of: {', '.join(choices)}")
    max_mb = float(defaults.get("max_file_mb", MAX_FILE_MB))
    max_s = float(defaults.get("max_duration_s", MAX_DURATION_S))

    with gr.Blocks(title="Semantic world model", analytics_enabled=False, delete_cache=(3600, RUN_MAX_AGE_S)) as demo:
        gr.Markdown(
            "# Semantic world model\n"
            "A clip is sampled into frames, each frame is captioned, the **4-tensor predictor** continues the "
            "captions with predicted sentences, and each predicted sentence is rendered back into a frame. "
            f"Clips up to {max_mb:g} MB and {format_duration(max_s)}."
        )
        with gr.Row():
            with gr.Column(scale=1):
                # gr.File, not gr.Video: the pipeline reads any container FFmpeg knows, while gr.Video's
                # player flags every clip the browser cannot play (MPEG-4 Part 2, HEVC, ...) as an error.
                clip = gr.File(label="Clip (MP4, MOV, MKV, WebM, AVI, ...)", elem_id="clip", height=120)
                examples = example_clips(defaults)
                if examples:
                    gr.Examples([[str(p)] for p in examples], inputs=[clip], label="Bundled examples")
                steps = gr.Slider(
                    1, MAX_STEPS, value=int(defaults.get("steps", 3)), step=1, label="Predicted steps", elem_id="steps"
                )
                interval = gr.Slider(
                    0.25,
                    10,
                    value=float(defaults.get("interval", 1.0)),
                    step=0.25,
                    label="Sampling interval (seconds between frames)",
                    elem_id="interval",
                )
                preset_box = gr.Dropdown(
                    choices,
                    value=preset,
                    label="Model preset",
                    elem_id="preset",
                    info="custom = the models named on the command line"
                    if CUSTOM in choices
                    else "auto = hub models when cached or reachable, else the offline pack",
                )
                seed = gr.Number(value=int(defaults.get("seed", 0)), precision=0, label="Seed", elem_id="seed")
                with gr.Accordion("Sampling (optional)", open=False):
                    temperature = gr.Slider(
                        0, 2, value=0, step=0.1, label="Temperature (0 = greedy)", elem_id="temperature"
                    )
                    samples = gr.Slider(
                        1, 4, value=1, step=1, label="Alternative futures (needs temperature > 0)", elem_id="samples"
                    )
                run = gr.Button("Run rollout", variant="primary", elem_id="run")
            with gr.Column(scale=2):
                banner = gr.Markdown(elem_id="unknown_banner")
                status = gr.Markdown(READY_MESSAGE, elem_id="status")
                observed = gr.Gallery(
                    label="Sampled frames and their captions",
                    columns=4,
                    height="auto",
                    object_fit="contain",
                    elem_id="observed",
                )
                predicted = gr.Markdown(elem_id="predicted")
                rendered = gr.Gallery(
                    label="Rendered predicted frames",
                    columns=4,
                    height="auto",
                    object_fit="contain",
                    elem_id="rendered",
                )
                with gr.Row():
                    video = gr.Video(
                        label="Rollout video (observed, then predicted)",
                        elem_id="rollout_video",
                        interactive=False,
                        height=260,
                    )
                    archive = gr.File(label="Run folder (zip with rollout.json)", elem_id="run_zip", interactive=False)

        clicked = gr.State()

        def on_run(
            video_path,
            steps_value,
            interval_value,
            preset_value,
            seed_value,
            temperature_value,
            samples_value,
            clicked_at,
            progress=gr.Progress(),
        ):
            return handle_run(
                video_path,
                steps_value,
                interval_value,
                preset_value,
                seed_value,
                temperature_value,
                samples_value,
                defaults=defaults,
                clicked_at=clicked_at,
                progress=lambda fraction, message: progress(fraction, desc=message),
            )

        clip.change(
            lambda path: on_upload(path, defaults),
            [clip],
            [status],
            queue=False,
            show_progress="hidden",
            api_visibility="private",
        )
        # A cheap check first (errors then mark only the status), the rollout only when it passes.
        run.click(
            lambda path, n, s: on_check(path, n, defaults, s),
            [clip, steps, seed],
            [status, banner, clicked],
            concurrency_limit=None,
            show_progress="hidden",
            api_visibility="private",
        ).success(
            on_run,
            [clip, steps, interval, preset_box, seed, temperature, samples, clicked],
            [observed, predicted, rendered, video, archive, status, banner],
            concurrency_limit=int(defaults.get("concurrency", 1)),
            concurrency_id="rollout",
            api_name="rollout",
        ).failure(lambda: FAILED_MESSAGE, None, [status], queue=False, show_progress="hidden", api_visibility="private")
    demo.queue(max_size=int(defaults.get("queue_size", 16)))
    return demo


def launch_demo(
    demo: gr.Blocks, defaults: dict | None = None, host: str = "127.0.0.1", port: int | None = None, **kwargs
):
    """Serve `demo` with Gradio's own upload limit (`max_file_mb`).

    Gradio only hands out files from the working directory, the system temp folder and `allowed_paths`:
    the examples folder is added, and a `temp_root` outside the first two (its run folders keep random names).
    """
    defaults = defaults or {}
    max_bytes = int(float(defaults.get("max_file_mb", MAX_FILE_MB)) * 1024 * 1024)
    allowed = []
    examples = Path(defaults.get("examples_dir") or EXAMPLES_DIR)
    if examples.is_dir():
        allowed.append(str(examples.resolve()))
    root = Path(defaults.get("temp_root") or default_temp_root()).resolve()
    if not any(root.is_relative_to(Path(p).resolve()) for p in (tempfile.gettempdir(), os.getcwd())):
        allowed.append(str(root))
    return demo.launch(
        server_name=host, server_port=port, max_file_size=max_bytes, allowed_paths=allowed or None, **kwargs
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m apps.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1, this machine only)"
    )
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument(
        "--preset",
        default=None,
        help=f"initial preset: {', '.join(available_presets())} (default auto, or custom when "
        "all three models are named)",
    )
    parser.add_argument("--captioner", help="image-to-text model: hub id or folder")
    parser.add_argument("--renderer", help="text-to-image model: hub id or folder")
    parser.add_argument("--predictor", help="4-tensor checkpoint folder")
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--concurrency", type=int, default=1, help="rollouts run at the same time (default 1)")
    parser.add_argument("--queue-size", type=int, default=16, help="requests waiting at most (default 16)")
    parser.add_argument("--max-file-mb", type=float, default=MAX_FILE_MB, help=f"upload limit (default {MAX_FILE_MB})")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=MAX_DURATION_S / 60,
        help=f"clip length limit (default {MAX_DURATION_S / 60:g})",
    )
    parser.add_argument(
        "--temp-root", type=Path, help=f"folder for the per-request run folders (default {default_temp_root()})"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.concurrency < 1:
        raise SystemExit("--concurrency must be at least 1")
    defaults = {
        "preset": args.preset,
        "captioner": args.captioner,
        "renderer": args.renderer,
        "predictor": args.predictor,
        "device": args.device,
        "concurrency": args.concurrency,
        "queue_size": args.queue_size,
        "max_file_mb": args.max_file_mb,
        "max_duration_s": args.max_minutes * 60,
        "temp_root": str(args.temp_root) if args.temp_root else None,
    }
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        demo = build_demo(defaults)
    except PresetError as err:
        raise SystemExit(f"error: {err}") from None
    if len(overrides(defaults)) < len(COMPONENTS):
        try:  # say now which models requests will use, or why none would work
            chosen, reason = choose_preset(defaults["preset"] or "auto")
            print(f"preset: {chosen['name']} ({reason})")
        except PresetError as err:
            print(f"warning: {err}")
    launch_demo(demo, defaults, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

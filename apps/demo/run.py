"""One request of the demo: its own folder, the rollout, and the outputs the page shows."""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from apps.demo.checks import EMPTY_MESSAGE, check_clip, check_seed, check_steps, fail, md_escape, readable
from apps.demo.config import CACHE_PREFIX, COMPONENTS, CUSTOM, RUN_MAX_AGE_S, DemoConfig
from apps.demo.estimate import RunTimes
from apps.demo.explain_view import HEADER, LEGEND, predicted_rows
from encoders.frames import VideoError
from pipeline.config import FrameSampling, ModelChoice
from pipeline.presets import PresetError
from pipeline.record import RolloutRecord
from pipeline.rollout import RolloutError, RolloutResult, run_rollout
from world_model.models.checkpoint import CheckpointError
from world_model.models.generation_config import GenerationConfig

logger = logging.getLogger(__name__)
KNOWN_ERRORS = (RolloutError, PresetError, VideoError, CheckpointError, ValueError, OSError)
UNFINISHED: set[Path] = set()  # request folders whose rollout is still running


def remove_unfinished() -> list[Path]:
    """Delete the folders of requests still running (the server is stopping); returns them."""
    folders = sorted(UNFINISHED)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    UNFINISHED.difference_update(folders)
    return folders


def new_request_dir(root: Path) -> Path:
    """A fresh folder for one request; old ones (from earlier requests) are pruned first."""
    root.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - RUN_MAX_AGE_S
    for old in root.iterdir():
        if old.name.startswith(CACHE_PREFIX):  # a server's Gradio cache (`apps.demo.app.own_gradio_cache`)
            continue
        try:
            if old.is_dir() and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return Path(tempfile.mkdtemp(dir=root, prefix=time.strftime("%Y%m%d-%H%M%S-")))


ZIP_LEAVES_OUT = ("rollout.gif",)  # the GIF repeats rollout.mp4, several times its size (11 MB for an 8 s clip)


def zip_run(run_dir: Path) -> Path:
    """RUN_DIR.zip beside the run folder: every file of it under RUN_DIR/ but `ZIP_LEAVES_OUT`, already compressed
    media stored as they are."""
    import zipfile

    archive = run_dir.with_suffix(".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(run_dir.rglob("*")):
            if path.is_file() and path.name not in ZIP_LEAVES_OUT:
                stored = path.suffix in (".mp4", ".png", ".gif", ".jpg")
                zf.write(path, path.relative_to(run_dir.parent), zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return archive


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
    config: DemoConfig | None = None,
    progress: Callable[[float, str], None] | None = None,
    clicked_at: float | None = None,
    times: RunTimes | None = None,
) -> tuple:
    """One request: check the inputs, run the rollout in a new folder, and return the outputs
    (observed gallery, captions and predicted sentences, rendered gallery, video, zip, status, out-of-world
    banner). `clicked_at` (time.time() of the click) makes the reported time include the wait in the queue; `times`
    learns the run's rates for the next request's estimate.
    Raises gr.Error with a readable message for anything that goes wrong."""
    config = config or DemoConfig()
    if video is None:
        raise fail(EMPTY_MESSAGE)
    steps_int = check_steps(steps)
    seed_int = check_seed(seed)
    if not interval or interval <= 0:
        raise fail(f"The sampling interval must be a positive number of seconds; got {interval}.")
    if samples is None or samples != samples or int(samples) < 1:
        raise fail(f"Samples must be at least 1; got {samples}.")
    path, _ = check_clip(video, config)

    named = config.overrides()
    if preset == CUSTOM:
        if len(named) < len(COMPONENTS):
            raise fail("The 'custom' preset needs --captioner, --renderer and --predictor on the command line.")
        models = named
    elif len(named) == len(COMPONENTS):
        models = {}  # a named preset chosen instead of the command-line models
    else:
        models = named  # a partial override on top of the preset

    request = new_request_dir(config.temp_root)
    UNFINISHED.add(request)
    run_dir = request / f"{safe_stem(path)}-rollout"
    report = progress or (lambda fraction, message: None)
    started = time.time()
    waited = max(started - clicked_at, 0.0) if clicked_at else 0.0
    try:
        result = run_rollout(
            path,
            steps_int,
            models=ModelChoice(preset=preset if preset != CUSTOM else "auto", device=config.device, **models),
            frames=FrameSampling(interval=float(interval), max_frames=config.max_frames),
            generation=GenerationConfig(samples=int(samples), temperature=float(temperature or 0.0), seed=seed_int),
            output=run_dir,
            progress=report,
        )
        report(1.0, "packing the run folder")
        archive = zip_run(run_dir)
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
    finally:
        UNFINISHED.discard(request)
    seconds = time.time() - started
    if times is not None:
        times.learn(result.rollout, seconds, preset)
    return outputs(result, archive, request.name, seconds, int(samples), float(temperature or 0), waited)


def unknown_banner(record: RolloutRecord) -> str:
    """A banner when frames are outside the captioner's world (`encoders.grounding`), else ""."""
    grounding = record.grounding
    if not grounding.flagged:
        return ""
    where = "This clip is" if grounding.verdict == "outside" else "Part of this clip is"
    return (
        f"## ⚠️ {where} outside the models' world\n"
        f"{grounding.flagged} of {grounding.frames} frames look like nothing the captioner "
        f"(`{md_escape(Path(record.models.captioner).name)}`) was trained on, so their captions, the "
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
    record, run_dir = result.rollout, result.run_dir
    observed = [(str(run_dir / o.image), f"t={o.timestamp_s:.1f}s: {o.caption}") for o in record.observed]
    predictions = record.predictions
    several = len(predictions) > 1
    rendered = [
        (str(run_dir / image), f"{f'sample {k + 1}, ' if several else ''}step {s + 1}: {sentence}")
        for k, p in enumerate(predictions)
        for s, (image, sentence) in enumerate(zip(p.images, p.sentences))
    ]
    lines = ["### Captions", "", "| time | caption | in the captioner's world |", "|---:|---|:---:|"]
    lines += [
        f"| {o.timestamp_s:.1f} s | {md_escape(o.caption) or '*(empty)*'} | "
        f"{ {True: 'yes', False: '**no**', None: '?'}[o.grounding.grounded if o.grounding else None] } |"
        for o in record.observed
    ]
    lines += ["", "### Predicted sentences"]
    for k, p in enumerate(predictions):
        if several:
            lines.append(f"**Sample {k + 1}**")
        lines += ["", *HEADER, *predicted_rows(p, record.observed), ""]
    lines += [LEGEND, ""]
    took = (
        f"{waited + seconds:.1f} s ({waited:.1f} s waiting in the queue, {seconds:.1f} s running)"
        if waited >= 0.5
        else f"{seconds:.1f} s"
    )
    status = [
        f"**Done** in {took}: {len(record.observed)} frames captioned, {len(predictions[0].sentences)} steps predicted.",
        "",
        f"- Run folder: `{request_id}/{run_dir.name}`",
        f"- Preset: **{md_escape(record.preset)}** ({md_escape(record.preset_reason)})",
        f"- Predictor: `{md_escape(Path(record.models.predictor).name)}`, readout {md_escape(record.sampling.readout)}",
        f"- Caption words outside the predictor's vocabulary: {record.oov.rate:.0%}",
    ]
    if samples > 1 and temperature <= 0:
        status.append("- Temperature 0 is greedy, so one sample was made; raise the temperature for alternatives.")
    distinct = len({tuple(p.sentences) for p in predictions})
    if several and distinct < len(predictions):
        status.append(
            f"- The {len(predictions)} samples give {distinct} different future(s): at temperature {temperature:g} "
            "the predictor is sure enough to draw the same sentences again; raise the temperature for more variety."
        )
    status += [f"- Warning: {md_escape(w)}" for w in record.warnings]
    video = str(run_dir / "rollout.mp4")
    return observed, "\n".join(lines), rendered, video, str(archive), "\n".join(status), unknown_banner(record)

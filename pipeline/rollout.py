"""The video rollout: clip -> captions -> 4-tensor rollout -> rendered frames.

    python -m pipeline.rollout video.mp4 --steps 5 [--preset auto|hub|offline] [--out DIR]
                                [--interval S | --frames K] [--device D] [--samples K --temperature X --seed S]
                                [--readout auto|sentences|bank|tokens] [--on-unknown warn|stop] [--verbose]

`run_rollout(video, steps, models, frames, generation, output)` is the Python API that the command and the demo
both call; its settings are the dataclasses of `pipeline.config` and `world_model.models.generation_config.GenerationConfig`,
and the command's flags are their fields. A run folder holds the observed and rendered frames, `rollout.json`
(`pipeline.record.RolloutRecord`), `storyboard.png`, `rollout.mp4` and `rollout.gif`. It is written beside its
destination and renamed into place only when complete (a stop signal, Ctrl-C, SIGTERM or SIGHUP, removes it).
Every caption carries a grounding score (`encoders.grounding`) and the clip a verdict; frames outside the
captioner's world are warned about, or refused with `--on-unknown stop`.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import argparse
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from encoders.frames import check_file_name, sample_frames
from encoders.grounding import clip_verdict
from pipeline.components import load_captioner, load_predictor, load_readout, load_renderer
from pipeline.config import FrameSampling, ModelChoice, OutputConfig, Plan, make_plan
from pipeline.presets import available_presets
from pipeline.record import ClipInfo, GroundingVerdict, Models, OutOfVocabulary, Prediction, RolloutRecord, Window
from pipeline.run_folder import run_folder
from pipeline.run_outputs import RENDERED, observed_frames, sampling_record, state_spans, window_warnings, write_outputs
from world_model.generation.explain import describe_slice, explain_lines, probability_text, step_records
from world_model.generation.predict import (  # one rule for the text and the video commands
    MAX_SAMPLES,  # noqa: F401  (callers read both caps from here)
    MAX_STEPS,
    check_horizon,
)
from world_model.models.generation_config import GenerationConfig
from world_model.text.windows import CaptionState, CaptionWindow, caption_states, caption_window, decode_states
from world_model.utils.cli import check_device
from world_model.utils.files import replace_dir
from world_model.utils.flags import SettingsParser, add_verbose, settings_main
from world_model.utils.timing import timed

Progress = Callable[[float, str], None]


class RolloutError(ValueError):
    """A run cannot go ahead or finish; the message says why and nothing is left half-written."""


@dataclass
class RolloutResult:
    """What a run produced: its folder, its `rollout` (rollout.json, typed) and the frames as arrays."""

    run_dir: Path
    rollout: RolloutRecord
    observed: list[np.ndarray] = field(repr=False)  # (H, W, 3) uint8 sampled frames
    rendered: list[list[np.ndarray]] = field(repr=False)  # [sample][step] (H, W, 3) uint8

    @property
    def record(self) -> dict:
        """rollout.json's JSON object, for readers by key."""
        return self.rollout.to_json()

    @property
    def predicted_sentences(self) -> list[list[str]]:
        return [p.sentences for p in self.rollout.predictions]


def run_rollout(
    video: str | Path,
    steps: int = 5,
    models: ModelChoice | str = "auto",
    frames: FrameSampling | None = None,
    generation: GenerationConfig | None = None,
    output: OutputConfig | str | Path | None = None,
    progress: Progress | None = None,
) -> RolloutResult:
    """Read a clip, predict its next `steps` states and render them.

    Args:
        video: the clip (any container OpenCV/FFmpeg reads).
        steps: predicted states (one per sampling interval of the future), 1 to `MAX_STEPS`.
        models: a preset name (`auto`: hub models when cached or reachable, otherwise the offline pack; `hub`;
            `offline`) or a `ModelChoice` (preset, components overridden with hub ids or folders, device).
        frames: which frames are captioned (`FrameSampling`; default one per second, at most 32; strips of the
            preset's `sampling.frames_per_state` frames, else single frames).
        generation: how the next sentences are drawn (`GenerationConfig`: greedy by default; `seed` also seeds
            the renderer; `readout` auto picks each state from the predictor's known sentences, else its
            sentence bank, else reads tokens off freely).
        output: the run folder, or an `OutputConfig` (folder, overwrite, fps of the video, image-to-image from
            the last observed frame, `on_unknown` warn or stop). Default folder `runs/<clip>-<time>` (with `-2`, `-3`
            ... when another run took that name); a folder that holds files is refused unless `overwrite`, and
            one another run is writing is refused.
        progress: optional callback `progress(fraction, message)` (the demo passes gr.Progress).
    """
    models = ModelChoice(preset=models) if isinstance(models, str) else models
    frames = frames or FrameSampling()
    generation = generation or GenerationConfig()
    output = output if isinstance(output, OutputConfig) else OutputConfig(out_dir=output)
    report = progress or (lambda fraction, message: None)
    check_horizon(steps, generation.samples, RolloutError)
    check_device(models.device)
    plan = make_plan(models, frames)
    generation = plan.preset.generation_for(generation)
    video = Path(video)
    check_file_name(video)  # before a run folder is named after it
    folders = {f"{name} folder": path for name, path in models.overrides().items() if Path(path).is_dir()}
    with run_folder(output.out_dir, output.overwrite, video.stem, folders) as (out_dir, staging):
        record, observed, rendered = run_in(staging, video, steps, plan, generation, output, report)
        replace_dir(staging, out_dir)
    report(1.0, "done")
    return RolloutResult(out_dir, record, observed, rendered)


def run_in(
    folder: Path,
    video: Path,
    steps: int,
    plan: Plan,
    generation: GenerationConfig,
    output: OutputConfig,
    report: Progress,
) -> tuple[RolloutRecord, list[np.ndarray], list[list[np.ndarray]]]:
    """The model work of one run, written into `folder`: (rollout.json's record, observed frames, rendered frames)."""
    timings: dict[str, float] = {}
    f, p = plan.frames, plan.preset
    with timed(timings, "sample_frames"):
        report(0.0, "sampling frames")
        clip = sample_frames(
            video,
            interval=f.seconds,
            num_frames=f.num_frames,
            max_frames=f.max_frames,
            frames_per_state=f.frames_per_state,
        )
    with timed(timings, "load_models"):
        report(0.15, "loading models")
        cap = load_captioner(p.captioner, plan.device, tuple(sorted(p.captioner_options.items())))
        predictor = load_predictor(p.predictor, plan.device)
        readout = load_readout(p.predictor, plan.device, generation.readout, generation.coherence)
        ren = load_renderer(p.renderer, plan.device, tuple(sorted(p.renderer_options.items())))
    with timed(timings, "caption"):
        report(0.3, f"captioning {len(clip)} frames")
        images = [frame.image for frame in clip]
        captions, groundings = caption(cap, images, report)
        verdict = clip_verdict(groundings)
        unknown = unknown_warning(verdict, groundings, p.captioner)
        if unknown and output.on_unknown == "stop":
            raise RolloutError(f"{unknown} (--on-unknown stop)")
    with timed(timings, "predict"):
        report(0.5, "predicting")
        c = predictor.model.config
        states = caption_states(captions, f.merge_repeats)  # repeated captions are one state, if merged
        window = caption_window([s.caption for s in states], predictor.vocab, c.n_states, c.n_tokens)
        predictions = predict(predictor, readout, window, states, steps, generation, plan.device)
    with timed(timings, "render"):
        init = images[-1] if output.init_from_last_frame or ren.continues else None
        rendered = render_states(ren, [q.sentences for q in predictions], generation.seed, init, report)
    with timed(timings, "write_outputs"):
        report(0.9, "writing outputs")
        info = clip.info
        record = RolloutRecord(
            video=str(video),
            clip=ClipInfo(info.fps, info.duration, info.width, info.height, info.rotation),
            preset=p.name,
            preset_reason=plan.reason,
            models=Models(p.captioner, p.renderer, p.predictor, plan.device),
            sampling=sampling_record(plan, steps, generation, readout.name, output),
            observed=observed_frames(clip, captions, groundings),
            grounding=GroundingVerdict(**verdict),
            states=state_spans(states, clip),
            window=Window(window.states, window.token_ids[0].tolist()),
            oov=OutOfVocabulary(window.tokens, window.unknown, round(window.oov_rate, 4), window.unknown_words),
            predictions=predictions,
            warnings=[unknown] * bool(unknown) + list(clip.warnings) + window_warnings(window),
            timings_s={},  # below, once writing is timed too
        )
        write_outputs(folder, record, images, rendered, output.fps)
    record.timings_s = {k: round(v, 3) for k, v in timings.items()}
    record.write(folder / "rollout.json")
    return record, images, rendered


def caption(cap, images: list[np.ndarray], report: Progress) -> tuple[list[str], list]:
    """One caption per (H, W, 3) image, and its grounding (None from a captioner that gives no score); a
    progress bar on a terminal's stderr and `report` after every batch."""
    if not hasattr(cap, "caption_and_ground"):
        return cap(images), [None] * len(images)

    def on_batch(done: int, total: int) -> None:
        report(0.3 + 0.2 * done / total, f"captioned {done} of {total} frames")

    bar = "captioning" if sys.stderr.isatty() else None  # a bar on a terminal, as rendering shows
    return cap.caption_and_ground(images, progress=bar, on_batch=on_batch)


def predict(
    predictor,
    readout,
    window: CaptionWindow,
    states: list[CaptionState],
    steps: int,
    generation: GenerationConfig,
    device: str,
) -> list[Prediction]:
    """`generation.futures` rollouts of `steps` states from the window of the clip's distinct caption `states`,
    their explanations per step (`world_model.generation.explain`) when `generation.explanations` and the model
    can explain, else None. An observed slice's `index` in those records is the index of its state's first
    caption."""
    seen = [] if generation.explanations else None
    vocab = predictor.vocab
    futures = readout.futures(predictor.model, vocab, window.token_ids.to(device), steps, generation, seen)
    return [
        Prediction(
            sentences=decode_states(ids, vocab),
            token_ids=ids.tolist(),
            explanations=caption_indices(step_records(steps_seen, ids, window.states, len(states), vocab), states)
            if steps_seen
            else None,
            images=[RENDERED.format(k, s + 1) for s in range(steps)],
        )
        for k, (ids, steps_seen) in enumerate(zip(futures, seen or [None] * len(futures)))
    ]


def caption_indices(records: list[dict], states: list[CaptionState]) -> list[dict]:
    """Renumber the observed slices of per-step explanation `records` from state index to the index of the
    state's first caption (in place; `drew_on` is one of the `attention` entries)."""
    for record in records:
        for source in record["attention"] or []:
            if source["source"] == "observed":
                source["index"] = states[source["index"]].first
    return records


def render_states(
    ren, futures: list[list[str]], seed: int, init: np.ndarray | None, report: Progress
) -> list[list[np.ndarray]]:
    """Render each sample's sentences one state at a time (sample k with seed + k), with a progress bar
    on stderr and `report` after every state; (H, W, 3) uint8 images per [sample][step]. Each render starts from
    `init` (the last observed image, or None); a renderer that `continues` the image before it gets the sample's
    previous render instead, from its second state on."""
    total = sum(len(f) for f in futures)
    rendered, done = [], 0
    with tqdm(total=total, desc="rendering", unit="state", disable=None) as bar:
        for k, sentences in enumerate(futures):
            images = []
            for sentence in sentences:
                report(0.6 + 0.3 * done / total, f"rendering predicted state {done + 1} of {total}")
                before = images[-1] if ren.continues and images else init
                images += ren([sentence], seed=seed + k, init_images=None if before is None else [before])
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


def summary(result: RolloutResult, explain: bool = False) -> str:
    """What the command prints; with `explain`, each predicted step's probability and its
    `world_model.generation.explain.explain_lines`."""
    r = result.rollout
    lines = [f"preset: {r.preset} ({r.preset_reason})"]

    def caption_time(index: int) -> str:
        return f"caption at t={r.observed[index].timestamp_s:.1f}s"

    lines += [
        f"  t={o.timestamp_s:>6.1f}s  {o.caption}"
        + ("  [outside the captioner's world]" if o.grounding and o.grounding.grounded is False else "")
        for o in r.observed
    ]
    merged = "repeats merged" if r.sampling.merge_repeats else "repeats kept, as the preset's predictor reads them"
    lines.append(f"states: {len(r.states)} of {len(r.observed)} captions ({merged})")
    for k, p in enumerate(r.predictions):
        lines.append(f"predicted{'' if len(r.predictions) == 1 else f' (sample {k + 1})'}:")
        for s, text in enumerate(p.sentences):
            step = (p.explanations or [None] * len(p.sentences))[s]
            if explain and step:
                lines.append(f"  step {s + 1}: {text}  (p={probability_text(step['probability'])})")
                lines += explain_lines(step, lambda source: describe_slice(source, caption_time))
            else:
                lines.append(f"  step {s + 1}: {text}")
    lines.append(f"out-of-vocabulary rate: {r.oov.rate:.1%}")
    lines += [f"warning: {w}" for w in r.warnings]
    lines.append("timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in r.timings_s.items()))
    lines.append(f"wrote {result.run_dir}/ (rollout.json, storyboard.png, rollout.mp4, rollout.gif)")
    return "\n".join(lines)


def quiet_libraries() -> None:
    """Silence transformers' and diffusers' loading bars and advisory warnings, OpenCV's and FFmpeg's decoder
    messages and the frame sampler's log (its warnings reach the summary anyway). The hub's download bars
    stay: a first run's download is minutes long and must show."""
    import diffusers
    import huggingface_hub
    import transformers

    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET, read when a capture opens
    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    diffusers.logging.set_verbosity_error()
    diffusers.logging.disable_progress_bar()
    huggingface_hub.utils.enable_progress_bars()  # transformers' disable_progress_bar turns them off too
    logging.getLogger("encoders").setLevel(logging.ERROR)


@dataclass
class RolloutSteps:
    """How far the command's rollout predicts (`run_rollout`'s `steps`)."""

    steps: int = field(default=5, metadata={"help": f"predicted future states (default 5, at most {MAX_STEPS})"})


def add_clip_and_switches(parser: SettingsParser) -> None:
    """The command's arguments beside its settings: the clip, --verbose, --debug and --explain."""
    parser.add_argument("video", type=Path, help="the clip to read")
    add_verbose(parser, "libraries' loading bars and warnings on stderr; an error shows its traceback")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (as --verbose does)")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print under each predicted step its probability, the likeliest alternatives and the caption it drew on "
        "most (rollout.json holds them either way)",
    )


def main(argv: list[str] | None = None) -> int:
    """The command: exit 0 with the summary on stdout, 2 with one `error:` line for bad input or settings, 1 for an
    internal failure, 128 + n on signal n (`world_model.utils.cli.run_command`)."""
    return settings_main(
        (ModelChoice, FrameSampling, GenerationConfig, OutputConfig, RolloutSteps),
        "pipeline.rollout",
        __doc__.split("\n\n")[0] + f" Presets: {', '.join(available_presets())}.",
        rollout_command,
        argv,
        arguments=add_clip_and_switches,
        usage_on_bad_setting=False,
        on_interrupt="nothing was written",
    )


def rollout_command(
    models: ModelChoice,
    frames: FrameSampling,
    generation: GenerationConfig,
    output: OutputConfig,
    horizon: RolloutSteps,
    args: argparse.Namespace,
    command: str,
) -> None:
    """The command's work: the libraries quiet unless --verbose, one rollout of the clip, its summary."""
    if not args.verbose:
        quiet_libraries()
    print(summary(run_rollout(args.video, horizon.steps, models, frames, generation, output), args.explain))


if __name__ == "__main__":
    sys.exit(main())

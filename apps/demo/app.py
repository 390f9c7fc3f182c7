"""The demo's page (`build_demo`), its server (`launch_demo`) and its command (`main`)."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import tempfile
from pathlib import Path

import gradio as gr
import torch

from apps import demo as demo_package
from apps.demo.checks import (
    FAILED_MESSAGE,
    READY_MESSAGE,
    REFUSED,
    error_status,
    format_duration,
    on_check,
    on_upload,
)
from apps.demo.config import CACHE_PREFIX, COMPONENTS, CUSTOM, DEMO_MAX_STEPS, RUN_MAX_AGE_S, DemoConfig
from apps.demo.estimate import RunTimes
from apps.demo.quiet_inputs import quiet
from apps.demo.run import handle_run, remove_unfinished
from pipeline.presets import PresetError, choose_preset
from world_model.utils.cli import (
    Interrupted,
    UsageError,
    check_device,
    check_writable,
    handled_signals,
    one_line,
    raise_interrupted,
)
from world_model.utils.flags import SettingsParser, settings_main


def own_gradio_cache(config: DemoConfig) -> Path:
    """A Gradio cache folder of this server's own under `temp_root` (set as GRADIO_TEMP_DIR before the page's
    components are made): Gradio keeps the example clips it serves in its cache and empties it when a server
    starts or stops, so a cache shared with another demo on the machine loses that demo's examples."""
    config.temp_root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=CACHE_PREFIX, dir=config.temp_root))
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    return folder


def build_demo(config: DemoConfig | None = None) -> gr.Blocks:
    """The Blocks app serving `config` (default `DemoConfig()`): the request's controls on the left, its results on
    the right; a click first checks the request (cheap, not queued), then queues the rollout."""
    config = config or DemoConfig()
    choices = config.preset_choices()
    preset = config.preset or (CUSTOM if CUSTOM in choices else "auto")
    if preset not in choices:
        raise PresetError(f"unknown preset {preset!r}; choose one of: {', '.join(choices)}")
    own_gradio_cache(config)
    with gr.Blocks(title="Semantic world model", analytics_enabled=False, delete_cache=(3600, RUN_MAX_AGE_S)) as demo:
        gr.Markdown(
            "# Semantic world model\n"
            "A clip is sampled into frames, each frame is captioned, the **4-tensor predictor** continues the "
            "captions with predicted sentences, and each predicted sentence is rendered back into a frame. "
            f"Clips up to {config.max_file_mb:g} MB and {format_duration(config.max_duration_s)}."
        )
        with gr.Row():
            with gr.Column(scale=1):
                inputs, run = request_controls(config, choices, preset)
            with gr.Column(scale=2):
                results = result_panels()
        wire(config, inputs, run, results)
    demo.queue(max_size=config.queue_size)
    return demo


def request_controls(config: DemoConfig, choices: list[str], preset: str) -> tuple[dict, gr.Button]:
    """The clip and the request's settings ({name: component}, in `handle_run`'s argument order) and the button."""
    # gr.File, not gr.Video: the pipeline reads any container FFmpeg knows, while gr.Video's
    # player flags every clip the browser cannot play (MPEG-4 Part 2, HEVC, ...) as an error.
    clip = gr.File(label="Clip (MP4, MOV, MKV, WebM, AVI, ...)", elem_id="clip", height=120)
    examples = config.example_clips()
    if examples:
        gr.Examples([[str(p)] for p in examples], inputs=[clip], label="Bundled examples")
    inputs = {
        "clip": clip,
        "steps": gr.Slider(1, DEMO_MAX_STEPS, value=config.steps, step=1, label="Predicted steps", elem_id="steps"),
        "interval": gr.Slider(
            0.25,
            10,
            value=config.interval,
            step=0.25,
            label="Sampling interval (seconds between frames)",
            elem_id="interval",
        ),
        "preset": gr.Dropdown(
            choices,
            value=preset,
            label="Model preset",
            elem_id="preset",
            info="custom = the models named on the command line"
            if CUSTOM in choices
            else "auto = hub models when cached or reachable, else the offline pack",
        ),
        "seed": gr.Number(value=config.seed, precision=0, label="Seed", elem_id="seed"),
    }
    with gr.Accordion("Sampling (optional)", open=False):
        inputs["temperature"] = gr.Slider(
            0, 2, value=0, step=0.1, label="Temperature (0 = greedy)", elem_id="temperature"
        )
        inputs["samples"] = gr.Slider(
            1, 4, value=1, step=1, label="Alternative futures (needs temperature > 0)", elem_id="samples"
        )
    for name in ("steps", "interval", "preset", "seed", "temperature", "samples"):  # an API call may send anything
        quiet(inputs[name])
    return inputs, gr.Button("Run rollout", variant="primary", elem_id="run")


def result_panels() -> dict:
    """What a request shows, {name: component} in the order of `apps.demo.run.outputs`' tuple."""
    panels = {"banner": gr.Markdown(elem_id="unknown_banner"), "status": gr.Markdown(READY_MESSAGE, elem_id="status")}
    gallery = {"columns": 4, "height": "auto", "object_fit": "contain"}
    strips = " (offline pack: each picture is one second, its first, middle and last frame side by side)"
    panels["observed"] = gr.Gallery(label="Sampled frames and their captions" + strips, elem_id="observed", **gallery)
    panels["predicted"] = gr.Markdown(elem_id="predicted")
    panels["rendered"] = gr.Gallery(label="Rendered predicted frames" + strips, elem_id="rendered", **gallery)
    with gr.Row():
        panels["video"] = gr.Video(
            label="Rollout video (observed, then predicted)", elem_id="rollout_video", interactive=False, height=260
        )
        panels["archive"] = gr.File(label="Run folder (zip with rollout.json)", elem_id="run_zip", interactive=False)
    return panels


def wire(config: DemoConfig, inputs: dict, run: gr.Button, panels: dict) -> None:
    """The events: an upload reports the clip; a click checks the request and says how long it should take (from
    this server's earlier runs), then queues the rollout."""
    clicked = gr.State()
    times = RunTimes()

    def on_click(path, steps, seed, interval, preset, temperature, samples):
        def expect(info) -> str:  # called once the steps are checked
            sampled = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (temperature, samples))
            futures = max(int(samples), 1) if sampled and temperature > 0 else 1
            return times.sentence(info, interval, config.max_frames, int(steps) * futures, preset)

        return on_check(path, steps, config, seed, expect)

    def on_run(
        clip,
        steps,
        interval,
        preset,
        seed,
        temperature,
        samples,
        clicked_at,
        progress=gr.Progress(),  # noqa: B008 (Gradio finds its tracker by this default; *args would hide it)
    ):
        if clicked_at == REFUSED:  # on_check already said why in the status area
            return tuple(gr.skip() for _ in range(7))
        try:
            return handle_run(
                clip,
                steps,
                interval,
                preset,
                seed,
                temperature,
                samples,
                config=config,
                clicked_at=clicked_at,
                times=times,
                progress=lambda fraction, message: progress(fraction, desc=message),
            )
        except gr.Error as err:  # said in the status area, the outputs emptied: no error box left open
            return None, "", None, None, None, error_status(err.message), ""

    status, banner, clip = panels["status"], panels["banner"], inputs["clip"]
    hidden = {"show_progress": "hidden", "api_visibility": "private"}
    clip.change(lambda path: on_upload(path, config), [clip], [status], queue=False, **hidden)
    outputs = [panels[k] for k in ("observed", "predicted", "rendered", "video", "archive", "status", "banner")]
    run.click(
        on_click,
        [clip, *(inputs[k] for k in ("steps", "seed", "interval", "preset", "temperature", "samples"))],
        [status, banner, clicked],
        concurrency_limit=None,
        **hidden,
    ).then(
        on_run,
        [*inputs.values(), clicked],
        outputs,
        concurrency_limit=config.concurrency,
        concurrency_id="rollout",
        api_name="rollout",
    ).failure(lambda: FAILED_MESSAGE, None, [status], queue=False, **hidden)  # only an unforeseen crash gets here


# The captions and explanation tables wrap at spaces only (Gradio's Markdown breaks words and numbers anywhere in a
# narrow column); a table wider than the page scrolls sideways instead.
TABLE_CSS = """
#predicted table { display: block; overflow-x: auto; max-width: 100%; table-layout: auto; }
#predicted th, #predicted td { word-break: normal !important; overflow-wrap: normal !important; hyphens: none; }
#predicted .p-alt, #predicted .p-chosen { white-space: nowrap; }
"""


def launch_demo(demo: gr.Blocks, config: DemoConfig | None = None, **kwargs):
    """Serve `demo` on `config.host`:`config.port` with Gradio's own upload limit (`max_file_mb`); `kwargs` go to
    `gr.Blocks.launch` (and win over the config's host and port).

    Gradio only hands out files from the working directory, the system temp folder and `allowed_paths`: the
    example clips it offers are added one by one (not their folder, whose other files it would serve too), and a
    `temp_root` outside the first two (its run folders keep random names).
    """
    config = config or DemoConfig()
    allowed = allowed_paths(config)
    options = {"server_name": config.host, "server_port": config.port, "css": TABLE_CSS, **kwargs}
    return demo.launch(max_file_size=int(config.max_file_mb * 1024 * 1024), allowed_paths=allowed or None, **options)


def allowed_paths(config: DemoConfig) -> list[str]:
    """The paths Gradio may serve beyond its defaults: each offered example clip, and `temp_root` when it lies
    outside the working directory and the system temp folder."""
    allowed = [str(p.resolve()) for p in config.example_clips()]
    root = config.temp_root.resolve()
    if not any(root.is_relative_to(Path(p).resolve()) for p in (tempfile.gettempdir(), os.getcwd())):
        allowed.append(str(root))
    return allowed


def main(argv: list[str] | None = None) -> int:
    """Serve the demo until a stop signal; exit 2 with one `error:` line for bad settings, 128 + n on signal n (the
    folders of requests still running are removed)."""
    return settings_main(
        DemoConfig,
        "apps.demo",
        demo_package.__doc__.split("\n\n")[0],
        lambda config, args, command: serve_logged(config),
        argv,
        arguments=no_other_arguments,
        usage_on_bad_setting=False,
        on_interrupt="server stopped",
    )


def no_other_arguments(parser: SettingsParser) -> None:
    """The demo's flags are its settings alone: it has no --verbose."""


def serve_logged(config: DemoConfig) -> None:
    """`serve`, its log lines on stderr and Gradio's analytics off unless the environment turns them on."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    serve(config)


def check_model_folders(config: DemoConfig) -> None:
    """A UsageError at start, not at every request, for a named model folder that is damaged: a predictor that does
    not load, a captioner or renderer folder with an unreadable weight file."""
    from world_model.models.checkpoint import CheckpointError
    from world_model.models.registry import load_predictor
    from world_model.utils.hub import unreadable_weights

    if config.predictor and Path(config.predictor).is_dir():
        try:
            load_predictor(config.predictor)
        except (CheckpointError, OSError, ValueError) as err:
            raise UsageError(f"--predictor {config.predictor}: {one_line(err)}") from None
    for flag, folder in (("--captioner", config.captioner), ("--renderer", config.renderer)):
        if folder and Path(folder).is_dir() and (damaged := unreadable_weights(Path(folder))):
            raise UsageError(f"{flag} {folder}: {damaged}")


def serve(config: DemoConfig) -> None:
    """Check the settings, build the demo and block while it serves; raise `Interrupted` for the stop signal that
    ended it (Gradio itself returns quietly on one)."""
    check_device(config.device)
    check_writable(config.temp_root / "request", "--temp-root")
    check_model_folders(config)
    torch.set_num_threads(config.threads)
    demo = build_demo(config)
    if len(config.overrides()) < len(COMPONENTS):
        try:  # say now which models requests will use, or why none would work
            chosen, reason = choose_preset(config.preset or "auto")
            print(f"preset: {chosen.name} ({reason})")
        except PresetError as err:
            print(f"warning: {err}", file=sys.stderr)
    arrived: list[int] = []
    previous = {signum: signal.signal(signum, stop_on_signal(arrived)) for signum in handled_signals()}
    try:
        launch_demo(demo, config)  # blocks until a stop signal
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for folder in remove_unfinished():
            print(f"removed the unfinished request folder {folder}", file=sys.stderr)
    if arrived:
        raise Interrupted(arrived[0])


def stop_on_signal(arrived: list[int]):
    """A handler that records the signal and stops the server as Ctrl-C does (Gradio closes on KeyboardInterrupt);
    `serve` then removes the folders of requests that were still running."""

    def handler(signum, frame) -> None:
        arrived.append(signum)
        raise_interrupted(signum, frame)

    return handler

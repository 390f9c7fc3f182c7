"""The Gradio demo (`apps/demo/`): its request handler in plain Python, and the served page driven by
Playwright in Debian's Chromium, with tiny local models (a BLIP captioner, a Stable Diffusion pipeline and a
4-tensor predictor) built once for the module.

Screenshots go to $DEMO_SCREENSHOTS when set, else to a pytest temporary folder.
"""

import io
import json
import os
import re
import shutil
import socket
import zipfile
from pathlib import Path

import gradio as gr
import pytest
import torch

from apps.demo import checks, run
from apps.demo.app import build_demo, launch_demo
from apps.demo.checks import EMPTY_MESSAGE, READY_MESSAGE, format_duration, on_check, on_upload
from apps.demo.config import DemoConfig
from apps.demo.run import handle_run
from encoders.grounding import Grounding
from pipeline.rollout import RolloutError
from pipeline.tiny_pack import make_tiny_blip, make_tiny_sd
from tests.model_factories import write_test_clip
from tests.test_record import make_record
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.text.vocab import Vocabulary

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WORDS = ["a red square moves to the right .", "the square stops at the wall .", "a ball falls down ."]
RUN_TIMEOUT_MS = 60_000

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_test_clip(tmp_path_factory.mktemp("clip") / "square.mp4", seconds=3.0, fps=10)


@pytest.fixture
def not_a_video(tmp_path):
    path = tmp_path / "notes.mp4"
    path.write_text("these are my notes, not a video\n" * 20)
    return path


# ---------------------------------------------------------------- the request handler, without a browser


@pytest.fixture
def no_rollout(monkeypatch):
    """Fail the test if a request that should be refused reaches the models."""

    def refuse(*args, **kwargs):
        raise AssertionError("run_rollout was called")

    monkeypatch.setattr(run, "run_rollout", refuse)


def test_empty_upload_asks_for_a_clip(no_rollout):
    with pytest.raises(gr.Error, match=re.escape(EMPTY_MESSAGE)):
        handle_run(None, 2)


@pytest.mark.parametrize("steps", [0, 11, 2.5])
def test_steps_out_of_range_are_refused(clip, no_rollout, steps):
    with pytest.raises(gr.Error, match=r"Steps must be a whole number from 1 to 10; got"):
        handle_run(str(clip), steps)


def test_oversize_file_is_refused_before_any_work(clip, no_rollout):
    with pytest.raises(gr.Error) as caught:  # 1 KiB; the test clip is larger
        handle_run(str(clip), 2, config=DemoConfig(max_file_mb=0.001))
    assert re.fullmatch(
        r"square\.mp4 is [\d.]+ MB; the limit is 0\.001 MB\. Trim or re-encode the clip and "
        r"upload it again\.",
        caught.value.message,
    )
    with pytest.raises(gr.Error, match="the limit is 0.002 MB"):
        handle_run(str(clip), 2, config=DemoConfig(max_file_mb=0.002))


def test_too_long_clip_is_refused_before_any_work(clip, no_rollout):
    with pytest.raises(gr.Error) as caught:
        handle_run(str(clip), 2, config=DemoConfig(max_minutes=1 / 60))
    assert caught.value.message == "square.mp4 is 3.0 s long; the limit is 1.0 s. Trim the clip and upload it again."
    assert format_duration(754) == "12 min 34 s" and format_duration(600) == "10 min"


def test_not_a_video_is_a_readable_error_without_the_server_path(not_a_video, no_rollout):
    with pytest.raises(gr.Error) as caught:
        handle_run(str(not_a_video), 2)
    message = caught.value.message
    assert message.startswith("Cannot read notes.mp4 as a video: it is not a video file")
    assert str(not_a_video.parent) not in message


def test_upload_status_describes_the_clip_or_says_why_not(clip, not_a_video):
    assert on_upload(str(clip), DemoConfig()) == "Clip square.mp4: 3.0 s, 160×96, 10 fps. Press **Run rollout**."
    assert on_upload(str(not_a_video), DemoConfig()).startswith("**Cannot use this clip:** Cannot read notes.mp4")
    assert "the limit is 1.0 s" in on_upload(str(clip), DemoConfig(max_minutes=1 / 60))
    assert on_upload(None, DemoConfig()) == READY_MESSAGE


def test_examples_are_offered_only_when_the_folder_has_clips(clip, tmp_path):
    def example_components(folder):
        app = build_demo(DemoConfig(examples_dir=folder))
        return [c for c in app.config["components"] if c.get("props", {}).get("label") == "Bundled examples"]

    assert example_components(tmp_path / "absent") == []
    (tmp_path / "examples").mkdir()
    shutil.copy(clip, tmp_path / "examples" / "square.mp4")
    assert len(example_components(tmp_path / "examples")) == 1


def test_pipeline_errors_become_readable_messages_and_leave_no_folder(clip, tmp_path, monkeypatch):
    from pipeline.presets import PresetError

    def missing_pack(*args, **kwargs):
        raise PresetError("the offline model pack is not in this installation")

    monkeypatch.setattr(run, "run_rollout", missing_pack)
    with pytest.raises(gr.Error) as caught:
        handle_run(str(clip), 2, preset="offline", config=DemoConfig(temp_root=tmp_path / "runs"))
    assert caught.value.message == checks.OFFLINE_MISSING  # in the page's words: which control to change
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_request_folder_is_unfinished_while_its_rollout_runs_and_removed_if_the_server_stops(
    clip, tmp_path, monkeypatch
):
    from apps.demo.app import stop_on_signal
    from world_model.utils.cli import stop_signals_raise

    seen = []

    def rollout(video, steps, models, frames, generation, output, progress):
        seen.append(set(run.UNFINISHED))
        raise RolloutError("stopped on purpose")

    monkeypatch.setattr(run, "run_rollout", rollout)
    with pytest.raises(gr.Error, match="stopped on purpose"):
        handle_run(str(clip), 2, config=DemoConfig(temp_root=tmp_path / "runs"))
    assert len(seen[0]) == 1 and next(iter(seen[0])).parent == tmp_path / "runs"
    assert run.UNFINISHED == set()
    stale = tmp_path / "runs" / "running"
    stale.mkdir()
    run.UNFINISHED.add(stale)
    assert run.remove_unfinished() == [stale] and not stale.exists() and run.UNFINISHED == set()
    arrived = []
    with stop_signals_raise(), pytest.raises(KeyboardInterrupt):  # the handlers it sets are put back
        stop_on_signal(arrived)(15, None)
    assert arrived == [15]


@pytest.mark.parametrize("seed", [1e20, -1, 2.5, float("nan")])
def test_seeds_outside_the_generator_range_are_refused(clip, no_rollout, seed):
    with pytest.raises(gr.Error, match=rf"The seed must be a whole number from 0 to {checks.MAX_SEED}"):
        handle_run(str(clip), 2, seed=seed)
    status, banner, clicked = on_check(str(clip), 2, DemoConfig(), seed)  # said in the status area
    assert status.startswith("**Could not run:** The seed must be") and clicked == checks.REFUSED


def flagged_record(flags):
    """A rollout.json record whose frames are in (True) or outside (False) the captioner's world."""
    return make_record(
        ["the large green ball bounces off the floor " * 3] * len(flags),
        [["a ball falls down ."]],
        [Grounding("feature_distance", 3.0 if f else 30.0, 15.6, f) for f in flags],
    )


def test_outputs_show_the_banner_the_full_captions_and_the_queue_wait(tmp_path):
    from pipeline.rollout import RolloutResult

    def show(flags, waited):
        result = RolloutResult(tmp_path, flagged_record(flags), [], [])
        return run.outputs(result, tmp_path / "run.zip", "req", 25.0, 1, 0.0, waited)

    _, tables, _, _, _, status, banner = show([False, False], 35.0)
    assert banner.startswith("## ⚠️ This clip is outside the models' world") and "2 of 2 frames" in banner
    assert "**Done** in 60.0 s (35.0 s waiting in the queue, 25.0 s running)" in status
    assert tables.count("the large green ball bounces off the floor " * 2) == 2, "full captions, not cut"
    assert tables.count("| **no** |") == 2
    assert show([True, True], 0.0)[-1] == "" and "**Done** in 25.0 s:" in show([True, True], 0.0)[-2]
    assert show([True, False, True], 0.0)[-1].startswith("## ⚠️ Part of this clip is outside")


# ---------------------------------------------------------------- the served page, in Chromium


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    vocab = Vocabulary.build(WORDS)
    torch.manual_seed(0)
    predictor = FourTensorModel(FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1))
    predictor.save_pretrained(root / "predictor", vocab=vocab)
    return {
        "captioner": str(make_tiny_blip(root / "blip")),
        "renderer": str(make_tiny_sd(root / "sd")),
        "predictor": str(root / "predictor"),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def chromium_present():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is absent (apt-get install chromium) so the browser tests cannot run")


@pytest.fixture(scope="module")
def server(chromium_present, models, tmp_path_factory):
    """The app on a free localhost port, served from a background thread; yields (url, temp_root)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models; extra threads only spin on a shared CPU
    temp_root = tmp_path_factory.mktemp("demo-runs")
    config = DemoConfig(**models, temp_root=temp_root, steps=3, port=free_port())
    app = build_demo(config)
    _, url, _ = launch_demo(app, config, prevent_thread_lock=True, quiet=True)
    try:
        yield url, temp_root
    finally:
        app.close()
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = Path(os.environ.get("DEMO_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def open_page(browser, url, width=1400):
    """A page in a fresh context (its own cookies and Gradio session); nothing outside localhost loads."""
    context = browser.new_context(viewport={"width": width, "height": 1000})
    context.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/]|localhost[:/])"), lambda route: route.abort())
    page = context.new_page()
    page.set_default_timeout(RUN_TIMEOUT_MS)
    page.goto(url, wait_until="domcontentloaded")
    page.locator("#run").wait_for()
    return page


def upload(page, path):
    page.locator("#clip input[type=file]").set_input_files(str(path))


def set_steps(page, steps):
    box = page.locator("#steps input[type=number]")
    box.fill(str(steps))
    box.press("Enter")


def wait_done(page):
    page.locator("#status", has_text="Done").wait_for()
    return page.locator("#status").inner_text()


def run_folder(status: str) -> str:
    return re.search(r"Run folder: (\S+)", status).group(1)


def check_results(page, steps):
    """Captions, predicted sentences, rendered images, a playable video and the zip are on the page."""
    observed = page.locator("#observed")
    assert observed.locator("img").count() == 3, "one image per sampled second of the 3 s clip"
    captions = observed.inner_text()
    assert all(f"t={t}.0s:" in captions for t in range(3)), captions
    tables = page.locator("#predicted table")  # the captions in full, then the predicted sentences
    assert tables.count() == 2 and tables.first.locator("tbody tr").count() == 3
    rows = tables.last.locator("tbody tr")
    assert rows.count() == steps
    assert [rows.nth(k).locator("td").first.inner_text() for k in range(steps)] == [str(s + 1) for s in range(steps)]
    assert all(rows.nth(k).locator("td").nth(1).inner_text().strip() for k in range(steps))
    rendered = page.locator("#rendered")
    assert rendered.locator("img").count() == steps
    assert all(f"step {s + 1}:" in rendered.inner_text() for s in range(steps))
    page.wait_for_function("""() => { const v = document.querySelector('#rollout_video video');
                                      return v && v.readyState >= 1 && v.duration > 0; }""")
    assert page.evaluate("document.querySelector('#rollout_video video').error") is None
    link = page.locator("#run_zip a[href*='.zip']").first
    response = page.request.get(link.get_attribute("href"))
    assert response.ok
    names = zipfile.ZipFile(io.BytesIO(response.body())).namelist()
    assert any(n.endswith("/rollout.json") for n in names) and any(n.endswith("/rollout.mp4") for n in names)
    assert not any(n.endswith(".gif") for n in names), "the GIF repeats the MP4: not zipped"
    assert "Traceback" not in page.content()


def test_upload_and_run_shows_every_output(server, browser, clip, shots):
    url, temp_root = server
    page = open_page(browser, url)
    upload(page, clip)
    set_steps(page, 2)
    page.locator("#run").click()
    # run_rollout's progress messages reach the page through gr.Progress (the first run also loads the models)
    stage = re.compile(r"loading models|captioning \d+ frames|predicting|rendering predicted state")
    page.get_by_text(stage).first.wait_for()
    status = wait_done(page)
    check_results(page, steps=2)
    assert (temp_root / run_folder(status)).is_dir()
    assert page.locator("#unknown_banner").inner_text().strip() == "", "no banner: the tiny captioner is uncalibrated"
    page.locator("#rendered").scroll_into_view_if_needed()
    page.screenshot(path=shots / "rollout.png", full_page=True)
    page.context.close()


BROKEN_WORDS_JS = """() => {
  const broken = [];
  for (const cell of document.querySelectorAll('#predicted td, #predicted th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        if (lines.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
}"""


def test_the_explanation_table_breaks_no_word_at_900_px(server, browser, clip, shots):
    url, _ = server
    page = open_page(browser, url, width=900)
    upload(page, clip)
    set_steps(page, 2)
    page.locator("#run").click()
    wait_done(page)
    assert page.locator("#predicted td").count() > 0
    assert page.evaluate(BROKEN_WORDS_JS) == [], "words or numbers split across lines"
    page.locator("#predicted").scroll_into_view_if_needed()
    page.screenshot(path=shots / "table_900px.png", full_page=True)
    page.context.close()


def test_a_clip_outside_the_captioners_world_gets_a_banner(server, browser, clip, monkeypatch, shots):
    from encoders.grounding import FEATURE_DISTANCE, Grounding
    from pipeline import rollout as rollout_module

    caption = "the large green ball bounces off the floor and the elevator goes up to floor three"

    class OutsideCaptioner:  # as the offline pack's captioner does on real footage
        def caption_and_ground(self, images, progress=None, on_batch=None):
            return [caption] * len(images), [Grounding(FEATURE_DISTANCE, 40.0, 15.6, False)] * len(images)

    monkeypatch.setattr(rollout_module, "load_captioner", lambda *args: OutsideCaptioner())
    url, _ = server
    page = open_page(browser, url)
    upload(page, clip)
    set_steps(page, 1)
    page.locator("#run").click()
    wait_done(page)
    banner = page.locator("#unknown_banner").inner_text()
    assert "This clip is outside the models' world" in banner and "3 of 3 frames" in banner
    assert page.locator("#predicted").inner_text().count(caption) == 3, "the full captions are readable"
    page.screenshot(path=shots / "outside_world.png", full_page=True)
    page.context.close()


def test_text_file_named_mp4_gives_a_readable_error(server, browser, not_a_video, shots):
    url, _ = server
    page = open_page(browser, url)
    upload(page, not_a_video)
    status = page.locator("#status", has_text="Cannot use this clip")
    status.wait_for()  # said as soon as the upload lands
    assert "Cannot read notes.mp4 as a video: it is not a video file" in status.inner_text()
    page.locator("#run").click()
    refused = page.locator("#status", has_text="Could not run: Cannot read notes.mp4 as a video")
    refused.wait_for()
    text = refused.inner_text()
    assert "it is not a video file" in text and "Traceback" not in text and "/tmp" not in text
    assert "Traceback" not in page.content() and page.locator(".toast-body").count() == 0, "no error box"
    assert "Error" not in page.locator("#observed").inner_text(), "a refused request leaves the outputs alone"
    page.screenshot(path=shots / "not_a_video.png", full_page=True)
    page.context.close()


def test_pipeline_error_is_shown_as_its_message(server, browser, clip, offline_pack_absent):
    url, temp_root = server
    before = set(temp_root.iterdir())
    page = open_page(browser, url)
    upload(page, clip)
    page.locator("#preset input").click()
    page.get_by_role("option", name="offline", exact=True).click()
    page.locator("#run").click()
    failed = page.locator("#status", has_text="Could not run")
    failed.wait_for()
    assert "offline model pack is not installed on this server" in failed.inner_text()
    assert "Traceback" not in page.content() and page.locator(".toast-body").count() == 0, "no error box"
    for panel in ("#observed", "#rendered"):
        assert "Error" not in page.locator(panel).inner_text(), "a failed run does not mark the outputs as errors"
    assert set(temp_root.iterdir()) == before, "a failed request leaves no folder behind"
    page.locator("#preset input").click()  # then a good run: the status is its own, nothing stale stays
    page.get_by_role("option", name="custom", exact=True).click()
    set_steps(page, 1)
    page.locator("#run").click()
    status = wait_done(page)
    assert "Could not run" not in status and page.locator(".toast-body").count() == 0
    page.context.close()


def test_run_without_a_clip_asks_for_one(server, browser):
    url, _ = server
    page = open_page(browser, url)
    page.locator("#run").click()
    page.locator("#status", has_text=EMPTY_MESSAGE).wait_for()
    assert "Traceback" not in page.content() and page.locator(".toast-body").count() == 0
    page.context.close()


def test_two_people_at_once_get_their_own_results(server, browser, clip):
    url, temp_root = server
    pages = [open_page(browser, url) for _ in range(2)]
    for page, steps in zip(pages, (1, 2)):
        upload(page, clip)
        set_steps(page, steps)
    for page in pages:
        page.locator("#run").click()
    statuses = [wait_done(page) for page in pages]
    assert any("waiting in the queue" in s for s in statuses), "one rollout at a time: the other waited, and says so"
    folders = [run_folder(s) for s in statuses]
    assert folders[0] != folders[1] and all((temp_root / f).is_dir() for f in folders)
    for page, steps in zip(pages, (1, 2)):
        check_results(page, steps)
        page.context.close()


def test_predicted_table_shows_probabilities_alternatives_and_attention(server, browser, clip, shots, models):
    url, _ = server
    n_states = json.loads((Path(models["predictor"]) / "config.json").read_text())["n_states"]
    page = open_page(browser, url)
    upload(page, clip)
    set_steps(page, 2)
    page.locator("#run").click()
    wait_done(page)
    rows = page.locator("#predicted table").last.locator("tbody tr")
    assert rows.count() == 2
    for k in range(2):
        row = rows.nth(k)
        chosen = float(row.locator("span.p-chosen").inner_text())
        row.locator("details summary").click()  # the alternatives are collapsed until asked for
        alternatives = row.locator("span.p-alt")
        alternatives.first.wait_for(state="visible")
        listed = [chosen] + [float(alternatives.nth(i).inner_text()) for i in range(alternatives.count())]
        assert len(listed) >= 3, "the chosen sentence and at least two alternatives"
        assert all(0 <= p <= 1 for p in listed) and sum(listed) <= 1 + 1e-3, listed
        bars = row.locator("meter.attention")
        assert bars.count() == n_states, "one bar per slice of the predictor's window"
        masses = [float(bars.nth(i).get_attribute("value")) for i in range(bars.count())]
        assert abs(sum(masses) - 1) < 2e-3 and all(0 <= m <= 1 for m in masses)
        labels = row.locator("td").last.inner_text()
        assert all(f"t={t}.0s" in labels for t in range(3)), "each observed caption has its bar"
    assert "step 1" in rows.nth(1).locator("td").last.inner_text(), "step 2 read the first predicted step"
    page.locator("#predicted").scroll_into_view_if_needed()
    page.screenshot(path=shots / "explanations.png", full_page=True)
    page.context.close()

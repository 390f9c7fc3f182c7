"""Regenerate the README's two pictures from the bundled offline pack and example clip.

    python docs/images/make_images.py            # both: storyboard.png and demo.png
    python docs/images/make_images.py storyboard # only the storyboard (no browser needed)

`storyboard.png` is the storyboard of `python -m pipeline.rollout examples/ball.mp4 --steps 5`; `demo.png` is the
Gradio demo (offline pack) after that clip has run, screenshotted in Debian's Chromium through Playwright.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
CLIP = ROOT / "examples" / "ball.mp4"
CHROMIUM = "/usr/bin/chromium"
STEPS = 5


def make_storyboard(out: Path = IMAGES / "storyboard.png") -> Path:
    """Run the README's main job into a temporary folder and keep its storyboard."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        command = [sys.executable, "-m", "pipeline.rollout", str(CLIP), "--steps", str(STEPS), "--out", str(run)]
        subprocess.run(command, check=True, cwd=ROOT)
        shutil.copyfile(run / "storyboard.png", out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_demo_screenshot(out: Path = IMAGES / "demo.png") -> Path:
    """Serve the demo on a free localhost port, run the example clip in Chromium and screenshot the page."""
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    from apps.demo.app import build_demo, launch_demo
    from apps.demo.config import DemoConfig

    with tempfile.TemporaryDirectory() as tmp:
        config = DemoConfig(preset="offline", temp_root=Path(tmp), steps=STEPS, port=free_port())
        app = build_demo(config)
        _, url, _ = launch_demo(app, config, prevent_thread_lock=True, quiet=True)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                context.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/]|localhost[:/])"), lambda r: r.abort())
                page = context.new_page()
                page.set_default_timeout(180_000)
                page.goto(url, wait_until="domcontentloaded")
                page.locator("#clip input[type=file]").set_input_files(str(CLIP))
                page.locator("#run").click()
                page.locator("#status", has_text="Done").wait_for()
                page.wait_for_timeout(1000)  # the gallery images fade in
                page.screenshot(path=out, full_page=True)
                browser.close()
        finally:
            app.close()
    return out


def main(argv: list[str]) -> int:
    wanted = set(argv) or {"storyboard", "demo"}
    unknown = wanted - {"storyboard", "demo"}
    if unknown:
        print(f"error: unknown picture(s) {sorted(unknown)}; choose storyboard and/or demo", file=sys.stderr)
        return 2
    IMAGES.mkdir(parents=True, exist_ok=True)
    if "storyboard" in wanted:
        print(f"wrote {make_storyboard().relative_to(ROOT)}")
    if "demo" in wanted:
        print(f"wrote {make_demo_screenshot().relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

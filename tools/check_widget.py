"""Drive a real JupyterLab in headless Chromium and check that a widget's slider redraws its figure.

    .venv/bin/python tools/check_widget.py [--notebook notebooks/02_hamiltonian_monte_carlo.ipynb]

Starts a JupyterLab server on a free local port (test run profile, so the chapter runs in
seconds), opens the chapter, runs all its cells, then moves the first slider of the first widget
(HMC iterations in chapter 2) with the keyboard and waits for the widget's figure to change.
Exit status 0 when it did. Slower than the test run (a minute or two), so not part of it.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_book import CHROMIUM_ARGS, find_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer at {url} within {timeout:.0f} s")


def _widget_image(page) -> str | None:
    """The src of the figure inside the first widget's output area (a data URL), or None."""
    return page.evaluate("""() => {
        const img = document.querySelector('.widget-vbox .jp-OutputArea-output img, .widget-output img');
        return img ? img.getAttribute('src') : null;
    }""")


def check(notebook: str, timeout: float) -> None:
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("no Chromium found (apt-get install chromium)")
    # The server works on a copy: JupyterLab autosaves, and the chapter's committed outputs must stay.
    workdir = Path(tempfile.mkdtemp(prefix="check-widget-"))
    shutil.copy(ROOT / notebook, workdir / Path(notebook).name)
    notebook = Path(notebook).name
    port, token = _free_port(), secrets.token_hex(16)
    env = os.environ | {"VCD_PROFILE": "test"}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "jupyter-lab"), "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={workdir}", "--allow-root"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_server(f"http://127.0.0.1:{port}/api?token={token}")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/lab/tree/{notebook}?token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=60_000)
            page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=120_000)  # the kernel is up
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click(timeout=60_000)
            page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click(timeout=30_000)
            try:
                page.wait_for_selector(".widget-slider", timeout=timeout * 1000)
            except Exception:
                page.screenshot(path=str(Path(os.environ.get("TMPDIR", "/tmp")) / "check_widget.png"), full_page=True)
                raise
            deadline = time.monotonic() + timeout
            while _widget_image(page) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("the widget never drew its figure")
                time.sleep(1)
            before = _widget_image(page)
            slider = page.locator(".widget-slider").first
            readout = slider.locator(".widget-readout")
            old_value = readout.inner_text()
            slider.locator(".noUi-handle").first.focus()
            for _ in range(5):
                page.keyboard.press("ArrowRight")
            while readout.inner_text() == old_value or _widget_image(page) in (before, None):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"slider {old_value} -> {readout.inner_text()}: the figure did not change")
                time.sleep(1)
            print(f"slider moved {old_value} -> {readout.inner_text()} and the widget's figure was redrawn")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebook", default="notebooks/02_hamiltonian_monte_carlo.ipynb")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the cells and the redraw")
    args = parser.parse_args()
    check(args.notebook, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Drive a real JupyterLab in headless Chromium and check that each chapter's widget redraws.

    .venv/bin/python tools/check_widget.py [--notebook notebooks/06_training_loops.ipynb]

For each chapter with a widget (chapters 2 and 6, or the one given), starts a JupyterLab server
on a free local port (test run profile, so the chapter runs in seconds) on a temporary copy of
the chapter, runs all its cells, moves the first slider of the first widget with the keyboard
(HMC iterations in chapter 2, the batch size in chapter 6) and waits for what the widget shows
(chapter 2's figure, chapter 6's timing line) to change. The copy is removed afterwards. Exit
status 0 when every widget redrew. Slower than the test run (minutes), so not part of it.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_book import CHROMIUM_ARGS, find_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _wait_for_server(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer at {url} within {timeout:.0f} s")


WIDGET_CHAPTERS = ("notebooks/02_hamiltonian_monte_carlo.ipynb", "notebooks/06_training_loops.ipynb")


def _widget_view(page) -> str | None:
    """What the first widget's output area shows: its figure (a data URL) or its text; None while
    it shows nothing yet or says it is compiling."""
    return page.evaluate("""() => {
        const area = document.querySelector('.widget-vbox .widget-output');
        if (!area) return null;
        const img = area.querySelector('img');
        if (img) return img.getAttribute('src');
        const text = area.innerText.trim();
        return text && !text.startsWith('compiling') ? text : null;
    }""")


def check(notebook: str, timeout: float) -> None:
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("no Chromium found (apt-get install chromium)")
    # The server works on a copy: JupyterLab autosaves, and the chapter's committed outputs must stay.
    from vcd_helpers.runs.workers import free_local_ports

    workdir = Path(tempfile.mkdtemp(prefix="check-widget-"))
    shutil.copy(ROOT / notebook, workdir / Path(notebook).name)
    notebook = Path(notebook).name
    port, token = free_local_ports(1)[0], secrets.token_hex(16)
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
                _see_widget_redraw(page, notebook, timeout)
            except Exception:
                shot = Path(tempfile.gettempdir()) / "check_widget.png"
                page.screenshot(path=str(shot), full_page=True)
                print(f"{notebook}: the page as it was is in {shot}", file=sys.stderr)
                raise
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


def _see_widget_redraw(page, notebook: str, timeout: float) -> None:
    page.wait_for_selector(".widget-slider", timeout=timeout * 1000)
    deadline = time.monotonic() + timeout
    slider = page.locator(".widget-slider").first
    # JupyterLab keeps only the cells near the viewport in the page, and Run All scrolls on to the last cell.
    while slider.scroll_into_view_if_needed() or _widget_view(page) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{notebook}: the widget never showed its first result")
        time.sleep(1)
    before = _widget_view(page)
    readout = slider.locator(".widget-readout")
    old_value = readout.inner_text()
    slider.locator(".noUi-handle").first.focus()
    for _ in range(5):
        page.keyboard.press("ArrowRight")
    while readout.inner_text() == old_value or _widget_view(page) in (before, None):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{notebook}: slider {old_value} -> {readout.inner_text()}: the widget did "
                               "not redraw")
        time.sleep(1)
    print(f"{notebook}: slider moved {old_value} -> {readout.inner_text()} and the widget redrew")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebook", help="one chapter (default: every chapter with a widget)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the cells and the redraw")
    args = parser.parse_args()
    for notebook in [args.notebook] if args.notebook else WIDGET_CHAPTERS:
        check(notebook, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The published book in a real browser: build it from the notebooks' committed outputs (no
execution, so it takes seconds) and check every page in headless Chromium (tools/check_book.py).

The full build (`make book`) executes every chapter in the book profile; run
`tools/check_book.py _build/html` on it after building.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import check_book  # noqa: E402

# Builds the whole book and opens it in Chromium.
pytestmark = pytest.mark.slow


def _chromium() -> str:
    chromium = check_book.find_chromium()
    if chromium is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium); the browser check cannot run")
    pytest.importorskip("playwright", reason="playwright is not installed; the browser check cannot run")
    return chromium


@pytest.fixture(scope="module")
def built_book(tmp_path_factory) -> Path:
    """The book built from the committed outputs with warnings as errors; its HTML directory."""
    out = tmp_path_factory.mktemp("book")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"  # render the committed outputs
    # Paths in a config file are relative to it: this one lives elsewhere.
    extensions = config["sphinx"].get("local_extensions", {})
    config["sphinx"]["local_extensions"] = {name: str(ROOT / path) for name, path in extensions.items()}
    config_file = out / "_config.yml"
    config_file.write_text(yaml.safe_dump(config))
    build = subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "--config", str(config_file),
                            "--path-output", str(out), "-W", "--keep-going"],
                           capture_output=True, text=True, cwd=ROOT)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return out / "_build" / "html"


def test_the_book_builds_without_a_warning(built_book):
    # Runs where there is no Chromium too: a duplicate figure name or a page ending in a rule
    # fails the build (-W) before any browser looks at it.
    assert {f"{page}.html" for page in check_book.toc_pages()} <= {
        str(path.relative_to(built_book)) for path in built_book.rglob("*.html")}


def _page(directory: Path, name: str, body: str) -> None:
    """A minimal page of the book's shape holding ``body`` under its heading."""
    (directory / f"{name}.html").write_text(f"<html><body><main><h1>A page</h1>{body}</main></body></html>")


def test_the_built_book_renders_in_chromium(built_book):
    chromium = _chromium()
    problems = check_book.check_book(built_book, check_book.toc_pages(), chromium)
    assert problems == [], "\n".join(problems)


def test_the_browser_check_finds_a_table_printed_as_text(tmp_path):
    chromium = _chromium()
    _page(tmp_path, "page", "<p>| | a | b |\n|---|---|---|\n| x | 1 | 2 |</p>"
                            "<table><tr><td>| a rendered table's cell |</td></tr></table>")
    problems = check_book.check_book(tmp_path, ["page"], chromium)
    assert problems == ["page: a Markdown table shown as text: '| | a | b |\\n|---|---|---|\\n| x | 1 | 2 |'"], problems


def test_every_committed_run_a_notebook_names_is_in_results():
    """A chapter that names a run (vae_e800_s0, vcd_scheduled_e100_s1, ...) reads results/NAME: that run
    must be committed and finished, or be a run of the plan that the chapter waits for (chapter 8 says
    which have not finished). The reproducibility appendix lists which chapter reads which run from
    the same scan."""
    import re

    import nbformat

    from vcd_helpers.plan import PLAN

    finished = {path.parent.name for path in (ROOT / "results").glob("*/results.json")}
    named = {}
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")
        for name in re.findall(r"[\"']((?:vcd|vae)\w*_e\d+_s\d+\w*)[\"']", code):
            named.setdefault(name, set()).add(notebook.name)
    assert {"vae_e800_s0", "vcd_scheduled_e800_s0"} <= set(named), sorted(named)
    planned = {run.name for run in PLAN}
    missing = {name: sorted(pages) for name, pages in named.items() if name not in finished | planned}
    assert missing == {}, f"notebooks name runs that results/ does not hold finished: {missing}"


def test_the_browser_check_finds_a_dropdown_that_does_not_hide_its_solution(tmp_path):
    # The exercises' hints and solutions are dropdowns; without the toggle script they show at once.
    chromium = _chromium()
    _page(tmp_path, "page", "<div class='admonition dropdown'><p class='admonition-title'>Solution</p>"
                            "<p>The answer, in plain view.</p></div>")
    problems = check_book.check_book(tmp_path, ["page"], chromium)
    assert problems == ["page: dropdown 'Solution' shows its content before a click"], problems


def test_the_browser_check_moves_a_precomputed_explorers_sliders(tmp_path):
    # A working explorer passes; one whose switching script is missing (every frame but the first
    # stays hidden whatever the sliders say) is reported.
    from vcd_helpers import widgets

    chromium = _chromium()
    frames = {(n, h): f"<pre>n={n} h={h}</pre>" for n in (10, 40) for h in (0.01, 0.2)}
    explorer = widgets.static_explorer(frames, [("iterations", (10, 40)), ("step size", (0.01, 0.2))], note="test").data
    _page(tmp_path, "good", explorer)
    _page(tmp_path, "broken", explorer.split("<script>")[0] + "</div>")
    assert check_book.check_book(tmp_path, ["good"], chromium) == []
    problems = check_book.check_book(tmp_path, ["broken"], chromium)
    assert any("shows frame(s)" in p for p in problems) and any("does not change" in p for p in problems), problems


def test_the_browser_check_finds_a_notebook_page_without_its_download(tmp_path):
    chromium = _chromium()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "_sources").mkdir()
    (tmp_path / "_sources" / "a.ipynb").write_text("{}")
    link = '<a class="btn-download-source-button" href="../_sources/{}.ipynb">.ipynb</a>'
    for page, target in (("a", "a"), ("b", "b")):  # b's download points at a file the book lacks
        (tmp_path / "notebooks" / f"{page}.html").write_text(
            f"<html><body>{link.format(target)}<main><h1>A page</h1></main></body></html>")
    (tmp_path / "notebooks" / "c.html").write_text("<html><body><main><h1>No download</h1></main></body></html>")
    assert check_book.check_book(tmp_path, ["notebooks/a"], chromium) == []
    assert check_book.check_book(tmp_path, ["notebooks/b"], chromium) == [
        "notebooks/b: broken internal link ../_sources/b.ipynb"]
    assert check_book.check_book(tmp_path, ["notebooks/c"], chromium) == ["notebooks/c: no download of its notebook (.ipynb)"]

"""Every chapter carries the book's scaffolding, read from the committed notebooks (no execution).

What a student relies on in every chapter: learning goals and a time estimate at the top; a
summary, further reading and graded exercises, each with a hint and a worked solution behind a
dropdown, at the end; every figure numbered and captioned; bookkeeping (assertions, watermarks)
hidden from the rendered page while nbval still runs it. The browser check
(tools/check_book.py) then checks that the dropdowns open in the built book.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import reading_time  # noqa: E402
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
PAGES = [entry["file"] for entry in TOC["chapters"]]
CHAPTERS = [page for page in PAGES if re.fullmatch(r"notebooks/\d\d\w*", page)]
NOTEBOOKS = [page for page in PAGES if page.startswith("notebooks/")]
GRADES = ("easy", "medium", "hard")


def _read(page: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / f"{page}.ipynb", as_version=4)


def _markdown(notebook: nbformat.NotebookNode) -> str:
    return "\n\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")


def _dropdowns(text: str, title: str) -> int:
    return len(re.findall(rf":::\{{admonition\}} {title}\s*\n:class: dropdown", text))


def test_the_toc_lists_every_chapter_notebook():
    on_disk = sorted(f"notebooks/{path.stem}" for path in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(NOTEBOOKS) == on_disk
    assert len(CHAPTERS) >= 8


@pytest.mark.parametrize("page", CHAPTERS)
def test_a_chapter_opens_with_goals_and_a_time_estimate(page):
    first = next(cell.source for cell in _read(page).cells if cell.cell_type == "markdown")
    assert first.startswith("# "), f"{page}: the first cell is not the title"
    assert ":::{admonition} Learning goals" in first, f"{page}: no learning goals at the top"
    assert re.search(r"minutes to read", first), f"{page}: no time estimate at the top"


@pytest.mark.parametrize("page", CHAPTERS)
def test_the_stated_reading_time_is_the_measured_one(page):
    """The time at the top is the introduction's rule applied to the chapter as committed
    (tools/reading_time.py): within 10% (at least 5 minutes) to read, a quarter hour of exercises."""
    first = next(cell.source for cell in _read(page).cells if cell.cell_type == "markdown")
    stated = re.search(r"About (\d+) minutes to read, and about ([\d.]+) hours for the exercises", first)
    assert stated, f"{page}: no 'About N minutes to read, and about H hours for the exercises' at the top"
    reading, exercises = reading_time.reading_time(ROOT / f"{page}.ipynb")
    assert abs(int(stated[1]) - reading) <= max(5, 0.1 * reading), (page, stated[0], f"measured {reading:.0f} min")
    assert abs(float(stated[2]) - exercises / 60) <= 0.25, (page, stated[0], f"measured {exercises / 60:.1f} h")


@pytest.mark.parametrize("page", CHAPTERS)
def test_a_chapter_ends_with_a_summary_reading_and_graded_exercises(page):
    text = _markdown(_read(page))
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    for heading in ("Summary", "Further reading", "Exercises"):
        assert heading in headings, f"{page}: no '## {heading}' section"
    exercises = text[text.index("## Exercises"):]
    # "(hard; about an hour)": a long exercise says so after its grade.
    grades = re.findall(r"\*\*Exercise \d+ \((easy|medium|hard)(?:[;,][^)]*)?\)\.\*\*", exercises)
    assert len(grades) >= 3 and set(grades) == set(GRADES), f"{page}: exercises graded {grades}"
    assert _dropdowns(exercises, "Hint") >= len(grades), f"{page}: an exercise without a hint dropdown"
    assert _dropdowns(exercises, "Solution") >= len(grades), f"{page}: an exercise without a solution dropdown"


def _images(cell: nbformat.NotebookNode) -> int:
    return sum("image/png" in output.get("data", {}) for output in cell.get("outputs", []))


@pytest.mark.parametrize("page", NOTEBOOKS)
def test_every_figure_is_numbered_and_captioned(page):
    notebook = _read(page)
    names = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or not _images(cell) or "remove-output" in cell.metadata.get("tags", []):
            continue
        figure = cell.metadata.get("mystnb", {}).get("figure", {})
        assert figure.get("name") and len(figure.get("caption", "")) > 40, \
            f"{page}: cell {index} draws a figure with no name or no caption saying what to see"
        assert _images(cell) == 1, f"{page}: cell {index} draws {_images(cell)} figures under one caption"
        # myst-nb gives every rich output of a named cell the figure's name: a last expression's
        # repr beside the image (end the cell with ';') makes the name a duplicate, and the build fails.
        rich = [o.output_type for o in cell.outputs if o.output_type in ("display_data", "execute_result")]
        assert rich == ["display_data"], f"{page}: cell {index} shows {rich} under one figure name: end it with ';'"
        names.append(figure["name"])
    assert len(names) == len(set(names)), f"{page}: figure names repeat: {names}"
    for target in re.findall(r"\{numref\}`(?:[^`<]*<)?([^`>]+)>?`", _markdown(notebook)):
        assert target in names, f"{page}: {{numref}} to {target!r}, which is not a figure of this page"


def _bookkeeping(source: str) -> bool:
    """A cell that only checks (assertions) or records provenance (the watermark)."""
    lines = [line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    if any("watermark(" in line for line in lines):
        return True
    statements = [line for line in lines if not line.startswith((" ", "\t", ")", "]", "}"))]
    return bool(statements) and all(line.startswith(("assert ", "np.testing.")) for line in statements)


@pytest.mark.parametrize("page", NOTEBOOKS)
def test_bookkeeping_is_hidden_from_the_page(page):
    shown = [index for index, cell in enumerate(_read(page).cells)
             if cell.cell_type == "code" and _bookkeeping(cell.source)
             and "remove-cell" not in cell.metadata.get("tags", [])]
    assert shown == [], f"{page}: assertion or watermark cells shown on the page: {shown} (tag them remove-cell)"


def _execution_commit(notebook: nbformat.NotebookNode) -> str | None:
    """The commit a committed notebook was executed at, from its provenance record ("Code: git commit X")."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            found = re.search(r"^Code: git commit ([0-9a-f]{40})", output.get("text", ""), re.MULTILINE)
            if found:
                return found.group(1)
    return None


def _code_cells(notebook: nbformat.NotebookNode) -> list[str]:
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


@pytest.mark.parametrize("page", CHAPTERS)
def test_the_committed_outputs_come_from_the_committed_code(page):
    """A chapter's outputs are those of its code: its code cells equal those of the commit it was
    executed at (markdown may have changed since; a code cell may not, or the outputs are stale)."""
    import subprocess

    notebook = _read(page)
    commit = _execution_commit(notebook)
    assert commit, f"{page}: no provenance record (the hidden watermark cell's output)"
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{page}.ipynb"], capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"commit {commit[:7]} is not in this checkout's history (a shallow clone?): {shown.stderr.strip()}")
    then = _code_cells(nbformat.reads(shown.stdout, as_version=4))
    changed = [index for index, (a, b) in enumerate(zip(then, _code_cells(notebook))) if a != b]
    assert len(then) == len(_code_cells(notebook)) and not changed, \
        f"{page}: code cells {changed or 'added or removed'} changed since its execution at {commit[:7]}: re-execute it"


def _ends_with_semicolon(source: str) -> bool:
    import io
    import tokenize

    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
    return bool(tokens) and tokens[-1].type == tokenize.OP and tokens[-1].string == ";"


@pytest.mark.parametrize("page", NOTEBOOKS)
def test_no_compared_cell_relies_on_a_semicolon_to_hide_its_value(page):
    """nbval runs cells without storing them in IPython's history, where a trailing ';' is looked
    up: there the value shows, in the committed notebook it does not, and the comparison fails."""
    cells = [index for index, cell in enumerate(_read(page).cells) if cell.cell_type == "code"
             and "nbval-ignore-output" not in cell.metadata.get("tags", []) and _ends_with_semicolon(cell.source)]
    assert not cells, f"{page}: cells {cells} end with ';' and nbval compares their outputs: end them with a " \
                      "statement (plt.show()), or tag them nbval-ignore-output"

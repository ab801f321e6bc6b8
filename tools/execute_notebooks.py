"""Execute chapters in place, so that the committed notebooks show what the book shows.

    python tools/execute_notebooks.py [--profile book|test] notebooks/00_data.ipynb [...]

Runs each notebook top to bottom from inside ``notebooks/``, in the ``book`` run profile unless
told otherwise, and writes it back with execution timings, widget state and widget views
stripped. A reader opening a chapter on a code host or in JupyterLab then sees the book's real
figures and numbers, while ``pytest --nbval`` still runs the chapters in the quick ``test``
profile: every cell whose output depends on the profile (or the machine, or the time) is tagged
``nbval-ignore-output`` and followed by assertions. ``--profile test`` is a quick check while
editing. Fails, writing nothing, if a cell raises or writes to stderr: stderr (TensorFlow's log
lines above all) differs between machines and would break strict nbval runs elsewhere. Run it on
a quiet machine: the chapters time things.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def strip_widgets(notebook: nbformat.NotebookNode, path: Path) -> None:
    """No widget state or view is kept: a widget does nothing without a live kernel. A progress bar
    keeps its text; an explorer's cell (tagged remove-output, as the book shows it) keeps no
    output, so a reader of the committed notebook sees the code and the static figure beside it.
    (nbclient must record the state while executing: its Output-widget hook fails without it.)"""
    notebook.metadata.pop("widgets", None)
    for index, cell in enumerate(notebook.cells):
        tags = cell.metadata.get("tags", [])
        if "remove-output" in tags:
            if "nbval-ignore-output" not in tags:
                raise SystemExit(f"{path}: cell {index} is tagged remove-output: tag it nbval-ignore-output too")
            cell.outputs = []
        for output in cell.get("outputs", []):
            output.get("data", {}).pop(WIDGET_VIEW, None)


def execute(path: Path, profile: str) -> None:
    notebook = nbformat.read(path, as_version=4)
    os.environ["VCD_PROFILE"] = profile
    NotebookClient(notebook, timeout=1800, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    strip_widgets(notebook, path)
    for index, cell in enumerate(notebook.cells):
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            if output.get("name") == "stderr":
                raise SystemExit(f"{path}: cell {index} wrote to stderr:\n{output['text'][:2000]}")
    nbformat.write(notebook, path)
    print(f"executed {path} in the {profile} profile")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=("book", "test"), default="book",
                        help="run profile (default: book, what the published book shows)")
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args()
    for notebook in args.notebooks:
        execute(notebook, args.profile)

"""Execute chapters in place, as the test run will, so their stored outputs are what nbval expects.

    python tools/execute_notebooks.py notebooks/00_data.ipynb [...]

Runs each notebook top to bottom in the ``test`` run profile from inside ``notebooks/`` and
writes it back with execution timings, widget state and widget views stripped. Fails, writing nothing, if a cell raises or
writes to stderr: stderr (TensorFlow's log lines above all) differs between machines and would
break strict nbval runs elsewhere.
"""

from __future__ import annotations

import os
import sys
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


def execute(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    os.environ["VCD_PROFILE"] = "test"
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    strip_widgets(notebook, path)
    for index, cell in enumerate(notebook.cells):
        cell.metadata.pop("execution", None)
        for output in cell.get("outputs", []):
            if output.get("name") == "stderr":
                raise SystemExit(f"{path}: cell {index} wrote to stderr:\n{output['text'][:2000]}")
    nbformat.write(notebook, path)
    print(f"executed {path}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for name in sys.argv[1:]:
        execute(Path(name))

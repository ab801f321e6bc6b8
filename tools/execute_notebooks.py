"""Execute chapters in place, as the test run will, so their stored outputs are what nbval expects.

    python tools/execute_notebooks.py notebooks/00_data.ipynb [...]

Runs each notebook top to bottom in the ``test`` run profile from inside ``notebooks/`` and
writes it back with execution timings and widget state stripped. Fails, writing nothing, if a cell raises or
writes to stderr: stderr (TensorFlow's log lines above all) differs between machines and would
break strict nbval runs elsewhere.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    os.environ["VCD_PROFILE"] = "test"
    # No widget state: a widget does nothing without a live kernel, and the book shows none.
    notebook.metadata.pop("widgets", None)
    NotebookClient(notebook, timeout=900, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
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

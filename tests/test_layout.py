"""The package's two wings: the library the chapters teach from never imports nor starts the run
service (``vcd_helpers.runs``), and the results layout the chapters read is a bottom floor that imports
no training code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "vcd_helpers"
LIBRARY = sorted(p for p in PACKAGE.glob("*.py") if p.name != "__main__.py")
TRAINING_CODE = {"training", "trainers", "loops", "variance", "objectives", "hmc", "optim", "pipeline",
                 "distributed", "evaluation", "control_variates"}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute, at any depth of its code (function-level too)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules |= {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.name)
def test_the_library_never_imports_the_run_service(path):
    reaching_up = sorted(m for m in imported_modules(path) if m == "vcd_helpers.runs" or m.startswith("vcd_helpers.runs."))
    assert not reaching_up, f"{path.name} imports {reaching_up}"


def starts_the_run_service(path: Path) -> bool:
    """Whether ``path``'s code builds a command line that runs the package's commands
    (``python -m vcd_helpers ...``), as a launcher of training processes does."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.List):
            items = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if any(a == "-m" and b.split(".")[0] == "vcd_helpers" for a, b in zip(items, items[1:])):
                return True
    return False


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.name)
def test_the_library_never_starts_the_run_service(path):
    assert not starts_the_run_service(path), f"{path.name} starts python -m vcd_helpers: that belongs in runs/"


def test_the_check_sees_a_launcher(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text("import sys\ncommand = [sys.executable, '-m', 'vcd_helpers', 'train']\n")
    assert starts_the_run_service(module)
    assert starts_the_run_service(PACKAGE / "runs" / "workers.py")


def test_the_results_layout_imports_no_training_code():
    imported = {m.removeprefix("vcd_helpers.") for m in imported_modules(PACKAGE / "results.py")}
    assert not imported & TRAINING_CODE, sorted(imported & TRAINING_CODE)


def test_the_check_sees_an_import_of_the_run_service(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from vcd_helpers import runs\n    from vcd_helpers.runs.train import train_run\n")
    assert {"vcd_helpers.runs", "vcd_helpers.runs.train"} <= imported_modules(module)


NOTEBOOKS = sorted((PACKAGE.parent / "notebooks").glob("*.ipynb"))
# Chapter 7 shows the training command's two-worker mode, started by the run service's launcher:
# starting processes is the run service's job, and the chapter shows that job.
RUN_SERVICE_SHOWN = {("07b_memory_and_replication.ipynb", "vcd_helpers.runs.workers")}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_chapter_imports_the_run_service(path):
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    module = ast.parse("\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))))
    imported = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    reaching = sorted(m for m in imported if (m == "vcd_helpers.runs" or m.startswith("vcd_helpers.runs."))
                      and not any(path.name == page and (m == shown or m.startswith(shown + "."))
                                  for page, shown in RUN_SERVICE_SHOWN))
    assert not reaching, f"{path.name} imports {reaching}: the chapters teach from the library"


"""`make book` never reports success for a chapter it did not execute: a tiny book of the real
book's execution settings and extensions, with a notebook that raises, built twice, fails twice;
fixed, it builds, and a rebuild executes nothing (book/_ext/reexecute_failed.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _notebook(path: Path, source: str) -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A chapter"),
                                               nbformat.v4.new_code_cell(source)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def _book(directory: Path, source: str) -> Path:
    """A two-page book (a page and a notebook running ``source``) with the book's own execution
    settings and Sphinx extensions."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    tiny = {"title": "A tiny book", "execute": config["execute"] | {"timeout": 120},
            "sphinx": {"local_extensions": {name: str(ROOT / path)
                                            for name, path in config["sphinx"]["local_extensions"].items()}}}
    (directory / "_config.yml").write_text(yaml.safe_dump(tiny))
    (directory / "_toc.yml").write_text(yaml.safe_dump({"format": "jb-book", "root": "intro",
                                                       "chapters": [{"file": "chapter"}]}))
    (directory / "intro.md").write_text("# A tiny book\n\nOne chapter.\n")
    _notebook(directory / "chapter.ipynb", source)
    return directory


def _build(book: Path) -> subprocess.CompletedProcess:
    """`make book`'s command on the tiny book."""
    return subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(book), "-W", "--keep-going"],
                          capture_output=True, text=True, cwd=book)


def test_a_failed_chapter_fails_every_build_until_it_executes(tmp_path):
    book = _book(tmp_path, "raise ValueError('this chapter fails')")
    for attempt in (1, 2):
        build = _build(book)
        log = build.stdout + build.stderr
        assert build.returncode != 0, (attempt, log[-3000:])
        assert "Executing notebook failed" in log, (attempt, log[-3000:])
    _notebook(book / "chapter.ipynb", "print('this chapter runs')")
    build = _build(book)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert "this chapter runs" in (book / "_build" / "html" / "chapter.html").read_text()
    # Once it succeeded, the cache holds it: a rebuild reads and executes nothing.
    build = _build(book)
    assert build.returncode == 0 and "Executing notebook" not in build.stdout + build.stderr, build.stdout[-3000:]

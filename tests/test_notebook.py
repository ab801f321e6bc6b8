"""The chapters' helpers: a visible note where a chapter's timings were taken on a busy machine."""

from __future__ import annotations

import pytest

from vcd_helpers import notebook, objectives, timing
from vcd_helpers.notebook import show_source, source_lines

QUIET = timing.MachineLoad(load_average=2.3, busy_cores=1.1, own_cores=1.1, cores=2)  # as seen quiet
BUSY = timing.MachineLoad(load_average=3.4, busy_cores=2.0, own_cores=1.0, cores=2)


def _timed(machine):
    return timing.Timing((0.1, 0.1, 0.1), machine=machine)


def test_the_note_shows_only_when_a_timing_was_taken_on_a_busy_machine():
    assert notebook.load_note(_timed(QUIET), {"a": _timed(QUIET)}).data == ""
    note = notebook.load_note({"a": _timed(QUIET)}, [_timed(BUSY)]).data
    assert "Timed on a busy machine" in note and "load average 3.4 on 2 cores" in note
    # A verdict carries its timings' load too.
    verdicts = timing.compare({"a": _timed(BUSY), "b": _timed(BUSY)}, "a")
    assert "Timed on a busy machine" in notebook.load_note(verdicts).data


def test_the_note_refuses_to_judge_without_a_timing():
    with pytest.raises(ValueError, match="no Timing or RatioInterval"):
        notebook.load_note({"a": 1.0}, [])


# source_lines: a function's essential lines for a chapter's listing, refusing a stale marker.

def _example(a, b):
    """A docstring
    over two lines."""
    if a < 0:
        raise ValueError("a")
    total = a + b
    return total


def test_source_lines_drops_the_docstring_and_keeps_the_body():
    text = source_lines(_example, docstring=False)
    assert text.splitlines()[0] == "def _example(a, b):"
    assert "docstring" not in text and "return total" in text and "raise ValueError" in text


def test_source_lines_between_keeps_the_marked_lines_and_marks_the_cuts():
    lines = source_lines(_example, docstring=False, between=("total =", "return total")).splitlines()
    assert lines == ["def _example(a, b):", "    ...", "    total = a + b", "    return total"]


def test_source_lines_refuses_a_missing_marker():
    with pytest.raises(ValueError, match="no lines from"):
        source_lines(_example, between=("no such line", "return"))


def test_the_chapter_3_listings_still_find_their_lines():
    text = source_lines(objectives.fit_diagonal_gaussian, docstring=False,
                        between=("@tf.function", "return loc.read_value()"))
    assert "encoder_surrogate_loss(" in text and "check_positive_int" not in text
    assert show_source(_example).data == source_lines(_example)

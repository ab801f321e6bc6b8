"""The chapters' helpers: a visible note where a chapter's timings were taken on a busy machine."""

from __future__ import annotations

import pytest

from vcd_helpers import notebook, timing

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

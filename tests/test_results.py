"""vcd_helpers.results: reading a run's files back when a full disk or a kill has cut them."""

from __future__ import annotations

import pytest

from vcd_helpers import results as layout


def test_a_launch_log_cut_mid_line_loses_that_line_alone(tmp_path):
    (tmp_path / layout.LAUNCHES_FILE).write_bytes(
        b'{"time": "2026", "code": {"commit": null, "dirty": false}}\n{"time": "20\n'
        b'{"time": "2027", "code": {"commit": "abc", "dirty": false}}\n')
    warnings: list[str] = []
    launches = layout.read_launches(tmp_path, warnings)
    assert [launch["time"] for launch in launches] == ["2026", "2027"]
    assert len(warnings) == 1 and "line(s) 2 damaged" in warnings[0]


def test_a_damaged_results_file_is_named(tmp_path):
    (tmp_path / layout.RESULTS_FILE).write_text('{"name": "cut')
    with pytest.raises(layout.RunDirectoryError, match=str(tmp_path / layout.RESULTS_FILE)):
        layout.read_results(tmp_path)
    (tmp_path / layout.RESULTS_FILE).unlink()
    with pytest.raises(layout.RunDirectoryError, match="has no results.json: the run has not finished"):
        layout.read_results(tmp_path)

"""runs.directory: the run service's writers and readers of a run directory, when a full disk or a
kill has cut their files."""

from __future__ import annotations

import numpy as np

from vcd_helpers import results as layout
from vcd_helpers.runs import directory


def test_a_damaged_saved_evaluation_batch_is_computed_again(tmp_path):
    good = tmp_path / "batch-00000.npz"
    np.savez(good, estimates=np.array([-90.0, -91.0]), seconds=2.5)
    (tmp_path / "batch-00001.npz").write_bytes(b"")  # emptied by a full disk
    (tmp_path / "batch-00002.npz").write_bytes(good.read_bytes()[:40])  # cut short
    done, seconds = directory.read_partial(tmp_path)
    assert list(done) == [0] and done[0].tolist() == [-90.0, -91.0] and seconds == 2.5


def test_a_record_appended_to_a_cut_line_keeps_a_line_of_its_own(tmp_path):
    path = tmp_path / "launches.jsonl"
    path.write_bytes(b'{"time": "2026", "code": {"commit": null, "dirty": false}}\n{"time": "20')  # cut by a full disk
    directory.append_jsonl(path, {"time": "2027", "code": {"commit": "abc", "dirty": False}})
    warnings: list[str] = []
    launches = layout.read_launches(tmp_path, warnings)
    assert [launch["time"] for launch in launches] == ["2026", "2027"]
    assert len(warnings) == 1 and "line(s) 2 damaged" in warnings[0]


def test_checkpoint_steps_are_read_from_the_file_names(tmp_path):
    for name in ("ckpt-10.index", "ckpt-20.index", "ckpt-20.data-00000-of-00001", "ckpt-x.index", "checkpoint"):
        (tmp_path / name).write_text("")
    assert directory.checkpoint_steps(tmp_path) == {10, 20}
    assert directory.checkpoint_steps(tmp_path, "ckpt-*.data-*") == {20}

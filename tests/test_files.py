"""vcd_helpers.files: a file is written whole or not at all."""

from __future__ import annotations

import errno
import json
import os

import pytest

from vcd_helpers import files


def test_files_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    path.write_text('{"old": true}')

    def full_disk(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError) as raised:
        files.write_atomic(path, '{"new": true}')
    # The system names no file for a full disk: the error names the one being written.
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert json.loads(path.read_text()) == {"old": True}
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind

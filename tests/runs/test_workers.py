"""runs.workers: a worker's wait for its peers, and the local launcher of one training command per
worker (no process is started: Popen is replaced)."""

from __future__ import annotations

import os

import pytest

from vcd_helpers.runs import workers


@pytest.mark.parametrize("given, expected", [({}, "60.0"), ({"VCD_WORKER_TIMEOUT": "7"}, "7")])
def test_workers_launched_together_wait_a_minute_for_each_other(tmp_path, monkeypatch, given, expected):
    started = []
    monkeypatch.setattr(workers.subprocess, "Popen", lambda command, env, **kw: started.append(env))
    workers.launch_local_workers(tmp_path / "c.json", [tmp_path / "a", tmp_path / "b"],
                                 env={"PATH": os.environ["PATH"], **given})
    assert [env["VCD_WORKER_TIMEOUT"] for env in started] == [expected, expected]

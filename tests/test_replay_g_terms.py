"""tools/replay_g_terms.py: a replay trains exactly the run it replays (its metrics rows equal the
run's, and the first differing row is reported), and it measures g's terms without changing the training."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from vcd_helpers.config import load_config
from vcd_helpers.runs.train import train_run

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("replay_g_terms", ROOT / "tools" / "replay_g_terms.py")
replay_g_terms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay_g_terms)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    config = load_config("tiny")
    path = tmp_path_factory.mktemp("replay") / "run"
    train_run(config, path, progress=False)
    return config, path / "metrics.csv"


@pytest.mark.slow  # retrains a run's first steps
def test_a_replay_equals_the_run_and_measures_every_interval(tiny_run):
    config, metrics = tiny_run
    out, comparison = replay_g_terms.replay(config, 40, 20, metrics)
    # every logging window of the 40 steps, identical as text
    assert comparison == {"rows_compared": 4, "rows_identical": 4, "first_difference": None,
                          "max_relative_difference": 0.0}
    assert [row[0] for row in out] == ["0", "20", "40"]
    values = {name: float(v) for name, v in zip(replay_g_terms.COLUMNS, out[0])}
    # At step 0 the baselines are zero, so |g - b| is |g|; the quadratic term is positive.
    assert values["baseline_p50"] == 0 and values["quadratic_p50"] > 0
    assert 0 <= values["floor_share"] <= 1 and values["epoch"] == 0


@pytest.mark.slow  # retrains a run's first steps
def test_a_replay_reports_the_first_row_that_differs_from_the_run(tiny_run, tmp_path):
    config, metrics = tiny_run
    rows = list(csv.reader(metrics.open()))
    rows[2][2] = repr(float(rows[2][2]) * (1 + 1e-6))  # the second window's encoder loss, slightly off
    changed = tmp_path / "metrics.csv"
    with changed.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    _, comparison = replay_g_terms.replay(config, 40, 20, changed)
    assert comparison["rows_identical"] == 3 and comparison["first_difference"] == 20
    assert comparison["max_relative_difference"] == pytest.approx(1e-6, rel=1e-3)


def test_the_summary_row_reads_the_terms():
    terms = {"log_joint": np.array([-100.0, -200.0, -300.0]), "quadratic": np.array([1.0, 2.0, 30.0]),
             "baseline": np.array([-99.0, -198.0, 0.0]), "scale": np.array([[1e-4, 1.0], [1.0, 1.0], [1.0, 1.0]])}
    row = dict(zip(replay_g_terms.COLUMNS, replay_g_terms.summary(200, 100, terms, 1e-4)))
    assert row["epoch"] == "2" and row["log_joint_p50"] == "-200" and row["quadratic_max"] == "30"
    assert row["abs_g_minus_b_p50"] == "0" and row["baseline_p50"] == "-99"
    assert float(row["floor_share"]) == pytest.approx(1 / 6, rel=1e-5)


@pytest.mark.parametrize("argv, named", [
    (["bogus_run"], "'bogus_run'"), (["vcd_local_e100_s0", "--epochs", "nan"], "'nan'"),
    (["vcd_local_e100_s0", "--epochs", "inf"], "'inf'"), (["vcd_local_e100_s0", "--epochs", "0"], "'0'"),
    (["vcd_local_e100_s0", "--epochs", "-1"], "'-1'"), (["vcd_local_e100_s0", "--every", "0"], "'0'"),
    (["vcd_local_e100_s0", "--every", "-100"], "'-100'"), (["vcd_local_e100_s0", "--every", "30"], "--every 30"),
    # Fewer measurements than the committed file holds (101): refused, the file untouched.
    (["vcd_local_e100_s0", "--epochs", "2"], "would replace the 101 measurements"),
    (["vcd_local_e100_s0", "vcd_local_e100_s1", "--epochs", "0.4"], "would replace the 101 measurements"),
])
def test_a_bad_replay_is_refused_before_it_trains_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, named):
    out = tmp_path / "g_terms"
    out.mkdir()
    for name in ("vcd_local_e100_s0", "vcd_local_e100_s1"):
        for suffix in (".csv", ".json"):
            (out / f"{name}{suffix}").write_bytes((replay_g_terms.OUT_DIR / f"{name}{suffix}").read_bytes())
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    monkeypatch.setattr(replay_g_terms, "OUT_DIR", out)
    monkeypatch.setattr(replay_g_terms, "replay", lambda *args: pytest.fail("trained despite a bad argument"))
    with pytest.raises(SystemExit) as exit_:
        replay_g_terms.main(argv)
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("tools/replay_g_terms.py: error:") and named in error, error
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before

"""Comparing runs: t intervals, paired differences, and reading a finished run back."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vcd_helpers import analysis
from vcd_helpers.config import load_config
from vcd_helpers.results import COMMITTED_RESULTS
from vcd_helpers.runs.evaluate import evaluate_run
from vcd_helpers.runs.train import train_run


def test_t_interval_of_three_values():
    interval = analysis.mean_interval([1.0, 2.0, 3.0])
    assert analysis.t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-3)
    assert interval.mean == 2.0 and interval.half_width == pytest.approx(4.3027 / np.sqrt(3), abs=1e-3)
    with pytest.raises(ValueError, match="need at least two finite numbers"):
        analysis.mean_interval([1.0])


def test_one_run_against_seeds_allows_the_spread_of_one_more_seed_about_their_mean():
    # seeds -1, 0, +1: mean 0, sd 1; one more run about their mean spreads as sd x sqrt(1 + 1/3)
    interval = analysis.against_seeds(2.5, [1.0, -1.0, 0.0])
    half = 4.3027 * np.sqrt(4 / 3)
    assert interval.mean == 2.5 and interval.n == 3
    assert (interval.low, interval.high) == pytest.approx((2.5 - half, 2.5 + half), abs=1e-3)
    assert analysis.against_seeds(2.5, [0.0, 2.0, 4.0]).mean == 0.5  # minus the seeds' mean, not plus
    assert analysis.against_seeds(0.0, [1.0, 3.0], confidence=0.9).half_width == pytest.approx(
        6.3138 * np.sqrt(2) * np.sqrt(1.5), abs=1e-3)  # t(1) at 0.95, sd sqrt(2)
    with pytest.raises(ValueError, match="need at least two finite numbers"):
        analysis.against_seeds(0.0, [1.0])
    with pytest.raises(ValueError, match="single=nan is invalid"):
        analysis.against_seeds(float("nan"), [1.0, 2.0])


def test_one_run_of_another_method_against_seeds_takes_its_own_spread():
    # seeds -1, 0, +1 (sd 1); the single run assumed to spread with sd 2: t(2) x sqrt(4 + 1/3)
    interval = analysis.against_seeds(2.5, [1.0, -1.0, 0.0], single_sd=2.0)
    assert interval.mean == 2.5 and interval.n == 3
    assert interval.half_width == pytest.approx(4.3027 * np.sqrt(4 + 1 / 3), abs=1e-3)
    assert analysis.against_seeds(2.5, [1.0, -1.0, 0.0], single_sd=1.0) == pytest.approx(
        analysis.against_seeds(2.5, [1.0, -1.0, 0.0]))  # its own spread the seeds': the default
    assert analysis.against_seeds(0.0, [1.0, 3.0], confidence=0.9, single_sd=0.0).half_width == pytest.approx(
        6.3138 * 1.0, abs=1e-3)  # no spread of its own: t(1) at 0.95 x sd sqrt(2) / sqrt(2)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"single_sd={bad!r} is invalid: must be a finite number >= 0"):
            analysis.against_seeds(0.0, [1.0, 2.0], single_sd=bad)


def test_two_single_runs_differ_by_up_to_the_seed_spread_times_root_two():
    # seeds -1, 0, +1: sd 1; two runs each with variance 1 differ with sd sqrt(2)
    assert analysis.between_two_runs([1.0, -1.0, 0.0]) == pytest.approx(4.3027 * np.sqrt(2), abs=1e-3)
    same_spread = analysis.between_two_runs([5.0, 3.0, 4.0])  # the spread, not the level
    assert same_spread == pytest.approx(analysis.between_two_runs([1.0, -1.0, 0.0]))
    assert analysis.between_two_runs([1.0, 3.0], confidence=0.9) == pytest.approx(6.3138 * 2, abs=1e-3)  # sd sqrt(2)
    with pytest.raises(ValueError, match="need at least two finite numbers"):
        analysis.between_two_runs([1.0])


def test_pairing_removes_the_spread_shared_by_both_runs():
    rng = np.random.default_rng(0)
    difficulty = rng.normal(-100, 20, size=5000)           # some images are harder for every model
    a = difficulty + rng.normal(0.0, 1.0, size=5000)
    b = difficulty + 0.5 + rng.normal(0.0, 1.0, size=5000)  # b is better by 0.5 nats
    paired = analysis.paired_difference(a, b)
    assert paired.low < -0.5 < paired.high and paired.half_width < 0.1
    unpaired = analysis.mean_interval(a).half_width + analysis.mean_interval(b).half_width
    assert unpaired > 10 * paired.half_width
    with pytest.raises(ValueError, match="needs the same images"):
        analysis.paired_difference(a, b[:10])


def test_an_interval_prints_its_mean_then_its_bounds_and_says_whether_it_excludes_zero():
    interval = analysis.Interval(1.234, -0.5, 2.968, 3)
    assert f"{interval:+.2f}" == "+1.23 [-0.50, +2.97]" and f"{interval:.1f}" == "1.2 [-0.5, 3.0]"
    assert f"{interval}" == str(interval)  # no format: the tuple's own text
    assert not interval.excludes_zero
    assert analysis.Interval(-1.0, -2.0, -0.1, 3).excludes_zero and analysis.Interval(1.0, 0.1, 2.0, 3).excludes_zero
    assert not analysis.Interval(1.0, 0.0, 2.0, 3).excludes_zero  # a bound on zero does not exclude it


def test_minus_an_interval_is_the_interval_of_the_opposite_difference():
    a, b = np.array([1.0, 2.5, 0.5, 3.0]), np.array([0.2, 1.0, 0.9, 1.1])
    assert -analysis.paired_difference(a, b) == analysis.paired_difference(b, a)
    assert -analysis.Interval(1.5, 0.5, 3.0, 4) == analysis.Interval(-1.5, -3.0, -0.5, 4)


def test_two_runs_pair_on_their_per_image_estimates():
    a, b = (analysis.load_run(COMMITTED_RESULTS / name) for name in ("vcd_scheduled_e100_s0", "vae_e100_s0"))
    expected = analysis.paired_difference(np.load(a.path / "per_example_log_likelihood.npy"),
                                          np.load(b.path / "per_example_log_likelihood.npy"), confidence=0.9)
    assert analysis.paired_runs(a, b, confidence=0.9) == expected and expected.mean > 0  # a - b: VCD above the VAE
    assert analysis.paired_runs(b, a).mean == pytest.approx(-analysis.paired_runs(a, b).mean)
    with pytest.raises(ValueError, match="run vae_e100_s0 has no per-image estimates"):
        analysis.paired_runs(a, dataclasses.replace(b, per_example=None))


@pytest.mark.slow
def test_a_finished_run_reads_back_with_its_curve_and_estimates(tmp_path):
    config = load_config("tiny", train_examples=500, steps=20, checkpoint_every_steps=10, curve_every_epochs=1,
                         control_variate={"kind": "local"}, evaluation={"num_examples": 12})
    train_run(config.replace(execution={"jit_compile": False}), tmp_path / "run", progress=False)
    run = analysis.load_run(tmp_path / "run")
    assert run.epochs == 2 and list(run.curve["step"]) == [10, 20] and run.per_example.shape == (12,)
    assert run.evaluation()["per_example"].shape == (12,) and run.local_baseline().shape == (500,)
    with pytest.raises(FileNotFoundError, match="--proposal encoder"):
        run.evaluation("encoder")
    evaluate_run(tmp_path / "run", proposal="encoder")
    encoder = run.evaluation("encoder")
    assert encoder["proposal"] == "encoder" and encoder["per_example"].shape == (12,)


def test_a_metric_mean_covers_the_rows_of_its_epochs():
    run = analysis.load_run(COMMITTED_RESULTS / "vcd_scheduled_e100_s0")  # 500 steps per epoch, a row per 100
    steps, accept = run.metrics["step"], run.metrics["accept_rate"]
    assert run.metric_mean("accept_rate", 90, 100) == pytest.approx(accept[steps > 45_000].mean())
    assert run.metric_mean("accept_rate", 0, 1) == pytest.approx(accept[steps <= 500].mean())
    with pytest.raises(ValueError, match=r"epochs \(100, 101\] hold no metrics row"):
        run.metric_mean("accept_rate", 100, 101)


def test_a_committed_robust_evaluation_reads_back_by_its_settings():
    run = analysis.load_run(COMMITTED_RESULTS / "vcd_scheduled_e800_s0")
    robust = run.evaluation(num_starts=4, step_size_per_chain=True, num_examples=1000)
    assert robust["num_examples"] == 1000 and robust["per_example"].shape == (1000,)
    # Not the paper's estimates of the same images: another file, other numbers.
    assert not np.array_equal(robust["per_example"], run.per_example[:1000])
    with pytest.raises(FileNotFoundError, match="num_starts=7"):
        run.evaluation(num_starts=7, step_size_per_chain=True, num_examples=1000)

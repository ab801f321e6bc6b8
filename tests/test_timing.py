"""The one timer: warm-up calls untimed, repeats timed, medians per unit, variants interleaved."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers import data, timing


def test_warm_up_calls_are_not_timed_and_every_output_is_kept():
    calls = []

    def fn():
        calls.append(len(calls))
        time.sleep(0.05 if len(calls) == 1 else 0.001)  # the first call "compiles"
        return {"value": tf.constant(float(len(calls)))}

    timed = timing.time_calls(fn, repeats=3, units=2)
    assert len(calls) == 4 and len(timed.seconds) == 3
    assert max(timed.seconds) < 0.04  # the slow first call was the warm-up
    assert timed.median == pytest.approx(float(np.median(timed.seconds)) / 2)
    assert [o["value"] for o in timed.outputs] == [2.0, 3.0, 4.0]  # host copies, not tensors
    assert timed.median_output in timed.outputs
    low, high = timed.spread_ms
    assert low <= timed.median_ms <= high and "median of 3" in str(timed)


def test_variants_are_timed_turn_by_turn_each_round_starting_with_the_next():
    order = []
    timings = timing.time_alternately({name: (lambda name=name: order.append(name)) for name in "abc"},
                                      repeats=4, warmup=0)
    assert order == list("abc" "bca" "cab" "abc") and set(timings) == {"a", "b", "c"}


def test_every_timing_says_what_the_machine_did_meanwhile(monkeypatch):
    def spin():  # one core busy for 30 ms of this process's CPU time
        end = time.process_time() + 0.03
        while time.process_time() < end:
            pass

    timings = timing.time_alternately({"a": spin, "b": spin}, repeats=3, warmup=0)
    machine = timings["a"].machine
    assert machine is timings["b"].machine and machine.cores == os.cpu_count()
    # One thread spinning: some share of one core, however small a busy machine leaves it (0.27
    # was seen with two other processes spinning on 2 cores), never much more than one.
    assert 0 < machine.own_cores <= 1.5, machine
    if machine.busy_cores is not None:  # Linux: the machine's busy cores include this process's
        assert machine.own_cores - 0.3 <= machine.busy_cores <= machine.cores + 1e-6, machine
    verdict = timing.compare(timings, "a")["b"]
    assert verdict.machine is machine and str(machine) in str(verdict)
    # Busy means other processes kept half a core busy, whatever the load average, which counts
    # this process's own threads (2.3 on 2 cores was seen on a quiet machine); without /proc/stat,
    # a load average above the core count.
    quiet = timing.MachineLoad(load_average=2.3, busy_cores=1.1, own_cores=1.1, cores=2)
    loaded = timing.MachineLoad(load_average=2.1, busy_cores=2.0, own_cores=1.0, cores=2)
    assert not quiet.busy and loaded.busy and not timing.MachineLoad(None, None, 1.0, 2).busy
    assert timing.MachineLoad(load_average=1.9, busy_cores=1.5, own_cores=1.0, cores=2).busy  # others: 0.5
    assert not timing.MachineLoad(load_average=1.9, busy_cores=1.4, own_cores=1.0, cores=2).busy
    assert timing.MachineLoad(2.1, None, 1.0, 2).busy and not timing.MachineLoad(2.0, None, 1.0, 2).busy
    assert str(loaded) == "load average 2.1 on 2 cores; 2.0 cores busy, 1.0 of them by the timing"
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert timing.time_calls(spin, repeats=1, warmup=0).machine.load_average == 9.0


def test_cores_used_is_cpu_time_over_wall_time():
    def spin():  # busy on one core until it has used 30 ms of CPU, however loaded the machine is
        end = time.process_time() + 0.03
        while time.process_time() < end:
            pass

    busy = timing.time_calls(spin, repeats=2, warmup=0)
    idle = timing.time_calls(lambda: time.sleep(0.03), repeats=2, warmup=0)
    # How much of a core the spin gets depends on what else runs: test the definition, not a share.
    assert sum(busy.cpu_seconds) >= 0.06 and busy.cores_used <= 1.5  # one thread: at most one core (+ noise)
    assert busy.cores_used == pytest.approx(sum(busy.cpu_seconds) / sum(busy.seconds))
    assert sum(idle.seconds) >= 0.06 and sum(idle.cpu_seconds) < 0.5 * sum(busy.cpu_seconds)
    assert idle.cores_used < busy.cores_used


@pytest.mark.parametrize("options, message", [
    (dict(repeats=0), "repeats=0 is invalid"),
    (dict(units=1.5), "units=1.5 is invalid"),
    (dict(warmup=-1), "warmup=-1 is invalid"),
])
def test_bad_timing_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        timing.time_calls(lambda: None, **options)


def test_a_stopwatch_starts_from_its_offset_and_leaves_work_out():
    clock = timing.Stopwatch(offset=100.0)
    time.sleep(0.02)
    clock.leave_out(0.01)
    assert 100.005 < clock.elapsed < 100.5


def test_input_pipeline_rate():
    assert data.batches_per_second(iter(range(1000)), num_batches=50) > 0


def _alternated(seconds: dict[str, np.ndarray], units: int = 1) -> dict[str, timing.Timing]:
    return {name: timing.Timing(tuple(float(s) for s in values), units) for name, values in seconds.items()}


def test_compare_finds_no_difference_between_identical_variants():
    rng = np.random.default_rng(1)
    timings = _alternated({"a": 0.040 * rng.lognormal(0, 0.1, 20), "b": 0.040 * rng.lognormal(0, 0.1, 20)})
    result = timing.compare(timings, baseline="a")
    assert set(result) == {"a", "b"}
    assert (result["a"].ratio, result["a"].low, result["a"].high, result["a"].differs) == (1.0, 1.0, 1.0, False)
    b = result["b"]
    assert b.low < 1 < b.high and not b.differs and b.verdict == "no difference resolved"
    assert b.low <= b.ratio <= b.high and b.rounds == 20 and b.confidence == 0.95
    assert str(b).endswith("(95% interval, 20 rounds): no difference resolved"), str(b)
    # Fewer rounds than an interval needs: the result says what its bracket is.
    few = timing.compare(_alternated({"a": [0.04, 0.05, 0.04], "b": [0.05, 0.04, 0.06]}), baseline="a")["b"]
    assert str(few).endswith("(only 3 rounds: about their range, not a 95% interval): no difference resolved"), str(few)
    assert timing.MIN_INTERVAL_ROUNDS == 10


def test_compare_resolves_a_variant_twice_as_slow():
    rng = np.random.default_rng(2)
    fast = 0.010 * rng.lognormal(0, 0.15, 15)
    slow = 0.020 * rng.lognormal(0, 0.15, 15)
    result = timing.compare(_alternated({"fast": fast, "slow": slow}), baseline="fast")
    slower = result["slow"]
    assert slower.differs and slower.verdict == "slower" and 1 < slower.low < 2 < slower.high < 2.5
    faster = timing.compare(_alternated({"fast": fast, "slow": slow}), baseline="slow")["fast"]
    assert faster.differs and faster.verdict == "faster" and faster.low < 0.5 < faster.high < 1
    assert timing.compare(_alternated({"fast": fast, "slow": slow}), baseline="fast", seed=0) == result  # seeded


def test_compare_pairs_the_calls_by_round():
    # The machine's speed drifts threefold over the rounds and meets both variants alike in each
    # round: the per-round ratio cancels it, where the two medians alone could not.
    rounds = 12
    rng = np.random.default_rng(3)
    drift = np.linspace(1, 3, rounds)
    rng.shuffle(drift)
    a = 0.030 * drift * rng.lognormal(0, 0.01, rounds)
    b = 0.031 * drift * rng.lognormal(0, 0.01, rounds)
    b_result = timing.compare(_alternated({"a": a, "b": b}), baseline="a")["b"]
    assert b_result.differs and 1.02 < b_result.low < 31 / 30 < b_result.high < 1.045, b_result


def test_compare_works_per_unit_of_work():
    seconds = np.full(5, 0.1) * np.array([1.0, 1.01, 0.99, 1.02, 0.98])
    timings = {"one": timing.Timing(tuple(seconds), units=1), "ten": timing.Timing(tuple(seconds), units=10)}
    ten = timing.compare(timings, baseline="one")["ten"]
    assert ten.ratio == pytest.approx(0.1) and ten.high == pytest.approx(0.1) and ten.differs


def test_coverage_of_compare_is_near_its_confidence():
    rng = np.random.default_rng(4)
    covered = 0
    for k in range(200):
        timings = _alternated({"a": rng.lognormal(0, 0.2, 20), "b": rng.lognormal(0, 0.2, 20)})
        covered += not timing.compare(timings, baseline="a", resamples=2000, seed=k)["b"].differs
    assert 0.85 <= covered / 200 <= 1.0, covered


@pytest.mark.parametrize("timings, options, message", [
    (dict(a=[1.0] * 5, b=[1.0] * 5), dict(baseline="c"), r"baseline='c' is invalid: must be one of the timed variants \('a', 'b'\)"),
    (dict(a=[1.0] * 2, b=[1.0] * 2), dict(baseline="a"), "2 rounds are too few: compare needs at least 3"),
    (dict(a=[1.0] * 5, b=[1.0] * 4), dict(baseline="a"), r"rounds per variant \{'a': 5, 'b': 4\} are invalid"),
    (dict(a=[1.0] * 5, b=[1.0, 0.0, 1.0, 1.0, 1.0]), dict(baseline="a"), "variant 'b' has call times"),
    (dict(a=[1.0] * 5), dict(baseline="a", confidence=1.5), "confidence=1.5 is invalid"),
    (dict(a=[1.0] * 5), dict(baseline="a", resamples=0), "resamples=0 is invalid"),
])
def test_bad_comparisons_are_named(timings, options, message):
    with pytest.raises(ValueError, match=message):
        timing.compare(_alternated({k: np.array(v) for k, v in timings.items()}), **options)


def test_a_verdict_reads_as_a_clause_for_the_prose():
    slower = timing.RatioInterval(1.84, 1.80, 1.90, 0.95, 10)
    faster = timing.RatioInterval(0.5, 0.4, 0.6, 0.95, 10)
    same = timing.RatioInterval(0.99, 0.97, 1.02, 0.95, 10)
    assert slower.phrase("eager", "XLA") == \
        "eager is slower than XLA (1.840 x the time, interval [1.800, 1.900], clear of 1)"
    assert faster.phrase("k = 10", "k = 1").startswith("k = 10 is faster than k = 1 (0.500 x the time")
    assert same.phrase("k = 10", "k = 1") == \
        "k = 10 and k = 1 do not differ beyond the noise (0.990 x the time, interval [0.970, 1.020], which includes 1)"
    much_faster = timing.RatioInterval(0.0123, 0.0121, 0.0125, 0.95, 10)  # not "0.01 x, interval [0.01, 0.01]"
    assert much_faster.phrase("XLA", "eager").endswith("(0.012 x the time, interval [0.012, 0.013], clear of 1)")
    # A narrow interval is not printed as a point (a reader took [1.02, 1.02] for no spread at all).
    narrow = timing.RatioInterval(1.0213, 1.0211, 1.0214, 0.95, 10)
    assert narrow.phrase("a", "b").endswith("(1.0213 x the time, interval [1.0211, 1.0214], clear of 1)")


@pytest.mark.parametrize("interval, shown", [
    # Two significant digits at least: a 80-fold speed-up is not "0.01 x [0.01, 0.01]".
    ((0.0123, 0.0121, 0.0125), "0.012 x [0.012, 0.013]"),
    # A resolved interval never shows a bound of 1.000: its digits show why it is resolved.
    ((0.994, 0.981, 0.9996), "0.9940 x [0.9810, 0.9996]"),
    ((1.0004, 1.0002, 1.0009), "1.0004 x [1.0002, 1.0009]"),
    # An unresolved one, or an ordinary one, keeps three decimals.
    ((0.994, 0.981, 1.002), "0.994 x [0.981, 1.002]"),
    ((1.85, 1.80, 1.90), "1.850 x [1.800, 1.900]"),
    # An interval of nonzero width gets the digits that show its width.
    ((1.0213, 1.0211, 1.0214), "1.0213 x [1.0211, 1.0214]"),
    ((0.50004, 0.50001, 0.50008), "0.5000 x [0.5000, 0.5001]"),
    ((1.0213, 1.0211, 1.0216), "1.021 x [1.021, 1.022]"),  # three decimals already show a width
])
def test_a_ratio_is_printed_with_the_digits_its_verdict_needs(interval, shown):
    assert str(timing.RatioInterval(*interval, 0.95, 12)).startswith(shown + " (95% interval, 12 rounds)")


def test_the_baseline_prints_as_the_baseline_not_as_a_verdict():
    timings = _alternated({"a": np.array([1.0, 1.1, 0.9, 1.0, 1.2]), "b": np.array([2.0, 2.1, 1.9, 2.2, 2.0])})
    result = timing.compare(timings, baseline="a")
    assert result["a"].is_baseline and not result["b"].is_baseline
    assert str(result["a"]) == "1 x: the baseline itself" and result["a"].phrase("a", "a") == "a is the baseline"
    assert str(result["b"]).startswith("2.0") and result["b"].verdict == "slower"

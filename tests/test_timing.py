"""The one timer: warm-up calls untimed, repeats timed, medians per unit, variants interleaved."""

from __future__ import annotations

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


def test_variants_are_timed_turn_by_turn():
    order = []
    timings = timing.time_alternately({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                      repeats=2, warmup=0)
    assert order == ["a", "b", "a", "b"] and set(timings) == {"a", "b"}


def test_cores_used_is_cpu_time_over_wall_time():
    def spin():  # busy on one core until it has used 30 ms of CPU, however loaded the machine is
        end = time.process_time() + 0.03
        while time.process_time() < end:
            pass

    busy = timing.time_calls(spin, repeats=2, warmup=0)
    idle = timing.time_calls(lambda: time.sleep(0.03), repeats=2, warmup=0)
    assert sum(busy.cpu_seconds) >= 0.06 and busy.cores_used <= 1.5  # one thread: at most one core (+ noise)
    assert idle.cores_used < 0.3 < busy.cores_used


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

"""The emulated device: its waits (once per call, of the configured length), results unchanged,
bad values refused. No speed is asserted beyond 'at least the configured wait elapsed'."""

import math
import time

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers import emulation
from vcd_helpers.loops import make_training_loop


class Recorder:
    def __init__(self):
        self.waits = []

    def __call__(self, seconds):
        self.waits.append(seconds)


class CountingTrainer:
    """A stand-in for a trainer: its state moves every step, so each step's metrics differ."""

    metric_names = ("loss", "seen")

    def __init__(self):
        self.total = tf.Variable(0.0)

    @tf.function
    def train_step(self, index, x):
        self.total.assign_add(tf.reduce_sum(x))
        return {"loss": self.total * 0.5, "seen": tf.cast(tf.reduce_sum(index), tf.float32)}


def batches():
    x = np.arange(8 * 3 * 4, dtype=np.float32).reshape(8, 3, 4) / 10
    index = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    return tf.data.Dataset.from_tensor_slices((index, x)).repeat()


def test_one_wait_of_the_call_latency_per_call_and_results_unchanged():
    recorder = Recorder()
    device = emulation.EmulatedDevice(0.003, sleep=recorder)
    calls = []
    for i in range(4):
        assert device.run(lambda a, b=0: (a, b, calls.append(a)), i, b=2)[:2] == (i, 2)
    assert calls == [0, 1, 2, 3]
    assert recorder.waits == [0.003] * 4 and device.calls == 4
    assert device.waited == pytest.approx(0.012)


def test_transfers_cost_latency_plus_bytes_over_bandwidth_each_way():
    recorder = Recorder()
    device = emulation.EmulatedDevice(0.01, feed_latency=0.002, bandwidth=1000.0, sleep=recorder)
    assert device.transfer_seconds(0) == 0.0
    assert device.transfer_seconds(500) == pytest.approx(0.502)
    device.run(lambda: tf.constant(1.0), bytes_in=100, bytes_out=20)
    # before the call: λ + the infeed; after it: the outfeed
    assert recorder.waits == pytest.approx([0.01 + 0.002 + 0.1, 0.002 + 0.02])
    device.run(lambda: None)  # no bytes: no transfer, only λ
    assert recorder.waits[2:] == pytest.approx([0.01])
    assert device.calls == 2


def test_zero_latency_never_waits():
    recorder = Recorder()
    device = emulation.EmulatedDevice(0.0, sleep=recorder)
    device.run(lambda: 1)
    assert recorder.waits == [] and device.calls == 1 and device.waited == 0.0


def test_a_real_call_takes_at_least_the_latency():
    device = emulation.EmulatedDevice(0.02)
    start = time.perf_counter()
    device.run(lambda: None)
    assert time.perf_counter() - start >= 0.02


@pytest.mark.parametrize("name, value", [("call_latency", -0.001), ("call_latency", math.inf),
                                         ("call_latency", float("nan")), ("call_latency", "1ms"),
                                         ("call_latency", True), ("feed_latency", -1)])
def test_bad_latency_raises_naming_the_value(name, value):
    with pytest.raises(ValueError, match=rf"{name}={value!r}".replace("(", r"\(").replace(")", r"\)")):
        emulation.EmulatedDevice(**{name: value})


@pytest.mark.parametrize("value", [0, -5.0, float("nan"), "fast"])
def test_bad_bandwidth_raises_naming_the_value(value):
    with pytest.raises(ValueError, match=f"bandwidth={value!r}"):
        emulation.EmulatedDevice(bandwidth=value)


def test_emulated_loop_returns_the_real_loops_results_with_one_wait_per_call():
    recorder = Recorder()
    device = emulation.EmulatedDevice(0.005, feed_latency=0.001, bandwidth=1e6, sleep=recorder)
    emulated = emulation.emulated_training_loop(CountingTrainer(), batches(), device)
    plain_trainer = CountingTrainer()
    plain, plain_iterator = make_training_loop(plain_trainer), iter(batches())
    for k in (3, 1, 5, 0):
        got = emulated(k)
        want = plain(plain_iterator, tf.constant(k))
        assert set(got) == {"loss", "seen"}
        for name in got:
            assert got[name].shape == (k,)
            np.testing.assert_array_equal(got[name].numpy(), want[name].numpy())
    assert device.calls == 4
    batch_bytes = 3 * 4 + 3 * 4 * 4  # int32 index [3] + float32 x [3, 4]
    assert emulated.batch_bytes == batch_bytes and emulated.metric_bytes == 8
    expected = []
    for k in (3, 1, 5, 0):
        expected.append(0.005 + (0.001 + k * batch_bytes / 1e6 if k else 0.0))
        if k:
            expected.append(0.001 + k * 8 / 1e6)
    assert recorder.waits == pytest.approx(expected)


@pytest.mark.parametrize("k", [-1, 1.5, True])
def test_emulated_loop_refuses_bad_k(k):
    loop = emulation.emulated_training_loop(CountingTrainer(), batches(), emulation.EmulatedDevice())
    with pytest.raises(ValueError, match=f"k={k!r}"):
        loop(k)


def test_element_bytes_needs_known_shapes():
    assert emulation.element_bytes(batches()) == 3 * 4 + 48
    ragged = tf.data.Dataset.range(5).batch(2)
    with pytest.raises(ValueError, match="fully known"):
        emulation.element_bytes(ragged)


def test_per_step_model_and_fit_recover_known_values():
    k = np.array([1, 2, 5, 10, 20, 50] * 3)
    latency = np.repeat([0.0, 0.005, 0.02], 6)
    tau, own = 0.004, 0.0003
    t = emulation.per_step_model(k, 0.0, tau) + (latency + own) / k
    for value in (0.0, 0.005, 0.02):
        pick = latency == value
        np.testing.assert_allclose(emulation.per_step_model(k[pick], value + own, tau), t[pick])
    fitted_tau, fitted_own = emulation.fit_per_call(k, t, latency)
    assert fitted_tau == pytest.approx(tau) and fitted_own == pytest.approx(own, abs=1e-12)
    # A 100 ms wait that overshoots by 2% at k = 1 (a sleep's overshoot): the fit weighs residuals
    # relative to each point, so the short points still set λ₀ (unweighted, 0.3 ms came out as 1.3 ms).
    k2 = np.array([1, 2, 5, 10, 20, 50] * 2)
    latency2 = np.repeat([0.0, 0.1], 6)
    t2 = emulation.per_step_model(k2, 0.0, tau) + (latency2 + own) / k2
    t2[6] *= 1.02
    fitted_tau, fitted_own = emulation.fit_per_call(k2, t2, latency2)
    assert fitted_own == pytest.approx(own, abs=1e-4) and fitted_tau == pytest.approx(tau, rel=0.02)
    feed = emulation.per_step_model(np.array([1, 4]), 0.01, 0.002, feed_latency=0.003, bytes_per_step=500,
                                    bandwidth=1000.0)
    np.testing.assert_allclose(feed, [0.016 + 0.5 + 0.002, 0.004 + 0.5 + 0.002])


def test_model_and_fit_refuse_bad_input():
    with pytest.raises(ValueError, match=r"k=\[0, 1\]"):
        emulation.per_step_model(np.array([0, 1]), 0.0, 0.001)
    with pytest.raises(ValueError, match="call_latency=-1"):
        emulation.per_step_model(1, -1, 0.001)
    with pytest.raises(ValueError, match="two different k"):
        emulation.fit_per_call(np.array([2, 2]), np.array([1.0, 1.0]), np.zeros(2))
    with pytest.raises(ValueError, match="shapes"):
        emulation.fit_per_call(np.array([1, 2]), np.array([1.0]), np.zeros(2))
    with pytest.raises(ValueError, match=r"seconds_per_step=\[1.0, 0.0\]"):
        emulation.fit_per_call(np.array([1, 2]), np.array([1.0, 0.0]), np.zeros(2))

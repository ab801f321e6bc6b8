"""In-graph training loops, the outfeed, and the benchmark's pieces (no timing is asserted)."""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers import bench, timing
from vcd_helpers.config import load_config
from vcd_helpers.data import indexed_batches, load_binarized_mnist
from vcd_helpers.trainers import build_trainer
from vcd_helpers.loops import Outfeed, fit, make_training_loop

CONFIG = load_config("tiny", batch_size=20)


def _batches():
    return indexed_batches(load_binarized_mnist("train")[:1000], 20, seed=0)


@pytest.mark.parametrize("jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_k_steps_per_call_equal_k_calls_of_one_step(jit_compile):
    one = fit(build_trainer(CONFIG.replace(execution={"jit_compile": jit_compile})), _batches(), 23, steps_per_call=1, progress=False)
    looped = fit(build_trainer(CONFIG.replace(execution={"jit_compile": jit_compile})), _batches(), 23, steps_per_call=10, progress=False)
    np.testing.assert_array_equal(one["step"], np.arange(1, 24))
    for name in one:
        if name != "wall_time":
            np.testing.assert_array_equal(one[name], looped[name], err_msg=name)


@pytest.mark.parametrize("names", [("loss",), ("loss", "accept_rate")])
def test_an_outfeed_of_one_or_more_metrics_drains_every_value(names):
    # A queue of one component dequeues a tensor, not a list: zip kept its first element only.
    outfeed = Outfeed(names)
    for i in range(10):
        outfeed.enqueue({name: tf.constant(float(i + k)) for k, name in enumerate(names)})
    drained = outfeed.drain()
    for k, name in enumerate(names):
        np.testing.assert_array_equal(drained[name], np.arange(10, dtype=np.float32) + k)
    assert all(len(v) == 0 for v in outfeed.drain().values())


def test_outfeed_streams_every_step_to_a_reader_thread_in_order():
    trainer = build_trainer(CONFIG.replace(execution={"jit_compile": False}))
    outfeed = Outfeed(trainer.metric_names)
    loop = make_training_loop(trainer, outfeed)
    received, finished = [], threading.Event()

    def reader():
        while not finished.is_set() or int(outfeed.queue.size()):
            received.append(outfeed.drain())
            finished.wait(0.05)

    thread = threading.Thread(target=reader)
    thread.start()
    stacked = loop(iter(_batches()), tf.constant(30))
    finished.set()
    thread.join()
    streamed = {name: np.concatenate([r[name] for r in received]) for name in trainer.metric_names}
    for name in trainer.metric_names:
        np.testing.assert_array_equal(streamed[name], stacked[name].numpy())
    assert int(trainer.step.numpy()) == 30


def test_bad_steps_per_call_is_a_clear_error():
    with pytest.raises(ValueError, match="steps_per_call=0 is invalid"):
        fit(build_trainer(CONFIG.replace(execution={"jit_compile": False})), _batches(), 3, steps_per_call=0, progress=False)


def test_step_flops_of_the_default_config_is_about_4_gflop():
    # 41 gradient evaluations of the decoder dominate: 3.6 GFLOP at batch 100.
    flops = bench.step_flops(load_config("default"))
    assert 3.5e9 < flops < 4.0e9
    assert bench.step_flops(load_config("default", batch_size=200)) == pytest.approx(2 * flops)
    assert bench.step_flops(load_config("default", method="vae")) < flops / 10


# The XLA styles compile the same step: test_k_steps_per_call_equal_k_calls_of_one_step covers them.
@pytest.mark.parametrize("style", ["eager", "function", "loop"])
def test_timing_styles_run(style):
    assert bench.time_training_step(CONFIG, style, steps_per_call=3, calls=1) > 0


def test_a_timed_step_compiles_once_and_every_timing_starts_from_the_initial_state():
    reference = fit(build_trainer(CONFIG.replace(seed=7, execution={"jit_compile": False})),
                    indexed_batches(load_binarized_mnist("train")[:1000], 20, seed=7), 3, progress=False)
    timed = bench.TimedStep(CONFIG, "loop", seed=7)
    for k in (3, 1, 3):  # one trainer behind all three; none inherits what an earlier timing trained
        call, _ = timed.call(k)
        metrics = call()
        for name in ("decoder_loss", "encoder_loss"):
            np.testing.assert_array_equal(metrics[name], reference[name][:k])
    assert timed.step.experimental_get_tracing_count() == 1
    call, _ = bench.step_call(CONFIG, "loop", steps_per_call=3, seed=7)
    np.testing.assert_array_equal(call()["decoder_loss"], reference["decoder_loss"])


def test_a_timed_steps_trainer_lives_as_long_as_its_caller_holds_it(monkeypatch):
    # No module keeps a compiled step: its trainer (weights, optimiser slots) goes with the call.
    built = []
    monkeypatch.setattr(bench, "build_trainer", lambda config: built.append(build_trainer(config)) or built[-1])
    call, _ = bench.step_call(CONFIG, "function", seed=7)
    trainer = weakref.ref(built.pop())
    call()
    del call
    gc.collect()
    assert trainer() is None


def test_unknown_style_is_refused():
    with pytest.raises(ValueError, match="style='fast' is invalid"):
        bench.time_training_step(CONFIG, "fast")


@pytest.mark.slow
def test_the_step_breakdown_adds_up_to_the_step():
    breakdown = bench.step_breakdown(CONFIG.replace(execution={"chain_shards": 2}), calls=1, steps_per_call=2)
    assert breakdown.chain_shards == 2
    assert sum(breakdown.parts().values()) == pytest.approx(breakdown.step)
    assert min(breakdown.step, breakdown.chain, breakdown.evaluations, breakdown.dots, breakdown.step_gflops,
               breakdown.dots_gflops, breakdown.shape_gflops, breakdown.matmul_rate) > 0
    text = bench.format_breakdown(breakdown).splitlines()
    assert len(text) == 7 and max(map(len, text)) <= 80 and "2 block(s)" in text[0]
    assert breakdown.part_intervals() is None and "[" not in text[1]  # one round: no interval
    # Enough rounds: each part's per-round difference gets an interval; a part whose rounds
    # straddle 0 is "not resolved", one that does not is shown with its interval.
    rounds = bench.MIN_INTERVAL_ROUNDS
    ms = {"step": [30.0] * rounds, "chain": [20.0 + r % 2 for r in range(rounds)],
          "evaluations": [20.5 - r % 2 for r in range(rounds)], "dots": [10.0 + r / 100 for r in range(rounds)]}
    timed = dataclasses.replace(breakdown, timings=breakdown.timings | {
        name: timing.Timing(tuple(v / 1000 for v in values)) for name, values in ms.items()})
    intervals = timed.part_intervals()
    assert intervals["around the chain: encoder, decoder loss, RMSProp"][1:] == pytest.approx((9.0, 10.0))
    assert intervals["the evaluations' matrix multiplies"][0] == pytest.approx(10.045)
    lines = bench.format_breakdown(timed).splitlines()
    assert lines[2].endswith("not resolved") and lines[4].endswith("]") and max(map(len, lines)) <= 80, lines
    # Each part's value is the median of its per-round differences, the centre of its interval,
    # not the difference of two medians (here 50 - 20 = 30 ms against a median difference of 10).
    skewed = dataclasses.replace(breakdown, timings=breakdown.timings | {
        name: timing.Timing(tuple(v / 1000 for v in values)) for name, values in (ms | {
            "step": [30.0 if r < 3 else 50.0 for r in range(rounds)],
            "chain": [20.0 if r < 7 else 40.0 for r in range(rounds)]}).items()})
    assert skewed.part_intervals()["around the chain: encoder, decoder loss, RMSProp"][0] == pytest.approx(10.0)
    assert " 10.0 ms" in bench.format_breakdown(skewed).splitlines()[1]
    with pytest.raises(ValueError, match="method='vae' is invalid"):
        bench.step_breakdown(CONFIG.replace(method="vae"))


def test_the_speed_explorer_compiles_each_batch_size_once(monkeypatch):
    from vcd_helpers import widgets

    built = []

    class Step:  # a stand-in: what is checked is which batch sizes get built (compiled), not the timing
        def __init__(self, config, style):
            built.append(config.batch_size)

        def call(self, k):
            return (lambda: tf.constant(0.0)), k

    monkeypatch.setattr(widgets, "TimedStep", Step)
    monkeypatch.setattr(widgets, "decoder_layer_gflops", lambda config: 10.0)
    explorer = widgets.training_speed_explorer(CONFIG, batch_sizes=(10, 20), steps_per_call=(1, 2), calls=2)
    batch_slider, per_call_slider = explorer.children[0].children
    for size in (10, 20, 10):  # back to a size already seen: no new compilation
        batch_slider.value = size
    per_call_slider.value = 2  # another steps per call of a compiled size: none either
    assert built == [20, 10]

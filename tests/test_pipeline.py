"""Pipelined and replicated VCD: schedules, validation, and gradients equal to the plain path.

The process's CPU is split into four logical devices by conftest.py (before TensorFlow starts),
so a stage or replica per device runs here as it would on four accelerators.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers import distributed, pipeline
from vcd_helpers.config import PipelineConfig, load_config
from vcd_helpers.data import indexed_batches, load_binarized_mnist
from vcd_helpers.pipeline import Task
from vcd_helpers.trainers import build_trainer
from vcd_helpers.loops import fit
from vcd_helpers.runs.train import train_run
from vcd_helpers.training import accumulate_gradients, max_relative_error

STAGE_DEVICES = ("/CPU:1", "/CPU:2", "/CPU:3")
# min_scale 0.1 keeps the untrained encoder's scales away from 1e-4, where g reaches 1e10 and float32
# sums in a different order differ in the fourth digit.
SMALL = dict(batch_size=24, train_examples=240, model={"min_scale": 0.1}, hmc={"num_iterations": 2, "num_leapfrog_steps": 1},
             control_variate={"kind": "local"}, optimizer={"learning_rate": 5e-4})


@pytest.fixture(scope="module")
def batch():
    config = load_config("default").replace(**SMALL)
    images = load_binarized_mnist("train")[:240]
    index, x = next(iter(indexed_batches(images, 24, seed=0)))
    return config, index, x


@pytest.fixture(scope="module")
def plain_sum(batch):
    """The reference the pipelined estimates are held to: the plain estimator summed over three
    micro-batches of 8 (``accumulate_gradients``), with its baseline and seed; computed once."""
    config, _, x = batch
    baseline, seed = 100.0 * tf.random.stateless_normal([24], seed=[3, 3]), tf.constant([5, 6])
    plain = build_trainer(config.replace(execution={"jit_compile": False}))
    return baseline, seed, tf.function(lambda: accumulate_gradients(plain, x, baseline, seed, micro_batch_size=8))()


def test_interleaved_order_is_one_forward_one_backward():
    orders = pipeline.device_orders("interleaved", 3, 4)
    assert [t.label for t in orders[0]] == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert [t.label for t in orders[2]] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert pipeline.in_flight_micro_batches(orders) == [3, 2, 1]
    assert pipeline.in_flight_micro_batches(pipeline.device_orders("grouped", 3, 4)) == [4, 4, 4]


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
def test_execution_order_respects_data_and_device_order(schedule):
    order = pipeline.execution_order(schedule, 3, 5)
    assert len(order) == len(set(order)) == 30
    seen = set()
    for task in order:
        if task.kind == "F" and task.stage > 0:
            assert Task("F", task.stage - 1, task.micro_batch) in seen
        if task.kind == "B":
            assert Task("F", task.stage, task.micro_batch) in seen
            if task.stage < 2:
                assert Task("B", task.stage + 1, task.micro_batch) in seen
        assert all(d in seen for d in pipeline._inputs(task))  # the step's graph is built in this order
        seen.add(task)
    for stage, device_order in enumerate(pipeline.device_orders(schedule, 3, 5)):
        assert [t for t in order if t.stage == stage] == device_order


@pytest.mark.parametrize("overrides, message", [
    (dict(schedule="round_robin"), "schedule='round_robin' is invalid: must be one of sequential, grouped"),
    (dict(schedule="interleaved", gradient_accumulation=2), "needs at least 3 micro-batches"),
    (dict(micro_batch_size=0), "micro_batch_size=0 is invalid: must be a positive integer"),
    (dict(gradient_accumulation=1.5), "gradient_accumulation=1.5 is invalid"),
    (dict(devices=("/CPU:0",)), "must be a tuple of one distinct device name per stage"),
    (dict(devices=("/CPU:0", "/CPU:1", "/CPU:1")), "must be a tuple of one distinct device name per stage"),
    (dict(recompute_encoder="no"), "pipeline.recompute_encoder='no' is invalid: must be true or false"),
    (dict(slot_device=0), "pipeline.slot_device=0 is invalid: must be a device name or null"),
])
def test_bad_pipeline_configs_are_clear_errors(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        PipelineConfig(**overrides)


@pytest.mark.parametrize("batch_size, accumulation", [(100, 4), (50, 5), (24, 4), (7, 7), (4, 4), (9, 9)])
def test_pipelined_splits_the_batch_into_the_fewest_micro_batches_that_outnumber_the_stages(batch_size, accumulation):
    cfg = load_config("default").replace(batch_size=batch_size)
    stages = pipeline.pipelined(cfg, "grouped", ("/CPU:1", "/CPU:2", "/CPU:3"), recompute_encoder=True,
                                slot_device="/CPU:0").execution.pipeline
    assert (stages.gradient_accumulation, stages.micro_batch_size) == (accumulation, batch_size // accumulation)
    assert (stages.schedule, stages.devices) == ("grouped", ("/CPU:1", "/CPU:2", "/CPU:3"))
    assert (stages.recompute_encoder, stages.slot_device) == (True, "/CPU:0")


def test_pipelined_compiles_the_chain_only_when_asked_and_keeps_the_rest_of_the_config():
    cfg = load_config("default")
    plain, xla = pipeline.pipelined(cfg), pipeline.pipelined(cfg, xla_chain=True)
    assert (plain.execution.jit_compile, xla.execution.jit_compile) == (False, True)
    stages = plain.execution.pipeline
    assert (stages.schedule, stages.devices, stages.recompute_encoder, stages.slot_device) == ("interleaved", (), False, None)
    assert plain.replace(execution={"pipeline": None, "jit_compile": cfg.execution.jit_compile}) == cfg


@pytest.mark.parametrize("batch_size", [1, 3])
def test_pipelined_refuses_a_batch_too_small_to_fill_the_stages(batch_size):
    with pytest.raises(ValueError, match=f"batch_size={batch_size} is too small to pipeline"):
        pipeline.pipelined(load_config("default").replace(batch_size=batch_size))


def test_each_task_of_the_step_reads_exactly_its_listed_inputs(batch, monkeypatch):
    # The chain's backward sends its first evaluation, computed in its forward: it reads no later
    # stage, unlike a network's backward (which _ordering_dependencies models).
    reads = {(kind, stage): [(d.kind, d.stage) for d in pipeline._inputs(Task(kind, stage, 7))]
             for kind in "FB" for stage in range(3)}
    assert reads == {("F", 0): [], ("F", 1): [("F", 0)], ("F", 2): [("F", 1)], ("B", 2): [("F", 2), ("F", 1)],
                     ("B", 1): [("F", 1)], ("B", 0): [("F", 0), ("F", 1), ("B", 1), ("B", 2)]}
    assert all(d.micro_batch == 7 for kind in "FB" for stage in range(3)
               for d in pipeline._inputs(Task(kind, stage, 7)))
    # The step hands each task only these: without any one of them, building the step fails.
    config, _, x = batch
    trainer = build_trainer(config.replace(execution={"pipeline": PipelineConfig(
        schedule="sequential", micro_batch_size=24, gradient_accumulation=1, devices=STAGE_DEVICES),
        "jit_compile": False}))
    listed = pipeline._inputs
    for (kind, stage), inputs in reads.items():
        for dropped in inputs:
            monkeypatch.setattr(pipeline, "_inputs", lambda task: [d for d in listed(task) if (
                (task.kind, task.stage) != (kind, stage) or (d.kind, d.stage) != dropped)])
            step = tf.function(lambda: trainer.estimate_gradients_pipelined(x, tf.zeros([24]), tf.constant([1, 2])))
            with pytest.raises(KeyError, match=re.escape(repr(dropped))):
                step.get_concrete_function()


def test_pipeline_must_see_the_configured_batch_on_existing_devices(batch):
    config, _, _ = batch
    with pytest.raises(ValueError, match="micro_batch_size x gradient_accumulation = 32 must equal batch_size=24"):
        config.replace(execution={"pipeline": PipelineConfig(micro_batch_size=8, gradient_accumulation=4)})
    with pytest.raises(ValueError, match=r"devices \['/CPU:9'\] do not exist here"):
        build_trainer(config.replace(execution={"pipeline": PipelineConfig(micro_batch_size=8, gradient_accumulation=3,
                                                       devices=("/CPU:1", "/CPU:2", "/CPU:9"))}))


def test_one_factory_builds_every_execution_and_says_what_xla_compiles(batch):
    config, _, _ = batch
    plain = build_trainer(config)
    assert type(plain).__name__ == "VCDTrainer" and plain.jit_compile and plain.steps_per_call == config.steps_per_call
    vae = build_trainer(config.replace(method="vae", execution={"jit_compile": False}))
    assert type(vae).__name__ == "VAETrainer" and not vae.jit_compile
    piped = build_trainer(config.replace(execution={
        "pipeline": PipelineConfig(micro_batch_size=8, gradient_accumulation=3), "steps_per_call": 5}))
    assert type(piped).__name__ == "PipelinedVCDTrainer" and piped.jit_compile and piped.steps_per_call == 5
    mirrored = {"strategy": "mirrored", "replicas": 2, "devices": STAGE_DEVICES[:2]}
    replicated = build_trainer(config.replace(execution=mirrored))
    assert type(replicated).__name__ == "ReplicatedVCDTrainer" and not replicated.jit_compile
    assert replicated.strategy is distributed.strategy_for(replicated.config.execution)  # made once per process
    # The model too is made under the strategy's scope: every weight mirrored on the replicas.
    assert all(isinstance(v, tf.distribute.DistributedValues) for v in replicated.model.variables)
    with pytest.raises(ValueError, match="execution.jit_compile=True is invalid: a step under a distribution strategy"):
        config.replace(execution=mirrored | {"jit_compile": True})
    with pytest.raises(ValueError, match="only VCD's step is pipelined or replicated, not method='vae'"):
        config.replace(method="vae", execution={"pipeline": PipelineConfig(micro_batch_size=8, gradient_accumulation=3)})


def test_batch_sizes_multiply():
    assert pipeline.batch_sizes(8, 4, 2, 10) == {"effective_batch": 64, "examples_per_host_call": 640}


@pytest.mark.parametrize("schedule, recompute", [("sequential", False), ("grouped", False), ("interleaved", False),
                                                ("interleaved", True)])
def test_pipelined_gradients_equal_the_plain_estimator_summed_over_micro_batches(batch, plain_sum, schedule,
                                                                                recompute):
    config, _, x = batch
    baseline, seed, expected = plain_sum
    trainer = build_trainer(config.replace(execution={"pipeline": PipelineConfig(
        schedule=schedule, micro_batch_size=8, gradient_accumulation=3, devices=STAGE_DEVICES,
        recompute_encoder=recompute), "jit_compile": False}))
    actual, times = tf.function(lambda: trainer.estimate_gradients_pipelined(x, baseline, seed))()
    assert max_relative_error(expected, actual) < 1e-4
    np.testing.assert_allclose(actual.encoder_loss, expected.encoder_loss, rtol=1e-5)
    np.testing.assert_allclose(actual.decoder_loss, expected.decoder_loss, rtol=1e-5)
    np.testing.assert_allclose(actual.g, expected.g, rtol=1e-5)
    assert float(actual.step_size) == pytest.approx(float(expected.step_size), rel=1e-6)
    assert times is None  # the training step carries no stamps
    stamped, times = trainer._stamped_estimate(x, baseline, seed)(x, baseline, seed)
    assert max_relative_error(actual, stamped) == 0.0 and float(stamped.step_size) == float(actual.step_size)
    assert times.shape == (18, 2) and np.all(times.numpy()[:, 1] >= times.numpy()[:, 0])


def _stamps(graph: tf.Graph) -> list[tf.Operation]:
    return [op for op in graph.get_operations() if op.type == "Timestamp"]


@pytest.mark.parametrize("schedule", ["sequential", "interleaved"])
def test_a_start_stamp_waits_for_its_device_and_its_inputs_and_nothing_else(batch, schedule):
    # tf.function chains every stateful op without a variable into one total order: stamps traced
    # there would make each task wait for the last task's end stamp on any device, serialising the
    # pipeline it measures (they did: the real timelines never overlapped). Traced without automatic
    # control dependencies, a start stamp waits for the end of its device's previous task (any
    # previous task, for sequential) and of the tasks it reads: a task starts when it can run.
    config, _, x = batch
    trainer = build_trainer(config.replace(execution={"pipeline": PipelineConfig(
        schedule=schedule, micro_batch_size=8, gradient_accumulation=3, devices=STAGE_DEVICES),
        "jit_compile": False}))
    baseline, seed = tf.zeros([24]), tf.constant([1, 2], tf.int64)
    stamps = _stamps(trainer._stamped_estimate(x, baseline, seed).graph)
    assert len(stamps) == 2 * 18 and len({op.device for op in stamps}) == 3
    start, end = dict(zip(trainer.order, stamps[0::2])), dict(zip(trainer.order, stamps[1::2]))  # in creation order
    for k, task in enumerate(trainer.order):
        before = [t for t in trainer.order[:k] if schedule == "sequential" or t.stage == task.stage]
        waits_for = {end[t].name for t in before[-1:] + pipeline._inputs(task)}
        assert {op.name for op in start[task].control_inputs} == waits_for, task
    step_graph = trainer.train_step.get_concrete_function(tf.TensorSpec([24], tf.int32), x).graph
    assert not _stamps(step_graph)  # the training step carries no stamps


def test_a_timed_step_changes_the_state_as_a_training_step_does(batch):
    config, _, x = batch
    execution = {"pipeline": PipelineConfig(schedule="grouped", micro_batch_size=8, gradient_accumulation=3,
                                            devices=STAGE_DEVICES), "jit_compile": False}
    timed, plain = (build_trainer(config.replace(execution=execution)) for _ in range(2))
    index = tf.range(24)
    for _ in range(2):
        metrics, timeline = timed.timed_step(index, x)
        expected = plain.train_step(index, x)
    assert {k: float(v) for k, v in metrics.items()} == {k: float(v) for k, v in expected.items()}
    for a, b in zip(timed.trainable_variables, plain.trainable_variables):
        np.testing.assert_array_equal(a, b)
    assert int(timed.step) == 2 and float(timed.step_size) == float(plain.step_size)
    assert len(timeline.tasks) == 18 and np.all(timeline.end >= timeline.start)
    # A task's bar starts once its device is free and its inputs exist: it covers no wait for them.
    start, end = dict(zip(timeline.tasks, timeline.start)), dict(zip(timeline.tasks, timeline.end))
    for task in timeline.tasks:
        assert all(start[task] >= end[d] for d in pipeline._inputs(task)), task
    for order in pipeline.device_orders("grouped", 3, 3):
        assert all(start[b] >= end[a] for a, b in zip(order, order[1:]))


def test_a_bfloat16_pipeline_multiplies_in_bfloat16_as_the_plain_estimator_does(batch, plain_sum):
    config, _, x = batch
    baseline, seed, float32_sum = plain_sum
    plain = build_trainer(config.replace(precision="bfloat16", execution={"jit_compile": False}))
    estimates = {"float32": float32_sum,
                 "bfloat16": tf.function(lambda: accumulate_gradients(plain, x, baseline, seed, micro_batch_size=8))()}
    trainer = build_trainer(config.replace(precision="bfloat16", execution={"pipeline": PipelineConfig(
        schedule="interleaved", micro_batch_size=8, gradient_accumulation=3, devices=STAGE_DEVICES), "jit_compile": False}))
    actual, _ = tf.function(lambda: trainer.estimate_gradients_pipelined(x, baseline, seed))()
    assert max_relative_error(estimates["bfloat16"], actual) < 1e-4
    assert max_relative_error(estimates["float32"], actual) > 1e-3


def test_accumulation_refuses_a_batch_that_is_not_a_multiple_of_the_micro_batch(batch):
    # 24 rows in micro-batches of 5 would drop 4 of them: refused before any estimate is computed.
    config, _, x = batch
    plain = build_trainer(config.replace(execution={"jit_compile": False}))
    with pytest.raises(ValueError, match="batch of 24 is not a multiple of micro_batch_size=5"):
        accumulate_gradients(plain, x, tf.zeros([24]), tf.constant([1, 2]), micro_batch_size=5)


def test_one_micro_batch_is_the_plain_estimator(batch):
    config, _, x = batch
    plain = build_trainer(config.replace(execution={"jit_compile": False}))
    seed = tf.constant([1, 2])
    single = tf.function(lambda: plain.estimate_gradients(x, tf.zeros([24]), tf.random.experimental.stateless_fold_in(seed, 0)))()
    accumulated = tf.function(lambda: accumulate_gradients(plain, x, tf.zeros([24]), seed, micro_batch_size=24))()
    assert max_relative_error(single, accumulated) == 0.0


def test_pipelined_training_step_runs_in_the_loop_and_records_a_timeline(batch):
    config, _, _ = batch
    trainer = build_trainer(config.replace(execution={"pipeline": PipelineConfig(
        schedule="interleaved", micro_batch_size=8, gradient_accumulation=3, devices=STAGE_DEVICES,
        slot_device="/CPU:0"), "jit_compile": False, "steps_per_call": 2}))
    images = load_binarized_mnist("train")[:240]
    seen = []
    assert fit(trainer, indexed_batches(images, 24, seed=0), 4, progress=False,
               on_step=lambda step, metrics: seen.append((int(trainer.step.numpy()), metrics["encoder_loss"]))) == {}
    assert [counter for counter, _ in seen] == [2, 2, 4, 4]  # steps_per_call=2: two steps per host call
    assert np.all(np.isfinite([loss for _, loss in seen])) and int(trainer.step.numpy()) == 4
    index, x = next(iter(indexed_batches(images, 24, seed=0)))
    _, timeline = trainer.timed_step(index, x)
    assert [t.kind for t in timeline.tasks[:3]] == ["F", "F", "F"] and timeline.span > 0
    placed = pipeline.state_bytes_per_device(trainer)
    assert placed["/CPU:0"] > 4 * 598_404  # every optimiser slot offloaded to the host device


def test_a_run_whose_trainer_cannot_be_built_leaves_no_directory(batch, tmp_path):
    config, _, _ = batch
    missing = config.replace(execution={"pipeline": PipelineConfig(micro_batch_size=8, gradient_accumulation=3,
                                                                   devices=("/CPU:1", "/CPU:2", "/CPU:9"))})
    with pytest.raises(ValueError, match=r"devices \['/CPU:9'\] do not exist here"):
        train_run(missing, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


# The training command with two workers over loopback (MultiWorkerMirroredStrategy, all-reducing over
# gRPC on 127.0.0.1; bit-equal metrics on both workers prove the reduction ran) is tested where
# chapter 7 runs it: its cells launch the two processes and assert exactly that under nbval.


# Emulated stages: the real schedules with stand-in tasks of known duration.

def _exact_span(schedule, num_stages, num_micro_batches, forward, backward):
    """A discrete-event reference: every task starts when its device is free and the tasks it is
    ordered after have ended."""
    order = pipeline.execution_order(schedule, num_stages, num_micro_batches)
    queues = [order] if schedule == "sequential" else pipeline.device_orders(schedule, num_stages, num_micro_batches)
    end, free = {}, [0.0] * len(queues)
    for task in order:  # execution_order respects every queue's order and the dependencies
        queue = next(q for q, tasks in enumerate(queues) if task in tasks)
        deps = [] if schedule == "sequential" else pipeline._ordering_dependencies(task, num_stages)
        end[task] = max([free[queue]] + [end[d] for d in deps]) + (forward if task.kind == "F" else backward)
        free[queue] = end[task]
    return max(end.values())


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
def test_schedule_time_formula_is_the_exact_span_of_a_balanced_pipeline(schedule):
    for num_stages in range(1, 6):
        for num_micro_batches in range(1, 9):
            for forward, backward in ((1.0, 1.0), (1.0, 2.0), (3.0, 0.5)):
                exact = _exact_span(schedule, num_stages, num_micro_batches, forward, backward)
                model = pipeline.schedule_time(schedule, num_stages, num_micro_batches, forward, backward)
                assert model == pytest.approx(exact), (schedule, num_stages, num_micro_batches, forward, backward)


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
def test_in_flight_formula_counts_the_schedules_orders(schedule):
    for num_stages in range(1, 6):
        for num_micro_batches in range(1, 9):
            orders = pipeline.device_orders(schedule, num_stages, num_micro_batches)
            assert pipeline.in_flight_micro_batches(orders) == pipeline.in_flight_formula(
                schedule, num_stages, num_micro_batches), (num_stages, num_micro_batches)
    assert pipeline.in_flight_formula("interleaved", 4, 8) == [4, 3, 2, 1]
    assert pipeline.in_flight_formula("interleaved", 4, 2) == [2, 2, 2, 1]
    assert pipeline.in_flight_formula("grouped", 3, 5) == [5, 5, 5]


def test_bubble_fraction_is_the_idle_share_of_the_exact_span():
    assert pipeline.bubble_fraction(3, 4) == pytest.approx(1 / 3)
    assert pipeline.bubble_fraction(1, 7) == 0.0
    for num_stages, num_micro_batches in ((2, 1), (3, 4), (4, 16), (5, 3)):
        span = _exact_span("grouped", num_stages, num_micro_batches, 1.0, 2.0)
        busy = num_micro_batches * 3.0  # per device
        assert 1 - busy / span == pytest.approx(pipeline.bubble_fraction(num_stages, num_micro_batches))


def test_timeline_idle_share_and_in_flight_from_timestamps():
    T = pipeline.Task
    # Two stages, one micro-batch each way, times in seconds: stage 0 busy 1 + 1 of a span of 4.
    tasks = [T("F", 0, 0), T("F", 1, 0), T("B", 1, 0), T("B", 0, 0)]
    timeline = pipeline.Timeline(tasks, np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0, 4.0]))
    assert timeline.num_stages == 2
    assert timeline.busy_fraction() == [0.5, 0.5]
    assert timeline.idle_fraction() == pytest.approx(0.5)
    assert timeline.peak_in_flight() == [1, 1]
    # In-flight counts follow the order tasks *started*, not the list's order.
    tasks = [T("F", 0, 0), T("B", 0, 0), T("F", 0, 1), T("B", 0, 1)]
    started = pipeline.Timeline(tasks, np.array([0.0, 2.0, 1.0, 3.0]), np.array([1.0, 3.0, 2.0, 4.0]))
    assert started.peak_in_flight() == [2]
    assert started.idle_fraction() == pytest.approx(0.0)


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
def test_emulated_schedule_runs_the_real_orders_and_dependencies(schedule):
    num_stages, num_micro_batches, forward, backward = 3, 4, 0.004, 0.008
    timeline = pipeline.emulate_schedule(schedule, num_stages, num_micro_batches, forward, backward)
    assert timeline.tasks == pipeline.execution_order(schedule, num_stages, num_micro_batches)
    start = dict(zip(timeline.tasks, timeline.start))
    end = dict(zip(timeline.tasks, timeline.end))
    assert min(start.values()) == 0.0
    for task in timeline.tasks:  # each task waited its duration, after the tasks it is ordered after
        assert end[task] - start[task] >= (forward if task.kind == "F" else backward) * 0.999
        for dependency in pipeline._ordering_dependencies(task, num_stages):
            assert start[task] >= end[dependency]
    for order in pipeline.device_orders(schedule, num_stages, num_micro_batches):  # each device in its order
        for before, after in zip(order, order[1:]):
            assert start[after] >= end[before]
    if schedule == "sequential":
        ranked = sorted(timeline.tasks, key=start.get)
        assert ranked == timeline.tasks and all(start[b] >= end[a] for a, b in zip(ranked, ranked[1:]))
    assert timeline.peak_in_flight() == pipeline.in_flight_formula(schedule, num_stages, num_micro_batches)
    # Waits do not shorten: no step beats the model of its schedule.
    assert timeline.span >= 0.999 * pipeline.schedule_time(schedule, num_stages, num_micro_batches, forward, backward)


def test_emulated_stages_overlap_across_devices():
    """Under grouped, stage 1's forward of micro-batch 0 runs while stage 0 runs micro-batch 1's:
    the devices' waits overlap (30 ms each, so a few ms of thread latency cannot hide it)."""
    timeline = pipeline.emulate_schedule("grouped", 2, 2, 0.03, 0.03)
    T = pipeline.Task
    start, end = (dict(zip(timeline.tasks, a)) for a in (timeline.start, timeline.end))
    assert start[T("F", 1, 0)] < end[T("F", 0, 1)] and start[T("F", 0, 1)] < end[T("F", 1, 0)]
    assert timeline.idle_fraction() < 0.5  # serialised, two stages would idle half the span


def test_emulated_stages_take_a_duration_per_stage():
    timeline = pipeline.emulate_schedule("interleaved", 2, 2, [0.002, 0.02], [0.002, 0.002])
    durations = {task: b - a for task, a, b in zip(timeline.tasks, timeline.start, timeline.end)}
    assert durations[pipeline.Task("F", 1, 0)] >= 0.02 and durations[pipeline.Task("F", 0, 0)] < 0.02


@pytest.mark.parametrize("args, message", [
    (("pipelined", 3, 4, 0.0, 0.0), "schedule='pipelined'"),
    (("grouped", 0, 4, 0.0, 0.0), "num_stages=0"),
    (("grouped", 3, 0, 0.0, 0.0), "num_micro_batches=0"),
    (("grouped", 3, 4, -0.1, 0.0), "forward_seconds=-0.1"),
    (("grouped", 3, 4, 0.0, [0.1, 0.1]), r"backward_seconds=\[0.1, 0.1\].*one per stage \(3\)"),
    (("grouped", 3, 4, float("nan"), 0.0), "forward_seconds=nan"),
])
def test_bad_emulation_input_is_a_clear_error(args, message):
    with pytest.raises(ValueError, match=message):
        pipeline.emulate_schedule(*args)
    with pytest.raises(ValueError, match="schedule='1f1b'"):
        pipeline.schedule_time("1f1b", 3, 4, 1.0, 1.0)
    with pytest.raises(ValueError, match="num_micro_batches=0"):
        pipeline.in_flight_formula("grouped", 3, 0)
    with pytest.raises(ValueError, match="num_stages=0"):
        pipeline.bubble_fraction(0, 4)


def test_max_relative_error_is_the_worst_tensors_largest_difference_over_its_largest_expected_magnitude():
    from vcd_helpers.training import VCDEstimate

    def estimate(**gradients):
        return VCDEstimate(gradients, *[None] * 5)

    expected = estimate(a=[tf.constant([2.0, -4.0]), tf.constant([0.5])], b=[tf.constant([[1.0, 3.0]])])
    actual = estimate(a=[tf.constant([2.5, -4.0]), tf.constant([0.5])], b=[tf.constant([[1.0, 2.4]])])
    assert max_relative_error(expected, actual) == pytest.approx(0.6 / 3.0)

"""Pipelined VCD: the training step split into stages on several devices, micro-batches
flowing through them under a schedule, gradients accumulated over the micro-batches.

The three stages, each on its own device (``config.PipelineConfig.devices``):

    stage 0 "encoder"  forward: x -> loc, scale, z0 = loc + scale * eps
                       backward: the encoder's gradients, from the messages of stages 1 and 2
    stage 1 "hmc"      forward: the HMC chain z0 -> zT on the decoder's log joint
                       backward: sends log p(x, z0) and its gradient with respect to z0 (the
                       chain's first evaluation) to the encoder
    stage 2 "decoder"  forward: log p(x | zT) under a tape
                       backward: the decoder's gradients, and log p(x, zT) for the encoder's g

The encoder's variables live on stage 0's device; the decoder's on stage 1's, where the chain
evaluates the decoder 41 times per micro-batch (and XLA requires its variables on its device);
stage 2 reads them once per micro-batch.

This is the maths of ``objectives.vcd_surrogate_losses`` cut at the stage boundaries: stage 0
computes ``objectives.encoder_surrogate_loss`` from the messages, the pathwise term entering as
the vector grad_z0 that stage 1 sends back. ``training.accumulate_gradients`` is the
unpipelined reference: the plain estimator (``VCDTrainer.estimate_gradients``) on each
micro-batch, summed. The tests hold the two equal for every schedule.

Micro-batch m of a step draws its randomness from ``fold_in(step_seed, m)`` and starts its chain
from the step size the step began with; after the step the step size is the mean of the
micro-batches' adapted step sizes. (The plain step adapts on all B chains at once; chains of
different micro-batches cannot share an acceptance rate without serialising the pipeline.)

A *schedule* fixes the order of the tasks (forward or backward of a stage on a micro-batch) on
each device; the step's graph enforces it with control dependencies, and TensorFlow runs tasks
on different devices concurrently. ``timed_step`` also records ``tf.timestamp()`` when each task
starts (once its device is free and the tasks whose outputs it reads have ended) and when it
ends, which gives the measured timeline (``Timeline``) of a step. Those stamps are
traced without ``tf.function``'s automatic control dependencies (``tf.compat.v1.wrap_function``):
``tf.function`` chains every stateful op that touches no variable, ``tf.timestamp`` among them,
into one total order, and would so serialise the very tasks the stamps time. The training step
itself carries no stamps.

``emulate_schedule`` runs the same schedules with stand-in stages whose durations are known (host
waits), to measure a schedule's bubble, time and memory against their formulas
(``bubble_fraction``, ``schedule_time``, ``in_flight_formula``) on a machine with few cores.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

from vcd_helpers.config import NUM_STAGES, SCHEDULES, Config, PipelineConfig, check_one_of, check_positive_int
from vcd_helpers.hmc import HMCResult
from vcd_helpers.model import VAE, bernoulli_log_likelihood, standard_normal_log_prob
from vcd_helpers.objectives import encoder_surrogate_loss
from vcd_helpers.seeds import fold_in, split_seed
from vcd_helpers.training import VCDEstimate, VCDTrainer



def batch_sizes(micro_batch_size: int, gradient_accumulation: int = 1, replicas: int = 1,
                device_iterations: int = 1) -> dict[str, int]:
    """How the micro-batch sets the batch an optimiser step sees and the examples a host call takes.

    effective_batch = micro_batch_size x gradient_accumulation x replicas (one optimiser step);
    examples_per_host_call = effective_batch x device_iterations.
    """
    for name, value in (("micro_batch_size", micro_batch_size), ("gradient_accumulation", gradient_accumulation),
                        ("replicas", replicas), ("device_iterations", device_iterations)):
        check_positive_int(name, value)
    effective = micro_batch_size * gradient_accumulation * replicas
    return {"effective_batch": effective, "examples_per_host_call": effective * device_iterations}


def pipelined(cfg: Config, schedule: str = "interleaved", devices: tuple[str, ...] = (), *, xla_chain: bool = False,
              **levers) -> Config:
    """``cfg`` with its step pipelined by ``schedule`` over ``devices`` (one per stage, or () to leave
    placement to TensorFlow): the batch split into the fewest micro-batches that divide it evenly
    and outnumber the stages, so that every stage has work once the pipeline has filled. Its ops run
    from a plain tf.function unless ``xla_chain`` (then XLA compiles the chain); ``levers`` are the
    remaining ``config.PipelineConfig`` fields (recompute_encoder, slot_device).

    Raises ValueError for a batch of at most NUM_STAGES examples (no split outnumbers the stages)
    or an invalid setting.
    """
    accumulation = next((a for a in range(NUM_STAGES + 1, cfg.batch_size + 1) if cfg.batch_size % a == 0), None)
    if accumulation is None:
        raise ValueError(f"batch_size={cfg.batch_size} is too small to pipeline: the {NUM_STAGES} stages need more "
                         f"than {NUM_STAGES} micro-batches per step to fill, so a batch of at least {NUM_STAGES + 1}")
    stages = PipelineConfig(schedule=schedule, micro_batch_size=cfg.batch_size // accumulation,
                            gradient_accumulation=accumulation, devices=devices, **levers)
    return cfg.replace(execution={"pipeline": stages, "jit_compile": xla_chain})


def short_device_name(name: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' or '/device:CPU:1' -> '/CPU:1'."""
    spec = tf.DeviceSpec.from_string(name)
    return f"/{spec.device_type}:{spec.device_index}"


class Task(NamedTuple):
    """One unit of pipeline work: ``kind`` 'F' (forward) or 'B' (backward) of ``stage`` on ``micro_batch``."""

    kind: str
    stage: int
    micro_batch: int

    @property
    def label(self) -> str:
        return f"{self.kind}{self.micro_batch}"


def device_orders(schedule: str, num_stages: int, num_micro_batches: int) -> list[list[Task]]:
    """The order of the tasks on each stage's device under ``schedule``: one list per stage.

    grouped: all forwards, then all backwards. interleaved (1F1B): stage ℓ (from 0) runs
    ``num_stages - ℓ - 1`` forwards to fill the pipeline, then alternates one forward and one
    backward, then drains the remaining backwards. sequential: forwards then backwards per
    micro-batch (``execution_order`` also serialises the devices).
    """
    check_one_of("schedule", schedule, SCHEDULES)
    orders = []
    for s in range(num_stages):
        forwards = [Task("F", s, m) for m in range(num_micro_batches)]
        backwards = [Task("B", s, m) for m in range(num_micro_batches)]
        if schedule == "sequential":
            order = [task for m in range(num_micro_batches) for task in (forwards[m], backwards[m])]
        elif schedule == "grouped":
            order = forwards + backwards
        else:
            warmup = min(num_stages - s - 1, num_micro_batches)
            order = forwards[:warmup]
            for m in range(num_micro_batches - warmup):
                order += [forwards[warmup + m], backwards[m]]
            order += backwards[num_micro_batches - warmup:]
        orders.append(order)
    return orders


def _inputs(task: Task) -> list[Task]:
    """The tasks whose outputs ``task`` reads in VCD's pipelined step (``estimate_gradients_pipelined``
    hands a task these and nothing else): the chain reads z0, the decoder's forward and backward
    read zT; the chain's backward reads only its forward (its messages are the chain's first
    evaluation); the encoder's backward reads its forward, zT and both messages."""
    reads = {("F", 0): [], ("F", 1): [("F", 0)], ("F", 2): [("F", 1)],
             ("B", 2): [("F", 2), ("F", 1)], ("B", 1): [("F", 1)], ("B", 0): [("F", 0), ("F", 1), ("B", 1), ("B", 2)]}
    return [Task(kind, stage, task.micro_batch) for kind, stage in reads[task.kind, task.stage]]


def _ordering_dependencies(task: Task, num_stages: int) -> list[Task]:
    """The tasks that end before ``task`` starts in the schedules' model of a pipeline, a network's: a
    forward after the previous stage's forward, a backward after its own forward and the next
    stage's backward (whose gradient it continues).

    VCD's step reads less (``_inputs``: its chain's backward reads no later stage), and every task it
    reads comes before it in this order, so ``execution_order`` builds the step's graph in it. The
    emulation waits for these, and ``schedule_time`` is their exact span.
    """
    if task.kind == "F":
        return [Task("F", task.stage - 1, task.micro_batch)] if task.stage > 0 else []
    deps = [Task("F", task.stage, task.micro_batch)]
    if task.stage < num_stages - 1:
        deps.append(Task("B", task.stage + 1, task.micro_batch))
    return deps


def execution_order(schedule: str, num_stages: int, num_micro_batches: int) -> list[Task]:
    """All tasks in one order that respects both ``_ordering_dependencies`` and every device's order
    (the order in which the step's graph is built). For 'sequential' it is the order they run in.

    Raises ValueError if the device orders deadlock (no such order exists).
    """
    orders = device_orders(schedule, num_stages, num_micro_batches)
    if schedule == "sequential":
        return [task for m in range(num_micro_batches) for task in
                [Task("F", s, m) for s in range(num_stages)] + [Task("B", s, m) for s in reversed(range(num_stages))]]
    done: set[Task] = set()
    position = [0] * num_stages
    result: list[Task] = []
    while len(result) < num_stages * num_micro_batches * 2:
        progressed = False
        for s in range(num_stages):
            while position[s] < len(orders[s]) and all(
                    d in done for d in _ordering_dependencies(orders[s][position[s]], num_stages)):
                task = orders[s][position[s]]
                done.add(task)
                result.append(task)
                position[s] += 1
                progressed = True
        if not progressed:
            waiting = [orders[s][position[s]] for s in range(num_stages) if position[s] < len(orders[s])]
            raise ValueError(f"the {schedule} schedule deadlocks: every device waits ({waiting})")
    return result


class Timeline(NamedTuple):
    """Measured start and end of every task of one step, in seconds from the step's first start.

    tasks: the tasks, in ``execution_order``; start, end: [num_tasks] float64 arrays.
    """

    tasks: list[Task]
    start: np.ndarray
    end: np.ndarray

    @property
    def span(self) -> float:
        return float(self.end.max())

    @property
    def num_stages(self) -> int:
        return 1 + max(task.stage for task in self.tasks)

    def busy_fraction(self) -> list[float]:
        """Per stage: the fraction of the step's span its device spent running tasks."""
        busy = [0.0] * self.num_stages
        for task, a, b in zip(self.tasks, self.start, self.end):
            busy[task.stage] += b - a
        return [b / self.span for b in busy]

    def idle_fraction(self) -> float:
        """The pipeline's measured bubble: the share of (stages x span) in which a device ran no task."""
        return 1.0 - sum(self.busy_fraction()) / self.num_stages

    def peak_in_flight(self) -> list[int]:
        """Per stage: the most micro-batches between their forward's start and their backward's end,
        in the order the tasks actually started (``in_flight_micro_batches`` of the measured order)."""
        ran = sorted(zip(self.start, range(len(self.tasks)), self.tasks))
        return in_flight_micro_batches([[task for _, _, task in ran if task.stage == s] for s in range(self.num_stages)])


def _stage_seconds(name: str, value: float | Sequence[float], num_stages: int) -> list[float]:
    values = [value] * num_stages if np.ndim(value) == 0 else list(value)
    if len(values) != num_stages or not all(np.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"{name}={value!r} is invalid: must be a number of seconds >= 0, or one per stage "
                         f"({num_stages})")
    return [float(v) for v in values]


def emulate_schedule(schedule: str, num_stages: int, num_micro_batches: int,
                     forward_seconds: float | Sequence[float], backward_seconds: float | Sequence[float]) -> Timeline:
    """Run ``schedule`` with emulated stages whose durations are known, and measure its timeline.

    One host thread per stage's device walks that device's ``device_orders`` list; each task waits
    until the tasks it is ordered after (``_ordering_dependencies``) have ended, then *is* a wait
    of ``forward_seconds`` or ``backward_seconds`` (``time.sleep``, which releases the CPU, so the
    P devices overlap as P accelerators would, whatever the number of cores). The sequential
    schedule runs ``execution_order`` in one thread, as the real step serialises it. Durations are
    one number for every stage, or one per stage.

    Returns the measured ``Timeline`` (tasks in ``execution_order``; real clock, so it includes the
    threads' wake-up latency). Raises ValueError for an unknown schedule, a non-positive number of
    stages or micro-batches, or a negative or non-finite duration.
    """
    check_positive_int("num_stages", num_stages)
    check_positive_int("num_micro_batches", num_micro_batches)
    forward = _stage_seconds("forward_seconds", forward_seconds, num_stages)
    backward = _stage_seconds("backward_seconds", backward_seconds, num_stages)
    order = execution_order(schedule, num_stages, num_micro_batches)  # validates; raises on a deadlock
    ended = {task: threading.Event() for task in order}
    times: dict[Task, tuple[float, float]] = {}

    def work(tasks: list[Task]) -> None:
        for task in tasks:
            for dependency in _ordering_dependencies(task, num_stages):
                ended[dependency].wait()
            start = time.perf_counter()
            time.sleep((forward if task.kind == "F" else backward)[task.stage])
            times[task] = (start, time.perf_counter())
            ended[task].set()

    queues = [order] if schedule == "sequential" else device_orders(schedule, num_stages, num_micro_batches)
    threads = [threading.Thread(target=work, args=(tasks,), daemon=True) for tasks in queues]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    start, end = (np.array([times[task][k] for task in order]) for k in (0, 1))
    origin = start.min()
    return Timeline(order, start - origin, end - origin)


def schedule_time(schedule: str, num_stages: int, num_micro_batches: int, forward_seconds: float,
                  backward_seconds: float) -> float:
    """The model of a balanced pipeline's step time (every stage's forward takes ``forward_seconds``, its
    backward ``backward_seconds``), t_F and t_B: sequential P M (t_F + t_B); grouped and interleaved
    (M + P - 1)(t_F + t_B)."""
    check_one_of("schedule", schedule, SCHEDULES)
    check_positive_int("num_stages", num_stages)
    check_positive_int("num_micro_batches", num_micro_batches)
    task_pair = forward_seconds + backward_seconds
    if schedule == "sequential":
        return num_stages * num_micro_batches * task_pair
    return (num_micro_batches + num_stages - 1) * task_pair


def in_flight_formula(schedule: str, num_stages: int, num_micro_batches: int) -> list[int]:
    """Per stage ℓ (from 0), the micro-batches a schedule keeps in flight at its peak, by formula:
    sequential 1; grouped M; interleaved (1F1B) min(P - ℓ, M)."""
    check_one_of("schedule", schedule, SCHEDULES)
    check_positive_int("num_stages", num_stages)
    check_positive_int("num_micro_batches", num_micro_batches)
    if schedule == "sequential":
        return [1] * num_stages
    if schedule == "grouped":
        return [num_micro_batches] * num_stages
    return [min(num_stages - s, num_micro_batches) for s in range(num_stages)]


class EncoderForward(NamedTuple):
    """What stage 0's forward keeps for its backward: the tape on the encoder, loc, scale [b, D],
    the noise eps [b, D], and z0 [b, D] (sent to stage 1)."""

    tape: tf.GradientTape
    loc: tf.Tensor
    scale: tf.Tensor
    eps: tf.Tensor
    z0: tf.Tensor


class DecoderForward(NamedTuple):
    """What stage 2's forward keeps for its backward: the tape on the decoder and log p(x | zT) [b]."""

    tape: tf.GradientTape
    log_likelihood: tf.Tensor


class DecoderMessage(NamedTuple):
    """Stage 2's backward: the decoder's gradients and loss (a sum), and log p(x, zT) [b] for stage 0."""

    gradients: list[tf.Tensor]
    loss: tf.Tensor
    log_joint_zT: tf.Tensor


class ChainMessage(NamedTuple):
    """Stage 1's backward, for stage 0: log p(x, z0) [b] and its gradient [b, D] at the chain's start."""

    log_joint_z0: tf.Tensor
    grad_z0: tf.Tensor


class EncoderResult(NamedTuple):
    """Stage 0's backward: the encoder's gradients (mean net, then scale net), loss (a sum) and g [b]."""

    gradients: list[tf.Tensor]
    loss: tf.Tensor
    g: tf.Tensor


class PipelinedVCDTrainer(VCDTrainer):
    """A VCD trainer whose step runs as a pipeline over three devices (``config.execution.pipeline``).

    Same state as ``VCDTrainer`` (so checkpoints are interchangeable) and the same
    ``train_step(index, x)``, with x the effective batch [micro_batch_size x
    gradient_accumulation, 784]; ``timed_step`` also returns the step's measured ``Timeline``.
    With ``jit_compile`` XLA compiles the HMC chain (stage 1's forward, most of the work); the
    step around it stays a plain ``tf.function``, whose executor runs the devices concurrently.
    Build it with ``trainers.build_trainer(config)``, which places the model's networks on
    their stages' devices.
    """

    def __init__(self, model: VAE, config: Config):
        pipeline = config.execution.pipeline
        known = [short_device_name(d.name) for d in tf.config.list_logical_devices()]
        missing = [d for d in pipeline.devices if short_device_name(d) not in known]
        if missing:
            raise ValueError(f"devices {missing} do not exist here; logical devices: {known}. Make more "
                             "with devices.split_physical_device(n) at the start of the process")
        super().__init__(model, config)
        self.pipeline = pipeline
        self.chain = tf.function(self.run_chain, jit_compile=True) if self.jit_compile else self.run_chain
        self.order = execution_order(pipeline.schedule, NUM_STAGES, pipeline.gradient_accumulation)
        self.train_step = tf.function(self._train_step)
        self._step_inputs = tf.function(self.step_inputs)
        self._apply_estimate = tf.function(self.apply_estimate)
        self._stamped_estimates: dict[tuple, Callable] = {}  # the stamped estimate, traced once per batch shape

    def timed_step(self, index: tf.Tensor, x: tf.Tensor) -> tuple[dict[str, tf.Tensor], Timeline]:
        """One training step, and when each of its tasks ran: the same state changes as
        ``train_step``, with the estimate computed by a stamped graph of its own."""
        baseline, seed = self._step_inputs(index)
        estimate, times = self._stamped_estimate(x, baseline, seed)(x, baseline, seed)
        metrics = self._apply_estimate(index, x, baseline, estimate)
        times = times.numpy()
        origin = times[:, 0].min()
        return metrics, Timeline(list(self.order), times[:, 0] - origin, times[:, 1] - origin)

    def _stamped_estimate(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor) -> Callable:
        """``estimate_gradients_pipelined`` with stamps, traced without automatic control
        dependencies (see the module's docstring): only the devices' orders and the tasks' inputs
        order the tasks. The estimate changes no state, so nothing else needs ordering."""
        signature = [tf.TensorSpec(t.shape, t.dtype) for t in (x, baseline, seed)]
        key = tuple((tuple(spec.shape), spec.dtype) for spec in signature)
        if key not in self._stamped_estimates:
            self._stamped_estimates[key] = tf.compat.v1.wrap_function(
                lambda x, baseline, seed: self.estimate_gradients_pipelined(x, baseline, seed, stamp=True), signature)
        return self._stamped_estimates[key]

    # The six tasks of a micro-batch, one method each. What a forward keeps for its backward and
    # what a backward sends upstream are named tuples; the schedule decides when each runs.

    def encoder_forward(self, x_m: tf.Tensor, noise_seed: tf.Tensor) -> EncoderForward:
        """Stage 0: loc, scale = encoder(x), z0 = loc + scale * eps, under a tape on the encoder."""
        tape = tf.GradientTape(watch_accessed_variables=False)
        # Recomputation keeps only the encoder's input from forward to backward.
        encoder = functools.partial(self.model.encoder, precision=self.config.precision)
        encoder = tf.recompute_grad(encoder) if self.pipeline.recompute_encoder else encoder
        with tape:
            tape.watch(self._encoder_variables())
            loc, scale = encoder(x_m)
        eps = tf.random.stateless_normal(tf.shape(loc), seed=noise_seed)
        return EncoderForward(tape, loc, scale, eps, tf.stop_gradient(loc + scale * eps))

    def _encoder_variables(self) -> list[tf.Variable]:
        groups = self.model.parameter_groups()
        return list(groups["encoder_mean"]) + list(groups["encoder_scale"])

    def chain_forward(self, x_m: tf.Tensor, z0: tf.Tensor, step_size: tf.Tensor, chain_seed: tf.Tensor) -> HMCResult:
        """Stage 1: the HMC chain from z0 on log p(x, .)."""
        return self.chain(x_m, z0, step_size, chain_seed)

    def decoder_forward(self, x_m: tf.Tensor, zT: tf.Tensor) -> DecoderForward:
        """Stage 2: log p(x | zT) under a tape on the decoder."""
        tape = tf.GradientTape(watch_accessed_variables=False)
        with tape:
            tape.watch(self.model.parameter_groups()["decoder"])
            log_likelihood = bernoulli_log_likelihood(x_m, self.model.decoder(zT, self.config.precision))
        return DecoderForward(tape, log_likelihood)

    def decoder_backward(self, forward: DecoderForward, zT: tf.Tensor) -> DecoderMessage:
        """Stage 2: the decoder's gradients and loss, and log p(x, zT) for the encoder's g."""
        # d decoder_loss / d log_likelihood is -1 for every example.
        gradients = forward.tape.gradient(forward.log_likelihood, self.model.parameter_groups()["decoder"],
                                          output_gradients=-tf.ones_like(forward.log_likelihood))
        log_joint_zT = tf.stop_gradient(forward.log_likelihood) + standard_normal_log_prob(zT)
        return DecoderMessage(gradients, -tf.reduce_sum(forward.log_likelihood), log_joint_zT)

    def chain_backward(self, chain: HMCResult) -> ChainMessage:
        """Stage 1: the chain's first evaluation, log p(x, z0) and its gradient, sent to the encoder."""
        return ChainMessage(tf.identity(chain.initial_log_prob), tf.identity(chain.initial_gradient))

    def encoder_backward(self, forward: EncoderForward, zT: tf.Tensor, chain: ChainMessage,
                         decoder: DecoderMessage, baseline_m: tf.Tensor) -> EncoderResult:
        """Stage 0: the encoder's surrogate loss from the messages, and its gradients."""
        with tf.GradientTape() as head:
            head.watch([forward.loc, forward.scale])
            loss, g = encoder_surrogate_loss(forward.loc, forward.scale, forward.loc + forward.scale * forward.eps, zT,
                                             chain.log_joint_z0, chain.grad_z0, decoder.log_joint_zT, baseline_m)
        d_loc, d_scale = head.gradient(loss, [forward.loc, forward.scale])
        gradients = forward.tape.gradient([forward.loc, forward.scale], self._encoder_variables(),
                                          output_gradients=[d_loc, d_scale])
        return EncoderResult(gradients, loss, g)

    def estimate_gradients_pipelined(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor, *,
                                     stamp: bool = False) -> tuple[VCDEstimate, tf.Tensor | None]:
        """The pipelined counterpart of ``training.accumulate_gradients``: x [B, 784], baseline [B], seed
        [2] -> (the same estimate, the tasks' [start, end] timestamps [num_tasks, 2] if ``stamp``, else
        None). Changes no state.

        Runs the tasks in ``self.order``, each on its stage's device after the task before it on that
        device (every task before it, for the sequential schedule) and on the outputs of the tasks it
        reads (``_inputs``). With ``stamp``, each task's start is stamped once that task before it and
        the tasks it reads have ended, and its end once its outputs exist: trace that only without
        automatic control dependencies (``timed_step`` does), which would chain the stamps and
        serialise the tasks."""
        p = self.pipeline
        b = p.micro_batch_size
        step_size = tf.convert_to_tensor(self.step_size)
        done: dict[Task, NamedTuple] = {}

        def run(task: Task, inputs: dict[tuple[str, int], NamedTuple]) -> NamedTuple:
            """``task`` on ``inputs``, the outputs of the tasks it reads, by (kind, stage)."""
            m = task.micro_batch
            x_m = x[m * b:(m + 1) * b]
            noise_seed, chain_seed = tf.unstack(split_seed(fold_in(seed, m), 2))
            if task.kind == "F":
                return (self.encoder_forward(x_m, noise_seed) if task.stage == 0 else
                        self.chain_forward(x_m, inputs["F", 0].z0, step_size, chain_seed) if task.stage == 1
                        else self.decoder_forward(x_m, inputs["F", 1].final_state))
            if task.stage == 2:
                return self.decoder_backward(inputs["F", 2], inputs["F", 1].final_state)
            if task.stage == 1:
                return self.chain_backward(inputs["F", 1])
            return self.encoder_backward(inputs["F", 0], inputs["F", 1].final_state, inputs["B", 1], inputs["B", 2],
                                         baseline[m * b:(m + 1) * b])

        times = []
        ended: dict[Task, tf.Tensor] = {}  # each task's end stamp
        last_on_device: dict[int, list[tf.Tensor]] = {}
        previous: list[tf.Tensor] = []
        for task in self.order:
            after = previous if p.schedule == "sequential" else last_on_device.get(task.stage, [])
            reads = _inputs(task)
            with tf.device(p.device(task.stage)):
                if stamp:
                    # The task runs once its device is free and its inputs exist: a start stamped after
                    # the device alone would count the wait for other stages' outputs as running time.
                    with tf.control_dependencies(after + [ended[d] for d in reads]):
                        start = tf.timestamp()
                    after = [start]
                with tf.control_dependencies(after):
                    done[task] = run(task, {(d.kind, d.stage): done[d] for d in reads})
                finished = [t for t in tf.nest.flatten(done[task]) if tf.is_tensor(t)]
                if stamp:
                    with tf.control_dependencies(finished):
                        ended[task] = tf.timestamp()
                    times.append(tf.stack([start, ended[task]]))
                    finished = [ended[task]]
            last_on_device[task.stage] = previous = finished

        micro = range(p.gradient_accumulation)
        encoder = [done[Task("B", 0, m)] for m in micro]
        decoder = [done[Task("B", 2, m)] for m in micro]
        chains = [done[Task("F", 1, m)] for m in micro]
        with tf.device(p.device(0)):
            encoder_sums = [tf.add_n(parts) for parts in zip(*(e.gradients for e in encoder))]
        with tf.device(p.device(2)):
            decoder_sums = [tf.add_n(parts) for parts in zip(*(d.gradients for d in decoder))]
        num_mean = len(self.model.parameter_groups()["encoder_mean"])
        gradients = {"encoder_mean": encoder_sums[:num_mean], "encoder_scale": encoder_sums[num_mean:],
                     "decoder": decoder_sums}
        estimate = VCDEstimate(gradients, tf.add_n([e.loss for e in encoder]), tf.add_n([d.loss for d in decoder]),
                               tf.concat([e.g for e in encoder], 0), tf.reduce_mean([c.accept_rate for c in chains]),
                               tf.reduce_mean([c.step_size for c in chains]))
        return estimate, (tf.stack(times) if stamp else None)

    def batch_estimate(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor) -> VCDEstimate:
        """The pipelined estimate, unstamped."""
        return self.estimate_gradients_pipelined(x, baseline, seed)[0]


def state_bytes_per_device(trainer: VCDTrainer) -> dict[str, int]:
    """Bytes of trainer state (weights, optimiser slots, control variate, ...) on each device."""
    totals: dict[str, int] = {}
    for variable in trainer.variables:
        device = short_device_name(variable.device)
        totals[device] = totals.get(device, 0) + int(np.prod(variable.shape)) * variable.dtype.size
    return dict(sorted(totals.items()))


def in_flight_micro_batches(orders: list[list[Task]]) -> list[int]:
    """Per stage: the most micro-batches whose forward has run and backward has not (each holds
    its saved activations): the activation memory a schedule needs, in micro-batches."""
    peaks = []
    for order in orders:
        live = peak = 0
        for task in order:
            live += 1 if task.kind == "F" else -1
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def bubble_fraction(num_stages: int, num_micro_batches: int) -> float:
    """The idle share of a balanced pipeline of P stages and M micro-batches: (P - 1) / (M + P - 1)."""
    check_positive_int("num_stages", num_stages)
    check_positive_int("num_micro_batches", num_micro_batches)
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


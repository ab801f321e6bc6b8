"""How fast is a training step? Timings of the real step in each execution style (the sweep and
the tables of ``python -m vcd_helpers bench`` are the run service's: ``runs/bench.py``).

Execution styles (``time_training_step``'s ``style``):

- ``eager``: a Python loop calling the step's Python code op by op;
- ``function``: a Python loop calling the ``tf.function`` step once per batch;
- ``loop``: ``steps_per_call`` steps inside one ``tf.function`` (``loops.make_training_loop``);
- ``xla`` / ``xla_loop``: the same two with the step compiled by XLA (``jit_compile=True``).

Every timing is ``timing.time_calls``': the median over several calls after a warm-up call
(tracing and compiling are never timed), divided by the steps per call. These are benchmarks: they print figures, and no
test depends on how fast a machine is.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from vcd_helpers.config import CHAIN_METHODS, NUM_PIXELS, Config, check_one_of, check_positive_int
from vcd_helpers.data import indexed_batches, load_binarized_mnist
from vcd_helpers.hmc import block_sizes, sharded_target, value_and_gradient
from vcd_helpers.seeds import salted_seed, split_seed
from vcd_helpers.timing import MIN_INTERVAL_ROUNDS, median_interval, Timing, time_alternately, time_calls
from vcd_helpers.trainers import build_trainer
from vcd_helpers.training import chain_blocks
from vcd_helpers.loops import make_training_loop

STYLES = ("eager", "function", "loop", "xla", "xla_loop")
#: How the benchmark table names each of ``config.PRECISIONS``.
PRECISION_LABELS = {"float32": "f32", "bfloat16": "bf16"}


def mlp_forward_flops(sizes: list[int]) -> int:
    """Multiply-adds x 2 of one example's pass through dense layers of these sizes."""
    return sum(2 * a * b for a, b in zip(sizes[:-1], sizes[1:]))


def step_flops(config: Config) -> float:
    """Floating-point operations of one training step (matrix multiplies only), for the batch.

    A forward pass costs F; back-propagating to the input costs about F more, and to the weights
    F more again. VCD: the HMC chain evaluates log p(x, z) and its gradient 1 + T*L times
    (2F each; its first evaluation, at z0, also serves the encoder's pathwise term); the decoder
    loss at zT trains the decoder (3F); each encoder net runs forward and is trained (3F each).
    The VAE: one encoder and decoder pass, trained (3F each). Hoffman's method costs VCD's: the
    same chain and decoder loss, its encoder's ELBO at z0 also read from the chain's first evaluation.
    """
    hidden, latent = config.model.hidden_units, config.model.latent_dim
    decoder = mlp_forward_flops([latent, hidden, hidden, NUM_PIXELS])
    encoder_net = mlp_forward_flops([NUM_PIXELS, hidden, hidden, latent])
    if config.method == "vae":
        per_example = 3 * decoder + 2 * 3 * encoder_net
    else:
        evaluations = 1 + config.hmc.num_iterations * config.hmc.num_leapfrog_steps
        per_example = evaluations * 2 * decoder + 3 * decoder + 2 * 3 * encoder_net
    return float(per_example * config.batch_size)


def matmul_call(m: int = 1024, k: int = 1024, n: int = 1024, *, dtype: tf.DType = tf.float32,
                jit_compile: bool = True) -> tuple[Callable[[], tf.Tensor], float]:
    """``(call, flops)``: ``call()`` runs [m, k] x [k, n] matrix multiplies of ``dtype`` back to
    back inside one compiled loop (XLA unless ``jit_compile`` is False: then TensorFlow's own
    kernels, oneDNN on x86), each depending on the last, as the chain's do, enough of them for
    about 2 GFLOP; ``flops`` is what one call computes. Time it beside other work
    (``timing.time_alternately``) to express that work as a share of this rate."""
    a = tf.cast(tf.random.stateless_normal([m, k], seed=[1, 2]), dtype)
    b = tf.cast(tf.random.stateless_normal([k, n], seed=[3, 4]) / float(np.sqrt(k)), dtype)
    count = max(1, int(2e9 // (2 * m * k * n)))

    @tf.function(jit_compile=jit_compile)
    def chained():
        def body(i, c, total):
            product = tf.linalg.matmul(c, b)
            # Feed a slice of each product into the next multiply, so none can be skipped or hoisted.
            return i + 1, c + tf.cast(1e-6, dtype) * product[:, :1], total + tf.cast(product[0, 0], tf.float32)
        return tf.while_loop(lambda i, *_: i < count, body, (0, a, 0.0))[2]

    return chained, float(2 * m * k * n * count)


def matmul_gflops(m: int = 1024, k: int = 1024, n: int = 1024, *, repeats: int = 5,
                  dtype: tf.DType = tf.float32, jit_compile: bool = True) -> float:
    """This machine's rate on [m, k] x [k, n] matrix multiplies of ``dtype``, in GFLOP/s: the
    median of ``repeats`` timed calls of ``matmul_call`` after a warm-up. The default, float32
    at 1024^3 under XLA, is what large multiplies reach here (the "dense rate"); the step's own
    shapes (at batch B the decoder's widest layer is B x 200 x 784) show what small ones do, and
    ``tf.bfloat16`` what reduced precision would."""
    call, flops = matmul_call(m, k, n, dtype=dtype, jit_compile=jit_compile)
    return flops / time_calls(call, repeats=repeats).median / 1e9


class TimedStep:
    """A trainer of ``config`` built to be timed, with its step in ``style`` (see the module):
    ``step`` is ``loop(iterator, k)`` for the ``loop`` styles, else ``step(index, x)``. The style
    sets ``execution.jit_compile``; the rest of the execution section (e.g. ``chain_shards``) is the
    config's. The caller holds it (nothing else does) and ``call`` gives timed calls of any steps
    per call from the one compiled step (k is a tensor of the loop), so they never compile again."""

    def __init__(self, config: Config, style: str, seed: int = 0):
        check_one_of("style", style, STYLES)
        self.config, self.style, self.seed = config, style, seed
        self.trainer = build_trainer(config.replace(seed=seed, execution={"jit_compile": style.startswith("xla")}))
        if style in ("loop", "xla_loop"):
            self.step = make_training_loop(self.trainer)
        else:
            self.step = self.trainer.train_step.python_function if style == "eager" else self.trainer.train_step
        self.initial_state = [variable.numpy() for variable in self.trainer.variables]

    def call(self, steps_per_call: int = 1) -> tuple[Callable[[], Any], int]:
        """``(call, k)``: ``call()`` runs k training steps (``steps_per_call`` for the ``loop`` styles,
        else 1), taking batches from an endless pipeline. Starts from the trainer's initial state and
        the first batch, so that no timing inherits the weights an earlier one trained (calls alive at
        once share them)."""
        k = steps_per_call if self.style in ("loop", "xla_loop") else 1
        for variable, value in zip(self.trainer.variables, self.initial_state):
            variable.assign(value)
        config = self.config
        iterator = iter(indexed_batches(load_binarized_mnist("train")[: config.train_examples], config.batch_size,
                                        self.seed))
        step = self.step
        if self.style in ("loop", "xla_loop"):
            steps = tf.constant(k)
            return (lambda: step(iterator, steps)), k
        return (lambda: step(*next(iterator))), k


def step_call(config: Config, style: str, *, steps_per_call: int = 1,
              seed: int = 0) -> tuple[Callable[[], Any], int]:
    """``(call, k)``: ``call()`` runs k training steps of ``config`` in ``style`` (see the module),
    from a ``TimedStep`` of its own that lives as long as ``call`` does (each ``step_call`` builds
    and compiles one: hold a ``TimedStep`` to time one step at several steps per call)."""
    return TimedStep(config, style, seed).call(steps_per_call)


def time_training_step(config: Config, style: str, *, steps_per_call: int = 1, calls: int = 5,
                       seed: int = 0) -> float:
    """Median milliseconds per training step of ``config`` run in ``style``: ``step_call``, timed
    ``calls`` times after its compiling first call."""
    check_positive_int("calls", calls)
    call, k = step_call(config, style, steps_per_call=steps_per_call, seed=seed)
    return time_calls(call, repeats=calls, units=k).median_ms


@dataclass(frozen=True)
class BenchmarkRow:
    """One configuration's timing. ``shape_gflops``: the machine's matmul rate at the step's
    widest multiply at this batch size (batch x hidden x 784), measured in the same run, and
    ``bound_ms``: the step's time if all its FLOPs ran at that rate; ``cores_used``: process CPU
    time over wall time while the step ran (1.0: one core kept busy); ``chain_shards``: blocks of
    VCD's chain evaluated concurrently (None: the VAE, which has no chain); ``precision``: the
    networks' multiplies (``config.precision``)."""

    config: str
    batch_size: int
    ms_per_step: float
    examples_per_second: float
    gflops_per_second: float
    shape_gflops: float
    bound_ms: float
    cores_used: float
    chain_shards: int | None = None
    precision: str = "float32"


def decoder_layer_gflops(config: Config) -> float:
    """``matmul_gflops`` at the step's widest multiply: [batch, hidden] x [hidden, 784]."""
    return matmul_gflops(config.batch_size, config.model.hidden_units, NUM_PIXELS)


def row_from_timing(config: Config, timed: Timing, shape_gflops: float) -> BenchmarkRow:
    """The benchmark row of ``config``'s step timed as ``timed`` (per step), against the matmul
    rate ``shape_gflops`` at the step's widest multiply."""
    chain_shards = chain_blocks(config.execution) if config.method in CHAIN_METHODS else None
    flops, ms = step_flops(config), timed.median_ms
    return BenchmarkRow(config.name, config.batch_size, ms, 1000 * config.batch_size / ms,
                        flops / (ms / 1000) / 1e9, shape_gflops, 1000 * flops / (shape_gflops * 1e9),
                        timed.cores_used, chain_shards, config.precision)


@dataclass(frozen=True)
class StepBreakdown:
    """Where a VCD step's milliseconds go: median ms of each part, timed alternately in one process
    together with the machine's multiply rates, so that drift hits them all alike.

    ``step``: the whole training step (XLA, in-graph loop); ``chain``: its HMC chain alone;
    ``evaluations``: the chain's 1 + T x L evaluations of log p(x, z) and its gradient, back to
    back with none of HMC's own work; ``dots``: only those evaluations' matrix multiplies (the
    decoder's three forward and three backward ones). The differences are the parts in between.
    ``step_gflops`` and ``dots_gflops``: the rates the step and the multiplies reach;
    ``shape_gflops``: the step's widest multiply (batch x hidden x 784) by itself;
    ``matmul_rate``: dense 1024^3 multiplies (all GFLOP/s, float32). ``timings``: each timed
    part's ``Timing`` from the alternation ("step" per training step; "dense" and "widest" are the
    multiplies above), for their spread.
    """

    chain_shards: int
    step: float
    chain: float
    evaluations: float
    dots: float
    step_gflops: float
    dots_gflops: float
    shape_gflops: float
    matmul_rate: float
    timings: dict[str, Timing] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def parts(self) -> dict[str, float]:
        """ms of each part of the step, adding up to ``step``."""
        return {name: getattr(self, whole) - (getattr(self, less) if less else 0.0)
                for name, (whole, less) in PARTS.items()}

    def part_intervals(self, confidence: float = 0.95) -> dict[str, tuple[float, float, float]] | None:
        """Per part, the median over the alternated rounds of its per-round difference (ms) and
        that median's bootstrap interval, (median, low, high); None with fewer than
        ``MIN_INTERVAL_ROUNDS`` rounds. A part whose interval holds 0 is not resolved from noise."""
        rounds = len(self.timings["step"].seconds) if self.timings else 0
        if rounds < MIN_INTERVAL_ROUNDS:
            return None
        ms = {name: 1000 * np.asarray(self.timings[name].seconds) / self.timings[name].units
              for name in ("step", "chain", "evaluations", "dots")}
        result = {}
        for name, (whole, less) in PARTS.items():
            per_round = ms[whole] - (ms[less] if less else 0.0)
            result[name] = (float(np.median(per_round)), *median_interval(per_round, confidence=confidence))
        return result


#: The step's parts: (the timed whole, the timed part it contains) whose difference each part is.
PARTS = {"around the chain: encoder, decoder loss, RMSProp": ("step", "chain"),
         "HMC's own: momenta, Metropolis, step size, loop": ("chain", "evaluations"),
         "the evaluations' elementwise work: softplus, ReLU": ("evaluations", "dots"),
         "the evaluations' matrix multiplies": ("dots", None)}


def _decoder_dots(weights: list[tf.Tensor], z: tf.Tensor) -> tf.Tensor:
    """The matrix multiplies of one decoder evaluation and its gradient in z, nothing else:
    z [B, D] through the weights and back again; [B, D]."""
    h = z
    for w in weights:
        h = tf.linalg.matmul(h, w)
    for w in reversed(weights):
        h = tf.linalg.matmul(h, w, transpose_b=True)
    return h


def step_breakdown(config: Config, *, calls: int = 11, steps_per_call: int = 10, seed: int = 0) -> StepBreakdown:
    """Time a VCD step of ``config`` and its parts alternately (see ``StepBreakdown``), with the
    chain in ``config.execution.chain_shards`` blocks (default: one per compute thread). Each part
    is compiled by XLA, as in the training step. Raises ValueError for the VAE (no chain)."""
    if config.method != "vcd":
        raise ValueError(f"method={config.method!r} is invalid: only VCD's step has a chain to break down")
    step, k = step_call(config, "xla_loop", steps_per_call=steps_per_call, seed=seed)
    trainer = build_trainer(config.replace(seed=seed))
    chain_shards = trainer.chain_shards
    x = tf.constant(load_binarized_mnist("train")[: config.batch_size], tf.float32)
    loc, scale = trainer.model.encoder(x)
    noise_seed, chain_seed = tf.unstack(split_seed(salted_seed(seed, "step_breakdown"), 2))
    z0 = loc + scale * tf.random.stateless_normal(tf.shape(loc), seed=noise_seed)
    hmc = config.hmc
    count = 1 + hmc.num_iterations * hmc.num_leapfrog_steps
    target = sharded_target(functools.partial(trainer.model.log_joint, precision=config.precision), x, chain_shards)
    sizes = block_sizes(config.batch_size, chain_shards)
    weights = [tf.convert_to_tensor(w) for w in trainer.model.decoder.net.weights]

    chain = tf.function(lambda: trainer.run_chain(x, z0, trainer.step_size, chain_seed).final_state,
                        jit_compile=True)

    def repeated(one):  # ``count`` evaluations, each starting where the last ended
        def body(i, z):
            return i + 1, z + 1e-6 * one(z)
        return tf.function(lambda: tf.while_loop(lambda i, _: i < count, body, (0, z0))[1], jit_compile=True)

    evaluations = repeated(lambda z: value_and_gradient(target, z)[1])
    dots = repeated(lambda z: tf.concat([_decoder_dots(weights, b) for b in tf.split(z, sizes)], axis=0))
    dense, dense_flops = matmul_call()
    widest, widest_flops = matmul_call(config.batch_size, config.model.hidden_units, NUM_PIXELS)
    timings = time_alternately({"step": step, "chain": chain, "evaluations": evaluations, "dots": dots,
                                "dense": dense, "widest": widest}, repeats=calls)
    seconds = {name: t.median / (k if name == "step" else 1) for name, t in timings.items()}
    hidden, latent = config.model.hidden_units, config.model.latent_dim
    dot_flops = count * 2 * mlp_forward_flops([latent, hidden, hidden, NUM_PIXELS]) * config.batch_size
    return StepBreakdown(chain_shards, *(1000 * seconds[name] for name in ("step", "chain", "evaluations", "dots")),
                         step_gflops=step_flops(config) / seconds["step"] / 1e9,
                         dots_gflops=dot_flops / seconds["dots"] / 1e9,
                         shape_gflops=widest_flops / seconds["widest"] / 1e9,
                         matmul_rate=dense_flops / seconds["dense"] / 1e9,
                         timings={name: dataclasses.replace(t, units=k) if name == "step" else t
                                  for name, t in timings.items()})


def format_breakdown(breakdown: StepBreakdown) -> str:
    """The breakdown as a few lines of text: each part's ms and share of the step and, with enough
    rounds, the median of its per-round differences (so that the value lies in its interval) with
    the 95% interval of that median, or "not resolved" where that holds 0; with fewer rounds, the
    difference of two medians. On a noisy machine a small part can come out negative."""
    b = breakdown
    lines = [f"one VCD step, chain in {b.chain_shards} block(s): {b.step:.1f} ms, {b.step_gflops:.0f} GFLOP/s, "
             f"{b.step_gflops / b.matmul_rate:.0%} of the dense rate"]
    intervals = b.part_intervals()
    for name, ms in b.parts().items():
        if intervals:
            ms, low, high = intervals[name]
        line = f"  {name:<50}{ms:>6.1f} ms {ms / b.step:>4.0%}"
        if intervals:
            line += " not resolved" if low <= 0 <= high else f" [{low:.1f}, {high:.1f}]"
        lines.append(line)
    lines.append(f"  the multiplies alone: {b.dots_gflops:.0f} GFLOP/s, {b.dots_gflops / b.matmul_rate:.0%} of the "
                 f"dense rate ({b.matmul_rate:.0f} GFLOP/s)")
    lines.append(f"  the widest multiply alone: {b.shape_gflops:.0f} GFLOP/s, {b.shape_gflops / b.matmul_rate:.0%} "
                 "of the dense rate")
    return "\n".join(lines)

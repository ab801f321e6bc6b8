"""How fast is a training step? Timings of the real step in each execution style, and the
benchmark behind ``python -m vcd_helpers bench``.

Execution styles (``time_training_step``'s ``style``):

- ``eager``: a Python loop calling the step's Python code op by op;
- ``function``: a Python loop calling the ``tf.function`` step once per batch;
- ``loop``: ``steps_per_call`` steps inside one ``tf.function`` (``training.make_training_loop``);
- ``xla`` / ``xla_loop``: the same two with the step compiled by XLA (``jit_compile=True``).

Every timing is the median over several calls after a warm-up call (tracing and compiling are
never timed), divided by the steps per call. These are benchmarks: they print figures, and no
test depends on how fast a machine is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from vcd_helpers.config import Config, load_config
from vcd_helpers.data import NUM_PIXELS, indexed_batches, load_binarized_mnist
from vcd_helpers.training import build_trainer, make_training_loop

STYLES = ("eager", "function", "loop", "xla", "xla_loop")


def mlp_forward_flops(sizes: list[int]) -> int:
    """Multiply-adds x 2 of one example's pass through dense layers of these sizes."""
    return sum(2 * a * b for a, b in zip(sizes[:-1], sizes[1:]))


def step_flops(config: Config) -> float:
    """Floating-point operations of one training step (matrix multiplies only), for the batch.

    A forward pass costs F; back-propagating to the input costs about F more, and to the weights
    F more again. VCD: the HMC chain evaluates log p(x, z) and its gradient 1 + T*L times
    (2F each); the pathwise term differentiates the decoder at z0 back to the encoder (2F);
    the decoder loss at zT trains the decoder (3F); each encoder net runs forward and is trained
    (3F each). The VAE: one encoder and decoder pass, trained (3F each).
    """
    hidden, latent = config.model.hidden_units, config.model.latent_dim
    decoder = mlp_forward_flops([latent, hidden, hidden, NUM_PIXELS])
    encoder_net = mlp_forward_flops([NUM_PIXELS, hidden, hidden, latent])
    if config.method == "vae":
        per_example = 3 * decoder + 2 * 3 * encoder_net
    else:
        evaluations = 1 + config.hmc.num_iterations * config.hmc.num_leapfrog_steps
        per_example = evaluations * 2 * decoder + 2 * decoder + 3 * decoder + 2 * 3 * encoder_net
    return float(per_example * config.batch_size)


def matmul_gflops(size: int = 1024, repeats: int = 5) -> float:
    """This machine's dense float32 matrix-multiply rate: a size^3 matmul in a tf.function."""
    a = tf.random.stateless_normal([size, size], seed=[1, 2])
    b = tf.random.stateless_normal([size, size], seed=[3, 4])
    matmul = tf.function(lambda a, b: tf.reduce_sum(tf.linalg.matmul(a, b)))
    matmul(a, b).numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).numpy()
        times.append(time.perf_counter() - start)
    return 2 * size ** 3 / float(np.median(times)) / 1e9


def time_training_step(config: Config, style: str, *, steps_per_call: int = 1, calls: int = 5,
                       seed: int = 0) -> float:
    """Median milliseconds per training step of ``config`` run in ``style`` (see the module).

    ``steps_per_call`` applies to the ``loop`` styles (the others run one step per call).
    """
    if style not in STYLES:
        raise ValueError(f"style={style!r} is invalid: must be one of {', '.join(STYLES)}")
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls={calls!r} is invalid: must be a positive integer")
    k = steps_per_call if style in ("loop", "xla_loop") else 1
    trainer = build_trainer(config.replace(seed=seed), jit_compile=style.startswith("xla"))
    images = load_binarized_mnist("train")[: config.train_examples]
    iterator = iter(indexed_batches(images, config.batch_size, seed))
    if style == "eager":
        def call():
            index, x = next(iterator)
            return trainer._train_step(index, x)
    elif style in ("function", "xla"):
        def call():
            index, x = next(iterator)
            return trainer.train_step(index, x)
    else:
        loop = make_training_loop(trainer)
        steps = tf.constant(k)

        def call():
            return loop(iterator, steps)
    call()  # trace and compile
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        outputs = call()
        float(tf.reduce_sum(outputs[trainer.metric_names[0]]))  # wait for the result
        times.append((time.perf_counter() - start) / k)
    return 1000 * float(np.median(times))


@dataclass(frozen=True)
class BenchmarkRow:
    config: str
    batch_size: int
    ms_per_step: float
    examples_per_second: float
    gflops_per_second: float


def benchmark_row(config: Config, *, steps_per_call: int = 10, calls: int = 5,
                  style: str = "xla_loop") -> BenchmarkRow:
    """Time ``config``'s step as the training command runs it (XLA, in-graph loop) and derive
    examples/s and GFLOP/s."""
    ms = time_training_step(config, style, steps_per_call=steps_per_call, calls=calls)
    return BenchmarkRow(config.name, config.batch_size, ms, 1000 * config.batch_size / ms,
                        step_flops(config) / (ms / 1000) / 1e9)


def run_benchmark(config_names: list[str], batch_sizes: list[int], *, steps_per_call: int = 10,
                  calls: int = 5) -> list[BenchmarkRow]:
    """``benchmark_row`` for each preset and batch size. Speed does not depend on the learning
    rate, so every batch size (tuned or not) runs at the preset's batch-100 rate."""
    return [benchmark_row(load_config(name, batch_size=batch_size, optimizer={"learning_rate": 5e-4}),
                          steps_per_call=steps_per_call, calls=calls)
            for name in config_names for batch_size in batch_sizes]


def format_benchmark(rows: list[BenchmarkRow], matmul_rate: float) -> str:
    """A plain-text table of the rows, with the measured matmul rate for comparison."""
    lines = [f"dense float32 matmul on this machine: {matmul_rate:.0f} GFLOP/s (1024^3, tf.function)",
             f"{'config':<12}{'batch':>7}{'ms/step':>10}{'examples/s':>12}{'GFLOP/s':>10}{'of matmul':>11}"]
    for r in rows:
        lines.append(f"{r.config:<12}{r.batch_size:>7}{r.ms_per_step:>10.1f}{r.examples_per_second:>12.0f}"
                     f"{r.gflops_per_second:>10.1f}{r.gflops_per_second / matmul_rate:>11.0%}")
    return "\n".join(lines)

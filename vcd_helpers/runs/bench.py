"""The benchmark behind ``python -m vcd_helpers bench``: the table of step timings over presets,
batch sizes and precisions, and the final evaluation's speed, each as a plain-text table.

The timings themselves are the library's (``vcd_helpers.bench``: ``step_call``, ``row_from_timing``,
``step_breakdown``); this module sweeps them and formats what the command prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from vcd_helpers.bench import (PRECISION_LABELS, BenchmarkRow, decoder_layer_gflops, mlp_forward_flops,
                               row_from_timing, step_call)
from vcd_helpers.config import NUM_PIXELS, SPLIT_SIZES, Config, EvaluationConfig, check_positive_int, load_config
from vcd_helpers.data import load_binarized_mnist
from vcd_helpers.devices import cpu_model
from vcd_helpers.evaluation import make_evaluator
from vcd_helpers.model import VAE
from vcd_helpers.timing import time_calls


def benchmark_row(config: Config, *, steps_per_call: int = 10, calls: int = 5, style: str = "xla_loop",
                  shape_gflops: float | None = None) -> BenchmarkRow:
    """Time ``config``'s step as the training command runs it (XLA, in-graph loop; VCD's chain in
    ``config.execution.chain_shards`` blocks, by default one per compute thread), derive examples/s
    and GFLOP/s, and set them against the matmul rate at the step's own shape
    (``decoder_layer_gflops``, measured unless given)."""
    call, k = step_call(config, style, steps_per_call=steps_per_call)
    timed = time_calls(call, repeats=calls, units=k)
    return row_from_timing(config, timed, decoder_layer_gflops(config) if shape_gflops is None else shape_gflops)


def run_benchmark(config_names: list[str], batch_sizes: list[int], *, steps_per_call: int = 10,
                  calls: int = 5, chain_shards: int | None = None,
                  precisions: Sequence[str] = ("float32",)) -> list[BenchmarkRow]:
    """``benchmark_row`` for each preset, batch size and precision (``config.PRECISIONS``; the
    precisions of one preset and batch size are timed one after the other). Speed does not depend
    on the learning rate, so every batch size (tuned or not) runs at the preset's batch-100 rate.
    The matmul rate at each batch size's shape is measured once and shared by the presets."""
    configs = [load_config(name, batch_size=batch_size, optimizer={"learning_rate": 5e-4}, precision=precision,
                           execution={"chain_shards": chain_shards})
               for name in config_names for batch_size in batch_sizes for precision in precisions]
    rates = {c.batch_size: decoder_layer_gflops(c) for c in configs}
    return [benchmark_row(c, steps_per_call=steps_per_call, calls=calls, shape_gflops=rates[c.batch_size])
            for c in configs]


def machine_header(matmul_rate: float) -> list[str]:
    """The two lines above every benchmark table: the CPU, and the dense matmul rate the table's
    GFLOP/s are read against. The CPU's name has a line of its own: a brand string is at most 48
    characters, so the line stays within the tables' 80 on any CPU."""
    return [f"CPU: {cpu_model()}, {os.cpu_count()} cores",
            f"dense float32 matmul: {matmul_rate:.0f} GFLOP/s at 1024^3 (XLA)"]


def format_benchmark(rows: list[BenchmarkRow], matmul_rate: float) -> str:
    """A plain-text table of the rows (at most 80 characters wide: it is printed in the book), with
    the CPU model and the large-matmul rate for comparison above it."""
    lines = [*machine_header(matmul_rate),
             "prec: the networks' multiplies (f32, or bf16 operands with float32 sums);",
             "of dense: GFLOP/s over that rate; cores: process CPU time / wall time; shards:",
             "  blocks of chains evaluated concurrently",
             "shape: GFLOP/s at the step's widest multiply (batch x 200 x 784); bound: the",
             "  step's ms if all its FLOPs ran at that rate",
             f"{'config':<10}{'batch':>6}{'prec':>5}{'ms/step':>8}{'ex/s':>7}{'GFLOP/s':>8}{'of dense':>9}"
             f"{'cores':>6}{'shards':>7}{'shape':>6}{'bound':>7}"]
    for r in rows:
        lines.append(f"{r.config:<10}{r.batch_size:>6}{PRECISION_LABELS[r.precision]:>5}{r.ms_per_step:>8.1f}"
                     f"{r.examples_per_second:>7.0f}{r.gflops_per_second:>8.1f}"
                     f"{r.gflops_per_second / matmul_rate:>9.0%}{r.cores_used:>6.2f}"
                     f"{r.chain_shards or '-':>7}{r.shape_gflops:>6.0f}{r.bound_ms:>7.1f}")
    return "\n".join(lines)


def evaluation_flops(config: Config, evaluation: EvaluationConfig) -> float:
    """Floating-point operations (matrix multiplies only) of evaluating one image by ``evaluation``.

    With F the decoder's forward pass and E the encoder's (both nets): the proposal needs the
    encoder, and for the HMC proposals the encoder again (the chain's start) and two chains, the
    burn-in and the kept one, each evaluating log p(x, z) and its gradient (2F) once at its start
    and ``num_leapfrog_steps`` times per iteration; then each of the S importance samples costs F.
    """
    hidden, latent = config.model.hidden_units, config.model.latent_dim
    decoder = mlp_forward_flops([latent, hidden, hidden, NUM_PIXELS])
    encoder = 2 * mlp_forward_flops([NUM_PIXELS, hidden, hidden, latent])
    per_image = encoder + evaluation.num_samples * decoder
    if evaluation.proposal != "encoder":
        chains = (evaluation.burn_in > 0) + 1
        evaluations = chains + (evaluation.burn_in + evaluation.kept) * config.hmc.num_leapfrog_steps
        per_image += encoder + evaluations * 2 * decoder
    return float(per_image)


@dataclass(frozen=True)
class EvaluationRow:
    """The final evaluation's speed: ``seconds_per_image`` (median call over its images),
    ``gflops_per_second`` (``evaluation_flops`` at that speed), ``cores_used`` (process CPU time
    over wall time) and ``test_set_minutes``, the time the same protocol takes on all 10,000
    test images at that speed."""

    proposal: str
    num_examples: int
    num_samples: int
    batch_size: int
    seconds_per_image: float
    gflops_per_second: float
    cores_used: float

    @property
    def test_set_minutes(self) -> float:
        return 10_000 * self.seconds_per_image / 60


def benchmark_evaluation(config: Config, *, proposal: str = "hmc_moments", num_examples: int | None = None,
                         calls: int = 1, seed: int = 0) -> EvaluationRow:
    """Time ``config``'s final evaluation (``evaluation.make_evaluator``, as a run's last step
    calls it) with ``proposal`` on the first ``num_examples`` test images (default: one batch of
    ``config.evaluation.batch_size``), after an untimed call that traces it. The model is freshly
    initialised: the protocol's work does not depend on the weights (fixed chain lengths and
    sample counts). Raises ValueError for a ``num_examples`` that is not a positive multiple of
    the evaluation's batch size (a partial batch would trace a second graph inside the timing) or
    exceeds the test split (its rates would count images that were never evaluated)."""
    evaluation = config.replace(evaluation={"proposal": proposal, "num_examples": None}).evaluation
    num_examples = evaluation.batch_size if num_examples is None else num_examples
    check_positive_int("num_examples", num_examples)
    if num_examples > SPLIT_SIZES["test"]:
        raise ValueError(f"num_examples={num_examples} is invalid: the test split has {SPLIT_SIZES['test']:,} images")
    if num_examples % evaluation.batch_size:
        raise ValueError(f"num_examples={num_examples} is invalid: must be a multiple of the evaluation's "
                         f"batch size {evaluation.batch_size}")
    images = load_binarized_mnist("test")[:num_examples]
    evaluate = make_evaluator(VAE(config.model, seed=seed), evaluation, config.hmc)
    evaluate(images[: evaluation.batch_size], seed)  # traces the batch's graph
    timed = time_calls(lambda: evaluate(images, seed).per_example, repeats=calls, warmup=0, units=num_examples)
    return EvaluationRow(proposal, num_examples, evaluation.num_samples, evaluation.batch_size, timed.median,
                         evaluation_flops(config, evaluation) / timed.median / 1e9, timed.cores_used)


def format_evaluation(rows: Sequence[EvaluationRow], matmul_rate: float) -> str:
    """The evaluation rows as a plain-text table against the dense matmul rate."""
    lines = [*machine_header(matmul_rate),
             f"{'proposal':<12}{'images':>7}{'S':>7}{'batch':>6}{'s/image':>8}{'GFLOP/s':>8}{'of dense':>9}"
             f"{'cores':>6}{'10k images':>11}"]
    for r in rows:
        lines.append(f"{r.proposal:<12}{r.num_examples:>7}{r.num_samples:>7}{r.batch_size:>6}"
                     f"{r.seconds_per_image:>8.3f}{r.gflops_per_second:>8.1f}{r.gflops_per_second / matmul_rate:>9.0%}"
                     f"{r.cores_used:>6.2f}{r.test_set_minutes:>9.0f} m")
    return "\n".join(lines)

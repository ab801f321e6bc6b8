"""runs.bench: the step table (fits 80 columns, labels its rows) and the final evaluation's row (its FLOP
count, and a tiny timed run); no speed is asserted."""

from __future__ import annotations

import dataclasses
import os

import pytest
import tensorflow as tf

from vcd_helpers import bench as library_bench
from vcd_helpers import devices
from vcd_helpers.config import EvaluationConfig, load_config
from vcd_helpers.runs import bench

F_DECODER = 2 * (10 * 200 + 200 * 200 + 200 * 784)
F_ENCODER = 2 * 2 * (784 * 200 + 200 * 200 + 200 * 10)  # the mean and the scale nets


def test_the_paper_protocol_flops_per_image():
    config = load_config("default")
    # Two chains (300 burn-in, 300 kept iterations) of 5 leapfrog steps, each evaluation a forward
    # and a backward pass to z; then 20,000 decoder passes; the encoder for the proposal and the start.
    expected = 2 * F_ENCODER + (2 + 600 * 5) * 2 * F_DECODER + 20_000 * F_DECODER
    assert bench.evaluation_flops(config, EvaluationConfig()) == expected
    encoder_only = dataclasses.replace(EvaluationConfig(), proposal="encoder")
    assert bench.evaluation_flops(config, encoder_only) == F_ENCODER + 20_000 * F_DECODER
    no_burn_in = dataclasses.replace(EvaluationConfig(), burn_in=0, kept=10)
    assert bench.evaluation_flops(config, no_burn_in) == 2 * F_ENCODER + (1 + 50) * 2 * F_DECODER + 20_000 * F_DECODER


def test_a_tiny_evaluation_row():
    config = load_config("default", evaluation={"num_samples": 20, "burn_in": 2, "kept": 3, "batch_size": 4})
    row = bench.benchmark_evaluation(config, num_examples=8)
    assert (row.proposal, row.num_examples, row.num_samples, row.batch_size) == ("hmc_moments", 8, 20, 4)
    flops = bench.evaluation_flops(config, config.evaluation)
    assert row.gflops_per_second == pytest.approx(flops / row.seconds_per_image / 1e9)
    assert row.test_set_minutes == pytest.approx(10_000 * row.seconds_per_image / 60)
    assert row.seconds_per_image > 0 and row.cores_used > 0
    table = bench.format_evaluation([row], matmul_rate=100.0).splitlines()
    assert table[:2] == bench.machine_header(100.0) and table[-1].split()[:4] == ["hmc_moments", "8", "20", "4"]
    assert max(map(len, table)) <= 80


def test_a_partial_batch_is_refused():
    config = load_config("default", evaluation={"batch_size": 4})
    with pytest.raises(ValueError, match="num_examples=6 is invalid: must be a multiple of the evaluation's batch size 4"):
        bench.benchmark_evaluation(config, num_examples=6)


def test_more_images_than_the_test_split_are_refused():
    # 20,000 images were accepted once, and the rates printed for them doubled: the split has 10,000.
    config = load_config("default", evaluation={"batch_size": 500})
    with pytest.raises(ValueError, match="num_examples=20000 is invalid: the test split has 10,000 images"):
        bench.benchmark_evaluation(config, num_examples=20_000)


CONFIG = load_config("tiny", batch_size=20)


def test_benchmark_table_sets_the_step_against_the_matmul_rate_at_its_shape(monkeypatch):
    # The longest CPU name there is (a brand string holds 48 characters; the CI's Xeon broke a
    # header that put the name and the matmul rate on one line): the table still fits 80 columns.
    longest = "Intel(R) Xeon(R) Platinum 8480C Processor @ 2.0G"
    assert len(longest) == 48
    monkeypatch.setattr(bench, "cpu_model", lambda: longest)
    assert library_bench.matmul_gflops(16, 32, 64, repeats=1) > 0
    assert library_bench.matmul_gflops(16, 32, 64, repeats=1, dtype=tf.bfloat16, jit_compile=False) > 0
    row = library_bench.BenchmarkRow("default", 100, ms_per_step=50.0, examples_per_second=2000.0,
                             gflops_per_second=72.0, shape_gflops=90.0, bound_ms=40.0, cores_used=1.15,
                             chain_shards=2, precision="bfloat16")
    vae = library_bench.BenchmarkRow("vae", 100, 5.0, 20000.0, 20.0, 90.0, 1.0, 1.0)
    table = bench.format_benchmark([row, vae], matmul_rate=150.0).splitlines()
    assert table[0] == f"CPU: {longest}, {os.cpu_count()} cores" and max(map(len, table)) <= 80
    assert table[1] == "dense float32 matmul: 150 GFLOP/s at 1024^3 (XLA)"
    assert table[-3].split()[-6:] == ["of", "dense", "cores", "shards", "shape", "bound"]
    assert table[-2].split() == ["default", "100", "bf16", "50.0", "2000", "72.0", "48%", "1.15", "2", "90", "40.0"]
    assert table[-1].split()[2] == "f32" and table[-1].split()[-3] == "-"  # the VAE has no chain


def test_a_benchmark_row_names_the_blocks_of_its_chain_and_its_precision():
    # The TF-kernel loop: what is checked is the row's labels, which need no XLA compilation.
    row = bench.benchmark_row(CONFIG.replace(precision="bfloat16", execution={"chain_shards": 2}), steps_per_call=2,
                              calls=1, shape_gflops=1.0, style="loop")
    assert (row.chain_shards, row.precision) == (2, "bfloat16")
    assert bench.benchmark_row(CONFIG, steps_per_call=2, calls=1, shape_gflops=1.0, style="loop").chain_shards == \
        devices.compute_threads()

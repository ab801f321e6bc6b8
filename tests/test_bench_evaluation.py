"""The final evaluation's benchmark row: its FLOP count, and a tiny timed run (no speed is asserted)."""

from __future__ import annotations

import dataclasses

import pytest

from vcd_helpers import bench
from vcd_helpers.config import EvaluationConfig, load_config

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

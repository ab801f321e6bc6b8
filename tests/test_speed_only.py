"""A setting is speed-only (``config.SPEED_ONLY``, ``config.PIPELINE_SPEED_ONLY``: left out of a
run's identity, so a resume may change it) only if training with either value gives the same
weights and metrics, bit for bit; every other execution setting is part of the run."""

from __future__ import annotations

import numpy as np
import pytest

from vcd_helpers import config as config_module
from vcd_helpers.config import PipelineConfig, load_config
from vcd_helpers.data import indexed_batches, load_binarized_mnist
from vcd_helpers.loops import fit
from vcd_helpers.trainers import build_trainer

# min_scale 0.1 keeps the untrained encoder's scales away from the floor, where g is huge.
CONFIG = load_config("tiny", batch_size=24, model={"min_scale": 0.1})
STAGES = ("/CPU:1", "/CPU:2", "/CPU:3")  # conftest.py splits the CPU into four logical devices


def _pipelined(**pipeline):
    return CONFIG.replace(execution={"pipeline": PipelineConfig(micro_batch_size=8, gradient_accumulation=3, **pipeline)})


def _mirrored(devices):
    return CONFIG.replace(execution={"strategy": "mirrored", "replicas": 2, "devices": devices})


#: Per speed-only setting: the same run with two values of it (and, for steps_per_call, the
#: steps per host call given to the loop).
VARIATIONS = {
    ("execution", "steps_per_call"): ((CONFIG, 1), (CONFIG.replace(execution={"steps_per_call": 5}), 5)),
    ("execution", "devices"): ((_mirrored(("/CPU:0", "/CPU:1")), 1), (_mirrored(("/CPU:2", "/CPU:3")), 1)),
    ("pipeline", "devices"): ((_pipelined(), 1), (_pipelined(devices=STAGES), 1)),
    ("pipeline", "slot_device"): ((_pipelined(), 1), (_pipelined(slot_device="/CPU:0"), 1)),
}


def _train(config, steps_per_call: int, steps: int = 10):
    trainer = build_trainer(config)
    images = load_binarized_mnist("train")[: config.train_examples]
    metrics = fit(trainer, indexed_batches(images, config.batch_size, config.seed), steps,
                  steps_per_call=steps_per_call, progress=False)
    return [v.numpy() for v in trainer.model.variables], {k: v for k, v in metrics.items() if k != "wall_time"}


def test_every_speed_only_setting_has_a_variation_here():
    declared = {("execution", s) for s in config_module.SPEED_ONLY} | {
        ("pipeline", s) for s in config_module.PIPELINE_SPEED_ONLY}
    assert declared == set(VARIATIONS)


@pytest.mark.slow
@pytest.mark.parametrize("setting", sorted(VARIATIONS), ids="-".join)
def test_a_speed_only_setting_trains_the_same_bits(setting):
    (first, k_first), (second, k_second) = VARIATIONS[setting]
    assert first.identity() == second.identity() and first != second
    weights_a, metrics_a = _train(first, k_first)
    weights_b, metrics_b = _train(second, k_second)
    for a, b in zip(weights_a, weights_b, strict=True):
        np.testing.assert_array_equal(a, b)
    for name in metrics_a:
        np.testing.assert_array_equal(metrics_a[name], metrics_b[name], err_msg=name)


@pytest.mark.parametrize("changed", [
    CONFIG.replace(execution={"jit_compile": False}),
    *(CONFIG.replace(execution={"chain_shards": shards}) for shards in range(1, CONFIG.batch_size + 1)),
    _pipelined(schedule="sequential"),
    _pipelined(recompute_encoder=True),
], ids=lambda c: str(c.execution))
def test_settings_that_change_the_round_off_are_part_of_the_run(changed):
    # XLA or not, the chain's blocks (one row each sums otherwise than whole), the sequential
    # schedule's order of sums and the recomputed encoder all train other bits: a resume that
    # changes them is refused by the run's config (tests/runs/test_run_faults.py).
    reference = _pipelined() if changed.execution.pipeline is not None else CONFIG
    assert changed.identity() != reference.identity()

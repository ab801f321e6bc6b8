"""vcd_helpers.distributed: strategies and replicated VCD (the local worker launcher: tests/runs/test_workers.py).

The process's CPU is split into four logical devices by conftest.py (before TensorFlow starts),
so a replica per device runs here as it would on several accelerators.
"""

from __future__ import annotations


import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers import distributed
from vcd_helpers.config import Config, ExecutionConfig, load_config
from vcd_helpers.data import indexed_batches, load_binarized_mnist
from vcd_helpers.loops import fit
from vcd_helpers.trainers import build_trainer
from vcd_helpers.training import accumulate_gradients, max_relative_error

from test_pipeline import STAGE_DEVICES, batch  # the same small VCD batch on the same devices (tests/ is on the path)


@pytest.mark.slow
def test_replicas_compute_the_same_sum_as_accumulation(batch):
    config, index, x = batch
    baseline = tf.zeros([24])
    seed = tf.constant([7, 8])
    replicated = build_trainer(config.replace(execution={"strategy": "mirrored", "replicas": 3,
                                                         "devices": STAGE_DEVICES}))
    actual = tf.function(lambda: replicated.batch_estimate(x, baseline, seed))()
    expected = tf.function(lambda: accumulate_gradients(replicated, x, baseline, seed, micro_batch_size=8))()
    assert max_relative_error(expected, actual) < 1e-5
    images = load_binarized_mnist("train")[:240]
    history = fit(replicated, indexed_batches(images, 24, seed=0), 4, steps_per_call=2, progress=False)
    assert np.all(np.isfinite(history["encoder_loss"]))


def test_bad_strategy_input_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="strategy='ring' is invalid"):
        distributed.make_strategy("ring")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="needs the TF_CONFIG environment variable"):
        distributed.make_strategy("multi_worker")
    with pytest.raises(ValueError, match="execution.replicas=2 is invalid: must be 1 without a strategy"):
        load_config("default", execution={"replicas": 2})
    for devices in (["/CPU:1"], ["/CPU:1", "/CPU:1"], "/CPU:1", [1, 2]):
        with pytest.raises(ValueError, match=r"execution.devices=.* is invalid: must be a tuple of one distinct device "
                                             "name per replica of the mirrored strategy \(here 2\)"):
            Config.from_dict({"batch_size": 128, "execution": {"strategy": "mirrored", "replicas": 2, "devices": devices}})


def test_one_strategy_per_process_for_sections_that_differ_in_speed_only(batch):
    config, _, _ = batch
    mirrored = ExecutionConfig("mirrored", 2, devices=STAGE_DEVICES[:2])
    assert distributed.strategy_for(mirrored) is distributed.strategy_for(
        ExecutionConfig("mirrored", 2, devices=STAGE_DEVICES[:2], steps_per_call=5))
    assert distributed.strategy_for(mirrored) is not distributed.strategy_for(
        ExecutionConfig("mirrored", 2, devices=STAGE_DEVICES[1:]))
    # A trainer's weights must be mirrored: a model made outside the strategy's scope is refused.
    from vcd_helpers.distributed import ReplicatedVCDTrainer
    from vcd_helpers.model import VAE
    with pytest.raises(ValueError, match="the model was made outside the strategy's scope"):
        ReplicatedVCDTrainer(VAE(config.model, seed=0), config.replace(execution=mirrored))

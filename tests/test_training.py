"""vcd_helpers.training: one VCD step updates every piece of state; a sharded chain and a bfloat16
step give the same step up to round-off."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers.config import load_config
from vcd_helpers.devices import compute_threads
from vcd_helpers.model import VAE
from vcd_helpers.trainers import build_trainer

STEP_INDEX = tf.constant([4, 7, 9, 11, 12])


def _batch(n=6, seed=0):
    return tf.cast(tf.random.stateless_uniform([n, 784], seed=[seed, 1]) < 0.2, tf.float32)


def test_one_vcd_step_updates_every_piece_of_state():
    config = load_config("tiny", steps=2, control_variate={"kind": "local"}, train_examples=200)
    trainer = build_trainer(config.replace(execution={"jit_compile": False}))
    decoder_before = [v.numpy().copy() for v in trainer.model.decoder.trainable_variables]
    encoder_before = [v.numpy().copy() for v in trainer.model.encoder.trainable_variables]
    metrics = trainer.train_step(tf.constant([4, 7, 9]), _batch(3))
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert int(trainer.step) == 1  # the adapted step size is carried: tests/test_trainers.py pins it exactly
    assert all(not np.array_equal(a, b.numpy()) for a, b in zip(decoder_before, trainer.model.decoder.trainable_variables))
    assert all(not np.array_equal(a, b.numpy()) for a, b in zip(encoder_before, trainer.model.encoder.trainable_variables))
    local = trainer.control_variate.local_values.numpy()
    assert np.count_nonzero(local) == 3 and np.all(local[[4, 7, 9]] != 0)


_STEPS: dict = {}


def _one_xla_step(method: str, precision: str, chain_shards: int | None = None) -> tuple[dict, list[np.ndarray]]:
    """Metrics and weights after one XLA training step of the tiny config on ``_batch(5)``; each
    combination is compiled and run once per module (two tests share the float32 VCD step)."""
    if method == "vcd" and chain_shards is None:
        chain_shards = compute_threads()  # the trainer's default, made explicit for the key
    key = (method, precision, chain_shards)
    if key not in _STEPS:
        config = load_config("tiny", method=method, steps=2, train_examples=200, precision=precision)
        trainer = build_trainer(config.replace(execution={"jit_compile": True, "chain_shards": chain_shards}))
        assert method == "vae" or trainer.chain_shards == chain_shards
        metrics = {name: float(value) for name, value in trainer.train_step(STEP_INDEX, _batch(5)).items()}
        _STEPS[key] = metrics, [v.numpy() for v in trainer.model.trainable_variables]
    return _STEPS[key]


@pytest.mark.slow
def test_a_sharded_chain_gives_the_same_step():
    metrics, weights = {}, {}
    for shards in (1, 2):
        metrics[shards], weights[shards] = _one_xla_step("vcd", "float32", shards)
    assert metrics[2] == pytest.approx(metrics[1], rel=1e-4)
    for expected, actual in zip(weights[1], weights[2]):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)


def test_chain_shards_are_checked():
    with pytest.raises(ValueError, match="execution.chain_shards=2 is invalid: only a method with an HMC chain"):
        load_config("tiny", method="vae", execution={"chain_shards": 2})
    with pytest.raises(ValueError, match="execution.chain_shards=0 is invalid: must be a positive integer"):
        load_config("tiny", execution={"chain_shards": 0})


@pytest.mark.parametrize("method", ["vcd", "vae"])
def test_a_bfloat16_step_is_the_float32_step_up_to_bfloat16_round_off(method):
    config = load_config("tiny", method=method)
    metrics, weights = {}, {}
    for precision in ("float32", "bfloat16"):
        metrics[precision], variables = _one_xla_step(method, precision)
        weights[precision] = np.concatenate([v.ravel() for v in variables])
    # At initialisation the chain's accept/reject draws (5 chains) and the encoder's loss (scales
    # near their floor) amplify round-off; the likelihood term does not.
    loss = "loss" if method == "vae" else "decoder_loss"
    assert metrics["bfloat16"][loss] == pytest.approx(metrics["float32"][loss], rel=0.05)
    assert metrics["bfloat16"][loss] != metrics["float32"][loss]  # the multiplies did run in bfloat16
    assert all(np.isfinite(list(metrics["bfloat16"].values())))
    start = np.concatenate([v.numpy().ravel() for v in VAE(config.model, seed=config.seed).trainable_variables])
    update = {precision: w - start for precision, w in weights.items()}
    # Adam's first step moves each weight by about the learning rate, along its gradient's sign:
    # bf16's gradients point the same way for nearly every weight (measured: 95% VCD, 99.6% VAE).
    assert np.mean(np.sign(update["float32"]) == np.sign(update["bfloat16"])) > 0.9

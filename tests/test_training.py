"""vcd_helpers.training: one VCD step updates every piece of state; a sharded chain and a bfloat16
step give the same step up to round-off; Hoffman's step shares VCD's chain and decoder gradient."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers.config import load_config
from vcd_helpers.devices import compute_threads
from vcd_helpers.model import VAE
from vcd_helpers.objectives import posterior_distribution
from vcd_helpers.seeds import training_seed
from vcd_helpers.trainers import build_trainer
from vcd_helpers.training import HoffmanTrainer, VCDTrainer

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


# Hoffman (2017): VCD's chain and decoder update, the ELBO's encoder update, no control variate.

HOFFMAN_CONFIG = load_config("tiny", batch_size=6, model={"min_scale": 0.1})


def _hoffman_or_vcd_trainer(kind):
    config = HOFFMAN_CONFIG.replace(method="hoffman") if kind is HoffmanTrainer else HOFFMAN_CONFIG
    trainer = build_trainer(config.replace(execution={"jit_compile": False, "chain_shards": 1}))
    assert type(trainer) is kind
    return trainer


def test_the_step_runs_vcds_chain_and_gives_the_decoder_vcds_gradient():
    # Same weights, same step seed, same step size: the same z0, the same chain, so the decoder's
    # gradient is VCD's to the bit; the encoder's is the ELBO's at that z0.
    hoffman, vcd = _hoffman_or_vcd_trainer(HoffmanTrainer), _hoffman_or_vcd_trainer(VCDTrainer)
    for a, b in zip(hoffman.model.trainable_variables, vcd.model.trainable_variables):  # one seed, one model
        np.testing.assert_array_equal(a, b)
    x = _batch()
    seed = tf.constant([5, 7], tf.int64)
    ours = hoffman.estimate_gradients(x, tf.zeros([6]), seed)
    theirs = vcd.estimate_gradients(x, tf.zeros([6]), seed)
    assert ours.g is None
    np.testing.assert_array_equal(ours.decoder_loss, theirs.decoder_loss)
    np.testing.assert_array_equal(ours.accept_rate, theirs.accept_rate)
    for a, b in zip(ours.gradients["decoder"], theirs.gradients["decoder"]):
        np.testing.assert_array_equal(a, b)
    noise_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))[0]
    with tf.GradientTape() as tape:
        loc, scale = hoffman.model.encoder(x)
        noise = tf.random.stateless_normal(tf.shape(loc), seed=noise_seed)
        z0 = loc + scale * noise
        minus_elbo = -tf.reduce_sum(hoffman.model.log_joint(x, z0) - posterior_distribution(loc, scale).log_prob(z0))
    np.testing.assert_allclose(float(ours.encoder_loss), float(minus_elbo), rtol=1e-6)
    groups = hoffman.model.parameter_groups()
    want = tape.gradient(minus_elbo, {name: groups[name] for name in ("encoder_mean", "encoder_scale")})
    for name in want:
        for a, b in zip(ours.gradients[name], want[name]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(tf.reduce_max(tf.abs(b))))


def test_a_step_updates_the_weights_the_step_size_and_the_step_and_has_no_control_variate():
    trainer = _hoffman_or_vcd_trainer(HoffmanTrainer)
    before = [v.numpy() for v in trainer.model.trainable_variables]
    metrics = trainer.train_step(tf.range(6), _batch())
    assert set(metrics) == set(trainer.metric_names) == {"encoder_loss", "decoder_loss", "accept_rate", "step_size"}
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert int(trainer.step) == 1 and float(trainer.step_size) == float(metrics["step_size"])
    assert float(trainer.step_size) != HOFFMAN_CONFIG.hmc.initial_step_size  # adapted by the chain
    assert all(not np.array_equal(a, b.numpy()) for a, b in zip(before, trainer.model.trainable_variables))
    assert set(trainer.checkpoint_objects()) == {"model", "step_size"}
    assert not hasattr(trainer, "control_variate")  # no score function, nothing to carry per row


def test_its_steps_draw_from_their_own_stream():
    trainer = _hoffman_or_vcd_trainer(HoffmanTrainer)
    np.testing.assert_array_equal(trainer.seed, training_seed(HOFFMAN_CONFIG.seed, "hoffman"))
    assert not np.array_equal(training_seed(HOFFMAN_CONFIG.seed, "hoffman"), training_seed(HOFFMAN_CONFIG.seed, "vcd"))

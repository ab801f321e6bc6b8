"""Hoffman (2017)'s method: the encoder by the ELBO at z0, the decoder on the chain's end zT
(objectives.hoffman_surrogate_losses, training.HoffmanTrainer), pinned as VCD's losses are."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers.config import load_config
from vcd_helpers.model import VAE, bernoulli_log_likelihood
from vcd_helpers.objectives import hoffman_surrogate_losses, posterior_distribution
from vcd_helpers.seeds import training_seed
from vcd_helpers.trainers import build_trainer
from vcd_helpers.training import HoffmanTrainer, VCDTrainer

from test_vcd import _batch, _chain_ending_at  # VCD's test batch and hand-made chain (tests/ is on the path)

CONFIG = load_config("tiny", batch_size=6, model={"min_scale": 0.1})


def _losses_and_gradients(model, x, noise, zT):
    with tf.GradientTape(persistent=True) as tape:
        loc, scale = model.encoder(x)
        z0 = loc + scale * noise
        encoder_loss, decoder_loss = hoffman_surrogate_losses(model, x, loc, scale, z0,
                                                              _chain_ending_at(model, x, z0, zT))
        elbo = model.log_joint(x, z0) - posterior_distribution(loc, scale).log_prob(z0)
        formulas = (-tf.reduce_sum(elbo), -tf.reduce_sum(bernoulli_log_likelihood(x, model.decoder(zT))))
    encoder, decoder = model.encoder.trainable_variables, model.decoder.trainable_variables
    got = (encoder_loss, decoder_loss, tape.gradient(encoder_loss, encoder), tape.gradient(decoder_loss, decoder))
    want = (*formulas, tape.gradient(formulas[0], encoder), tape.gradient(formulas[1], decoder))
    return got, want


def test_the_losses_are_the_elbo_at_z0_and_the_likelihood_at_zT():
    model = VAE(seed=0)
    x = _batch()
    noise = tf.random.stateless_normal([6, 10], seed=[2, 2])
    zT = tf.random.stateless_normal([6, 10], seed=[1, 1])
    got, want = _losses_and_gradients(model, x, noise, zT)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-6)
    np.testing.assert_allclose(float(got[1]), float(want[1]), rtol=1e-6)
    for a, b in [*zip(got[2], want[2]), *zip(got[3], want[3])]:
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(tf.reduce_max(tf.abs(b))))


def test_the_encoder_learns_nothing_from_the_chain_and_the_decoder_nothing_from_z0():
    model = VAE(seed=0)
    x = _batch()
    noise = tf.random.stateless_normal([6, 10], seed=[2, 2])
    near, far = (tf.random.stateless_normal([6, 10], seed=[1, k]) * s for k, s in ((1, 1.0), (2, 3.0)))
    (enc_a, dec_a, grads_a, dgrads_a), _ = _losses_and_gradients(model, x, noise, near)
    (enc_b, dec_b, grads_b, dgrads_b), _ = _losses_and_gradients(model, x, noise, far)
    assert float(enc_a) == float(enc_b) and float(dec_a) != float(dec_b)
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_array_equal(a, b)
    other_noise = tf.random.stateless_normal([6, 10], seed=[3, 3])
    (_, dec_c, _, dgrads_c), _ = _losses_and_gradients(model, x, other_noise, near)
    assert float(dec_c) == float(dec_a)
    for a, c in zip(dgrads_a, dgrads_c):
        np.testing.assert_array_equal(a, c)


def test_the_encoder_reads_log_p_at_z0_from_the_chains_first_evaluation():
    # No second decoder pass at z0: shift the chain's recorded log p(x, z0) and the loss shifts by
    # exactly that, summed; tilt its recorded gradient and the encoder's gradient follows.
    model = VAE(seed=0)
    x = _batch()
    with tf.GradientTape(persistent=True) as tape:
        loc, scale = model.encoder(x)
        z0 = loc + scale * tf.random.stateless_normal([6, 10], seed=[2, 2])
        chain = _chain_ending_at(model, x, z0, z0)
        shifted = chain._replace(initial_log_prob=chain.initial_log_prob + 3.0,
                                 initial_gradient=chain.initial_gradient + 1.0)
        loss, _ = hoffman_surrogate_losses(model, x, loc, scale, z0, chain)
        loss_shifted, _ = hoffman_surrogate_losses(model, x, loc, scale, z0, shifted)
        tilt = -tf.reduce_sum(z0)  # what a gradient raised by 1 in every coordinate adds to -log p
    np.testing.assert_allclose(float(loss_shifted), float(loss) - 6 * 3.0, rtol=1e-6)
    encoder = model.encoder.trainable_variables
    for a, b, c in zip(tape.gradient(loss_shifted, encoder), tape.gradient(loss, encoder), tape.gradient(tilt, encoder)):
        np.testing.assert_allclose(a, b + c, rtol=1e-4, atol=1e-5 * float(tf.reduce_max(tf.abs(b))))


def _trainer(kind):
    config = CONFIG.replace(method="hoffman") if kind is HoffmanTrainer else CONFIG
    trainer = build_trainer(config.replace(execution={"jit_compile": False, "chain_shards": 1}))
    assert type(trainer) is kind
    return trainer


def test_the_step_runs_vcds_chain_and_gives_the_decoder_vcds_gradient():
    # Same weights, same step seed, same step size: the same z0, the same chain, so the decoder's
    # gradient is VCD's to the bit; the encoder's is the ELBO's at that z0.
    hoffman, vcd = _trainer(HoffmanTrainer), _trainer(VCDTrainer)
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
    trainer = _trainer(HoffmanTrainer)
    before = [v.numpy() for v in trainer.model.trainable_variables]
    metrics = trainer.train_step(tf.range(6), _batch())
    assert set(metrics) == set(trainer.metric_names) == {"encoder_loss", "decoder_loss", "accept_rate", "step_size"}
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert int(trainer.step) == 1 and float(trainer.step_size) == float(metrics["step_size"])
    assert float(trainer.step_size) != CONFIG.hmc.initial_step_size  # adapted by the chain
    assert all(not np.array_equal(a, b.numpy()) for a, b in zip(before, trainer.model.trainable_variables))
    assert set(trainer.checkpoint_objects()) == {"model", "step_size"}
    assert not hasattr(trainer, "control_variate")  # no score function, nothing to carry per row


def test_its_steps_draw_from_their_own_stream():
    trainer = _trainer(HoffmanTrainer)
    np.testing.assert_array_equal(trainer.seed, training_seed(CONFIG.seed, "hoffman"))
    assert not np.array_equal(training_seed(CONFIG.seed, "hoffman"), training_seed(CONFIG.seed, "vcd"))


@pytest.mark.parametrize("execution, allowed", [({"chain_shards": 3}, True), ({"strategy": "mirrored", "replicas": 2}, False)])
def test_the_config_takes_its_chain_blocks_but_not_a_replicated_step(execution, allowed):
    if allowed:
        assert CONFIG.replace(method="hoffman", execution=execution).execution.chain_shards == 3
    else:
        with pytest.raises(ValueError, match="only VCD's step is pipelined or replicated, not method='hoffman'"):
            CONFIG.replace(method="hoffman", execution=execution)

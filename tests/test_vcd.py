"""VCD pieces: the surrogate losses' gradients, the control variates, one training step."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.config import ControlVariateConfig, load_config
from vcd_helpers.devices import compute_threads
from vcd_helpers.control_variates import ControlVariate
from vcd_helpers.hmc import HMCResult, value_and_gradient
from vcd_helpers.model import VAE, bernoulli_log_likelihood
from vcd_helpers.objectives import vcd_surrogate_losses
from vcd_helpers.trainers import build_trainer

STEP_INDEX = tf.constant([4, 7, 9, 11, 12])


def _batch(n=6, seed=0):
    return tf.cast(tf.random.stateless_uniform([n, 784], seed=[seed, 1]) < 0.2, tf.float32)


def _chain_ending_at(model, x, z0, zT):
    """An HMCResult from z0 to a given zT, with the chain's first evaluation at z0."""
    log_joint_z0, grad_z0 = value_and_gradient(lambda z: model.log_joint(x, z), tf.stop_gradient(z0))
    return HMCResult(final_state=zT, final_log_prob=model.log_joint(x, zT), step_size=tf.constant(0.05),
                     accept_rate=tf.constant(1.0), trace=None, initial_log_prob=log_joint_z0, initial_gradient=grad_z0)


def test_decoder_loss_gradient_is_the_likelihood_at_zT():
    model = VAE(seed=0)
    x = _batch()
    zT = tf.random.stateless_normal([6, 10], seed=[1, 1])
    with tf.GradientTape(persistent=True) as tape:
        loc, scale = model.encoder(x)
        z0 = loc + scale * tf.random.stateless_normal([6, 10], seed=[2, 2])
        _, decoder_loss, _ = vcd_surrogate_losses(model, x, loc, scale, z0, _chain_ending_at(model, x, z0, zT),
                                                  tf.zeros([6]))
        reference = -tf.reduce_sum(bernoulli_log_likelihood(x, model.decoder(zT)))
    for a, b in zip(tape.gradient(decoder_loss, model.decoder.trainable_variables),
                    tape.gradient(reference, model.decoder.trainable_variables)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_encoder_loss_equals_the_formula_differentiated_through_the_decoder():
    # The pathwise term reuses the chain's gradient at z0; it must equal autodiff of
    # -log p(x, z0) through the decoder, and the loss's value must equal the formula's.
    model = VAE(seed=0)
    x = _batch()
    zT = tf.random.stateless_normal([6, 10], seed=[1, 1])
    eps = tf.random.stateless_normal([6, 10], seed=[2, 2])
    baseline = tf.fill([6], -300.0)
    with tf.GradientTape(persistent=True) as tape:
        loc, scale = model.encoder(x)
        z0 = loc + scale * eps
        encoder_loss, _, g = vcd_surrogate_losses(model, x, loc, scale, z0, _chain_ending_at(model, x, z0, zT),
                                                  baseline)
        quadratic = 0.5 * tf.reduce_sum(tf.square((zT - loc) / scale), -1)
        g_formula = tf.stop_gradient(model.log_joint(x, zT)) + quadratic
        log_q0 = tfp.distributions.Independent(tfp.distributions.Normal(loc, scale), 1).log_prob(tf.stop_gradient(z0))
        formula = tf.reduce_sum(-model.log_joint(x, z0) + g_formula + tf.stop_gradient(g_formula - baseline) * log_q0)
    np.testing.assert_allclose(float(encoder_loss), float(formula), rtol=1e-6)
    np.testing.assert_allclose(g, g_formula, rtol=1e-6)
    variables = model.encoder.trainable_variables
    for a, b in zip(tape.gradient(encoder_loss, variables), tape.gradient(formula, variables)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(tf.reduce_max(tf.abs(b))))


def test_g_and_the_encoder_loss_value_on_a_well_scaled_q0():
    # With the encoder's own (tiny) scales the quadratic and score terms dwarf the others (the
    # encoder loss is ~1.6e11 there), so a value check at rtol 1e-6 cannot see log p(z) in g or the
    # pathwise term; here q0 = N(0, I) keeps every term of comparable size, and b = g removes the
    # score term from the value.
    model = VAE(seed=0)
    x = _batch()
    loc, scale = tf.zeros([6, 10]), tf.ones([6, 10])
    z0 = tf.random.stateless_normal([6, 10], seed=[2, 2])
    zT = tf.random.stateless_normal([6, 10], seed=[1, 1])
    expected_g = model.log_joint(x, zT) + 0.5 * tf.reduce_sum(tf.square(zT), -1)
    encoder_loss, decoder_loss, g = vcd_surrogate_losses(model, x, loc, scale, z0,
                                                         _chain_ending_at(model, x, z0, zT), expected_g)
    np.testing.assert_allclose(g, expected_g, rtol=1e-6)
    np.testing.assert_allclose(float(encoder_loss), float(tf.reduce_sum(-model.log_joint(x, z0) + expected_g)),
                               rtol=1e-6)
    np.testing.assert_allclose(float(decoder_loss),
                               float(-tf.reduce_sum(bernoulli_log_likelihood(x, model.decoder(zT)))), rtol=1e-6)


def test_score_term_vanishes_when_the_baseline_equals_g():
    model = VAE(seed=0)
    x = _batch()
    zT = tf.random.stateless_normal([6, 10], seed=[1, 1])
    eps = tf.random.stateless_normal([6, 10], seed=[2, 2])

    with tf.GradientTape(persistent=True) as tape:
        loc, scale = model.encoder(x)
        z0 = loc + scale * eps
        chain = _chain_ending_at(model, x, z0, zT)
        _, _, g = vcd_surrogate_losses(model, x, loc, scale, z0, chain, tf.zeros([6]))
        encoder_loss, _, _ = vcd_surrogate_losses(model, x, loc, scale, z0, chain, g)
        no_score = tf.reduce_sum(-model.log_joint(x, z0) + 0.5 * tf.reduce_sum(tf.square((zT - loc) / scale), -1))
    variables = model.encoder.trainable_variables
    for a, b in zip(tape.gradient(encoder_loss, variables), tape.gradient(no_score, variables)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3 * float(tf.reduce_max(tf.abs(b))) + 1e-6)


def test_score_term_gradient_wrt_the_mean_is_analytic():
    # d/d mu of stop(w) * log N(stop(z0); mu, sigma) = w * (z0 - mu) / sigma^2
    model = VAE(seed=0)
    x = _batch(3)
    loc = tf.Variable(tf.zeros([3, 10]))
    scale = tf.fill([3, 10], 0.5)
    z0 = tf.random.stateless_normal([3, 10], seed=[3, 3])
    zT = loc + 0.0  # quadratic term's gradient at zT = mu is zero
    with tf.GradientTape() as tape:
        encoder_loss, _, g = vcd_surrogate_losses(model, x, loc, scale, z0, _chain_ending_at(model, x, z0, zT),
                                                  tf.zeros([3]))
        pathwise = -tf.reduce_sum(model.log_joint(x, z0))
        score_only = encoder_loss - pathwise - tf.reduce_sum(g)
    expected = g[:, None] * (z0 - loc) / 0.25
    np.testing.assert_allclose(tape.gradient(score_only, loc), expected, rtol=1e-4)


@pytest.mark.parametrize("kind", ["none", "global", "local", "scheduled"])
def test_control_variate_values_and_updates(kind):
    cv = ControlVariate(ControlVariateConfig(kind=kind, decay=0.9, switch_step=2), num_examples=5)
    index = tf.constant([0, 3])
    g = tf.constant([10.0, 20.0])
    np.testing.assert_array_equal(cv.values(index, tf.constant(0)), [0.0, 0.0])
    for step in range(4):
        before = cv.values(index, tf.constant(step)).numpy()
        cv.update(index, g, tf.constant(step))
        after = cv.values(index, tf.constant(step + 1)).numpy()
        if kind == "none":
            assert np.all(after == 0)
        elif kind == "global" or (kind == "scheduled" and step < 1):
            np.testing.assert_allclose(after, [0.9 * before[0] + 1.5] * 2, rtol=1e-6)
        elif kind == "local" or (kind == "scheduled" and step >= 2):
            np.testing.assert_allclose(after, 0.9 * before + 0.1 * g.numpy(), rtol=1e-6)
    if kind == "scheduled":
        # At the switch every example, seen or not, starts from the global value.
        assert cv.local_values.numpy()[1] == pytest.approx(float(cv.global_value))
    assert (cv.local_values is None) == (kind in ("none", "global"))


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


def test_a_baseline_near_g_reduces_the_estimators_variance():
    from vcd_helpers.variance import estimator_variance

    config = load_config("tiny")
    trainer = build_trainer(config.replace(execution={"jit_compile": False}))
    x = _batch(16)
    g = trainer.estimate_gradients(x, tf.zeros([16]), tf.constant([9, 9])).g
    none = estimator_variance(trainer, x, tf.zeros([16]), num_draws=8)
    tracked = estimator_variance(trainer, x, g, num_draws=8)
    for group in none:
        assert tracked[group] < none[group], (group, tracked[group], none[group])
    # Traced once, by the trainer that holds it, whatever the batch's values and baselines; the same draws again.
    assert trainer.draw_gradients.experimental_get_tracing_count() == 1
    assert estimator_variance(trainer, x, g, num_draws=8) == tracked
    with pytest.raises(ValueError, match="num_draws=1"):
        estimator_variance(trainer, x, g, num_draws=1)
    # Nothing else holds the compiled draws: they go with the trainer.
    held = weakref.ref(trainer)
    del trainer
    gc.collect()
    assert held() is None


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


@pytest.mark.parametrize("kind", ["global", "local", "scheduled"])
def test_a_control_variate_holds_state_not_weights(kind):
    # A trainable baseline would be collected with the model's weights (and differentiated, checkpointed as one).
    baseline = ControlVariate(ControlVariateConfig(kind=kind), num_examples=10)
    assert baseline.variables and not baseline.trainable_variables


def test_a_scheduled_control_variate_read_from_a_preset_switches_to_local():
    # The kind read from the preset's JSON is a string equal to "scheduled" but not the literal itself:
    # the kind is compared by value. Switch after step 0: the local values start from the global one
    # (1.5) and move towards each example's own g.
    config = load_config("tiny", control_variate={"switch_step": 1}).control_variate
    assert config.kind == "scheduled"
    cv = ControlVariate(config, num_examples=5)
    index, g = tf.constant([0, 3]), tf.constant([10.0, 20.0])
    cv.update(index, g, tf.constant(0))
    cv.update(index, g, tf.constant(1))
    np.testing.assert_allclose(cv.values(index, tf.constant(2)), [0.9 * 1.5 + 1.0, 0.9 * 1.5 + 2.0], rtol=1e-6)



@pytest.mark.parametrize("kind", ["global", "local"])
def test_a_control_variate_moves_by_one_minus_decay_for_any_decay(kind):
    # At decay 0.9, 1 - decay cannot be told from 1 % decay (both 0.1); at 0.25 it can (0.75 against 0).
    cv = ControlVariate(ControlVariateConfig(kind=kind, decay=0.25), num_examples=5)
    index, g = tf.constant([0, 3]), tf.constant([10.0, 20.0])
    cv.update(index, g, tf.constant(0))
    expected = [0.75 * 15.0] * 2 if kind == "global" else [7.5, 15.0]
    np.testing.assert_allclose(cv.values(index, tf.constant(1)), expected, rtol=1e-6)

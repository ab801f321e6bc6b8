"""objectives: reparameterised_elbo for any target, the VCD divergence's two parts, the toy fit
of a diagonal Gaussian q0 by the ELBO and by VCD's encoder loss, and VCD's surrogate losses on a
VAE, whose gradients are the estimator's; Hoffman's losses, the ELBO at z0 and the likelihood at zT."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers import objectives
from vcd_helpers.hmc import HMCResult, value_and_gradient
from vcd_helpers.model import VAE, bernoulli_log_likelihood
from vcd_helpers.objectives import hoffman_surrogate_losses, posterior_distribution, vcd_surrogate_losses

tfd = tfp.distributions

COV = np.array([[1.0, 0.9], [0.9, 1.0]], np.float32)
MEAN = np.array([0.5, -1.0], np.float32)
LOG_Z = 3.0  # the toy target's normaliser: pi_tilde(z) = Z * N(z; MEAN, COV)


def _target(cov=COV, mean=MEAN):
    return tfd.MultivariateNormalTriL(loc=mean, scale_tril=tf.linalg.cholesky(cov))


def _unnormalised(z):
    return _target().log_prob(z) + LOG_Z


def _kl_diag_to_full(loc, scale, mean=MEAN, cov=COV):
    """KL(N(loc, diag scale^2) || N(mean, cov)) in closed form."""
    precision = np.linalg.inv(cov)
    d = len(loc)
    diff = mean - loc
    return 0.5 * (np.sum(np.diag(precision) * scale ** 2) + diff @ precision @ diff - d
                  + np.log(np.linalg.det(cov)) - np.sum(np.log(scale ** 2)))


def _standard_normal(z):
    return -0.5 * tf.reduce_sum(tf.square(z), axis=-1) - 0.5 * float(z.shape[-1]) * np.log(2 * np.pi)


def test_reparameterised_elbo_mean_is_log_z_minus_kl():
    loc = np.array([0.2, -0.4], np.float32)
    scale = np.array([0.5, 0.3], np.float32)
    noise = tf.random.stateless_normal([200_000, 2], seed=[0, 1])
    values = objectives.reparameterised_elbo(_unnormalised, loc, scale, noise).numpy()
    assert values.shape == (200_000,)
    expected = LOG_Z - _kl_diag_to_full(loc.astype(np.float64), scale.astype(np.float64))
    standard_error = values.std() / np.sqrt(len(values))
    assert abs(values.mean() - expected) < 4 * standard_error + 1e-3, (values.mean(), expected, standard_error)


def test_reparameterised_elbo_is_log_target_minus_log_q0_at_loc_plus_scale_noise():
    loc = tf.constant([[0.2, -0.4], [1.0, 0.0], [0.0, 2.0]])
    scale = tf.constant([[0.5, 0.3], [1.0, 2.0], [0.1, 0.1]])
    noise = tf.random.stateless_normal([3, 2], seed=[3, 1])
    z = (loc + scale * noise).numpy()
    log_q0 = np.sum(-0.5 * noise.numpy() ** 2 - np.log(scale.numpy()) - 0.5 * np.log(2 * np.pi), axis=1)
    np.testing.assert_allclose(objectives.reparameterised_elbo(_unnormalised, loc, scale, noise),
                               _unnormalised(z).numpy() - log_q0, rtol=1e-5, atol=1e-5)


def test_reparameterised_elbo_gradient_flows_to_loc_and_scale():
    # On a standard normal target the ELBO's mean is -1/2 sum(loc^2 + scale^2) + sum log scale + D/2:
    # gradients -loc and -scale + 1/scale, which common noise reproduces up to Monte Carlo error.
    loc = tf.Variable([0.5, -1.0])
    scale = tf.Variable([0.5, 2.0])
    noise = tf.random.stateless_normal([100_000, 2], seed=[5, 5])
    with tf.GradientTape() as tape:
        mean = tf.reduce_mean(objectives.reparameterised_elbo(_standard_normal, loc, scale, noise))
    grad_loc, grad_scale = tape.gradient(mean, [loc, scale])
    np.testing.assert_allclose(grad_loc, [-0.5, 1.0], atol=0.02)
    np.testing.assert_allclose(grad_scale, [-0.5 + 2.0, -2.0 + 0.5], atol=0.03)


def test_half_standardised_square_values_and_mean():
    z = tf.constant([[1.0, 3.0], [0.0, 0.0]])
    loc = tf.constant([[0.0, 1.0], [0.0, 0.0]])
    scale = tf.constant([[2.0, 0.5], [1.0, 1.0]])
    np.testing.assert_allclose(objectives.half_standardised_square(z, loc, scale), [0.5 * (0.25 + 16.0), 0.0])
    noise = tf.random.stateless_normal([100_000, 10], seed=[1, 2])
    values = objectives.half_standardised_square(3.0 + 0.2 * noise, tf.fill([1, 10], 3.0), tf.fill([1, 10], 0.2))
    assert abs(float(tf.reduce_mean(values)) - 5.0) < 0.03  # D / 2


def test_divergence_terms_exact_values_and_sum():
    loc = tf.constant([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    scale = tf.constant([[1.0, 1.0, 1.0], [0.5, 2.0, 1.0]])
    zT = tf.constant([[1.0, 2.0, 0.0], [2.0, 1.0, 3.0]])
    terms = objectives.vcd_divergence_terms(loc, scale, tf.constant([-10.0, -4.0]), zT, tf.constant([-7.5, -5.0]))
    np.testing.assert_allclose(terms.gain, [2.5, -1.0])
    np.testing.assert_allclose(terms.scale_term, [0.5 * 5.0 - 1.5, 0.5 * (4.0 + 0.0 + 4.0) - 1.5])
    np.testing.assert_allclose(terms.divergence, terms.gain + terms.scale_term)


def test_divergence_terms_refuse_a_state_that_is_not_a_batch_of_vectors():
    with pytest.raises(ValueError, match=r"zT has shape \(3,\)"):
        objectives.vcd_divergence_terms(tf.zeros([3]), tf.ones([3]), tf.zeros([]), tf.zeros([3]), tf.zeros([]))
    with pytest.raises(ValueError, match=r"zT has shape \(2, 4, 3\)"):
        objectives.vcd_divergence_terms(tf.zeros([4, 3]), tf.ones([4, 3]), tf.zeros([4]), tf.zeros([2, 4, 3]),
                                        tf.zeros([4]))


def _sampled_terms(loc, scale, chains=20_000, seed=0):
    loc = tf.fill([chains, 3], loc)
    scale = tf.fill([chains, 3], scale)
    noise = tf.random.stateless_normal([chains, 3], seed=[seed, 7])
    return objectives.sample_vcd_divergence_terms(_standard_normal, loc, scale, noise, 0.5, num_iterations=4,
                                                  num_leapfrog_steps=5, seed=seed, adapt_step_size=False)


def _mean_and_error(values):
    values = np.asarray(values)
    return values.mean(), values.std() / np.sqrt(len(values))


def test_sampled_terms_vanish_when_q0_is_the_target():
    # q0 = pi: the chain leaves pi invariant, so zT ~ q0 too; both parts average 0.
    terms = _sampled_terms(0.0, 1.0)
    assert terms.gain.shape == terms.scale_term.shape == (20_000,)
    for values in (terms.gain, terms.scale_term):
        mean, error = _mean_and_error(values)
        assert abs(mean) < 4 * error + 0.01, (mean, error)


def test_sampled_terms_signs_when_q0_is_off_centre_or_too_narrow():
    # Off-centre q0 (loc 2, right width): the chain climbs towards the mode, a positive gain, and
    # zT is far from loc in q0's units: a positive scale term too.
    off = _sampled_terms(2.0, 1.0, seed=1)
    assert _mean_and_error(off.gain)[0] > 2.0
    assert _mean_and_error(off.scale_term)[0] > 1.0
    # Too narrow a q0 (scale 0.3 at the mode): the chain spreads out, down the density (negative
    # gain), and far in q0's narrow units (a large scale term); their sum, L_VCD, is positive.
    narrow = _sampled_terms(0.0, 0.3, seed=2)
    assert _mean_and_error(narrow.gain)[0] < -0.5
    assert _mean_and_error(narrow.scale_term)[0] > 5.0
    assert _mean_and_error(narrow.divergence)[0] > 1.0


def test_fit_by_the_elbo_is_the_closed_form_mode_seeking_gaussian():
    # KL(q0 || pi) over diagonal Gaussians is minimised at loc = mean, scale_d = 1 / sqrt(precision_dd).
    fit = objectives.fit_diagonal_gaussian(_target().log_prob, [1.0, 1.0], [0.3, 0.3], objective="elbo",
                                           num_steps=400, seed=0)
    expected_scale = 1.0 / np.sqrt(np.diag(np.linalg.inv(COV)))
    np.testing.assert_allclose(fit.scale_history[-200:].mean(0), expected_scale, rtol=0.05)
    np.testing.assert_allclose(fit.loc_history[-200:].mean(0), MEAN, atol=0.05)
    assert fit.loc_history.shape == fit.scale_history.shape == (400, 2)
    np.testing.assert_allclose(fit.loc, fit.loc_history[-1])
    assert fit.step_size == pytest.approx(0.1)  # the ELBO runs no chain


def test_a_fit_returns_its_last_steps_loc_and_scale():
    fit = objectives.fit_diagonal_gaussian(_target().log_prob, [1.0, 1.0], [0.3, 0.3], objective="elbo",
                                           num_steps=3, seed=0)
    assert fit.loc_history.shape == fit.scale_history.shape == (3, 2)
    np.testing.assert_array_equal(fit.loc, fit.loc_history[-1])
    np.testing.assert_array_equal(fit.scale, fit.scale_history[-1])
    assert not np.array_equal(fit.scale_history[-1], fit.scale_history[-2])  # the scale moves every step


def test_fit_by_vcd_is_wider_than_the_elbo_and_narrower_than_the_marginals():
    fit = objectives.fit_diagonal_gaussian(_target().log_prob, [1.0, 1.0], [0.3, 0.3], objective="vcd",
                                           num_steps=300, seed=0)
    elbo_scale = 1.0 / np.sqrt(np.diag(np.linalg.inv(COV)))
    scale = fit.scale_history[-100:].mean(0)
    assert np.all(scale > elbo_scale + 0.1), scale
    assert np.all(scale < np.sqrt(np.diag(COV))), scale
    np.testing.assert_allclose(fit.loc_history[-100:].mean(0), MEAN, atol=0.15)
    assert fit.step_size != pytest.approx(0.1)  # h adapted and carried over steps


def test_fit_defaults_are_the_documented_settings():
    # 100 samples a step, Adam at 0.05, chains of 8 iterations of 5 leapfrog steps from h = 0.1, seed 0.
    target = _target().log_prob
    implicit = objectives.fit_diagonal_gaussian(target, [1.0, 1.0], [0.3, 0.3], objective="vcd", num_steps=3)
    explicit = objectives.fit_diagonal_gaussian(target, [1.0, 1.0], [0.3, 0.3], objective="vcd", num_steps=3,
                                                batch_size=100, learning_rate=0.05, num_iterations=8,
                                                num_leapfrog_steps=5, step_size=0.1, seed=0)
    np.testing.assert_array_equal(implicit.loc_history, explicit.loc_history)
    np.testing.assert_array_equal(implicit.scale_history, explicit.scale_history)
    assert implicit.step_size == explicit.step_size


@pytest.mark.parametrize("overrides, message", [
    ({"objective": "kl"}, "objective='kl' is invalid"),
    ({"num_steps": 0}, "num_steps=0 is invalid"),
    ({"batch_size": 2.5}, "batch_size=2.5 is invalid"),
    ({"learning_rate": -1.0}, "learning_rate=-1.0 is invalid"),
    ({"step_size": float("nan")}, "step_size=nan is invalid"),
    ({"initial_scale": [1.0, 0.0]}, r"initial_scale=\[1.0, 0.0\] is invalid"),
    ({"initial_scale": [1.0]}, "must be vectors of one length"),
    ({"initial_loc": [[0.0, 0.0]], "initial_scale": [[1.0, 1.0]]}, "must be vectors of one length"),  # matrices
])
def test_fit_refuses_bad_input(overrides, message):
    arguments = {"initial_loc": [0.0, 0.0], "initial_scale": [1.0, 1.0], "objective": "elbo", "num_steps": 2}
    arguments.update(overrides)
    with pytest.raises(ValueError, match=message):
        objectives.fit_diagonal_gaussian(_target().log_prob, **arguments)


def test_the_encoder_loss_at_a_start_with_a_zero_coordinate_is_its_closed_form():
    # The pathwise term's value is -log p(x, z0) whatever z0 is, a coordinate at exactly 0 included.
    z0, zT = tf.constant([[0.0, 0.5]]), tf.constant([[0.1, 0.2]])
    loss, g = objectives.encoder_surrogate_loss(tf.zeros([1, 2]), tf.ones([1, 2]), z0, zT, tf.constant([-1.0]),
                                                tf.constant([[0.3, -0.4]]), tf.constant([-2.0]), tf.constant([0.0]))
    expected_g = -2.0 + 0.5 * (0.1**2 + 0.2**2)
    log_q0 = -np.log(2 * np.pi) - 0.5 * 0.5**2
    np.testing.assert_allclose(g, [expected_g], rtol=1e-6)
    np.testing.assert_allclose(loss, 1.0 + expected_g + expected_g * log_q0, rtol=1e-5)


# VCD's surrogate losses on a VAE: their gradients are the estimator's.

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


# Hoffman (2017)'s losses: the ELBO at z0 for the encoder (read from the chain's first evaluation),
# the likelihood at the chain's end zT for the decoder.

def _hoffman_losses_and_gradients(model, x, noise, zT):
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
    got, want = _hoffman_losses_and_gradients(model, x, noise, zT)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-6)
    np.testing.assert_allclose(float(got[1]), float(want[1]), rtol=1e-6)
    for a, b in [*zip(got[2], want[2]), *zip(got[3], want[3])]:
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(tf.reduce_max(tf.abs(b))))


def test_the_encoder_learns_nothing_from_the_chain_and_the_decoder_nothing_from_z0():
    model = VAE(seed=0)
    x = _batch()
    noise = tf.random.stateless_normal([6, 10], seed=[2, 2])
    near, far = (tf.random.stateless_normal([6, 10], seed=[1, k]) * s for k, s in ((1, 1.0), (2, 3.0)))
    (enc_a, dec_a, grads_a, dgrads_a), _ = _hoffman_losses_and_gradients(model, x, noise, near)
    (enc_b, dec_b, grads_b, dgrads_b), _ = _hoffman_losses_and_gradients(model, x, noise, far)
    assert float(enc_a) == float(enc_b) and float(dec_a) != float(dec_b)
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_array_equal(a, b)
    other_noise = tf.random.stateless_normal([6, 10], seed=[3, 3])
    (_, dec_c, _, dgrads_c), _ = _hoffman_losses_and_gradients(model, x, other_noise, near)
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

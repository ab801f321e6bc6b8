"""Annealed importance sampling against closed forms, with few temperatures so that the weights vary.

Target: exp(c) N(z; m, diag s^2), whose normaliser is exactly c; proposal q = N(0, I). The target is
narrower than q and off-centre, so that the log weights spread over nats (the mean of the log weights
lies KL(q || p) = 1.78 nats below log Z), yet their variance stays finite (s^2 < 2): with K = 4096
chains, log of the mean weight has a standard error of 0.02 nats.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.evaluation import annealed_importance_sampling

M = np.array([0.8, -0.5, 0.3])
S = np.array([0.6, 0.8, 0.7])
C = np.array([-120.0, -3.0, 0.0, 25.0])  # log Z of each of four examples
#: KL(q || p) for q = N(0, I), p = N(m, diag s^2): how far below log Z the log weights lie on average.
KL_Q_P = float(np.sum(np.log(S) + (1 + M**2) / (2 * S**2) - 0.5))
NUM_CHAINS = 4096


def _target(z):  # z [K, B, 3] -> [K, B]
    normal = tfp.distributions.MultivariateNormalDiag(M.astype(np.float32), S.astype(np.float32))
    return normal.log_prob(z) + C.astype(np.float32)


@functools.cache
def _ais(num_temperatures, seed=11):
    # Eagerly: a few temperatures run faster than they trace.
    return annealed_importance_sampling(_target, tf.zeros([4, 3]), tf.ones([4, 3]), num_temperatures=num_temperatures,
                                        num_chains=NUM_CHAINS, num_leapfrog_steps=5, step_size=0.3, seed=seed)


def test_the_closed_form_kl_is_what_the_tests_assume():
    assert KL_Q_P == pytest.approx(1.776, abs=1e-3)


def test_one_temperature_weighs_the_start_before_moving_it():
    # With T = 1, each chain's log weight is log p(z0) - log q(z0) at its draw z0 ~ q, before the one
    # HMC move: their mean is c - KL(q || p), exactly (to within 5 standard errors, 0.1 nats). Weighed
    # after the move, at states nearer p, the mean comes out 2.35 nats higher.
    result = _ais(1)
    log_weights = result.log_weights.numpy()
    assert log_weights.shape == (NUM_CHAINS, 4)
    assert float(result.accept_rate) > 0.5  # the move moved
    spread = log_weights.std(axis=0)
    assert np.all(spread > 1.0), spread  # the weights vary: mean of logs and log of mean differ
    standard_error = spread / np.sqrt(NUM_CHAINS)
    np.testing.assert_array_less(np.abs(log_weights.mean(axis=0) - (C - KL_Q_P)), 5 * standard_error)


@pytest.mark.parametrize("num_temperatures", [1, 3])
def test_few_temperatures_recover_the_exact_normaliser(num_temperatures):
    # log Z = logsumexp(log w) - log K: unbiased in Z, so with 4,096 chains within 0.1 nats of c. The
    # mean of the log weights lies well below (1.78 nats at T = 1; asserted at least 0.3 here).
    result = _ais(num_temperatures)
    np.testing.assert_allclose(result.log_normalizer.numpy(), C, atol=0.1)
    assert np.all(result.log_weights.numpy().mean(axis=0) < C - 0.3)


def test_ais_takes_its_settings_by_name_only():
    # Keyword-only, so that a call cannot swap two counts (temperatures, chains, leapfrog steps) unnoticed.
    with pytest.raises(TypeError):
        annealed_importance_sampling(_target, tf.zeros([4, 3]), tf.ones([4, 3]), 2, 2, 1, 0.3, 0)


def test_ais_runs_on_starts_whose_latent_size_is_only_known_at_run_time():
    # Traced for any [B, D]: the latent size falls back to the runtime shape, and the draws are the same.
    spec = tf.TensorSpec([None, None], tf.float32)
    settings = dict(num_temperatures=2, num_chains=8, num_leapfrog_steps=2, step_size=0.3, seed=5)
    traced = tf.function(lambda loc, scale: annealed_importance_sampling(_target, loc, scale, **settings).log_normalizer,
                         input_signature=[spec, spec])
    eager = annealed_importance_sampling(_target, tf.zeros([4, 3]), tf.ones([4, 3]), **settings).log_normalizer
    np.testing.assert_allclose(traced(tf.zeros([4, 3]), tf.ones([4, 3])), eager, rtol=1e-5, atol=1e-4)


def test_a_frozen_step_size_stays_fixed_and_still_recovers_the_normaliser():
    # adapt_step_size=False: every move uses the given step size (so each leaves its f_t exactly
    # invariant and the estimate of Z is unbiased); with the default the shared step size adapts.
    settings = dict(num_temperatures=3, num_chains=NUM_CHAINS, num_leapfrog_steps=5, step_size=0.3, seed=11)
    frozen = annealed_importance_sampling(_target, tf.zeros([4, 3]), tf.ones([4, 3]), adapt_step_size=False, **settings)
    assert float(frozen.step_size) == np.float32(0.3)  # exactly the float32 it was given
    assert 0.5 < float(frozen.accept_rate) < 1.0  # the moves moved, and not all were accepted
    np.testing.assert_allclose(frozen.log_normalizer.numpy(), C, atol=0.1)
    adapted = _ais(3)  # the same settings, adapting (the default)
    assert float(adapted.step_size) != pytest.approx(0.3, abs=1e-4)
    # The same draws up to the first move: the two differ only in the step sizes of later moves.
    assert not np.allclose(frozen.log_weights.numpy(), adapted.log_weights.numpy())


def test_a_frozen_step_size_equals_moves_at_that_fixed_step_size():
    # With one temperature the only move uses the given step size either way: the adapting and the
    # frozen run give the same weights (the adaptation acts after the move), and differ only in the
    # step size they report.
    settings = dict(num_temperatures=1, num_chains=64, num_leapfrog_steps=5, step_size=0.3, seed=2)
    frozen = annealed_importance_sampling(_target, tf.zeros([4, 3]), tf.ones([4, 3]), adapt_step_size=False, **settings)
    adapted = annealed_importance_sampling(_target, tf.zeros([4, 3]), tf.ones([4, 3]), **settings)
    np.testing.assert_array_equal(frozen.log_weights.numpy(), adapted.log_weights.numpy())
    assert float(frozen.accept_rate) == pytest.approx(float(adapted.accept_rate))
    assert float(frozen.step_size) == np.float32(0.3) and float(adapted.step_size) != np.float32(0.3)


def test_ais_log_likelihood_passes_the_frozen_step_size_on():
    # The model-level estimate takes the same option: frozen and adapting differ beyond one temperature.
    from vcd_helpers.config import HMCConfig, ModelConfig
    from vcd_helpers.evaluation import ais_log_likelihood
    from vcd_helpers.model import VAE

    tiny = VAE(ModelConfig(hidden_units=8, latent_dim=2), seed=0)
    images = (np.random.default_rng(1).random([3, 784]) < 0.2).astype(np.float32)

    def ais(**kwargs):
        return ais_log_likelihood(tiny, images, HMCConfig(adaptation_rate=0.5), num_temperatures=3, num_chains=4,
                                  seed=3, **kwargs)

    np.testing.assert_array_equal(ais(), ais(adapt_step_size=True))
    assert not np.array_equal(ais(), ais(adapt_step_size=False))

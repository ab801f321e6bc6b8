"""The evaluation's diagnostics: the importance weights' effective sample size S_eff streamed
beside the estimate, its plumbing through make_evaluator, and the evaluation's HMC chain
(hmc_posterior_chain) that chapter 2 diagnoses with traces, ESS and R-hat."""

from __future__ import annotations


import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers import evaluation
from vcd_helpers.results import COMMITTED_RESULTS, restore_model
from vcd_helpers.config import EvaluationConfig, HMCConfig
from vcd_helpers.evaluation import hmc_posterior_chain, importance_sampled_log_likelihood
from vcd_helpers.model import VAE
from vcd_helpers.seeds import fold_in, split_seed

tfd = tfp.distributions
HMC = HMCConfig()


def logsumexp(a, axis):
    top = a.max(axis=axis, keepdims=True)
    return np.squeeze(top, axis) + np.log(np.exp(a - top).sum(axis=axis))

# A conjugate toy: z ~ N(0, I_D), x | z ~ N(z, NOISE^2 I_D), so p(z | x) = N(x / (1 + NOISE^2), v I),
# v = NOISE^2 / (1 + NOISE^2), and p(x) = N(0, (1 + NOISE^2) I).
D, NOISE = 3, 0.8
POSTERIOR_VAR = NOISE**2 / (1 + NOISE**2)


def toy_log_joint(x, z):
    """x [B, D], z [C, B, D] -> [C, B] (float64)."""
    return (tfd.Independent(tfd.Normal(z, NOISE), 1).log_prob(x)
            + tfd.Independent(tfd.Normal(tf.zeros_like(z), 1.0), 1).log_prob(z))


def toy_x(batch=4, seed=0):
    return tf.constant(np.random.default_rng(seed).normal(0, 1.5, size=(batch, D)))


def test_s_eff_is_s_when_the_proposal_is_the_posterior():
    x = toy_x()
    loc = x / (1 + NOISE**2)
    scale = tf.fill(tf.shape(x), tf.constant(np.sqrt(POSTERIOR_VAR), tf.float64))
    for num_samples, chunk_size in [(1000, 300), (7, 3), (5, 50)]:
        estimate, s_eff = importance_sampled_log_likelihood(
            toy_log_joint, x, loc, scale, num_samples=num_samples, chunk_size=chunk_size, seed=1,
            return_effective_sample_size=True)
        # Every weight equals p(x): S_eff is S, whatever the chunking, and the estimate exact.
        np.testing.assert_allclose(s_eff, num_samples, rtol=1e-9, err_msg=f"S={num_samples}, chunk={chunk_size}")
        exact = tfd.MultivariateNormalDiag(tf.zeros(D, tf.float64), tf.fill([D], tf.constant(np.sqrt(1 + NOISE**2), tf.float64))).log_prob(x)
        np.testing.assert_allclose(estimate, exact, atol=1e-9)


def test_s_eff_is_one_when_one_weight_dominates():
    x = toy_x(batch=3)

    def peaked(x, z):  # log weights that differ by hundreds of nats: the largest takes all
        return 2_000.0 * z[..., 0] - 5_000.0

    estimate, s_eff = importance_sampled_log_likelihood(
        peaked, x, tf.zeros_like(x), tf.ones_like(x), num_samples=200, chunk_size=30, seed=4,
        return_effective_sample_size=True)
    assert np.all(np.isfinite(estimate)) and np.all(np.isfinite(s_eff))  # no overflow at +-thousands of nats
    np.testing.assert_allclose(s_eff, 1.0, atol=1e-9)


def _recording(log_joint_fn, record):
    def fn(x, z):
        value = log_joint_fn(x, z)
        record.append((z.numpy(), value.numpy()))
        return value
    return fn


@pytest.mark.parametrize("num_samples, chunk_size", [(23, 5), (40, 40), (9, 4)])
def test_s_eff_matches_numpy_over_all_weights(num_samples, chunk_size):
    """Eagerly the chunks run one by one, so every sample and its log joint can be recorded and
    S_eff = (sum w)^2 / sum w^2 computed in numpy over exactly the first S of them."""
    x = toy_x(batch=5, seed=3)
    # A poor proposal (shifted, too narrow): weights that vary over orders of magnitude, with an
    # offset of -3,000 nats that a computation without rescaling would underflow.
    loc = tf.zeros_like(x) + 0.5
    scale = tf.fill(tf.shape(x), tf.constant(0.5, tf.float64))
    record = []
    shifted = lambda x, z: toy_log_joint(x, z) - 3_000.0
    estimate, s_eff = importance_sampled_log_likelihood(
        _recording(shifted, record), x, loc, scale, num_samples=num_samples, chunk_size=chunk_size, seed=7,
        return_effective_sample_size=True)
    num_chunks = -(-num_samples // chunk_size)
    assert len(record) == num_chunks
    z = np.concatenate([r[0] for r in record])[:num_samples]                       # [S, B, D]
    log_joint = np.concatenate([r[1] for r in record])[:num_samples]               # [S, B]
    log_r = (-0.5 * ((z - loc.numpy()) / scale.numpy()) ** 2 - np.log(scale.numpy())
             - 0.5 * np.log(2 * np.pi)).sum(-1)
    log_w = log_joint - log_r
    expected_s_eff = np.exp(2 * logsumexp(log_w, axis=0) - logsumexp(2 * log_w, axis=0))
    expected_estimate = logsumexp(log_w, axis=0) - np.log(num_samples)
    if num_chunks > 1:  # the running maximum must move after the first chunk, or rescaling goes untested
        assert np.any(log_w[chunk_size:].max(axis=0) > log_w[:chunk_size].max(axis=0))
    assert np.all((expected_s_eff > 1.1) & (expected_s_eff < num_samples - 0.5))  # neither extreme
    np.testing.assert_allclose(s_eff, expected_s_eff, rtol=1e-9)
    np.testing.assert_allclose(estimate, expected_estimate, rtol=1e-12)


def test_the_estimate_is_bit_identical_with_and_without_s_eff():
    x = toy_x(batch=6, seed=5)
    args = dict(num_samples=101, chunk_size=20, seed=11)
    loc, scale = tf.zeros_like(x), tf.ones_like(x)
    alone = importance_sampled_log_likelihood(toy_log_joint, x, loc, scale, **args)
    with_size, _ = importance_sampled_log_likelihood(toy_log_joint, x, loc, scale, return_effective_sample_size=True,
                                                     **args)
    np.testing.assert_array_equal(alone.numpy(), with_size.numpy())


def test_importance_sampling_rejects_bad_counts():
    x = toy_x()
    for kwargs, name in [(dict(num_samples=0, chunk_size=5), "num_samples=0"),
                         (dict(num_samples=10, chunk_size=-1), "chunk_size=-1")]:
        with pytest.raises(ValueError, match=name):
            importance_sampled_log_likelihood(toy_log_joint, x, x, tf.ones_like(x), seed=0, **kwargs)


# --- the evaluator and the evaluation's chain, on the paper's (untrained) VAE -----------------

X = tf.constant(np.random.default_rng(0).integers(0, 2, size=(5, 784)), tf.float32)


@pytest.fixture(scope="module")
def model():
    return VAE(seed=0)


@pytest.fixture(scope="module")
def trained():
    """The committed 800-epoch VAE and five digits it generates (binarised decoder means of prior
    draws): weights that vary but do not collapse to one, as an untrained model's would."""
    vae, _ = restore_model(COMMITTED_RESULTS / "vae_e800_s0")
    z = tf.random.stateless_normal([5, vae.config.latent_dim], seed=[0, 3])
    return vae, tf.cast(tf.sigmoid(vae.decoder(z)) > 0.5, tf.float32)


def test_make_evaluator_returns_each_estimates_s_eff(trained):
    model, X = trained
    protocol = EvaluationConfig(proposal="encoder", num_samples=30, chunk_size=8, batch_size=2)
    images = X.numpy()
    plain = evaluation.make_evaluator(model, protocol, HMC)(images, 3)
    result = evaluation.make_evaluator(model, protocol, HMC, effective_sample_size=True)(images, 3)
    assert plain.effective_sample_size is None
    np.testing.assert_array_equal(result.per_example, plain.per_example)   # the same estimates
    assert result.effective_sample_size.shape == (5,)                      # three batches, the last partial
    # Each image's S_eff is the one importance sampling gives its batch, in the images' order.
    expected = []
    for k, start in enumerate(range(0, 5, 2)):
        x = X[start: start + 2]
        _, sample_seed = tf.unstack(split_seed(fold_in(3, k), 2))
        loc, scale = model.encoder(x)
        expected.append(importance_sampled_log_likelihood(
            model.log_joint, x, loc, 1.2 * scale, num_samples=30, chunk_size=8, seed=sample_seed,
            return_effective_sample_size=True)[1].numpy())
    np.testing.assert_allclose(result.effective_sample_size, np.concatenate(expected), rtol=1e-4)
    assert np.all((result.effective_sample_size >= 1) & (result.effective_sample_size <= 30 + 1e-3))
    assert len(set(np.round(result.effective_sample_size, 3))) == 5        # per image, not one shared value
    assert np.ptp(result.effective_sample_size) > 1                        # and not all at the floor of 1


def test_make_evaluator_refuses_resuming_with_s_eff(model):
    evaluate = evaluation.make_evaluator(model, EvaluationConfig(proposal="encoder", num_samples=4, chunk_size=4),
                                         HMC, effective_sample_size=True)
    with pytest.raises(ValueError, match="effective_sample_size"):
        evaluate(X.numpy(), 0, done={0: np.zeros(5)})
    with pytest.raises(ValueError, match="effective_sample_size"):
        evaluate(X.numpy(), 0, on_batch=lambda k, e: None)


def _chain(model, **kwargs):
    args = dict(burn_in=6, kept=4, step_size=HMC.initial_step_size, seed=2, **HMC.kernel_arguments())
    args.update(kwargs)
    return hmc_posterior_chain(model, X, **args)


def test_the_chain_has_the_documented_shapes(model):
    traced = _chain(model, trace_burn_in=True)
    assert traced.kept_states.shape == (4, 5, model.config.latent_dim)
    assert traced.burn_in_states.shape == (6, 5, model.config.latent_dim)
    assert _chain(model).burn_in_states is None
    assert np.isnan(_chain(model, burn_in=0).burn_in_accept_rate)
    assert 0 <= float(traced.burn_in_accept_rate) <= 1 and 0 <= float(traced.kept_accept_rate) <= 1
    # Tracing the burn-in changes nothing else.
    np.testing.assert_array_equal(traced.kept_states, _chain(model).kept_states)


def test_the_chain_starts_at_initial_state(model):
    loc = model.encoder(X)[0]
    start = loc + tf.constant(np.random.default_rng(1).normal(0, 3, size=loc.shape), tf.float32)
    # A vanishing step size: every state stays where the chain started.
    still = _chain(model, step_size=1e-7, initial_state=start, trace_burn_in=True, num_leapfrog_steps=1)
    np.testing.assert_allclose(still.burn_in_states[0], start, atol=1e-4)
    np.testing.assert_allclose(still.kept_states[-1], start, atol=1e-4)
    default = _chain(model, step_size=1e-7, trace_burn_in=True, num_leapfrog_steps=1)
    np.testing.assert_allclose(default.burn_in_states[0], loc, atol=1e-4)   # by default: the encoder mean
    # With a real step size, the chain from elsewhere is another chain.
    assert not np.allclose(_chain(model, initial_state=start).kept_states, _chain(model).kept_states)


def test_the_kept_phase_does_not_adapt(model):
    # Without burn-in, the kept iterations run at the given step size and report it unchanged.
    assert float(_chain(model, burn_in=0, kept=10, step_size=0.3).step_size) == pytest.approx(0.3, abs=0.0, rel=1e-7)
    # With burn-in, the step size adapts there (it moves) and stays frozen through the kept phase:
    # the same burn-in followed by 2 or 12 kept iterations ends at the same step size.
    short, long = _chain(model, kept=2, step_size=0.3), _chain(model, kept=12, step_size=0.3)
    assert abs(float(short.step_size) - 0.3) > 1e-4
    assert float(short.step_size) == float(long.step_size)
    np.testing.assert_array_equal(short.kept_states, long.kept_states[:2])  # the same chain, continued


def test_the_chain_is_reproducible(model):
    np.testing.assert_array_equal(_chain(model).kept_states, _chain(model).kept_states)
    assert not np.array_equal(_chain(model).kept_states, _chain(model, seed=3).kept_states)


@pytest.mark.parametrize("kwargs, message", [
    (dict(burn_in=-1), "burn_in=-1"),
    (dict(burn_in=2.5), "burn_in=2.5"),
    (dict(kept=0), "kept=0"),
    (dict(step_size=0.0), "step_size=0.0"),
    (dict(step_size=float("nan")), "step_size=nan"),
    (dict(initial_state=tf.zeros([5, 3])), r"initial_state has shape \(5, 3\)"),
])
def test_the_chain_rejects_bad_input_naming_it(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _chain(model, **kwargs)


def test_the_chain_takes_its_settings_by_name_only(model):
    # Keyword-only, so that a call cannot swap burn_in and kept (both counts) unnoticed.
    with pytest.raises(TypeError):
        hmc_posterior_chain(model, X, 1, 1, 0.1, 2, 2)

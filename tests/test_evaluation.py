"""vcd_helpers.evaluation on a linear-Gaussian latent model, whose marginal likelihood is exact.

    z ~ N(0, I_D),  x | z ~ N(W z + c, s^2 I_P)   =>   x ~ N(c, W W^T + s^2 I_P)
    p(z | x) = N(m, S),  S = (I + W^T W / s^2)^-1,  m = S W^T (x - c) / s^2
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers import evaluation
from vcd_helpers.evaluation import importance_sampled_log_likelihood

tfd = tfp.distributions
D, P, NOISE = 3, 6, 0.7
rng = np.random.default_rng(0)
W = rng.normal(size=(P, D))
C = rng.normal(size=P)


def log_joint(x, z):
    """x [B, P], z [S, B, D] -> [S, B]."""
    mean = tf.einsum("pd,sbd->sbp", W, z) + C
    return (tfd.Independent(tfd.Normal(mean, NOISE), 1).log_prob(x)
            + tfd.Independent(tfd.Normal(tf.zeros_like(z), 1.0), 1).log_prob(z))


def exact_posterior(x):
    cov = np.linalg.inv(np.eye(D) + W.T @ W / NOISE**2)
    mean = (x - C) @ W @ cov.T / NOISE**2
    return mean, np.sqrt(np.diag(cov))


def test_matches_the_exact_marginal_likelihood():
    x = rng.normal(size=(8, P)) * 2
    exact = tfd.MultivariateNormalFullCovariance(C, W @ W.T + NOISE**2 * np.eye(P)).log_prob(x).numpy()
    mean, std = exact_posterior(x)
    estimate = importance_sampled_log_likelihood(
        log_joint, tf.constant(x), tf.constant(mean), tf.constant(np.tile(1.2 * std, (8, 1))),
        num_samples=20_000, chunk_size=1_500, seed=3).numpy()
    # A diagonal, widened proposal of a correlated posterior still gives an exact-in-the-limit
    # estimate; with 20,000 samples it is within a few hundredths of a nat.
    np.testing.assert_allclose(estimate, exact, atol=0.03)


def test_zero_variance_proposal_is_exact_for_any_chunking():
    # With orthogonal columns in W the posterior is diagonal; proposing from it exactly makes
    # every weight equal p(x), so any chunking, partial last chunk included, must be exact.
    q, _ = np.linalg.qr(rng.normal(size=(P, D)))
    w_orth = q * np.array([1.5, 0.7, 2.0])

    def log_joint_orth(x, z):
        mean = tf.einsum("pd,sbd->sbp", w_orth, z) + C
        return (tfd.Independent(tfd.Normal(mean, NOISE), 1).log_prob(x)
                + tfd.Independent(tfd.Normal(tf.zeros_like(z), 1.0), 1).log_prob(z))

    x = rng.normal(size=(5, P))
    cov = np.linalg.inv(np.eye(D) + w_orth.T @ w_orth / NOISE**2)
    assert np.allclose(cov, np.diag(np.diag(cov)))
    mean = (x - C) @ w_orth @ cov.T / NOISE**2
    exact = tfd.MultivariateNormalFullCovariance(C, w_orth @ w_orth.T + NOISE**2 * np.eye(P)).log_prob(x).numpy()
    scale = tf.constant(np.tile(np.sqrt(np.diag(cov)), (5, 1)))
    for num_samples, chunk_size in [(10, 10), (1000, 300), (7, 3), (5, 50)]:
        estimate = importance_sampled_log_likelihood(log_joint_orth, tf.constant(x), tf.constant(mean), scale,
                                                     num_samples=num_samples, chunk_size=chunk_size, seed=2)
        np.testing.assert_allclose(estimate, exact, atol=1e-9, err_msg=f"S={num_samples}, chunk={chunk_size}")


def test_ais_recovers_an_exactly_known_normaliser():
    """Targets log N(z; m, diag s^2) + c have log Z = c exactly; AIS from N(0, I) must find c."""
    rng = np.random.default_rng(3)
    m = tf.constant(rng.normal(0.0, 1.5, size=(4, 3)), tf.float32)
    s = tf.constant(rng.uniform(0.3, 1.2, size=(4, 3)), tf.float32)
    c = tf.constant([-95.0, -3.0, 0.0, 40.0])
    target = lambda z: tfp.distributions.MultivariateNormalDiag(m, s).log_prob(z) + c
    result = tf.function(lambda: evaluation.annealed_importance_sampling(
        target, tf.zeros([4, 3]), tf.ones([4, 3]), num_temperatures=1000, num_chains=64, num_leapfrog_steps=5,
        step_size=0.3, seed=7))()
    np.testing.assert_allclose(result.log_normalizer.numpy(), c.numpy(), atol=0.05)
    assert 0.5 < float(result.accept_rate) <= 1.0
    # With few temperatures the estimate falls below log Z: it is a lower bound in expectation.
    rough = evaluation.annealed_importance_sampling(target, tf.zeros([4, 3]), tf.ones([4, 3]), num_temperatures=2,
                                                    num_chains=16, num_leapfrog_steps=5, step_size=0.3, seed=7)
    assert np.mean(rough.log_normalizer.numpy() - c.numpy()) < -0.05


def test_sigmoid_schedule_runs_from_zero_to_one():
    betas = evaluation.sigmoid_schedule(10)
    assert betas[0] == 0.0 and betas[-1] == 1.0 and np.all(np.diff(betas) > 0) and len(betas) == 11


def test_sigmoid_schedule_is_symmetric_half_way_at_the_middle_and_dense_at_both_ends():
    # A sigmoid's spacing: beta_t + beta_(T - t) = 1, so the middle temperature is 1/2, and the steps
    # grow from each end towards the middle.
    betas = evaluation.sigmoid_schedule(10)
    np.testing.assert_allclose(betas + betas[::-1], 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(betas[5], 0.5, rtol=0, atol=1e-12)
    steps = np.diff(betas)
    assert np.all(np.diff(steps[:5]) > 0) and np.all(np.diff(steps[5:]) < 0), steps


def test_an_evaluation_of_n_examples_scores_the_first_n_images():
    from vcd_helpers.config import EvaluationConfig, HMCConfig
    from vcd_helpers.model import VAE

    images = (np.random.default_rng(0).random([5, 784]) < 0.2).astype(np.float32)
    model = VAE(seed=0)
    protocol = dict(batch_size=2, num_samples=4, chunk_size=4, proposal="encoder")
    first_two = evaluation.make_evaluator(model, EvaluationConfig(num_examples=2, **protocol), HMCConfig())(images)
    every_one = evaluation.make_evaluator(model, EvaluationConfig(num_examples=None, **protocol), HMCConfig())(images)
    assert first_two.per_example.shape == (2,) and every_one.per_example.shape == (5,)
    np.testing.assert_allclose(first_two.per_example, every_one.per_example[:2], rtol=1e-6)


def test_an_evaluation_takes_done_batches_of_the_right_length_as_they_are_and_recomputes_the_others():
    # How a killed final evaluation resumes: done[k] is kept when its length is the batch's, whatever its
    # values; a batch stored with another length (shorter or longer) is computed again and handed to on_batch.
    from vcd_helpers.config import EvaluationConfig, HMCConfig
    from vcd_helpers.config import ModelConfig
    from vcd_helpers.model import VAE

    images = (np.random.default_rng(0).random([6, 784]) < 0.2).astype(np.float32)
    model = VAE(ModelConfig(hidden_units=8, latent_dim=2), seed=0)
    evaluate = evaluation.make_evaluator(model, EvaluationConfig(batch_size=2, num_samples=4, chunk_size=4,
                                                                 proposal="encoder"), HMCConfig())
    fresh = evaluate(images, 3).per_example
    handed = []
    done = {0: np.full(2, 7.0, np.float32), 1: np.zeros(1, np.float32), 2: np.zeros(3, np.float32)}
    resumed = evaluate(images, 3, done=done, on_batch=lambda k, values: handed.append(k)).per_example
    assert handed == [1, 2]
    np.testing.assert_array_equal(resumed[:2], [7.0, 7.0])
    np.testing.assert_allclose(resumed[2:], fresh[2:], rtol=1e-6)


def test_on_batch_is_handed_each_computed_batchs_own_estimates():
    from vcd_helpers.config import EvaluationConfig, HMCConfig, ModelConfig
    from vcd_helpers.model import VAE

    images = (np.random.default_rng(0).random([6, 784]) < 0.2).astype(np.float32)
    model = VAE(ModelConfig(hidden_units=8, latent_dim=2), seed=0)
    evaluate = evaluation.make_evaluator(model, EvaluationConfig(batch_size=2, num_samples=4, chunk_size=4,
                                                                 proposal="encoder"), HMCConfig())
    handed = {}
    result = evaluate(images, 3, done={0: np.full(2, 7.0, np.float32)},
                      on_batch=lambda k, values: handed.__setitem__(k, values))
    assert sorted(handed) == [1, 2]
    for k in (1, 2):
        np.testing.assert_array_equal(handed[k], result.per_example[2 * k: 2 * k + 2])


def test_scoring_in_blocks_gives_the_same_numbers_from_blocks_of_at_most_the_block():
    x = tf.constant(rng.normal(size=(4, P)), tf.float32)
    seen = []

    def recording(x, z):
        seen.append(z.shape[0])
        return log_joint(x, z)

    for samples, block, pieces in [(5, 2, [2, 2, 1]), (6, 3, [3, 3]), (3, 8, [3]), (1, 1, [1])]:
        z = tf.constant(rng.normal(size=(samples, 4, D)), tf.float32)
        seen.clear()
        blocked = evaluation.log_joint_in_blocks(recording, block)(x, z)
        assert seen == pieces
        np.testing.assert_array_equal(blocked.numpy(), log_joint(x, z).numpy())


def test_the_evaluator_scores_each_chunk_in_blocks():
    from vcd_helpers.config import EvaluationConfig, HMCConfig, ModelConfig
    from vcd_helpers.model import VAE

    model = VAE(ModelConfig(hidden_units=8, latent_dim=2), seed=0)
    seen = []
    log_joint_of_model = model.log_joint
    model.log_joint = lambda x, z: seen.append(z.shape[0]) or log_joint_of_model(x, z)
    images = (np.random.default_rng(0).random([2, 784]) < 0.2).astype(np.float32)
    evaluation.make_evaluator(model, EvaluationConfig(batch_size=2, num_samples=10, chunk_size=5, proposal="encoder"),
                              HMCConfig())(images)
    assert seen == [evaluation.SCORE_BLOCK] * (5 // evaluation.SCORE_BLOCK) + [5 % evaluation.SCORE_BLOCK]

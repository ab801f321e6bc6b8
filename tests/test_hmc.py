"""vcd_helpers.hmc: correctness on a correlated Gaussian, adaptation, seeds, TFP agreement."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.data import load_binarized_mnist
from vcd_helpers.hmc import block_sizes, hmc_chain, leapfrog, trace_posterior, sharded_target, value_and_gradient
from vcd_helpers.model import VAE

COV = np.array([[1.0, 0.8, 0.0], [0.8, 1.0, 0.3], [0.0, 0.3, 0.5]])
MEAN = np.array([1.0, -2.0, 0.5])
TARGET = tfp.distributions.MultivariateNormalTriL(MEAN.astype(np.float32), np.linalg.cholesky(COV).astype(np.float32))
NUM_CHAINS = 4000


def dispersed_starts(seed=0):
    return tf.random.stateless_normal([NUM_CHAINS, 3], seed=[seed, 99]) * 3.0


def test_final_states_match_the_target_moments():
    result = tf.function(lambda: hmc_chain(TARGET.log_prob, dispersed_starts(), 0.3, num_iterations=60,
                                           num_leapfrog_steps=5, seed=1, adapt_step_size=False))()
    states = result.final_state.numpy()
    # Monte Carlo error of the mean with 4000 chains: sd/sqrt(4000) ~ 0.016; allow 5 sigma.
    np.testing.assert_allclose(states.mean(axis=0), MEAN, atol=5 * np.sqrt(np.diag(COV).max() / NUM_CHAINS))
    np.testing.assert_allclose(np.cov(states.T), COV, atol=0.1)
    assert 0.6 < float(result.accept_rate) <= 1.0


def test_adaptation_drives_acceptance_to_the_target():
    far_too_big = 2.5
    chain = tf.function(lambda start: hmc_chain(TARGET.log_prob, start, far_too_big, num_iterations=300,
                                                num_leapfrog_steps=5, seed=3, return_trace=True))
    result = chain(TARGET.sample(500, seed=[1, 2]))
    late = result.trace.accept_rates.numpy()[-100:].mean()
    assert abs(late - 0.9) < 0.05, late
    assert float(result.step_size) < far_too_big
    np.testing.assert_allclose(result.trace.step_sizes.numpy()[0], far_too_big)


def test_same_seed_same_chain_and_different_seed_different_chain():
    def run(seed):
        return hmc_chain(TARGET.log_prob, dispersed_starts(), 0.3, num_iterations=5, num_leapfrog_steps=3,
                         seed=seed).final_state.numpy()
    np.testing.assert_array_equal(run(7), run(7))
    assert not np.allclose(run(7), run(8))


def test_eager_and_function_agree_exactly():
    args = dict(num_iterations=4, num_leapfrog_steps=3, seed=5)
    start = dispersed_starts()[:64]
    eager = hmc_chain(TARGET.log_prob, start, 0.3, **args)
    graph = tf.function(lambda s: hmc_chain(TARGET.log_prob, s, 0.3, **args))(start)
    np.testing.assert_allclose(eager.final_state, graph.final_state, atol=1e-5)
    np.testing.assert_allclose(eager.step_size, graph.step_size, rtol=1e-6)


def test_xla_chain_is_deterministic_and_samples_the_target():
    # XLA lowers stateless random ops to another bit generator: same distribution, other draws.
    chain = tf.function(lambda s: hmc_chain(TARGET.log_prob, s, 0.3, num_iterations=60, num_leapfrog_steps=5,
                                            seed=5, adapt_step_size=False), jit_compile=True)
    first, second = chain(dispersed_starts()), chain(dispersed_starts())
    np.testing.assert_array_equal(first.final_state, second.final_state)
    states = first.final_state.numpy()
    np.testing.assert_allclose(states.mean(axis=0), MEAN, atol=5 * np.sqrt(1.0 / NUM_CHAINS))
    np.testing.assert_allclose(np.cov(states.T), COV, atol=0.1)


def test_gradients_do_not_flow_through_the_chain():
    start = tf.Variable(dispersed_starts()[:10])
    with tf.GradientTape() as tape:
        result = hmc_chain(TARGET.log_prob, start, 0.3, num_iterations=2, num_leapfrog_steps=2, seed=0)
        total = tf.reduce_sum(result.final_state)
    assert tape.gradient(total, start) is None


def test_gradient_evaluations_per_iteration_equal_leapfrog_steps():
    calls = []

    def counting_log_prob(z):
        calls.append(1)
        return TARGET.log_prob(z)

    hmc_chain(counting_log_prob, dispersed_starts()[:4], 0.1, num_iterations=8, num_leapfrog_steps=5, seed=0)
    # Eager tf.while_loop runs the Python body each time: 1 initial evaluation + 8 x 5.
    assert len(calls) == 1 + 8 * 5


def test_agrees_in_distribution_with_tfp():
    kernel = tfp.mcmc.HamiltonianMonteCarlo(TARGET.log_prob, step_size=0.3, num_leapfrog_steps=5)

    @tf.function
    def tfp_chain():
        return tfp.mcmc.sample_chain(num_results=1, num_burnin_steps=59, current_state=dispersed_starts(1),
                                     kernel=kernel, trace_fn=None, seed=[4, 4])[0]

    ours = tf.function(lambda: hmc_chain(TARGET.log_prob, dispersed_starts(1), 0.3, num_iterations=60,
                                         num_leapfrog_steps=5, seed=4, adapt_step_size=False))()
    a, b = ours.final_state.numpy(), tfp_chain().numpy()
    standard_error = np.sqrt(np.diag(COV) * 2 / NUM_CHAINS)
    assert np.all(np.abs(a.mean(0) - b.mean(0)) < 5 * standard_error)
    np.testing.assert_allclose(a.std(0), b.std(0), rtol=0.08)
    # Per-dimension two-sample Kolmogorov-Smirnov distance, critical value at alpha ~ 1e-3.
    for d in range(3):
        grid = np.sort(np.concatenate([a[:, d], b[:, d]]))
        ks = np.abs(np.searchsorted(np.sort(a[:, d]), grid, "right") -
                    np.searchsorted(np.sort(b[:, d]), grid, "right")).max() / NUM_CHAINS
        assert ks < 1.95 * np.sqrt(2 / NUM_CHAINS), (d, ks)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_iterations": 0}, "num_iterations=0 is invalid"),
    ({"num_leapfrog_steps": 2.0}, "num_leapfrog_steps=2.0 is invalid"),
    ({"target_accept_rate": 1.0}, "target_accept_rate=1.0 is invalid"),
    ({"target_accept_rate": 1.5}, "target_accept_rate=1.5 is invalid"),
    ({"target_accept_rate": 0.0}, "target_accept_rate=0.0 is invalid"),
    ({"target_accept_rate": -0.5}, "target_accept_rate=-0.5 is invalid"),
    ({"initial_state": tf.zeros([3])}, r"initial_state has shape \(3,\): expected \[chains, dims\]"),
])
def test_bad_arguments_are_named(kwargs, message):
    args = dict(num_iterations=2, num_leapfrog_steps=2, seed=0, initial_state=dispersed_starts()[:2]) | kwargs
    with pytest.raises(ValueError, match=message):
        hmc_chain(TARGET.log_prob, step_size=0.1, **args)


def test_a_chain_on_a_vae_posterior_starts_from_the_encoder_and_climbs():
    model = VAE(seed=0)
    x = tf.constant(load_binarized_mnist("test")[:6], tf.float32)
    run = trace_posterior(model, x, num_iterations=12, num_leapfrog_steps=3, step_size=0.01, seed=4)
    assert run.z0.shape == (6, 10) and run.log_probs.shape == (13, 6) and run.after.shape == (6, 784)
    assert run.accept_rates.shape == run.step_sizes.shape == (12,) and 0 <= run.accept_rate <= 1
    np.testing.assert_allclose(run.log_probs[0], model.log_joint(x, tf.constant(run.z0)).numpy(), rtol=1e-6)
    assert run.log_probs[-1].mean() > run.log_probs[0].mean()  # an untrained encoder's draws are far off
    again = trace_posterior(model, x, num_iterations=12, num_leapfrog_steps=3, step_size=0.01, seed=4,
                             z0=tf.constant(run.z0))
    np.testing.assert_array_equal(again.log_probs, run.log_probs)  # the same start and seed: the same chain


def test_the_chain_on_a_posterior_runs_as_one_compiled_graph():
    model, calls = VAE(seed=0), []
    log_joint = model.log_joint
    model.log_joint = lambda x, z: (calls.append(1), log_joint(x, z))[1]
    x = tf.constant(load_binarized_mnist("test")[:2], tf.float32)
    trace_posterior(model, x, num_iterations=12, num_leapfrog_steps=3, step_size=0.01, seed=4)
    assert len(calls) < 10, len(calls)  # traced a few times; 37 evaluations if run op by op


@pytest.mark.parametrize("size, blocks, expected", [(100, 2, [50, 50]), (100, 3, [34, 33, 33]), (3, 5, [1, 1, 1]),
                                                    (7, 1, [7])])
def test_block_sizes_cut_the_rows_evenly(size, blocks, expected):
    assert block_sizes(size, blocks) == expected


@pytest.mark.parametrize("num_shards", [0, 1.5, True])
def test_a_bad_number_of_shards_is_named(num_shards):
    with pytest.raises(ValueError, match=f"num_shards={num_shards!r} is invalid: must be a positive integer"):
        sharded_target(lambda data, z: z[:, 0], tf.zeros([4, 2]), num_shards)


@pytest.mark.parametrize("num_shards", [2, 3])
def test_a_sharded_target_is_the_same_target_and_the_same_chain(num_shards):
    model = VAE(seed=0)
    x = tf.constant(load_binarized_mnist("test")[:10], tf.float32)
    z0 = tf.random.stateless_normal([10, 10], seed=[5, 6])
    plain = lambda z: model.log_joint(x, z)
    sharded = sharded_target(model.log_joint, x, num_shards)
    for expected, actual in zip(value_and_gradient(plain, z0), value_and_gradient(sharded, z0)):
        np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=1e-5, atol=1e-4)

    def chain(target):
        return tf.function(lambda z: hmc_chain(target, z, 0.05, num_iterations=4, num_leapfrog_steps=3, seed=7),
                           jit_compile=True)(z0)
    expected, actual = chain(plain), chain(sharded)
    # The same momenta, uniforms and step-size rule: the chains differ by float round-off only.
    np.testing.assert_allclose(actual.final_state.numpy(), expected.final_state.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(actual.step_size), float(expected.step_size), rtol=1e-6)
    assert float(actual.accept_rate) == float(expected.accept_rate)


# Leapfrog on an exactly known Gaussian, in float64 so that round-off stays far below what is tested.
PRECISION64 = np.linalg.inv(COV)


def gaussian64(z):
    centred = z - MEAN
    return -0.5 * tf.reduce_sum(centred * tf.linalg.matvec(tf.constant(PRECISION64), centred), axis=-1)


def _leapfrog64(state, momentum, step_size, num_steps):
    _, gradient = value_and_gradient(gaussian64, state)
    return leapfrog(gaussian64, state, momentum, gradient, tf.constant(step_size, tf.float64), num_steps)


def _energy(state, momentum):
    return (-gaussian64(state) + 0.5 * tf.reduce_sum(tf.square(momentum), axis=-1)).numpy()


def test_leapfrog_is_time_reversible():
    # Forward L steps, negate the momentum, L steps more: back to the start with the momentum negated.
    start = tf.random.stateless_normal([64, 3], seed=[2, 7], dtype=tf.float64) + MEAN
    momentum = tf.random.stateless_normal([64, 3], seed=[2, 8], dtype=tf.float64)
    end, end_momentum, end_log_prob, end_gradient = _leapfrog64(start, momentum, 0.15, 10)
    assert float(tf.reduce_max(tf.abs(end - start))) > 0.3  # the trajectory went somewhere
    np.testing.assert_allclose(end_log_prob, gaussian64(end), rtol=1e-12)  # log p and gradient at the end
    np.testing.assert_allclose(end_gradient, value_and_gradient(gaussian64, end)[1], rtol=1e-12, atol=1e-12)
    back, back_momentum, _, _ = _leapfrog64(end, -end_momentum, 0.15, 10)
    np.testing.assert_allclose(back, start, atol=1e-10)
    np.testing.assert_allclose(-back_momentum, momentum, atol=1e-10)


def test_leapfrog_energy_error_shrinks_as_the_step_size_squared():
    # A second-order integrator: over a fixed trajectory length (1.0), the error in H = -log p + |p|^2 / 2
    # falls as h^2. Step sizes well inside the stable range (h < 2 sqrt(smallest variance) = 0.58).
    start = tf.random.stateless_normal([256, 3], seed=[3, 7], dtype=tf.float64) + MEAN
    momentum = tf.random.stateless_normal([256, 3], seed=[3, 8], dtype=tf.float64)
    step_sizes = np.array([0.1, 0.05, 0.025, 0.0125])
    errors = []
    for h in step_sizes:
        end, end_momentum, _, _ = _leapfrog64(start, momentum, float(h), int(round(1.0 / h)))
        errors.append(np.mean(np.abs(_energy(end, end_momentum) - _energy(start, momentum))))
    slope = np.polyfit(np.log(step_sizes), np.log(errors), 1)[0]
    assert 1.9 < slope < 2.1, (slope, errors)
    assert errors[-1] < 5e-4, errors


def test_the_chain_evaluates_the_target_at_its_initial_state():
    # The VCD trainer reuses these two as log p(x, z0) and its gradient: they must be at the start given.
    start = dispersed_starts()[:16]
    result = hmc_chain(TARGET.log_prob, start, 0.3, num_iterations=2, num_leapfrog_steps=3, seed=1)
    log_prob, gradient = value_and_gradient(TARGET.log_prob, start)
    np.testing.assert_allclose(result.initial_log_prob, log_prob, rtol=1e-6)
    np.testing.assert_allclose(result.initial_gradient, gradient, rtol=1e-6)
    assert float(tf.reduce_max(tf.abs(result.final_state - start))) > 0.1  # ... and not at the end


@pytest.mark.parametrize("num_shards, blocks", [(1, [10]), (2, [5, 5]), (3, [4, 3, 3])])
def test_a_sharded_target_evaluates_one_block_of_rows_per_shard(num_shards, blocks):
    seen = []

    def log_prob_fn(data, z):
        seen.append(int(data.shape[0]))
        return tf.reduce_sum(z, axis=-1) + data[:, 0]

    data = tf.reshape(tf.range(20.0), [10, 2])
    target = sharded_target(log_prob_fn, data, num_shards)
    z = tf.ones([10, 3])
    np.testing.assert_array_equal(target(z), 3.0 + data[:, 0])
    assert seen == blocks


def test_a_sharded_target_of_a_batch_unknown_when_tracing_is_the_plain_target():
    calls = []

    def log_prob_fn(data, z):
        calls.append(data.shape[0])
        return tf.reduce_sum(z, axis=-1) + data[:, 0]

    @tf.function(input_signature=[tf.TensorSpec([None, 2]), tf.TensorSpec([None, 3])])
    def evaluate(data, z):
        return sharded_target(log_prob_fn, data, 2)(z)

    data = tf.reshape(tf.range(20.0), [10, 2])
    np.testing.assert_array_equal(evaluate(data, tf.ones([10, 3])), 3.0 + data[:, 0])
    assert calls == [None]  # one evaluation of the whole (unknown) batch


def test_trace_posterior_takes_its_settings_by_name_only():
    # Keyword-only, so that a call cannot swap num_iterations and num_leapfrog_steps unnoticed.
    from vcd_helpers.config import ModelConfig

    model = VAE(ModelConfig(hidden_units=8, latent_dim=2), seed=0)
    with pytest.raises(TypeError):
        trace_posterior(model, tf.zeros([2, 784]), 2, 1, 0.1)


def test_trace_posterior_draws_from_seed_0_by_default():
    # The HMC explorer widget calls it without a seed: its figures are seed 0's.
    from vcd_helpers.config import ModelConfig

    model = VAE(ModelConfig(hidden_units=8, latent_dim=2), seed=0)
    x = tf.constant(load_binarized_mnist("test")[:2], tf.float32)
    settings = dict(num_iterations=2, num_leapfrog_steps=1, step_size=0.05)
    np.testing.assert_array_equal(trace_posterior(model, x, **settings).log_probs,
                                  trace_posterior(model, x, seed=0, **settings).log_probs)

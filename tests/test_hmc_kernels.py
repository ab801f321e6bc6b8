"""The kernels hmc_chain is built from (HMC, step-size adaptation, the driver), and the chain's
numbers pinned.

Runs in progress resume with the current code and check that the rows they write again are
identical, and the committed results must stay reproducible: every number the chain feeds
(hmc_chain eagerly, traced and under XLA; two VCD training steps; the evaluation's chain,
importance sampling and AIS) is compared with the float32 values recorded before the kernels
existed (commit 6f18aaa, AMD EPYC, AVX-512, TensorFlow 2.21). On that machine the kernels
reproduced them bit for bit; other CPUs pick other matmul kernels (another summation order), so
the comparison allows float32 round-off (``assert_pinned``), far below what a change of the maths
moves.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers import evaluation
from vcd_helpers.config import EvaluationConfig, HMCConfig, load_config
from vcd_helpers.hmc import (HamiltonianMonteCarlo, StepSizeAdaptation, accept_rate, hmc_chain, hmc_results,
                             mean_over_iterations, trace_posterior, sample_chain, value_and_gradient)
from vcd_helpers.model import VAE
from vcd_helpers.seeds import split_seed
from vcd_helpers.trainers import build_trainer

GAUSSIAN = tfp.distributions.MultivariateNormalTriL(
    np.array([1.0, -2.0, 0.5], np.float32),
    np.linalg.cholesky([[1.0, 0.8, 0.0], [0.8, 1.0, 0.3], [0.0, 0.3, 0.5]]).astype(np.float32))
STARTS = tf.random.stateless_normal([64, 3], seed=[8, 1]) * 2.0
IMAGES = (np.random.default_rng(7).random([3, 784]) < 0.25).astype(np.float32)


def test_bootstrap_results_hold_the_target_at_the_start():
    results = HamiltonianMonteCarlo(GAUSSIAN.log_prob, 0.25, 3).bootstrap_results(STARTS)
    log_prob, gradient = value_and_gradient(GAUSSIAN.log_prob, STARTS)
    np.testing.assert_array_equal(results.target_log_prob, log_prob)
    np.testing.assert_array_equal(results.grads_target_log_prob, gradient)
    assert results.step_size.dtype == tf.float32 and float(results.step_size) == np.float32(0.25)
    assert results.is_accepted.shape == (64,) and bool(tf.reduce_all(results.is_accepted))


def test_one_step_carries_the_target_and_gradient_of_the_state_it_returns():
    # Accepted chains carry the trajectory's end values, rejected ones keep theirs: either way, those of
    # the returned state (no evaluation is repeated, none is stale).
    kernel = HamiltonianMonteCarlo(GAUSSIAN.log_prob, 0.5, 4)  # steps large enough that a few chains reject
    state, results = kernel.one_step(STARTS, kernel.bootstrap_results(STARTS), seed=tf.constant([3, 3]))
    accepted = results.is_accepted.numpy()
    assert 0 < accepted.sum() < len(accepted)
    np.testing.assert_array_equal(state.numpy()[~accepted], STARTS.numpy()[~accepted])
    assert np.all(np.any(state.numpy()[accepted] != STARTS.numpy()[accepted], axis=1))
    log_prob, gradient = value_and_gradient(GAUSSIAN.log_prob, state)
    np.testing.assert_allclose(results.target_log_prob, log_prob, rtol=1e-6)
    np.testing.assert_allclose(results.grads_target_log_prob, gradient, rtol=1e-5, atol=1e-6)
    assert float(results.step_size) == np.float32(0.5)
    assert float(accept_rate(results)) == accepted.mean()


def test_one_step_integrates_with_the_step_size_of_its_results():
    # As in TFP, the step size comes from the kernel results (where an adaptation sets it), not the constructor.
    seed = tf.constant([4, 1])
    small = HamiltonianMonteCarlo(GAUSSIAN.log_prob, 0.05, 3)
    expected, _ = small.one_step(STARTS, small.bootstrap_results(STARTS), seed)
    large = HamiltonianMonteCarlo(GAUSSIAN.log_prob, 0.6, 3)
    results = large.bootstrap_results(STARTS)._replace(step_size=tf.constant(0.05))
    np.testing.assert_array_equal(large.one_step(STARTS, results, seed)[0], expected)
    np.testing.assert_array_equal(large.copy(step_size=0.05).one_step(STARTS, small.bootstrap_results(STARTS), seed)[0],
                                  expected)


def test_a_diverged_trajectory_is_rejected():
    def exploding(z):  # finite at the start, not finite anywhere the trajectory goes
        return tf.where(tf.reduce_all(z == STARTS[:4], axis=1), -tf.reduce_sum(z**2, axis=1), np.nan)

    kernel = HamiltonianMonteCarlo(exploding, 0.1, 2)
    state, results = kernel.one_step(STARTS[:4], kernel.bootstrap_results(STARTS[:4]), seed=tf.constant([1, 1]))
    assert not bool(tf.reduce_any(results.is_accepted)) and np.isneginf(results.log_accept_ratio).all()
    np.testing.assert_array_equal(state, STARTS[:4])


def test_the_adaptation_applies_the_reference_rule_after_each_step():
    kernel = StepSizeAdaptation(HamiltonianMonteCarlo(GAUSSIAN.log_prob, 0.4, 4), target_accept_rate=0.8,
                                adaptation_rate=0.3)
    results = kernel.bootstrap_results(STARTS)
    assert float(results.new_step_size) == np.float32(0.4)
    for k in range(3):
        used = float(results.new_step_size)
        _, results = kernel.one_step(STARTS, results, seed=tf.constant([5, k]))
        assert float(results.inner_results.step_size) == used  # the step ran at the adapted size
        rate = results.inner_results.is_accepted.numpy().mean()
        np.testing.assert_allclose(float(results.new_step_size), used + 0.3 * ((rate - 0.8) / 0.8) * used, rtol=1e-6)
    assert float(results.new_step_size) != np.float32(0.4)


def test_a_step_size_per_chain_adapts_to_its_own_chains_target():
    # Two chains on targets 100 times apart in width: a shared step size suits at most one of
    # them; one step size per chain ([B, 1]) moves each towards its own target's scale.
    widths = tf.constant([[0.05], [5.0]])
    target = lambda z: -0.5 * tf.reduce_sum(tf.square(z / widths), axis=-1)  # noqa: E731
    kernel = StepSizeAdaptation(HamiltonianMonteCarlo(target, tf.fill([2, 1], 0.5), 3), target_accept_rate=0.8,
                                adaptation_rate=0.05)
    run = sample_chain(400, tf.zeros([2, 1]), kernel, seed=tf.constant([3, 4]),
                       trace_fn=lambda z, results: tf.cast(hmc_results(results).is_accepted, tf.float32))
    step_sizes = run.final_kernel_results.new_step_size.numpy()[:, 0]
    assert run.final_kernel_results.new_step_size.shape == (2, 1)
    assert 30 < step_sizes[1] / step_sizes[0] < 300  # each near its own width's scale
    late = run.trace.numpy()[200:].mean(axis=0)
    assert np.all((late > 0.6) & (late < 0.97)), late  # each chain near the target, neither stuck
    # The per-chain rule is the reference's, applied to each chain's own decision.
    results = kernel.bootstrap_results(tf.zeros([2, 1]))
    _, after = kernel.one_step(tf.zeros([2, 1]), results, seed=tf.constant([1, 1]))
    decided = after.inner_results.is_accepted.numpy().astype(np.float32)[:, None]
    np.testing.assert_allclose(after.new_step_size, 0.5 + 0.05 * ((decided - 0.8) / 0.8) * 0.5, rtol=1e-6)


def test_tfps_step_size_adaptation_and_sample_chain_drive_the_kernel():
    # TFP's drivers read the kernel's results by name (step_size, log_accept_ratio), as they read
    # tfp.mcmc.HamiltonianMonteCarlo's; hmc_results and accept_rate read through TFP's results too.
    target = tfp.distributions.MultivariateNormalDiag(loc=[1.0, -2.0], scale_diag=[0.5, 2.0])
    kernel = tfp.mcmc.SimpleStepSizeAdaptation(HamiltonianMonteCarlo(target.log_prob, 3.0, 5),
                                               num_adaptation_steps=200, target_accept_prob=0.75)
    run = tf.function(lambda: tfp.mcmc.sample_chain(500, tf.zeros([64, 2]), kernel=kernel, seed=[1, 2],
                                                    trace_fn=lambda _, r: (hmc_results(r), accept_rate(r))))
    chain = run()
    results, rates = chain.trace
    step_sizes = results.step_size.numpy()
    assert step_sizes[0] == 3.0 and step_sizes[-1] < 1.5, step_sizes[[0, -1]]  # too long a start: shrunk
    kept = chain.all_states[250:].numpy().reshape(-1, 2)
    np.testing.assert_allclose(kept.mean(0), [1.0, -2.0], atol=0.1)
    np.testing.assert_allclose(kept.std(0), [0.5, 2.0], rtol=0.1)
    # Each decision was drawn against the recorded ratio: log u < ratio, so a ratio >= 0 always
    # accepts, and the chains accept at the mean of min(1, exp(ratio)).
    ratio, accepted = results.log_accept_ratio.numpy(), results.is_accepted.numpy()
    assert accepted[ratio >= 0].all() and (ratio < 0).any()
    assert abs(accepted.mean() - np.exp(np.minimum(ratio, 0)).mean()) < 0.01
    np.testing.assert_array_equal(rates.numpy(), accepted.mean(-1, dtype=np.float32))


@pytest.mark.parametrize("rate", [0.0, 1.0, 1.5])
def test_the_adaptation_rejects_a_target_outside_zero_one(rate):
    with pytest.raises(ValueError, match=f"target_accept_rate={rate!r} is invalid"):
        StepSizeAdaptation(HamiltonianMonteCarlo(GAUSSIAN.log_prob, 0.1, 2), target_accept_rate=rate)


def test_only_the_fixed_kernel_is_calibrated():
    hmc = HamiltonianMonteCarlo(GAUSSIAN.log_prob, 0.1, 2)
    assert hmc.is_calibrated and not StepSizeAdaptation(hmc).is_calibrated


def test_sample_chain_steps_the_kernel_with_one_split_seed_per_iteration():
    kernel = StepSizeAdaptation(HamiltonianMonteCarlo(GAUSSIAN.log_prob, 0.9, 2), 0.8, 0.3)
    run = sample_chain(3, STARTS, kernel, seed=6, trace_fn=lambda z, results: (z, results.new_step_size))
    state, results = STARTS, kernel.bootstrap_results(STARTS)
    for k, seed in enumerate(split_seed(6, 3)):
        state, results = kernel.one_step(state, results, seed)
        np.testing.assert_array_equal(run.trace[0][k], state)       # traced after each iteration
        assert float(run.trace[1][k]) == float(results.new_step_size)
    np.testing.assert_array_equal(run.final_state, state)
    assert float(run.final_kernel_results.new_step_size) == float(results.new_step_size)
    assert sample_chain(2, STARTS, kernel, seed=6).trace is None


def test_sample_chain_starts_from_the_results_it_is_given():
    kernel = HamiltonianMonteCarlo(GAUSSIAN.log_prob, 0.3, 2)
    results = kernel.bootstrap_results(STARTS)._replace(step_size=tf.constant(1e-6))
    run = sample_chain(2, STARTS, kernel, seed=1, previous_kernel_results=results)
    np.testing.assert_allclose(run.final_state, STARTS, atol=1e-4)  # it ran at 1e-6, not 0.3
    assert float(run.final_kernel_results.step_size) == np.float32(1e-6)


def test_sample_chain_runs_tfp_kernels():
    kernel = tfp.mcmc.HamiltonianMonteCarlo(GAUSSIAN.log_prob, step_size=0.3, num_leapfrog_steps=3)
    run = sample_chain(4, STARTS, kernel, seed=2, trace_fn=lambda z, results: results.is_accepted)
    assert run.final_state.shape == (64, 3) and run.trace.shape == (4, 64)
    assert float(tf.reduce_max(tf.abs(run.final_state - STARTS))) > 0.1


def test_mean_over_iterations_sums_in_iteration_order():
    # 300 values, as the evaluation's kept phase records: enough for a vectorised reduce_mean to add them
    # in another order, and land on another float32.
    values = np.random.default_rng(0).random(300).astype(np.float32)
    total = np.float32(0.0)
    for v in values:
        total = np.float32(total + v)
    assert float(mean_over_iterations(tf.constant(values))) == float(total / np.float32(300))


def test_a_run_on_the_posterior_keeps_no_model_alive():
    model = _vae()
    trace_posterior(model, tf.constant(IMAGES[:1]), num_iterations=1, num_leapfrog_steps=1, step_size=0.01)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None


# --- the pinned numbers ----------------------------------------------------------------------

VARIANTS = {"adapt": dict(adapt_step_size=True), "fixed": dict(adapt_step_size=False),
            "adapt_trace": dict(adapt_step_size=True, return_trace=True)}
MODES = {"eager": lambda fn: fn, "function": tf.function, "xla": lambda fn: tf.function(fn, jit_compile=True)}


def _flat(*values) -> np.ndarray:
    """Every value as float32, flattened end to end: one array to compare exactly."""
    return np.concatenate([np.asarray(v, np.float32).ravel() for v in values])


def _chain_values(result) -> np.ndarray:
    trace = () if result.trace is None else tuple(result.trace)
    return _flat(result.final_state, result.final_log_prob, result.step_size, result.accept_rate,
                 result.initial_log_prob, result.initial_gradient, *trace)


def _vae() -> VAE:
    return VAE(seed=0)


def _chain_case(target: str, variant: str, mode: str) -> np.ndarray:
    kwargs = dict(num_leapfrog_steps=3, target_accept_rate=0.7, adaptation_rate=0.3, **VARIANTS[variant])
    if target == "gaussian":
        log_prob, start, step_size, kwargs["num_iterations"] = GAUSSIAN.log_prob, tf.random.stateless_normal(
            [5, 3], seed=[1, 2]) * 2.0, 0.4, 4
    else:
        model, x = _vae(), tf.constant(IMAGES)
        loc, scale = model.encoder(x)
        log_prob = lambda z: model.log_joint(x, z)  # noqa: E731
        start, step_size, kwargs["num_iterations"] = loc + scale * tf.random.stateless_normal(
            tf.shape(loc), seed=[3, 4]), 0.05, 3
    chain = MODES[mode](lambda s: hmc_chain(log_prob, s, step_size, seed=11, **kwargs))
    return _chain_values(chain(start))


def _trainer_case(mode: str) -> np.ndarray:
    """Two VCD steps of a small tiny-config trainer: each step's metrics (the second's depend on the
    weights and the step size the first left) and the step size they end with."""
    config = load_config("tiny", model={"hidden_units": 16, "latent_dim": 3},
                         hmc={"initial_step_size": 0.5, "adaptation_rate": 0.3})
    jit, shards = {"eager": (False, 1), "function": (False, 2), "xla": (True, 2)}[mode]
    trainer = build_trainer(config.replace(execution={"jit_compile": jit, "chain_shards": shards}))
    step = trainer.train_step.python_function if mode == "eager" else trainer.train_step
    x = tf.constant(IMAGES[:2])
    metrics = [step(tf.constant([5, 9]), x) for _ in range(2)]
    return _flat(*(m[name] for m in metrics for name in sorted(m)), trainer.step_size)


def _evaluation_case(name: str) -> np.ndarray:
    model, x = _vae(), tf.constant(IMAGES[:2])
    if name == "posterior_chain":
        chain = evaluation.hmc_posterior_chain(model, x, burn_in=3, kept=2, step_size=0.05, seed=5,
                                               num_leapfrog_steps=3, trace_burn_in=True)
        return _flat(*chain)
    if name == "posterior_chain_no_burn_in":
        chain = evaluation.hmc_posterior_chain(model, x, burn_in=0, kept=3, step_size=0.05, seed=5,
                                               num_leapfrog_steps=3)
        return _flat(chain.kept_states, chain.step_size, chain.kept_accept_rate)
    if name in ("hmc_moments", "hmc_mean"):
        protocol = EvaluationConfig(proposal=name, burn_in=3, kept=4, num_samples=6, chunk_size=4, batch_size=2,
                                    num_examples=2)
        return _flat(evaluation.make_evaluator(model, protocol, HMCConfig())(IMAGES, 3).per_example)
    if name == "ais":
        return _flat(evaluation.ais_log_likelihood(model, IMAGES[:2], HMCConfig(), num_temperatures=4,
                                                   num_chains=3, seed=1))
    if name == "ais_eager":
        loc, scale = model.encoder(x)
        result = evaluation.annealed_importance_sampling(
            lambda z: model.log_joint(x, z), loc, scale, num_temperatures=3, num_chains=2, num_leapfrog_steps=2,
            step_size=0.05, seed=2)
        return _flat(*result)
    assert name == "trace_posterior"
    run = trace_posterior(model, x, num_iterations=3, num_leapfrog_steps=2, step_size=0.05, seed=4)
    return _flat(run.z0, run.log_probs, run.accept_rates, run.step_sizes, run.after[:, 400:408], run.final_step_size,
                 run.accept_rate)


def _expected(key: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex("".join(PINNED[key])), "<f4")


def assert_pinned(actual: np.ndarray, key: str) -> None:
    """``actual`` equals the pinned values up to float32 round-off of another CPU's kernels."""
    np.testing.assert_allclose(actual, _expected(key), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("target", ["gaussian", "vae"])
def test_chain_numbers_pinned(target, variant, mode):
    assert_pinned(_chain_case(target, variant, mode), f"chain/{target}/{variant}/{mode}")


@pytest.mark.parametrize("mode", MODES)
def test_vcd_step_numbers_pinned(mode):
    assert_pinned(_trainer_case(mode), f"vcd/{mode}")


@pytest.mark.parametrize("name", ["posterior_chain", "posterior_chain_no_burn_in", "hmc_moments", "hmc_mean", "ais",
                                  "ais_eager", "trace_posterior"])
def test_evaluation_numbers_pinned(name):
    assert_pinned(_evaluation_case(name), f"evaluation/{name}")


# Recorded at the code before the kernels (commit 6f18aaa): float32 arrays, little-endian hex.
PINNED: dict[str, tuple[str, ...]] = {
    "chain/gaussian/adapt/eager": (
        "7d558e3f9a836bbff667a73f065413beb31d1bc025aea93f84be923f4686e2bf24987c3ed1df1d403820853ea3ebc73f058fd43f",
        "2d001bbf3ccbc03dec043bc0a2e138c0a657e9bf50278ac07660abc0cad1dc3e0000403fca9e9ec1055669c1c19987c2ec79cec1",
        "c67391c185573441163163c1609b134181e9fb406e4d0bc1d8a020410d04a741b69ad7c1740b694102da2c418c4270c18e45ad40",
        "69151741ca2354c138cc0a41",
    ),
    "chain/gaussian/adapt/function": (
        "7d558e3f9a836bbff667a73f065413beb31d1bc025aea93f84be923f4686e2bf24987c3ed1df1d403820853ea3ebc73f058fd43f",
        "2d001bbf3ccbc03dec043bc0a2e138c0a657e9bf50278ac07660abc0cad1dc3e0000403fca9e9ec1055669c1c19987c2ec79cec1",
        "c67391c185573441163163c1609b134181e9fb406e4d0bc1d8a020410d04a741b69ad7c1740b694102da2c418c4270c18e45ad40",
        "69151741ca2354c138cc0a41",
    ),
    "chain/gaussian/adapt/xla": (
        "dbfd36403f0cfbbd948f9b3fa986eabc90ca34c0ce68063f6b1dfa3fc12b0fc05f6c9d3e58f81c406da2ccbfe6fc483e37643540",
        "73f42dbfe2436b3f000573c0f05405c0fc0487c01c5468c0067c76c0cbd70d3f6666663fca9e9ec1055669c1c39987c2ec79cec1",
        "c67391c185573441163163c1609b134182e9fb406e4d0bc1d8a020410e04a741b89ad7c1740b694102da2c418c4270c18e45ad40",
        "69151741ca2354c138cc0a41",
    ),
    "chain/gaussian/fixed/eager": (
        "a05d9e3f28ae57bf86e8a43f4a69acbe61a318c0fdffa43f9e21bd3f6f61b9bf88baae3e2533b83f734a36bf505fbf3f8d75f53f",
        "7bef12bf9e54acbd647738c0bc524cc0a088f1bf066e3dc08eabaac0cdcccc3e9a99593fca9e9ec1055669c1c19987c2ec79cec1",
        "c67391c185573441163163c1609b134181e9fb406e4d0bc1d8a020410d04a741b69ad7c1740b694102da2c418c4270c18e45ad40",
        "69151741ca2354c138cc0a41",
    ),
    "chain/gaussian/fixed/function": (
        "a05d9e3f28ae57bf86e8a43f4a69acbe61a318c0fdffa43f9e21bd3f6f61b9bf88baae3e2533b83f734a36bf505fbf3f8d75f53f",
        "7bef12bf9e54acbd647738c0bc524cc0a088f1bf066e3dc08eabaac0cdcccc3e9a99593fca9e9ec1055669c1c19987c2ec79cec1",
        "c67391c185573441163163c1609b134181e9fb406e4d0bc1d8a020410d04a741b69ad7c1740b694102da2c418c4270c18e45ad40",
        "69151741ca2354c138cc0a41",
    ),
    "chain/gaussian/fixed/xla": (
        "85de5d40e691393e792d343f561b863f34e4cbbf0fdce63fb98f7c3fbb6d39c06ae6d3bf4af33240819041bf86a91c3ff68cdf3f",
        "9b5b6cbe8890253f7d0695c0bc916ec00412d5c0d87257c043bca3c0cdcccc3e3333733fca9e9ec1055669c1c39987c2ec79cec1",
        "c67391c185573441163163c1609b134182e9fb406e4d0bc1d8a020410e04a741b89ad7c1740b694102da2c418c4270c18e45ad40",
        "69151741ca2354c138cc0a41",
    ),
    "chain/gaussian/adapt_trace/eager": (
        "7d558e3f9a836bbff667a73f065413beb31d1bc025aea93f84be923f4686e2bf24987c3ed1df1d403820853ea3ebc73f058fd43f",
        "2d001bbf3ccbc03dec043bc0a2e138c0a657e9bf50278ac07660abc0cad1dc3e0000403fca9e9ec1055669c1c19987c2ec79cec1",
        "c67391c185573441163163c1609b134181e9fb406e4d0bc1d8a020410d04a741b69ad7c1740b694102da2c418c4270c18e45ad40",
        "69151741ca2354c138cc0a4124c40a403a8813bf3836d63f5a6d80be48823dc0cccd783f780660407829963f2c40f73f0ac45840",
        "82df2f3f4c70eb3fa7745a40e4e039bf805a013f5885c63f8a89e8bf2ec3793e8a7fb63e9fde33c0c6dc6c3f780660407829963f",
        "2c40f73f0ac4584082df2f3f4c70eb3fe27f2940507f7cbf1a7e023f7d558e3f9a836bbff667a73f065413beb31d1bc025aea93f",
        "90dc29407c162fbe8dce713f0ac4584082df2f3f4c70eb3f84920a4081d2c3bfb81de7be7d558e3f9a836bbff667a73f065413be",
        "b31d1bc025aea93f84be923f4686e2bf24987c3ed1df1d403820853ea3ebc73f058fd43f2d001bbf3ccbc03dec686fc0af3e2ec0",
        "a810e0c07c51c6c0ac98b5c0706ae6bfb12232c0a810e0c07c51c6c0cc864bc0ec043bc0a2e138c000bd51c07c51c6c0f0dc4ac0",
        "ec043bc0a2e138c0a657e9bf50278ac07660abc00000803f9a99193fcdcc4c3f9a99193fcdcccc3ea621e73ecf39dd3ef9b4e63e",
    ),
    "chain/gaussian/adapt_trace/function": (
        "7d558e3f9a836bbff667a73f065413beb31d1bc025aea93f84be923f4686e2bf24987c3ed1df1d403820853ea3ebc73f058fd43f",
        "2d001bbf3ccbc03dec043bc0a2e138c0a657e9bf50278ac07660abc0cad1dc3e0000403fca9e9ec1055669c1c19987c2ec79cec1",
        "c67391c185573441163163c1609b134181e9fb406e4d0bc1d8a020410d04a741b69ad7c1740b694102da2c418c4270c18e45ad40",
        "69151741ca2354c138cc0a4124c40a403a8813bf3836d63f5a6d80be48823dc0cccd783f780660407829963f2c40f73f0ac45840",
        "82df2f3f4c70eb3fa7745a40e4e039bf805a013f5885c63f8a89e8bf2ec3793e8a7fb63e9fde33c0c6dc6c3f780660407829963f",
        "2c40f73f0ac4584082df2f3f4c70eb3fe27f2940507f7cbf1a7e023f7d558e3f9a836bbff667a73f065413beb31d1bc025aea93f",
        "90dc29407c162fbe8dce713f0ac4584082df2f3f4c70eb3f84920a4081d2c3bfb81de7be7d558e3f9a836bbff667a73f065413be",
        "b31d1bc025aea93f84be923f4686e2bf24987c3ed1df1d403820853ea3ebc73f058fd43f2d001bbf3ccbc03dec686fc0af3e2ec0",
        "a810e0c07c51c6c0ac98b5c0706ae6bfb12232c0a810e0c07c51c6c0cc864bc0ec043bc0a2e138c000bd51c07c51c6c0f0dc4ac0",
        "ec043bc0a2e138c0a657e9bf50278ac07660abc00000803f9a99193fcdcc4c3f9a99193fcdcccc3ea621e73ecf39dd3ef9b4e63e",
    ),
    "chain/gaussian/adapt_trace/xla": (
        "dbfd36403f0cfbbd948f9b3fa986eabc90ca34c0ce68063f6b1dfa3fc12b0fc05f6c9d3e58f81c406da2ccbfe6fc483e37643540",
        "73f42dbfe2436b3f000573c0f05405c0fc0487c01c5468c0067c76c0cbd70d3f6666663fca9e9ec1055669c1c39987c2ec79cec1",
        "c67391c185573441163163c1609b134182e9fb406e4d0bc1d8a020410e04a741b89ad7c1740b694102da2c418c4270c18e45ad40",
        "69151741ca2354c138cc0a41227c6d40695508bf5de51a3f32ce113fa5ff1cc0a2b96a3ff72b5c403bac383f2bda0e4040668140",
        "d47988beecb7513f96101c40d98185bfc5f58c3ddc373540770ca6be9bb3ea3f1512453f79c232c0ac49293ff72b5c403bac383f",
        "2bda0e4042135840ca2351bf2176753f676bf13fe898b7bf94c8ab3efd075840ed7c23bfa642453da2a9b33f7ecbd3bf884ff83f",
        "6b1dfa3fc12b0fc05f6c9d3ed952484004cacebe6d1d0c409b0cacbefd180bc0cca9163fdbfd36403f0cfbbd948f9b3fa986eabc",
        "90ca34c0ce68063f6b1dfa3fc12b0fc05f6c9d3e58f81c406da2ccbfe6fc483e3764354073f42dbfe2436b3fec83dbc0de540bc0",
        "ea71f7c0ad0908c1123f32c0cd2fbfc04a493fc0ea71f7c03a73eac0a02efdbf28e498c0e496b5c0fc0487c018b422c122918dc0",
        "000573c0f05405c0fc0487c01c5468c0067c76c00000803fcdcc4c3f0000803fcdcc4c3fcdcccc3ea621e73e7e09f13e8703083f",
    ),
    "chain/vae/adapt/eager": (
        "b01f8a4078320c401f9480bfb49b90c0979c85bfd66645c04cad914014f220c068d18cc00460a8bf7fb8dc409f1fe0bf04a14041",
        "386ea9bf0c1f05406e47dd3f18bb9840f65e03c09c4400410b39bbc092638d40dbdc6c3f0ca9b0bf597fe43e75dab23f7a74a2bf",
        "f083a340f45369c0d1f3533fbe59dabd734d05c5ce3144c53a4accc46831933d0000803f9f3d86c5512198c5abf96bc5188c3fc2",
        "e1d7a4c26443b5c1a33cc8423edbfd402e43f542646df4c22b3a8242470f984124627bc288f15dc2485a46bfe07c8dc2b4de3242",
        "db6393c2b0fbb1bf6a6beec2aec6c041d6bfb9c244ad8e42eb5299c2ac8777c281e219c27d75ea413307a1c2453010436409bbc2",
        "a082914247c722c29e921cc2",
    ),
    "chain/vae/adapt/function": (
        "b01f8a4078320c401f9480bfb49b90c0979c85bfd66645c04cad914014f220c068d18cc00460a8bf7fb8dc409f1fe0bf04a14041",
        "386ea9bf0c1f05406e47dd3f18bb9840f65e03c09c4400410b39bbc092638d40dbdc6c3f0ca9b0bf597fe43e75dab23f7a74a2bf",
        "f083a340f45369c0d1f3533fbe59dabd734d05c5ce3144c53a4accc46831933d0000803f9f3d86c5512198c5abf96bc5188c3fc2",
        "e1d7a4c26443b5c1a33cc8423edbfd402e43f542646df4c22b3a8242470f984124627bc288f15dc2485a46bfe07c8dc2b4de3242",
        "db6393c2b0fbb1bf6a6beec2aec6c041d6bfb9c244ad8e42eb5299c2ac8777c281e219c27d75ea413307a1c2453010436409bbc2",
        "a082914247c722c29e921cc2",
    ),
    "chain/vae/adapt/xla": (
        "fd859740705a0640ed667bbf1b5b8ac0099789bf00e35cc0e9b8914012cb3ac005b79dc09c28bdbfaaa4dc40ae3f1ec035144041",
        "6af65ebf4381314051ff2240a0dc9140c184e0bf00bef14037bdc6c0dfb094407cc9a13f07cd54bf6e1c643e607cf93f0b7da0bf",
        "e3cd9e40e5e369c0692bde3ffada88be242a0ac5f24b42c583d1d5c46931933d0000803f9f3d86c5512198c5abf96bc5188c3fc2",
        "e0d7a4c26543b5c1a53cc84234dbfd402e43f542646df4c22b3a8242470f984127627bc288f15dc2d85a46bfdf7c8dc2b2de3242",
        "dc6393c27cfbb1bf6b6beec2afc6c041d6bfb9c243ad8e42eb5299c2ac8777c281e219c27c75ea413607a1c2453010436609bbc2",
        "a282914247c722c29b921cc2",
    ),
    "chain/vae/fixed/eager": (
        "95d0994067b23b4047147dbff04aadc028e896bf825886c009dbb240cb8044c0ab2b9bc0993a93bf4573ef4031afe6bf7aca4c41",
        "e96acebf745e2e40e34cec3f2107ba404c2314c03a120e41a33fd2c0db55a840c53dab3feb51aabfbe93863e57770540d0b10ec0",
        "641dcb40b04e89c0d57f903f36927b3d88e11fc587265bc51db1fdc4cdcc4c3d0000803f9f3d86c5512198c5abf96bc5188c3fc2",
        "e1d7a4c26443b5c1a33cc8423edbfd402e43f542646df4c22b3a8242470f984124627bc288f15dc2485a46bfe07c8dc2b4de3242",
        "db6393c2b0fbb1bf6a6beec2aec6c041d6bfb9c244ad8e42eb5299c2ac8777c281e219c27d75ea413307a1c2453010436409bbc2",
        "a082914247c722c29e921cc2",
    ),
    "chain/vae/fixed/function": (
        "95d0994067b23b4047147dbff04aadc028e896bf825886c009dbb240cb8044c0ab2b9bc0993a93bf4573ef4031afe6bf7aca4c41",
        "e96acebf745e2e40e34cec3f2107ba404c2314c03a120e41a33fd2c0db55a840c53dab3feb51aabfbe93863e57770540d0b10ec0",
        "641dcb40b04e89c0d57f903f36927b3d88e11fc587265bc51db1fdc4cdcc4c3d0000803f9f3d86c5512198c5abf96bc5188c3fc2",
        "e1d7a4c26443b5c1a33cc8423edbfd402e43f542646df4c22b3a8242470f984124627bc288f15dc2485a46bfe07c8dc2b4de3242",
        "db6393c2b0fbb1bf6a6beec2aec6c041d6bfb9c244ad8e42eb5299c2ac8777c281e219c27d75ea413307a1c2453010436409bbc2",
        "a082914247c722c29e921cc2",
    ),
    "chain/vae/fixed/xla": (
        "6353b84094ff7140939660bf1241c7c09978cabf3774b6c092b8d540404e78c0b46facc02e1388bf6f7cec40b59e1ec040af4b41",
        "3564b0bfe8db5540441e2240dbedb340a67d01c083020941f466dbc0d831b0401c0ed73f913c1cbf538ad93d4f122b40f5cb15c0",
        "acdec240a7ed86c0a8f007409ceb44bd4ead41c54cbf59c50e8b04c5cdcc4c3d3a8e633f9f3d86c5512198c5abf96bc5188c3fc2",
        "e0d7a4c26543b5c1a53cc84234dbfd402e43f542646df4c22b3a8242470f984127627bc288f15dc2d85a46bfdf7c8dc2b2de3242",
        "dc6393c27cfbb1bf6b6beec2afc6c041d6bfb9c243ad8e42eb5299c2ac8777c281e219c27c75ea413607a1c2453010436609bbc2",
        "a282914247c722c29b921cc2",
    ),
    "chain/vae/adapt_trace/eager": (
        "b01f8a4078320c401f9480bfb49b90c0979c85bfd66645c04cad914014f220c068d18cc00460a8bf7fb8dc409f1fe0bf04a14041",
        "386ea9bf0c1f05406e47dd3f18bb9840f65e03c09c4400410b39bbc092638d40dbdc6c3f0ca9b0bf597fe43e75dab23f7a74a2bf",
        "f083a340f45369c0d1f3533fbe59dabd734d05c5ce3144c53a4accc46831933d0000803f9f3d86c5512198c5abf96bc5188c3fc2",
        "e1d7a4c26443b5c1a33cc8423edbfd402e43f542646df4c22b3a8242470f984124627bc288f15dc2485a46bfe07c8dc2b4de3242",
        "db6393c2b0fbb1bf6a6beec2aec6c041d6bfb9c244ad8e42eb5299c2ac8777c281e219c27d75ea413307a1c2453010436409bbc2",
        "a082914247c722c29e921cc225adbd4087fb9840b94757bf0660ecc0a120cabf6f29e3c03a83fd40674691c002ada9c0282f8fbe",
        "1e740b41b78203c042b56341d96317c09fea904036461140b3760541ffbd2cc070922d41598300c13bb4ed40843a214008ff39bf",
        "8f7858bec03c814039479cc0621c114187ebb3c0aac7104020ae033f83eba640acd06040ba1392bf6196c2c08f1ca3bf827ea9c0",
        "46b7cf403ad65bc0373ea6c088bf8dbf51850541e205fabf8cf05441163ce3bf4c195b40d7660d40d76fd740d41524c08b781741",
        "1901e9c05f44c440be3fd03fd7d4adbf10f2253e2c7629402ed63ec06120ed40938d9ac0f5f0be3f50ff233db01f8a4078320c40",
        "1f9480bfb49b90c0979c85bfd66645c04cad914014f220c068d18cc00460a8bf7fb8dc409f1fe0bf04a14041386ea9bf0c1f0540",
        "6e47dd3f18bb9840f65e03c09c4400410b39bbc092638d40dbdc6c3f0ca9b0bf597fe43e75dab23f7a74a2bff083a340f45369c0",
        "d1f3533fbe59dabd067665c5fe1f89c565d144c5312537c5be1270c58f2a15c5734d05c5ce3144c53a4accc40000803f0000803f",
        "0000803fcdcc4c3da621673d966c823d",
    ),
    "chain/vae/adapt_trace/function": (
        "b01f8a4078320c401f9480bfb49b90c0979c85bfd66645c04cad914014f220c068d18cc00460a8bf7fb8dc409f1fe0bf04a14041",
        "386ea9bf0c1f05406e47dd3f18bb9840f65e03c09c4400410b39bbc092638d40dbdc6c3f0ca9b0bf597fe43e75dab23f7a74a2bf",
        "f083a340f45369c0d1f3533fbe59dabd734d05c5ce3144c53a4accc46831933d0000803f9f3d86c5512198c5abf96bc5188c3fc2",
        "e1d7a4c26443b5c1a33cc8423edbfd402e43f542646df4c22b3a8242470f984124627bc288f15dc2485a46bfe07c8dc2b4de3242",
        "db6393c2b0fbb1bf6a6beec2aec6c041d6bfb9c244ad8e42eb5299c2ac8777c281e219c27d75ea413307a1c2453010436409bbc2",
        "a082914247c722c29e921cc225adbd4087fb9840b94757bf0660ecc0a120cabf6f29e3c03a83fd40674691c002ada9c0282f8fbe",
        "1e740b41b78203c042b56341d96317c09fea904036461140b3760541ffbd2cc070922d41598300c13bb4ed40843a214008ff39bf",
        "8f7858bec03c814039479cc0621c114187ebb3c0aac7104020ae033f83eba640acd06040ba1392bf6196c2c08f1ca3bf827ea9c0",
        "46b7cf403ad65bc0373ea6c088bf8dbf51850541e205fabf8cf05441163ce3bf4c195b40d7660d40d76fd740d41524c08b781741",
        "1901e9c05f44c440be3fd03fd7d4adbf10f2253e2c7629402ed63ec06120ed40938d9ac0f5f0be3f50ff233db01f8a4078320c40",
        "1f9480bfb49b90c0979c85bfd66645c04cad914014f220c068d18cc00460a8bf7fb8dc409f1fe0bf04a14041386ea9bf0c1f0540",
        "6e47dd3f18bb9840f65e03c09c4400410b39bbc092638d40dbdc6c3f0ca9b0bf597fe43e75dab23f7a74a2bff083a340f45369c0",
        "d1f3533fbe59dabd067665c5fe1f89c565d144c5312537c5be1270c58f2a15c5734d05c5ce3144c53a4accc40000803f0000803f",
        "0000803fcdcc4c3da621673d966c823d",
    ),
    "chain/vae/adapt_trace/xla": (
        "fd859740705a0640ed667bbf1b5b8ac0099789bf00e35cc0e9b8914012cb3ac005b79dc09c28bdbfaaa4dc40ae3f1ec035144041",
        "6af65ebf4381314051ff2240a0dc9140c184e0bf00bef14037bdc6c0dfb094407cc9a13f07cd54bf6e1c643e607cf93f0b7da0bf",
        "e3cd9e40e5e369c0692bde3ffada88be242a0ac5f24b42c583d1d5c46931933d0000803f9f3d86c5512198c5abf96bc5188c3fc2",
        "e0d7a4c26543b5c1a53cc84234dbfd402e43f542646df4c22b3a8242470f984127627bc288f15dc2d85a46bfdf7c8dc2b2de3242",
        "dc6393c27cfbb1bf6b6beec2afc6c041d6bfb9c243ad8e42eb5299c2ac8777c281e219c27c75ea413607a1c2453010436609bbc2",
        "a282914247c722c29b921cc23fcec2409e809440aae352bf0248e9c035afe0bf665be2c0041cfa4066cd93c0c91dafc0f70d0dbf",
        "06380d41acf319c0930e6141a4c326c045dc984036e91d40fa840341e5d126c093662e413aa102c1b758f040cd2930401b9178be",
        "c27041be52a08240ffb5a1c0d06a0b412e70aec0ea363140acdc123fe080ac4029d35740e0e188bfd291bec073eba4bf5c4aafc0",
        "4b06c840afb381c0ece5adc0ae0d93bf3cbef840030f24c07438544192d9fcbf64577440e8be15405c02cc40ff1c10c059a41841",
        "080ce6c0a93bc940a99afb3f8276e9be8f92213e5cc0444007e64fc0c1f0e6408b9599c0bdb21140b311df3dfd859740705a0640",
        "ed667bbf1b5b8ac0099789bf00e35cc0e9b8914012cb3ac005b79dc09c28bdbfaaa4dc40ae3f1ec0351440416af65ebf43813140",
        "51ff2240a0dc9140c184e0bf00bef14037bdc6c0dfb094407cc9a13f07cd54bf6e1c643e607cf93f0b7da0bfe3cd9e40e5e369c0",
        "692bde3ffada88befb8663c5a3bf89c515c246c52fb038c517336dc53dd91bc5242a0ac5f24b42c583d1d5c40000803f0000803f",
        "0000803fcdcc4c3da621673d976c823d",
    ),
    "vcd/eager": (
        "0000803e0000000034639d44d2aee350824e9b3e0000803e5337c44dbcd98444d08257ce53703c3e53703c3e",
    ),
    "vcd/function": (
        "0000803e0000000032639d44c9aee350814e9b3e0000803e4b37c44dbcd98444ae8257ce51703c3e51703c3e",
    ),
    "vcd/xla": (
        "0000003f00000000d0557744a6d6ac4dd148c03e0000003f47d0bb4b7a6a6644d227984ef3158b3ef3158b3e",
    ),
    "evaluation/posterior_chain": (
        "7e5897400b2e0c407d823cc00e2779c0ca1c73bf232a73c0d97a89403b7b3cc004ba8ac024f78ebfb36baa40366a9ebf29751d40",
        "253cfbbfb049a63cd96928beae4d30403ecd0cbfc87c1d40510f84c0b5e2884037d7da3f20df28c0c57d4ac0997569bf68542ac0",
        "84fb52406b8f20c0b72b78c02e58a1bff9ef8d401ab92bbf0d2e1e40a290e0bf308038beaea1a0bd2459de3f4e200fbefbcbe23f",
        "aa4b4ac0f77bbd406be3924081d66ac0043de3c0a44dabbf912ffbc0b928f9409a4494c0e56aa5c018d6b4bde86404417c60f7bf",
        "6eab6b40b8f027c0b4f2c13f801ea9bf2ee4c140405215c09983804028defbc02942ac40977f6a40a8015dc0fc20bdc03316aebf",
        "dcd4ccc03fe1d3403e8c76c0b085a0c03a2430bfbbbded40f9c6cfbf1ee639403a3d1fc0edb1893f0cca8cbfc708944063aff5bf",
        "88eb5a40f5ead4c0979ba540aec33340fc7c48c08b8f98c09ab18cbfd930a3c0e288ae40506548c0bae991c0ad477ebf1035ce40",
        "f99bb5bfc8d3334057c300c03d4ebb3e580322bfd43c6640d2869ebf4c994140d687a7c0c27b4d3d0000803f0000803f",
    ),
    "evaluation/posterior_chain_no_burn_in": (
        "2edcc740e4f9984017556fc05de0eac0f1e4c2bf7610f8c01e35fa4067d69dc0b8b8aac01eaccdbe30750341e85af3bf4d766440",
        "039f2fc0de91e23f9a4184bf4341c040373e06c02fb0844071c9f3c0114cbf40d92e8340fa1469c06645cdc08419bfbf466ec8c0",
        "ea49d6405a798dc01a08a1c0aa3877bf445ceb401137acbffddc5c40518922c03011ab3fc87540bf4a9896405a9ec6bfc91d6040",
        "103bd0c01a86aa40bc88504008824fc09085a8c07d31c4bfc69ca7c0dc56b640603d83c0cd5099c0acfcacbf0602c840fa7998bf",
        "e57e4240add516c0c2d7353fdea0ccbe8d6769404d5190bf5fe61f406441a5c0cdcc4c3d0000803f",
    ),
    "evaluation/hmc_moments": (
        "958838c4399232c4",
    ),
    "evaluation/hmc_mean": (
        "22ef86c473a3f6c4",
    ),
    "evaluation/ais": (
        "1ff587c594a637c5",
    ),
    "evaluation/ais_eager": (
        "8bc288c5931147c543d789c57c0647c5ffbc88c5127589c5abaaaa3e8ff2483d",
    ),
    "evaluation/trace_posterior": (
        "da5fce402990b2409ad0fc3f56b906c15c3bcebf815212c1d94c1241ed83a9c0ae25fdc0f729653ee1761341bb390cc02adf0dc0",
        "867c3ec04c029ebff21ec4bf7962c940e8333fc04e2248c0038c0cc12c6e8cc5be9c33c5132982c51ed528c50de371c587ef1bc5",
        "0e2b60c5174912c50000803f0000803f0000803fcdcc4c3d0e074d3d60414d3d8fff7f3f8bc20235fbff7f3fb2e8e7339ec1783f",
        "7c49783f92f80c3e6735d23d4e397e3f54368037cde4d13c4a1aa23a3fb1763fd0bd5c3cd7be013a68ac7f3fc27b4d3d0000803f",
    ),
}

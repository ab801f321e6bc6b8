"""The paper's evaluation protocol, pinned: its settings, its three proposals exactly as the
reference builds them, and where the evaluation's chains start. A change to any of them moves the
reported test log-likelihood (removing the 1.2 widening moves it by most of a nat), so each is a
test failure, not a silent change of the book's numbers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers import evaluation
from vcd_helpers.config import PROPOSALS, EvaluationConfig, HMCConfig
from vcd_helpers.model import VAE

HMC = HMCConfig()
X = tf.constant(np.random.default_rng(0).integers(0, 2, size=(4, 784)), tf.float32)


@pytest.fixture(scope="module")
def model():
    return VAE(seed=0)


def _protocol(proposal: str) -> EvaluationConfig:
    # The paper's protocol but for a short chain: the proposals' construction is what is pinned here.
    return dataclasses.replace(EvaluationConfig(), proposal=proposal, burn_in=3, kept=4)


def test_the_paper_protocol_is_the_default():
    protocol = EvaluationConfig()
    assert (protocol.proposal, protocol.num_samples, protocol.widen) == ("hmc_moments", 20_000, 1.2)
    assert (protocol.burn_in, protocol.kept, protocol.split, protocol.num_examples) == (300, 300, "test", None)
    assert PROPOSALS == ("encoder", "hmc_mean", "hmc_moments")
    assert (HMC.initial_step_size, HMC.num_leapfrog_steps, HMC.target_accept_rate) == (0.05, 5, 0.9)


def test_the_encoder_proposal_is_the_encoder_widened(model):
    loc, scale = model.encoder(X)
    r_loc, r_scale = evaluation.proposal_for(model, X, _protocol("encoder"), HMC, seed=1)
    np.testing.assert_array_equal(r_loc, loc)
    np.testing.assert_allclose(r_scale, 1.2 * scale.numpy(), rtol=1e-6)


@pytest.mark.parametrize("proposal", ["hmc_mean", "hmc_moments"])
def test_the_hmc_proposals_are_the_chain_moments_widened(model, proposal):
    protocol = _protocol(proposal)
    mean, std = evaluation.hmc_posterior_moments(
        model, X, burn_in=protocol.burn_in, kept=protocol.kept, step_size=HMC.initial_step_size, seed=5,
        **HMC.kernel_arguments())
    r_loc, r_scale = evaluation.proposal_for(model, X, protocol, HMC, seed=5)
    np.testing.assert_allclose(r_loc, mean, rtol=1e-6)
    # hmc_mean keeps the encoder's scale; hmc_moments takes the chain's spread (floored): both widened.
    spread = model.encoder(X)[1] if proposal == "hmc_mean" else tf.maximum(std, model.config.min_scale)
    np.testing.assert_allclose(r_scale, 1.2 * spread.numpy(), rtol=1e-6)
    assert float(tf.reduce_max(tf.abs(r_loc - model.encoder(X)[0]))) > 1e-3  # the chain moved


def test_the_chains_start_at_the_encoder_mean(model):
    # A chain that cannot move (one kept state, a vanishing step, no burn-in) reports its start.
    mean, std = evaluation.hmc_posterior_moments(model, X, burn_in=0, kept=1, step_size=1e-7, seed=2,
                                                 num_leapfrog_steps=1)
    np.testing.assert_allclose(mean, model.encoder(X)[0], atol=1e-5)
    np.testing.assert_array_equal(std, tf.zeros_like(std))


def test_the_protocols_functions_take_their_seed_by_name_only(model):
    # Keyword-only, so that a seed cannot land in another count's place unnoticed.
    with pytest.raises(TypeError):
        evaluation.proposal_for(model, X, _protocol("encoder"), HMC, 1)
    with pytest.raises(TypeError):
        evaluation.evaluate_log_likelihood(model, X.numpy(), _protocol("encoder"), HMC, 1)


def test_make_evaluator_takes_effective_sample_size_by_name_only(model):
    # Keyword-only, so that a stray positional flag cannot switch on the S_eff output unnoticed.
    with pytest.raises(TypeError):
        evaluation.make_evaluator(model, _protocol("encoder"), HMC, True)


def test_evaluate_log_likelihood_draws_from_seed_0_by_default(model):
    protocol = dataclasses.replace(EvaluationConfig(), proposal="encoder", num_samples=8, chunk_size=8)

    def per_example(**kwargs):
        return evaluation.evaluate_log_likelihood(model, X.numpy(), protocol, HMC, **kwargs).per_example

    default = per_example()
    np.testing.assert_array_equal(default, per_example(seed=0))
    assert not np.array_equal(default, per_example(seed=1))


def test_ais_draws_per_batch_of_100_images_by_default():
    # Batch k draws from fold_in(seed, k): the default batching is part of the committed AIS
    # estimates' identity. 101 images: image 100 is in batch 1 with batches of 100, in batch 0 with 101.
    from vcd_helpers.config import ModelConfig

    tiny = VAE(ModelConfig(hidden_units=8, latent_dim=2), seed=0)
    images = (np.random.default_rng(1).random([101, 784]) < 0.2).astype(np.float32)

    def ais(**kwargs):
        return evaluation.ais_log_likelihood(tiny, images, HMC, num_temperatures=2, num_chains=2, seed=3, **kwargs)

    default = ais()
    np.testing.assert_array_equal(default, ais(batch_size=100))
    assert default[100] != ais(batch_size=101)[100]


def _chain(model, **overrides):
    arguments = dict(burn_in=6, kept=5, step_size=0.5, seed=3, trace_burn_in=True) | overrides
    return evaluation.hmc_posterior_chain(model, X, **HMC.kernel_arguments() | {"adaptation_rate": 0.05}, **arguments)


def test_the_burn_in_adapts_the_step_size_and_without_it_nothing_adapts(model):
    # Started far above what a 0.9 acceptance allows, the burn-in must shrink the step size.
    adapted = _chain(model)
    assert float(adapted.step_size) < 0.5 and np.isfinite(float(adapted.burn_in_accept_rate))
    frozen = _chain(model, burn_in=0, trace_burn_in=False)
    assert float(frozen.step_size) == 0.5 and np.isnan(float(frozen.burn_in_accept_rate))


def test_the_kept_phase_runs_at_the_burn_ins_step_size_and_never_adapts(model):
    # The kept phase's step size is the burn-in's last one, whatever the number of kept states:
    # a kept phase that adapted would end elsewhere after 1 and after 12 iterations.
    short, long = _chain(model, kept=1), _chain(model, kept=12)
    assert float(short.step_size) == float(long.step_size) < 0.5
    # Its first state is the burn-in's last state moved by one HMC iteration at that step size:
    # run from the burn-in's end with the adapted step size and no burn-in, it is the same state.
    resumed = evaluation.hmc_posterior_chain(
        model, X, burn_in=0, kept=1, step_size=float(short.step_size), seed=3, initial_state=short.burn_in_states[-1],
        **HMC.kernel_arguments())
    np.testing.assert_allclose(resumed.kept_states, short.kept_states, rtol=1e-6, atol=1e-6)


def test_the_moments_come_from_the_kept_states_only(model):
    chain = _chain(model, burn_in=4, kept=6, step_size=HMC.initial_step_size, seed=9)
    mean, std = evaluation.hmc_posterior_moments(
        model, X, burn_in=4, kept=6, step_size=HMC.initial_step_size, seed=9,
        **HMC.kernel_arguments() | {"adaptation_rate": 0.05})
    np.testing.assert_allclose(mean, tf.reduce_mean(chain.kept_states, axis=0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(std, tf.math.reduce_std(chain.kept_states, axis=0), rtol=1e-5, atol=1e-7)
    every_state = tf.concat([chain.burn_in_states, chain.kept_states], axis=0)
    assert float(tf.reduce_max(tf.abs(mean - tf.reduce_mean(every_state, axis=0)))) > 1e-4

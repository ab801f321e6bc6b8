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

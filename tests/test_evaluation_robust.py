"""The robust evaluation (``EvaluationConfig.robust``): several chains per image, each adapting
its own step size, and the proposal a mixture over the chains. It must find the mass of a
posterior mode that one chain from the encoder mean never reaches, and leave the paper's
protocol exactly as it was when switched off."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers import evaluation
from vcd_helpers.config import EvaluationConfig, HMCConfig
from vcd_helpers.model import VAE
from vcd_helpers.results import evaluation_file_name

HMC = HMCConfig()
LOG_EVIDENCE = -50.0                          # log p(x) of the toy, the same for every image
MINOR, MAJOR = (-1.5, 0.0), (1.5, 0.0)        # the posterior's two modes, 12 of their own widths
MINOR_WEIGHT, MODE_SCALE = 0.1, 0.25          # apart: an 18-nat barrier no chain crosses
ENCODER_MEAN, ENCODER_SCALE = (-0.5, 0.0), 2.0  # in the minor mode's basin (which ends at z_1 = -0.05)


class BimodalModel:
    """A stand-in for the VAE with a known evidence: p(z | x) = 0.1 N(MINOR, 0.25^2 I) + 0.9
    N(MAJOR, 0.25^2 I) in 2-D for every image, and an encoder N(ENCODER_MEAN, 2^2 I) whose mean
    lies in the minor mode's basin: one chain from the encoder mean stays in the minor mode, while
    a draw from the encoder lands in the major mode's basin with probability 0.41."""

    config = SimpleNamespace(min_scale=1e-3)

    def encoder(self, x):
        batch = tf.shape(x)[0]
        return tf.tile(tf.constant([ENCODER_MEAN]), [batch, 1]), tf.fill([batch, 2], ENCODER_SCALE)

    def log_joint(self, x, z):  # z [..., B, 2] -> [..., B]
        def log_normal(centre):
            return tf.reduce_sum(-0.5 * tf.square((z - centre) / MODE_SCALE) - math.log(MODE_SCALE * math.sqrt(2 * math.pi)), -1)
        return LOG_EVIDENCE + tf.reduce_logsumexp(
            tf.stack([math.log(MINOR_WEIGHT) + log_normal(MINOR), math.log(1 - MINOR_WEIGHT) + log_normal(MAJOR)]), 0)


IMAGES = np.zeros([3, 1], np.float32)
PAPER = EvaluationConfig(num_samples=4000, chunk_size=500, burn_in=100, kept=100)


def _evaluate(protocol: EvaluationConfig) -> np.ndarray:
    return evaluation.make_evaluator(BimodalModel(), protocol, HMC)(IMAGES, 0).per_example


def test_the_robust_evaluation_finds_the_mode_one_chain_from_the_encoder_mean_misses():
    paper, robust = _evaluate(PAPER), _evaluate(PAPER.robust(16))
    # One chain from the encoder mean sees the minor mode only: it estimates its mass, log 0.1 below.
    np.testing.assert_allclose(paper, LOG_EVIDENCE + math.log(MINOR_WEIGHT), atol=0.1)
    # The mixture over 16 chains covers both modes (all 15 draws miss the major one with
    # probability 0.59^15 = 4e-4): the evidence itself.
    np.testing.assert_allclose(robust, LOG_EVIDENCE, atol=0.1)


def test_the_first_chain_starts_at_the_encoder_mean_and_the_others_at_encoder_draws():
    model = VAE(seed=0)
    x = tf.constant(np.random.default_rng(0).integers(0, 2, size=(4, 784)), tf.float32)
    # Chains that cannot move (no burn-in, one kept state, a vanishing step) report their starts.
    mean, std = evaluation.hmc_posterior_moments(model, x, burn_in=0, kept=1, step_size=1e-7, seed=2,
                                                 num_leapfrog_steps=1, num_starts=3)
    loc, scale = model.encoder(x)
    assert mean.shape == std.shape == (3, 4, loc.shape[-1])
    np.testing.assert_allclose(mean[0], loc, atol=1e-5)
    standardised = ((mean[1:] - loc) / scale).numpy()
    assert np.all(np.abs(standardised) > 1e-3) and np.all(np.abs(standardised) < 6)  # draws, not the mean
    assert np.abs(standardised[0] - standardised[1]).min() > 1e-4                   # independent draws
    assert 0.5 < standardised.std() < 1.5                                             # at the encoder's scale


class TwoWidths(BimodalModel):
    """Image 0's posterior 200 times narrower than image 1's (one Gaussian each): a step size
    of 0.05 suits image 1 and is ten times too long for image 0."""

    def log_joint(self, x, z):
        widths = tf.constant([0.005, 1.0])[: tf.shape(x)[0]]
        return tf.reduce_sum(-0.5 * tf.square((z - tf.constant(MINOR)) / widths[:, None]), -1)


def test_a_step_size_per_chain_adapts_to_its_own_chain():
    x, arguments = IMAGES[:2], dict(burn_in=300, kept=2, step_size=0.05, seed=4, **HMC.kernel_arguments())
    shared = evaluation.hmc_posterior_chain(TwoWidths(), x, **arguments)
    assert shared.step_size.shape == ()
    steps = tf.fill([2, 1], 0.05)
    own = evaluation.hmc_posterior_chain(TwoWidths(), x, **arguments | {"step_size": steps}).step_size.numpy()
    assert own.shape == (2, 1)
    # Each chain's step size follows its own posterior (the burn-in can shrink a step size by up to
    # 0.99^300 but grow it by 1.001^300 = 1.4 at most); the shared one follows neither.
    assert own[1, 0] / own[0, 0] > 5
    assert own[0, 0] < float(shared.step_size) < own[1, 0]


def test_the_mixture_proposal_is_the_equal_weight_mean_of_its_components():
    rng = np.random.default_rng(3)
    loc, scale = rng.normal(size=[3, 2, 4]), rng.uniform(0.5, 2, size=[3, 2, 4])
    mixture = evaluation.proposal_distribution(tf.constant(loc), tf.constant(scale))
    z = rng.normal(size=[5, 2, 4])
    log_components = (-0.5 * ((z[:, None] - loc) / scale) ** 2 - np.log(scale * np.sqrt(2 * np.pi))).sum(-1)  # [5, M, B]
    expected = np.log(np.exp(log_components).mean(axis=1))
    np.testing.assert_allclose(mixture.log_prob(z), expected, rtol=1e-10)
    assert mixture.sample(7, seed=[1, 2]).shape == (7, 2, 4)


def test_one_start_and_a_shared_step_size_are_the_papers_protocol_exactly():
    model = VAE(seed=0)
    x = tf.constant(np.random.default_rng(0).integers(0, 2, size=(4, 784)), tf.float32)
    short = dataclasses.replace(EvaluationConfig(), burn_in=3, kept=4)
    explicit = dataclasses.replace(short, num_starts=1, step_size_per_chain=False)
    for a, b in zip(evaluation.proposal_for(model, x, short, HMC, seed=5),
                    evaluation.proposal_for(model, x, explicit, HMC, seed=5)):
        np.testing.assert_array_equal(a, b)
    assert evaluation_file_name(short) == "evaluation-hmc_moments-S20000-Nall.json"


def test_the_robust_protocol_has_a_file_of_its_own():
    assert evaluation_file_name(EvaluationConfig(num_examples=1000).robust(4)) == \
        "evaluation-hmc_moments-M4-per_chain-S20000-Nall.json".replace("Nall", "N1000")
    assert evaluation_file_name(dataclasses.replace(EvaluationConfig(), step_size_per_chain=True)) == \
        "evaluation-hmc_moments-per_chain-S20000-Nall.json"


@pytest.mark.parametrize("overrides, message", [
    ({"num_starts": 0}, "evaluation.num_starts=0 is invalid: must be a positive integer"),
    ({"num_starts": 2.0}, "evaluation.num_starts=2.0 is invalid"),
    ({"step_size_per_chain": 1}, "evaluation.step_size_per_chain=1 is invalid: must be true or false"),
    ({"proposal": "encoder", "num_starts": 4}, "evaluation.num_starts=4 is invalid: the encoder proposal runs no chain"),
    ({"proposal": "encoder", "step_size_per_chain": True}, "evaluation.step_size_per_chain=True is invalid"),
])
def test_bad_robust_settings_are_refused_naming_them(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        EvaluationConfig(**overrides)


class ImageCentred(BimodalModel):
    """p(z | x) = N((3 x_0, 0), 0.25^2 I): a posterior of its own for each image, so that a chain
    run on another image's x ends elsewhere."""

    def log_joint(self, x, z):  # z [..., B, 2] -> [..., B]
        centre = tf.stack([3.0 * x[:, 0], tf.zeros_like(x[:, 0])], -1)
        return tf.reduce_sum(-0.5 * tf.square((z - centre) / 0.25), -1)


def test_each_start_runs_on_its_own_images_posterior():
    # Chain m of image b must target p(z | x_b): x tiled [M B] in the order of the starts.
    x = np.array([[0.0], [1.0], [-1.0]], np.float32)
    mean, _ = evaluation.hmc_posterior_moments(ImageCentred(), tf.constant(x), burn_in=200, kept=100, step_size=0.05,
                                               seed=1, num_starts=3, **HMC.kernel_arguments())
    assert mean.shape == (3, 3, 2)
    expected = np.broadcast_to(np.stack([3 * x[:, 0], np.zeros(3)], -1), (3, 3, 2))
    np.testing.assert_allclose(mean, expected, atol=0.3)


@pytest.mark.parametrize("num_starts", [1, 3])
def test_step_size_per_chain_gives_each_chain_its_own_initial_step_size(monkeypatch, num_starts):
    seen = []
    real = evaluation.hmc_posterior_chain
    monkeypatch.setattr(evaluation, "hmc_posterior_chain",
                        lambda model, x, **kwargs: seen.append((x.shape[0], kwargs["step_size"])) or real(model, x, **kwargs))
    evaluation.hmc_posterior_moments(BimodalModel(), tf.constant(IMAGES), burn_in=1, kept=1, step_size=0.05, seed=1,
                                     num_starts=num_starts, step_size_per_chain=True, **HMC.kernel_arguments())
    (rows, step_size), = seen
    assert rows == num_starts * len(IMAGES)
    np.testing.assert_array_equal(step_size, np.full([rows, 1], 0.05, np.float32))


@pytest.mark.parametrize("proposal", ["hmc_mean", "hmc_moments"])
def test_the_mixtures_components_each_have_a_scale(proposal):
    protocol = dataclasses.replace(PAPER, proposal=proposal, burn_in=2, kept=3).robust(3)
    loc, scale = evaluation.proposal_for(BimodalModel(), tf.constant(IMAGES), protocol, HMC, seed=1)
    assert loc.shape == scale.shape == (3, len(IMAGES), 2)
    if proposal == "hmc_mean":  # the encoder's scale for every chain, widened
        np.testing.assert_allclose(scale, np.full(scale.shape, 1.2 * ENCODER_SCALE), rtol=1e-6)
    estimate = evaluation.make_evaluator(BimodalModel(), dataclasses.replace(protocol, num_samples=50, chunk_size=50),
                                         HMC)(IMAGES, 0).per_example
    assert estimate.shape == (len(IMAGES),) and np.all(np.isfinite(estimate))


def test_robust_defaults_to_four_starts_and_sets_both():
    assert EvaluationConfig().robust() == dataclasses.replace(EvaluationConfig(), num_starts=4,
                                                              step_size_per_chain=True)


@pytest.mark.parametrize("num_starts", [2, 3])
def test_every_number_of_starts_starts_at_the_mean_then_at_draws(num_starts):
    model = VAE(seed=0)
    x = tf.constant(np.random.default_rng(0).integers(0, 2, size=(4, 784)), tf.float32)
    mean, _ = evaluation.hmc_posterior_moments(model, x, burn_in=0, kept=1, step_size=1e-7, seed=2,
                                               num_leapfrog_steps=1, num_starts=num_starts)
    loc, scale = model.encoder(x)
    assert mean.shape == (num_starts, 4, loc.shape[-1])
    np.testing.assert_allclose(mean[0], loc, atol=1e-5)
    assert np.all(np.abs(((mean[1:] - loc) / scale).numpy()) > 1e-3)

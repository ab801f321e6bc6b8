"""Training objectives: the reparameterised ELBO of the plain VAE, the VCD surrogate losses and
Hoffman (2017)'s losses (the ELBO for the encoder, the chain's end for the decoder); and, to read
a trained model, the VCD divergence's two parts (the chain's gain, the scale term).

Shapes: x [batch, 784]; per-example objectives [batch]. Losses are *summed* over the batch, as
in the reference code, so learning rates are per-example rates.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.config import ControlVariateConfig, check_one_of, check_positive_int, check_positive_number
from vcd_helpers.control_variates import ControlVariate
from vcd_helpers.hmc import HMCResult, hmc_chain
from vcd_helpers.model import VAE, bernoulli_log_likelihood, standard_normal_log_prob
from vcd_helpers.seeds import salted_seed, split_seed

tfd = tfp.distributions


def posterior_distribution(loc: tf.Tensor, scale: tf.Tensor) -> tfd.Distribution:
    """q0(z | x) = N(loc, diag(scale^2)) with the latent dimension as the event: [batch] batch shape."""
    return tfd.Independent(tfd.Normal(loc, scale), reinterpreted_batch_ndims=1)


def reparameterised_elbo(log_joint_fn: Callable[[tf.Tensor], tf.Tensor], loc: tf.Tensor, scale: tf.Tensor,
                         noise: tf.Tensor) -> tf.Tensor:
    """One-sample reparameterised ELBO per row: log p(z) - log q0(z) at z = loc + scale * noise.

    ``log_joint_fn`` maps z [B, D] to the unnormalised log target [B] (log p(x, z) on the VAE,
    log pi(z) on a toy); loc, scale, noise [B, D] (loc and scale may broadcast) -> [B]. Gradients
    flow to loc and scale through z and through log q0. Its mean is log Z - KL(q0 || pi), Z the
    target's normaliser.
    """
    z = loc + scale * noise
    return log_joint_fn(z) - posterior_distribution(loc, scale).log_prob(z)


def elbo(model: VAE, x: tf.Tensor, seed: tf.Tensor, precision: str = "float32") -> tf.Tensor:
    """One-sample reparameterised ELBO per example: log p(x, z) - log q(z | x), z = loc + scale * eps.

    x [batch, 784] -> [batch]. Gradients flow to encoder and decoder through z. ``precision``: the
    networks' multiplies (``model.matmul``).
    """
    loc, scale = model.encoder(x, precision)
    return reparameterised_elbo(lambda z: model.log_joint(x, z, precision), loc, scale,
                                tf.random.stateless_normal(tf.shape(loc), seed=seed))


def half_standardised_square(z: tf.Tensor, loc: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    """1/2 sum_d ((z_d - loc_d) / scale_d)^2: z, loc, scale [B, D] (broadcastable) -> [B]. Its mean
    under q0 = N(loc, diag scale^2) is D/2; it is the part of g(z) that depends on the encoder."""
    return 0.5 * tf.reduce_sum(tf.square((z - loc) / scale), axis=-1)


def pathwise_log_joint(z0: tf.Tensor, log_joint_z0: tf.Tensor, grad_z0: tf.Tensor) -> tf.Tensor:
    """log p(x, z0) [B] rebuilt from its value and gradient, so that it differentiates through z0
    [B, D] by the chain rule without another decoder pass: log p(x, z0) + grad_z0 . (z0 - stop(z0)),
    whose value is log p(x, z0) and whose gradient is grad_z0 . dz0/dphi (phi: the encoder's
    parameters). log_joint_z0 [B] and grad_z0 [B, D] are what the HMC chain evaluated at its start
    (``HMCResult.initial_log_prob``, ``initial_gradient``)."""
    return (tf.stop_gradient(log_joint_z0)
            + tf.reduce_sum(tf.stop_gradient(grad_z0) * (z0 - tf.stop_gradient(z0)), axis=-1))


def encoder_surrogate_loss(loc: tf.Tensor, scale: tf.Tensor, z0: tf.Tensor, zT: tf.Tensor,
                           log_joint_z0: tf.Tensor, grad_z0: tf.Tensor, log_joint_zT: tf.Tensor,
                           baseline: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The encoder's VCD surrogate loss, summed over the batch, and g(zT) (book/algorithm.md).

        g(z; mu, sigma) = log p(x, z) + 1/2 sum_d ((z_d - mu_d) / sigma_d)^2
        encoder_loss = sum_n [ -log p(x, z0)                               pathwise, through z0
                               + g(zT; mu, sigma)                          through mu, sigma only
                               + stop(g(zT) - b) * log q0(stop(z0))  ]     score function

    The pathwise term needs log p(x, z0) and its gradient in z0, which the HMC chain has already
    evaluated at its start (``HMCResult.initial_log_prob``, ``initial_gradient``): by the chain
    rule, d/dphi of -log p(x, z0(phi)) is -grad_z0 . dz0/dphi (phi: the encoder's parameters),
    which ``pathwise_log_joint`` gives without a second decoder pass at z0.

    Args:
      loc, scale: the encoder's outputs [B, D], differentiable.
      z0: loc + scale * eps [B, D], differentiable; zT: the chain's end [B, D].
      log_joint_z0 [B], grad_z0 [B, D]: log p(x, z0) and its gradient with respect to z0.
      log_joint_zT [B]: log p(x, zT). baseline [B]: the control variate b.
    Returns (encoder_loss, g) with g = g(zT) [B] stopped, for the control variate.
    """
    zT = tf.stop_gradient(zT)
    g = tf.stop_gradient(log_joint_zT) + half_standardised_square(zT, loc, scale)
    log_q0 = posterior_distribution(loc, scale).log_prob(tf.stop_gradient(z0))
    score = tf.stop_gradient(g - baseline) * log_q0
    pathwise = -pathwise_log_joint(z0, log_joint_z0, grad_z0)
    return tf.reduce_sum(pathwise + g + score), tf.stop_gradient(g)


def vcd_surrogate_losses(model: VAE, x: tf.Tensor, loc: tf.Tensor, scale: tf.Tensor, z0: tf.Tensor,
                         chain: HMCResult, baseline: tf.Tensor,
                         precision: str = "float32") -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Both VCD surrogate losses of a batch, each summed over it, and g(zT).

        encoder_loss   ``encoder_surrogate_loss`` (pathwise, g and score-function terms)
        decoder_loss = -sum_n log p(x | zT)

    Args:
      x [B, 784]; loc, scale [B, D] and z0 = loc + scale * eps [B, D], differentiable.
      chain: the HMC chain run from z0 on log p(x, .); its end is zT, and its first evaluation
        gives log p(x, z0) and the gradient at z0.
      baseline: the control variate b [B].
      precision: the decoder's multiplies (``model.matmul``).
    Returns (encoder_loss, decoder_loss, g) with g = g(zT) [B] stopped. Take the encoder loss's
    gradient with respect to the encoder's variables only and the decoder loss's with respect
    to the decoder's: each loss updates its own group.
    """
    zT = tf.stop_gradient(chain.final_state)
    # One decoder pass at zT serves both g (stopped) and the decoder loss (differentiated).
    log_likelihood_zT = bernoulli_log_likelihood(x, model.decoder(zT, precision))
    log_joint_zT = log_likelihood_zT + standard_normal_log_prob(zT)
    encoder_loss, g = encoder_surrogate_loss(loc, scale, z0, zT, chain.initial_log_prob, chain.initial_gradient,
                                             log_joint_zT, baseline)
    return encoder_loss, -tf.reduce_sum(log_likelihood_zT), g


def hoffman_surrogate_losses(model: VAE, x: tf.Tensor, loc: tf.Tensor, scale: tf.Tensor, z0: tf.Tensor,
                             chain: HMCResult, precision: str = "float32") -> tuple[tf.Tensor, tf.Tensor]:
    """Hoffman (2017)'s two losses of a batch, each summed over it. The decoder learns as in VCD,
    from the end zT of the HMC chain run from the encoder's draw z0; the encoder learns as in the
    plain VAE, by the ELBO at z0:

        encoder_loss = -sum_n [ log p(x, z0) - log q0(z0 | x) ]    through z0, loc and scale
        decoder_loss = -sum_n log p(x | zT)

    Args:
      x [B, 784]; loc, scale [B, D] and z0 = loc + scale * eps [B, D], differentiable.
      chain: the HMC chain run from z0 on log p(x, .); its first evaluation gives log p(x, z0) and
        its gradient at z0 (``pathwise_log_joint``: no decoder pass at z0).
      precision: the decoder's multiplies (``model.matmul``).
    Returns (encoder_loss, decoder_loss). Take the encoder loss's gradient with respect to the
    encoder's variables only and the decoder loss's with respect to the decoder's. No score
    function, so no control variate.
    """
    log_joint_z0 = pathwise_log_joint(z0, chain.initial_log_prob, chain.initial_gradient)
    encoder_loss = -tf.reduce_sum(log_joint_z0 - posterior_distribution(loc, scale).log_prob(z0))
    zT = tf.stop_gradient(chain.final_state)
    return encoder_loss, -tf.reduce_sum(bernoulli_log_likelihood(x, model.decoder(zT, precision)))


class VCDTerms(NamedTuple):
    """The VCD divergence of a batch, split per example into its two parts (book/algorithm.md):

        gain       = log p(x, zT) - log p(x, z0)                          [B], the chain's climb
        scale_term = 1/2 sum_d ((zT_d - mu_d) / sigma_d)^2 - D/2         [B]

    Their sum's mean over the batch is a one-sample-per-example estimate of L_VCD
    (``divergence``): -E_q0[log p(x, z0)] - D/2 + E_qT[g(zT)] with the terms regrouped.
    """

    gain: tf.Tensor
    scale_term: tf.Tensor

    @property
    def divergence(self) -> tf.Tensor:
        """gain + scale_term [B]: each example's estimate of L_VCD."""
        return self.gain + self.scale_term


def vcd_divergence_terms(loc: tf.Tensor, scale: tf.Tensor, log_joint_z0: tf.Tensor, zT: tf.Tensor,
                         log_joint_zT: tf.Tensor) -> VCDTerms:
    """The two parts of L_VCD (``VCDTerms``) from a chain's start and end.

    loc, scale [B, D] (the q0 that z0 was drawn from); log_joint_z0 [B] = log p(x, z0); zT [B, D],
    the chain's end; log_joint_zT [B] = log p(x, zT). Raises ValueError when zT is not [B, D].
    """
    zT = tf.convert_to_tensor(zT)
    if zT.shape.rank != 2:
        raise ValueError(f"zT has shape {zT.shape}: expected [batch, latent dims]")
    dims = tf.cast(tf.shape(zT)[-1], zT.dtype)
    return VCDTerms(gain=log_joint_zT - log_joint_z0,
                    scale_term=half_standardised_square(zT, loc, scale) - 0.5 * dims)


def sample_vcd_divergence_terms(target_log_prob_fn: Callable[[tf.Tensor], tf.Tensor], loc: tf.Tensor,
                                scale: tf.Tensor, noise: tf.Tensor, step_size: float | tf.Tensor, *,
                                num_iterations: int, num_leapfrog_steps: int, seed: tf.Tensor,
                                adapt_step_size: bool = True) -> VCDTerms:
    """Draw z0 = loc + scale * noise, run ``hmc.hmc_chain`` on ``target_log_prob_fn`` to zT and
    return ``vcd_divergence_terms`` of the pair: how VCD's objective reads a q0 (no gradients).

    target_log_prob_fn: z [B, D] -> [B] (log p(x, z) of a batch of images, or a toy's log pi);
    loc, scale, noise [B, D]; step_size the chain's initial one; the rest as ``hmc_chain``.
    """
    z0 = tf.stop_gradient(loc + scale * noise)
    chain = hmc_chain(target_log_prob_fn, z0, step_size, num_iterations=num_iterations,
                      num_leapfrog_steps=num_leapfrog_steps, seed=seed, adapt_step_size=adapt_step_size)
    return vcd_divergence_terms(tf.stop_gradient(loc), tf.stop_gradient(scale), chain.initial_log_prob,
                                chain.final_state, chain.final_log_prob)


class GaussianFit(NamedTuple):
    """A diagonal Gaussian q0 fitted to a target: loc, scale [D] at the end; history: loc and
    scale after every step, [num_steps, D] each; step_size: the chain's adapted h at the end
    (VCD only; the initial one for the ELBO)."""

    loc: np.ndarray
    scale: np.ndarray
    loc_history: np.ndarray
    scale_history: np.ndarray
    step_size: float


FIT_OBJECTIVES = ("elbo", "vcd")


def fit_diagonal_gaussian(target_log_prob_fn: Callable[[tf.Tensor], tf.Tensor], initial_loc: Sequence[float],
                          initial_scale: Sequence[float], *, objective: str, num_steps: int, batch_size: int = 100,
                          learning_rate: float = 0.05, num_iterations: int = 8, num_leapfrog_steps: int = 5,
                          step_size: float = 0.1, seed: int = 0) -> GaussianFit:
    """Fit q0 = N(loc, diag scale^2), loc and log scale trainable, to a target log pi [B, D] -> [B]
    by one of the package's estimators, with Adam and ``batch_size`` samples per step:

    - ``"elbo"``: maximise ``reparameterised_elbo`` (minimises KL(q0 || pi));
    - ``"vcd"``: minimise ``encoder_surrogate_loss`` with a global control variate
      (``ControlVariate``, kind ``global``), the chain being ``hmc_chain`` (``num_iterations``
      iterations of ``num_leapfrog_steps`` leapfrog steps, h adapted and carried over steps).

    Raises ValueError for an unknown objective, non-positive counts, learning rate or step size,
    or locs and scales of different lengths or non-positive scales.
    """
    check_one_of("objective", objective, FIT_OBJECTIVES)
    for name, count in (("num_steps", num_steps), ("batch_size", batch_size), ("num_iterations", num_iterations),
                        ("num_leapfrog_steps", num_leapfrog_steps)):
        check_positive_int(name, count)
    check_positive_number("learning_rate", learning_rate)
    check_positive_number("step_size", step_size)
    initial_loc = np.asarray(initial_loc, np.float32)
    initial_scale = np.asarray(initial_scale, np.float32)
    if initial_loc.ndim != 1 or initial_loc.shape != initial_scale.shape:
        raise ValueError(f"initial_loc {initial_loc.shape} and initial_scale {initial_scale.shape} are invalid: "
                         f"must be vectors of one length D")
    if not np.all(initial_scale > 0):
        raise ValueError(f"initial_scale={initial_scale.tolist()} is invalid: every scale must be positive")

    dims = initial_loc.shape[0]
    loc = tf.Variable(initial_loc)
    log_scale = tf.Variable(np.log(initial_scale))
    optimizer = tf.keras.optimizers.Adam(learning_rate)
    chain_step_size = tf.Variable(float(step_size))
    baseline = ControlVariate(ControlVariateConfig(kind="global"), num_examples=1)
    index = tf.zeros([batch_size], tf.int32)
    seeds = split_seed(salted_seed(seed, "fit_diagonal_gaussian"), num_steps)

    @tf.function
    def train_step(step):
        noise_seed, chain_seed = tf.unstack(split_seed(seeds[step], 2))
        noise = tf.random.stateless_normal([batch_size, dims], seed=noise_seed)
        with tf.GradientTape() as tape:
            scale = tf.broadcast_to(tf.exp(log_scale), [batch_size, dims])
            locs = tf.broadcast_to(loc, [batch_size, dims])
            if objective == "elbo":
                loss = -tf.reduce_mean(reparameterised_elbo(target_log_prob_fn, locs, scale, noise))
            else:
                z0 = locs + scale * noise
                chain = hmc_chain(target_log_prob_fn, z0, chain_step_size, num_iterations=num_iterations,
                                  num_leapfrog_steps=num_leapfrog_steps, seed=chain_seed)
                b = baseline.values(index, step)
                summed, g = encoder_surrogate_loss(locs, scale, z0, chain.final_state, chain.initial_log_prob,
                                                   chain.initial_gradient, chain.final_log_prob, b)
                loss = summed / batch_size
        gradients = tape.gradient(loss, [loc, log_scale])
        optimizer.apply_gradients(zip(gradients, [loc, log_scale]))
        if objective == "vcd":
            baseline.update(index, g, step)
            chain_step_size.assign(chain.step_size)
        return loc.read_value(), tf.exp(log_scale)

    locs, scales = [], []
    for step in range(num_steps):
        new_loc, new_scale = train_step(tf.constant(step))
        locs.append(new_loc.numpy())
        scales.append(new_scale.numpy())
    return GaussianFit(loc=locs[-1], scale=scales[-1], loc_history=np.array(locs), scale_history=np.array(scales),
                       step_size=float(chain_step_size.numpy()))

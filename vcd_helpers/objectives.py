"""Training objectives: the reparameterised ELBO of the plain VAE, and the VCD surrogate losses.

Shapes: x [batch, 784]; per-example objectives [batch]. Losses are *summed* over the batch, as
in the reference code, so learning rates are per-example rates.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.hmc import HMCResult
from vcd_helpers.model import VAE, bernoulli_log_likelihood, standard_normal_log_prob

tfd = tfp.distributions


def posterior_distribution(loc: tf.Tensor, scale: tf.Tensor) -> tfd.Distribution:
    """q0(z | x) = N(loc, diag(scale^2)) with the latent dimension as the event: [batch] batch shape."""
    return tfd.Independent(tfd.Normal(loc, scale), reinterpreted_batch_ndims=1)


def elbo(model: VAE, x: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """One-sample reparameterised ELBO per example: log p(x, z) - log q(z | x), z = loc + scale * eps.

    x [batch, 784] -> [batch]. Gradients flow to encoder and decoder through z.
    """
    loc, scale = model.encoder(x)
    z = loc + scale * tf.random.stateless_normal(tf.shape(loc), seed=seed)
    return model.log_joint(x, z) - posterior_distribution(loc, scale).log_prob(z)


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
    rule, d/dtheta of -log p(x, z0(theta)) is -grad_z0 . dz0/dtheta, so the term is written as
    -(log p(x, z0) + grad_z0 . (z0 - stop(z0))), whose value is -log p(x, z0) and whose gradient
    is exactly that. No second decoder pass at z0 is needed.

    Args:
      loc, scale: the encoder's outputs [B, D], differentiable.
      z0: loc + scale * eps [B, D], differentiable; zT: the chain's end [B, D].
      log_joint_z0 [B], grad_z0 [B, D]: log p(x, z0) and its gradient with respect to z0.
      log_joint_zT [B]: log p(x, zT). baseline [B]: the control variate b.
    Returns (encoder_loss, g) with g = g(zT) [B] stopped, for the control variate.
    """
    zT = tf.stop_gradient(zT)
    g = tf.stop_gradient(log_joint_zT) + 0.5 * tf.reduce_sum(tf.square((zT - loc) / scale), axis=-1)
    log_q0 = posterior_distribution(loc, scale).log_prob(tf.stop_gradient(z0))
    score = tf.stop_gradient(g - baseline) * log_q0
    pathwise = -(tf.stop_gradient(log_joint_z0)
                 + tf.reduce_sum(tf.stop_gradient(grad_z0) * (z0 - tf.stop_gradient(z0)), axis=-1))
    return tf.reduce_sum(pathwise + g + score), tf.stop_gradient(g)


def vcd_surrogate_losses(model: VAE, x: tf.Tensor, loc: tf.Tensor, scale: tf.Tensor, z0: tf.Tensor,
                         chain: HMCResult, baseline: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Both VCD surrogate losses of a batch, each summed over it, and g(zT).

        encoder_loss   ``encoder_surrogate_loss`` (pathwise, g and score-function terms)
        decoder_loss = -sum_n log p(x | zT)

    Args:
      x [B, 784]; loc, scale [B, D] and z0 = loc + scale * eps [B, D], differentiable.
      chain: the HMC chain run from z0 on log p(x, .); its end is zT, and its first evaluation
        gives log p(x, z0) and the gradient at z0.
      baseline: the control variate b [B].
    Returns (encoder_loss, decoder_loss, g) with g = g(zT) [B] stopped. Take the encoder loss's
    gradient with respect to the encoder's variables only and the decoder loss's with respect
    to the decoder's: each loss updates its own group.
    """
    zT = tf.stop_gradient(chain.final_state)
    # One decoder pass at zT serves both g (stopped) and the decoder loss (differentiated).
    log_likelihood_zT = bernoulli_log_likelihood(x, model.decoder(zT))
    log_joint_zT = log_likelihood_zT + standard_normal_log_prob(zT)
    encoder_loss, g = encoder_surrogate_loss(loc, scale, z0, zT, chain.initial_log_prob, chain.initial_gradient,
                                             log_joint_zT, baseline)
    return encoder_loss, -tf.reduce_sum(log_likelihood_zT), g

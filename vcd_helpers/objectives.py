"""Training objectives: the reparameterised ELBO of the plain VAE, and the VCD surrogate losses.

Shapes: x [batch, 784]; per-example objectives [batch]. Losses are *summed* over the batch, as
in the reference code, so learning rates are per-example rates.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_probability as tfp

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


def vcd_surrogate_losses(model: VAE, x: tf.Tensor, loc: tf.Tensor, scale: tf.Tensor, z0: tf.Tensor,
                         zT: tf.Tensor, baseline: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The VCD surrogate losses, each summed over the batch (../shared/design/vcd-algorithm.md).

        g(z; mu, sigma) = log p(x, z) + 1/2 sum_d ((z_d - mu_d) / sigma_d)^2
        encoder_loss = sum_n [ -log p(x, z0)                               pathwise, through z0
                               + g(zT; mu, sigma)                          through mu, sigma only
                               + stop(g(zT) - b) * log q0(stop(z0))  ]     score function
        decoder_loss = -sum_n log p(x | zT)

    Args:
      loc, scale: the encoder's outputs [B, D], differentiable.
      z0: loc + scale * eps [B, D], differentiable; zT: the HMC chain's end [B, D].
      baseline: the control variate b [B].
    Returns (encoder_loss, decoder_loss, g) with g = g(zT) [B] stopped, for the control variate.
    Take the encoder loss's gradient with respect to the encoder's variables only and the
    decoder loss's with respect to the decoder's: each loss updates its own group.
    """
    zT = tf.stop_gradient(zT)
    quadratic = 0.5 * tf.reduce_sum(tf.square((zT - loc) / scale), axis=-1)
    # One decoder pass at zT serves both g (stopped) and the decoder loss (differentiated).
    log_likelihood_zT = bernoulli_log_likelihood(x, model.decoder(zT))
    g = tf.stop_gradient(log_likelihood_zT + standard_normal_log_prob(zT)) + quadratic
    log_q0 = posterior_distribution(loc, scale).log_prob(tf.stop_gradient(z0))
    score_weight = tf.stop_gradient(g - baseline)
    encoder_loss = tf.reduce_sum(-model.log_joint(x, z0) + g + score_weight * log_q0)
    decoder_loss = -tf.reduce_sum(log_likelihood_zT)
    return encoder_loss, decoder_loss, tf.stop_gradient(g)

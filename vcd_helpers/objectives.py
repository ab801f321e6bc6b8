"""Training objectives: the reparameterised ELBO of the plain VAE.

Shapes: x [batch, 784]; per-example objectives [batch]. Losses are *summed* over the batch, as
in the reference code, so learning rates are per-example rates.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.model import VAE

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

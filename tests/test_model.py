"""vcd_helpers.model and objectives: architecture, initialisation, log joint, ELBO."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.model import VAE, count_parameters
from vcd_helpers.objectives import elbo

tfd = tfp.distributions


def test_parameter_count_matches_the_paper():
    assert count_parameters(VAE(seed=0)) == 598_404


def test_groups_partition_the_parameters():
    model = VAE(seed=0)
    groups = model.parameter_groups()
    assert sum(sum(int(tf.size(v)) for v in g) for g in groups.values()) == 598_404
    assert {len(g) for g in groups.values()} == {6}


def test_initialisation_follows_the_reference():
    model = VAE(seed=1)
    w_hidden = model.encoder.mean_net.weights[0].numpy()
    w_out = model.decoder.net.weights[2].numpy()
    assert abs(w_hidden.std() - 1 / np.sqrt(200)) < 0.002 and abs(w_hidden.mean()) < 0.002
    assert abs(w_out.std() - 1.0) < 0.01
    np.testing.assert_array_equal(VAE(seed=1).decoder.net.biases[0], model.decoder.net.biases[0])
    assert not np.array_equal(VAE(seed=2).decoder.net.biases[0], model.decoder.net.biases[0])


def test_encoder_shapes_and_scale_floor():
    model = VAE(seed=0)
    x = tf.cast(tf.random.stateless_uniform([7, 784], seed=[1, 2]) < 0.2, tf.float32)
    loc, scale = model.encoder(x)
    assert loc.shape == scale.shape == (7, 10)
    assert float(tf.reduce_min(scale)) >= 1e-4


def test_log_joint_matches_tfp_distributions_and_broadcasts():
    model = VAE(seed=0)
    x = tf.cast(tf.random.stateless_uniform([5, 784], seed=[3, 4]) < 0.3, tf.float32)
    z = tf.random.stateless_normal([5, 10], seed=[5, 6])
    expected = (tfd.Independent(tfd.Bernoulli(logits=model.decoder(z)), 1).log_prob(x)
                + tfd.MultivariateNormalDiag(tf.zeros(10)).log_prob(z))
    np.testing.assert_allclose(model.log_joint(x, z), expected, rtol=1e-5)
    z_samples = tf.random.stateless_normal([3, 5, 10], seed=[7, 8])
    stacked = model.log_joint(x, z_samples)
    assert stacked.shape == (3, 5)
    np.testing.assert_allclose(stacked[1], model.log_joint(x, z_samples[1]), rtol=1e-5)


def test_elbo_is_finite_and_differentiable():
    model = VAE(seed=0)
    x = tf.cast(tf.random.stateless_uniform([4, 784], seed=[1, 1]) < 0.2, tf.float32)
    with tf.GradientTape() as tape:
        value = elbo(model, x, seed=tf.constant([0, 1]))
    assert value.shape == (4,) and np.all(np.isfinite(value))
    grads = tape.gradient(value, model.trainable_variables)
    assert all(g is not None for g in grads)

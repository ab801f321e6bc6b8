"""vcd_helpers.model and objectives: architecture, initialisation, log joint, ELBO."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.model import VAE, count_parameters, matmul
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


def test_only_an_mlps_last_layer_draws_from_a_unit_normal_whatever_its_depth():
    # Hidden layers N(0, 1 / sizes[1]) (the first hidden width), the output layer N(0, 1), for any number
    # of layers and widths (the VAE's networks have three layers and one hidden width).
    from vcd_helpers.model import MLP

    for sizes in ([20, 400, 100], [20, 400, 400, 400, 400]):
        stds = [float(np.std(w.numpy())) for w in MLP(sizes, seed=0).weights]
        np.testing.assert_allclose(stds[:-1], 1 / np.sqrt(sizes[1]), rtol=0.05)
        np.testing.assert_allclose(stds[-1], 1.0, rtol=0.05)


def test_every_weight_and_bias_is_a_draw_of_its_own():
    # Stateless draws from one seed share their leading values whatever the shape, so a seed used
    # twice shows as two variables whose first values are proportional (e.g. a bias equal to the first
    # row of its weight). Each of the 18 variables must have a seed of its own.
    heads = [v.numpy().ravel()[:8] for v in VAE(seed=0).trainable_variables]
    heads = [h / np.linalg.norm(h) for h in heads]
    for i in range(len(heads)):
        for j in range(i):
            assert abs(float(heads[i] @ heads[j])) < 0.99, (i, j)


def test_the_networks_are_relu_layers_with_a_linear_last_layer():
    # The last layer has no ReLU: the encoder mean and the decoder's logits take both signs.
    from vcd_helpers.model import MLP

    mlp = MLP([5, 4, 4, 3], seed=3)
    x = tf.random.stateless_normal([6, 5], seed=[4, 4])
    h = x
    for k, (w, b) in enumerate(zip(mlp.weights, mlp.biases)):
        h = h @ w + b
        h = tf.nn.relu(h) if k < 2 else h
    np.testing.assert_allclose(mlp(x), h, rtol=1e-5, atol=1e-6)
    assert float(tf.reduce_min(h)) < 0


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


def _bf16(t: tf.Tensor) -> np.ndarray:
    return tf.cast(tf.cast(t, tf.bfloat16), tf.float32).numpy()


@pytest.mark.parametrize("jit_compile", [False, True])
def test_bfloat16_multiplies_round_operands_and_product_but_sum_in_float32(jit_compile):
    a = tf.random.stateless_normal([64, 200], seed=[1, 2])
    b = tf.random.stateless_normal([200, 784], seed=[3, 4])

    @tf.function(jit_compile=jit_compile)
    def product(a, b):
        return matmul(a, b, "bfloat16")

    out = product(a, b).numpy()
    # The exact product of the rounded operands, summed in float64, then rounded once to bfloat16:
    # a sum in bfloat16 over 200 terms would be off by many of its units in the last place.
    exact = _bf16(a).astype(np.float64) @ _bf16(b).astype(np.float64)
    ulp = np.abs(_bf16(tf.constant(exact, tf.float32))) * 2.0 ** -7
    assert out.dtype == np.float32
    assert np.all(np.abs(out - exact) <= ulp + 1e-6)
    assert np.max(np.abs(out - exact) / (np.abs(exact) + 1e-3)) > 1e-4  # the product was rounded: not float32
    np.testing.assert_allclose(matmul(a, b), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-3)  # by default: float32


def test_the_precision_reaches_every_network_and_bad_values_are_named():
    model = VAE(seed=0)
    x = tf.cast(tf.random.stateless_uniform([4, 784], seed=[1, 1]) < 0.2, tf.float32)
    z = tf.random.stateless_normal([4, 10], seed=[2, 2])
    full = model.log_joint(x, z)
    with tf.GradientTape() as tape:
        tape.watch(z)
        reduced = model.log_joint(x, z, "bfloat16")
    grad = tape.gradient(reduced, z)
    assert reduced.dtype == grad.dtype == tf.float32 and np.all(np.isfinite(grad))
    assert 0 < np.max(np.abs(reduced - full)) < 0.02 * np.max(np.abs(full))
    np.testing.assert_array_equal(model.log_joint(x, z, "float32"), full)
    # Both of the encoder's networks multiply in the precision they are given.
    for full_part, reduced_part in zip(model.encoder(x), model.encoder(x, "bfloat16")):
        assert 0 < np.max(np.abs(reduced_part - full_part)) < 0.05 * np.max(np.abs(full_part)) + 0.05
    with pytest.raises(ValueError, match="precision='float16' is invalid: must be one of float32, bfloat16"):
        model.log_joint(x, z, "float16")


def test_vae_devices_takes_encoder_and_decoder_and_refuses_any_other_key():
    from vcd_helpers.config import ModelConfig

    config = ModelConfig(hidden_units=8, latent_dim=2)
    placed = VAE(config, devices={"encoder": "/CPU:0", "decoder": "/CPU:0"})
    assert placed.decoder.net.weights[0].device.endswith("CPU:0")
    with pytest.raises(ValueError, match=r"devices has keys \['gpu'\]"):
        VAE(config, devices={"encoder": "/CPU:0", "gpu": "/CPU:0"})


def test_an_mlp_of_one_size_has_no_layer_and_is_the_identity():
    from vcd_helpers.model import MLP

    x = tf.reshape(tf.range(6.0), [2, 3])
    mlp = MLP([3], seed=0)
    assert mlp.weights == [] and mlp.biases == []
    np.testing.assert_array_equal(mlp(x), x)
    assert MLP([3, 0], seed=0)(x).shape == (2, 0)  # one layer, no hidden width used, even of width 0

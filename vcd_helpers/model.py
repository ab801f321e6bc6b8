"""The VAE of the VCD paper: a Gaussian encoder with separate mean and scale networks, a
Bernoulli decoder, a standard normal prior, and the batched log joint log p(x, z).

Shapes: x [batch, 784] in {0, 1}; z [..., batch, latent] (leading sample dimensions broadcast).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import tensorflow as tf

from vcd_helpers.config import NUM_PIXELS, PRECISIONS, ModelConfig, check_one_of
from vcd_helpers.seeds import SeedLike, split_seed


def matmul(a: tf.Tensor, b: tf.Tensor, precision: str = "float32") -> tf.Tensor:
    """a [m, k] @ b [k, n] -> float32 [m, n], with operands in ``precision``.

    'bfloat16': both operands are rounded to bfloat16 and multiplied by the backend's bfloat16
    kernel, which sums the products in float32; the product is rounded to bfloat16 and widened
    back to float32. The multiplies of the gradients run the same way (the tape differentiates the
    casts). Raises ValueError for a precision outside ``config.PRECISIONS``.
    """
    check_one_of("precision", precision, PRECISIONS)
    if precision == a.dtype.name:
        return tf.linalg.matmul(a, b)
    return tf.cast(tf.linalg.matmul(tf.cast(a, precision), tf.cast(b, precision)), a.dtype)


class MLP(tf.Module):
    """Dense layers with ReLU between them and a linear last layer.

    Initialisation of the reference code: hidden layers draw W and b from N(0, 1/hidden_units);
    the output layer draws W and b from N(0, 1).
    """

    def __init__(self, sizes: Sequence[int], seed: SeedLike, name: str | None = None):
        super().__init__(name=name)
        hidden_std = 1.0 / math.sqrt(sizes[1]) if len(sizes) > 2 else 1.0
        layer_seeds = split_seed(seed, 2 * (len(sizes) - 1))
        self.weights, self.biases = [], []
        for k, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            std = 1.0 if k == len(sizes) - 2 else hidden_std
            self.weights.append(tf.Variable(
                std * tf.random.stateless_normal([fan_in, fan_out], seed=layer_seeds[2 * k]), name=f"w{k}"))
            self.biases.append(tf.Variable(
                std * tf.random.stateless_normal([fan_out], seed=layer_seeds[2 * k + 1]), name=f"b{k}"))

    def __call__(self, inputs: tf.Tensor, precision: str = "float32") -> tf.Tensor:
        """inputs [..., sizes[0]] -> outputs [..., sizes[-1]]; the multiplies in ``precision`` (``matmul``)."""
        # Leading sample dimensions are folded into one batch so every layer is a single 2-D matmul.
        leading = tf.shape(inputs)[:-1]
        h = tf.reshape(inputs, [-1, inputs.shape[-1]])
        last = len(self.weights) - 1
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = matmul(h, w, precision) + b
            if k < last:
                h = tf.nn.relu(h)
        return tf.reshape(h, tf.concat([leading, tf.shape(h)[-1:]], axis=0))


class Encoder(tf.Module):
    """q0(z | x) = N(loc, diag(scale^2)), with separate mean and scale networks.

    scale = min_scale + softplus(a - min_scale): positive, smooth, and never an exponential,
    which keeps early training from producing huge scales.
    """

    def __init__(self, config: ModelConfig, seed: SeedLike):
        super().__init__(name="encoder")
        sizes = [NUM_PIXELS, config.hidden_units, config.hidden_units, config.latent_dim]
        mean_seed, scale_seed = split_seed(seed, 2)
        self.mean_net = MLP(sizes, mean_seed, name="mean_net")
        self.scale_net = MLP(sizes, scale_seed, name="scale_net")
        self.min_scale = config.min_scale

    def __call__(self, x: tf.Tensor, precision: str = "float32") -> tuple[tf.Tensor, tf.Tensor]:
        """x [batch, 784] -> (loc, scale), each [batch, latent]."""
        loc = self.mean_net(x, precision)
        scale = self.min_scale + tf.nn.softplus(self.scale_net(x, precision) - self.min_scale)
        return loc, scale


class Decoder(tf.Module):
    """p(x | z): independent Bernoulli pixels whose logits come from a 10-200-200-784 MLP."""

    def __init__(self, config: ModelConfig, seed: SeedLike):
        super().__init__(name="decoder")
        self.net = MLP([config.latent_dim, config.hidden_units, config.hidden_units, NUM_PIXELS], seed, name="net")

    def __call__(self, z: tf.Tensor, precision: str = "float32") -> tf.Tensor:
        """z [..., latent] -> Bernoulli logits [..., 784]."""
        return self.net(z, precision)


def bernoulli_log_likelihood(x: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """log p(x | logits) summed over pixels: x [..., 784], logits [..., 784] -> [...].

    x * logits - softplus(logits) is log sigmoid(logits) for x = 1 and log sigmoid(-logits) for
    x = 0, computed stably, and it broadcasts x against leading sample dimensions of logits.
    """
    return tf.reduce_sum(x * logits - tf.nn.softplus(logits), axis=-1)


def standard_normal_log_prob(z: tf.Tensor) -> tf.Tensor:
    """log N(z; 0, I): z [..., latent] -> [...]."""
    dim = tf.cast(tf.shape(z)[-1], z.dtype)
    return -0.5 * tf.reduce_sum(tf.square(z), axis=-1) - 0.5 * dim * math.log(2.0 * math.pi)


class VAE(tf.Module):
    """Encoder, decoder and prior N(0, I). Parameters come in three groups, each with its own
    learning rate: ``encoder_mean``, ``encoder_scale`` and ``decoder``.

    The networks' calls and ``log_joint`` take a ``precision`` for their multiplies: float32 by
    default (evaluation never passes another), ``config.precision`` in the training steps. Biases,
    activations, likelihoods and the weights stay float32 either way."""

    def __init__(self, config: ModelConfig | None = None, seed: SeedLike = 0, *,
                 devices: Mapping[str, str] | None = None):
        """``devices`` optionally places the 'encoder' and 'decoder' variables (device names);
        the initial values do not depend on it."""
        super().__init__(name="vae")
        self.config = config or ModelConfig()
        devices = dict(devices or {})
        unknown = set(devices) - {"encoder", "decoder"}
        if unknown:
            raise ValueError(f"devices has keys {sorted(unknown)}: allowed keys are 'encoder' and 'decoder'")
        encoder_seed, decoder_seed = split_seed(seed, 2)
        with tf.device(devices.get("encoder")):
            self.encoder = Encoder(self.config, encoder_seed)
        with tf.device(devices.get("decoder")):
            self.decoder = Decoder(self.config, decoder_seed)

    def log_joint(self, x: tf.Tensor, z: tf.Tensor, precision: str = "float32") -> tf.Tensor:
        """log p(x, z) = log p(x | z) + log p(z): x [batch, 784], z [..., batch, latent] -> [..., batch].
        ``precision``: the decoder's multiplies (``matmul``)."""
        return bernoulli_log_likelihood(x, self.decoder(z, precision)) + standard_normal_log_prob(z)

    def parameter_groups(self) -> dict[str, tuple[tf.Variable, ...]]:
        """The trainable variables of each group, in a fixed order."""
        return {
            "encoder_mean": self.encoder.mean_net.trainable_variables,
            "encoder_scale": self.encoder.scale_net.trainable_variables,
            "decoder": self.decoder.trainable_variables,
        }


def count_parameters(module: tf.Module) -> int:
    """Number of scalar trainable parameters in ``module``."""
    return sum(int(tf.size(v)) for v in module.trainable_variables)

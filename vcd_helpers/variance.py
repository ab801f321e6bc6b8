"""VCD's gradient estimator at fixed parameters: its variance (chapter 5's measure of a control
variate) and the terms of the g its score-function term weighs (chapter 8's local baselines)."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

from vcd_helpers.objectives import half_standardised_square
from vcd_helpers.seeds import fold_in, salted_seed, split_seed
from vcd_helpers.training import VCDTrainer


def _gradient_draws(trainer: VCDTrainer, groups: tuple[str, ...]) -> Callable[..., dict[str, list[tf.Tensor]]]:
    """A compiled (x, baseline, seed) -> {group: flattened gradients}: the trainer's
    ``draw_gradients``, which it holds and traces once per groups (a chapter comparing baselines
    calls estimator_variance again and again on one trainer; x and the baseline are arguments)."""
    return functools.partial(trainer.draw_gradients, groups=groups)


def estimator_variance(trainer: VCDTrainer, x: tf.Tensor, baseline: tf.Tensor, *, num_draws: int,
                       seed: int = 0, groups: tuple[str, ...] = ("encoder_mean", "encoder_scale")) -> dict[str, float]:
    """Total variance (trace of the covariance) of VCD's gradient estimate at fixed parameters.

    Draws the estimator ``num_draws`` times on the batch x [B, 784] with the given baseline [B]
    and independent seeds (draw k: ``fold_in(salted_seed(seed, "estimator_variance"), k)``), and
    returns, per parameter group, the sum over its parameters of the variance across draws.
    Changes no state.
    """
    if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 2:
        raise ValueError(f"num_draws={num_draws!r} is invalid: a variance needs an integer >= 2")
    draw = _gradient_draws(trainer, groups)
    sums = {name: 0.0 for name in groups}
    squares = {name: 0.0 for name in groups}
    x, baseline = tf.convert_to_tensor(x, tf.float32), tf.convert_to_tensor(baseline, tf.float32)
    root = salted_seed(seed, "estimator_variance")
    for k in range(num_draws):
        gradients = draw(x, baseline, fold_in(root, k))
        for name in groups:
            flat = tf.concat(gradients[name], axis=0).numpy().astype(np.float64)
            sums[name] = sums[name] + flat
            squares[name] = squares[name] + flat ** 2
    variance = {}
    for name in groups:
        mean = sums[name] / num_draws
        variance[name] = float(np.sum(squares[name] / num_draws - mean ** 2) * num_draws / (num_draws - 1))
    return variance


class GTerms(NamedTuple):
    """g(zT) = log p(x, zT) + 1/2 sum_d ((zT_d - mu_d) / sigma_d)^2 split in its two terms, per
    example, with the baseline b the step subtracts from it and the encoder's scales."""

    log_joint: tf.Tensor  # log p(x, zT) [B]
    quadratic: tf.Tensor  # 1/2 sum_d ((zT_d - mu_d) / sigma_d)^2 [B]
    baseline: tf.Tensor  # b [B]
    scale: tf.Tensor  # sigma [B, D]

    @property
    def g(self) -> tf.Tensor:
        return self.log_joint + self.quadratic


def g_terms(trainer: VCDTrainer, index: tf.Tensor, x: tf.Tensor, seed: tf.Tensor) -> GTerms:
    """The terms of g on the batch (index [B], rows of the training set; x [B, 784]) for the draws
    of ``seed`` [2], drawn as ``trainer.estimate_gradients(x, b, seed)`` draws them (z0 ~ q0, the
    trainer's chain from it at its current step size), so that their sum is the estimate's g; b
    as the trainer's next step reads it. Changes no state."""
    noise_seed, chain_seed = tf.unstack(split_seed(seed, 2))
    loc, scale = trainer.model.encoder(x, trainer.config.precision)
    z0 = loc + scale * tf.random.stateless_normal(tf.shape(loc), seed=noise_seed)
    zT = trainer.run_chain(x, z0, trainer.step_size, chain_seed).final_state
    return GTerms(trainer.model.log_joint(x, zT, trainer.config.precision), half_standardised_square(zT, loc, scale),
                  trainer.control_variate.values(index, trainer.step), scale)

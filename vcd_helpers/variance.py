"""The variance of VCD's gradient estimator at fixed parameters (chapter 4's measure of a
control variate)."""

from __future__ import annotations

import weakref
from typing import Callable

import numpy as np
import tensorflow as tf

from vcd_helpers.training import VCDTrainer


# One traced draw per (trainer, groups): a chapter comparing baselines calls estimator_variance
# again and again on the same trainer, and x and the baseline are arguments, not captured constants.
_DRAWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _gradient_draws(trainer: VCDTrainer, groups: tuple[str, ...]) -> Callable[..., dict[str, list[tf.Tensor]]]:
    """A compiled (x, baseline, seed) -> {group: flattened gradients}, traced once per trainer."""
    per_trainer = _DRAWS.setdefault(trainer, {})
    if groups not in per_trainer:
        per_trainer[groups] = tf.function(lambda x, baseline, s: {
            name: [tf.reshape(g, [-1]) for g in trainer.estimate_gradients(x, baseline, s).gradients[name]]
            for name in groups})
    return per_trainer[groups]


def estimator_variance(trainer: VCDTrainer, x: tf.Tensor, baseline: tf.Tensor, *, num_draws: int,
                       seed: int = 0, groups: tuple[str, ...] = ("encoder_mean", "encoder_scale")) -> dict[str, float]:
    """Total variance (trace of the covariance) of VCD's gradient estimate at fixed parameters.

    Draws the estimator ``num_draws`` times on the batch x [B, 784] with the given baseline [B]
    and independent seeds, and returns, per parameter group, the sum over its parameters of the
    variance across draws. Changes no state.
    """
    if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 2:
        raise ValueError(f"num_draws={num_draws!r} is invalid: a variance needs an integer >= 2")
    draw = _gradient_draws(trainer, groups)
    sums = {name: 0.0 for name in groups}
    squares = {name: 0.0 for name in groups}
    x, baseline = tf.convert_to_tensor(x, tf.float32), tf.convert_to_tensor(baseline, tf.float32)
    for k in range(num_draws):
        gradients = draw(x, baseline, tf.constant([seed, k], tf.int32))
        for name in groups:
            flat = tf.concat(gradients[name], axis=0).numpy().astype(np.float64)
            sums[name] = sums[name] + flat
            squares[name] = squares[name] + flat ** 2
    variance = {}
    for name in groups:
        mean = sums[name] / num_draws
        variance[name] = float(np.sum(squares[name] / num_draws - mean ** 2) * num_draws / (num_draws - 1))
    return variance

"""The optimiser of the reference code: an RMSProp variant, and its step-decay schedule.

    ms    <- rho * ms + (1 - rho) * g^2          (ms starts at 0.01, not 0)
    theta <- theta - lr(step) * g / (1 + sqrt(ms))
    lr(step) = lr0 * decay_rate ** floor(step / decay_steps)

The "1 +" in the denominator (instead of Keras's epsilon) bounds the effective step by lr*|g|
when gradients are small and shrinks it like RMSProp when they are large. Each parameter group
(encoder mean net, encoder scale net, decoder) has its own instance and learning rate.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from vcd_helpers.config import Config, OptimizerConfig


def step_decay(initial_rate: float, decay_rate: float, decay_steps: int, step: tf.Tensor) -> tf.Tensor:
    """lr0 * decay_rate ** floor(step / decay_steps), as a float32 scalar."""
    exponent = tf.math.floordiv(tf.cast(step, tf.int64), decay_steps)
    return initial_rate * tf.pow(tf.constant(decay_rate, tf.float32), tf.cast(exponent, tf.float32))


class ReferenceRMSProp(tf.Module):
    """RMSProp with ``1 + sqrt(ms)`` in the denominator, for one group of variables."""

    def __init__(self, variables: Sequence[tf.Variable], learning_rate: float, *, decay_steps: int,
                 decay_rate: float = OptimizerConfig.lr_decay_rate, rms_decay: float = OptimizerConfig.rms_decay,
                 initial_mean_square: float = OptimizerConfig.initial_mean_square,
                 slot_device: str | None = None, name: str | None = None):
        super().__init__(name=name)
        self.variables_ = tuple(variables)
        self.learning_rate = learning_rate
        self.decay_steps = decay_steps
        self.decay_rate = decay_rate
        self.rms_decay = rms_decay
        # A slot lives beside its variable unless ``slot_device`` moves every slot elsewhere (the
        # "optimiser offload" of the multi-device chapter: slots on the host, weights on devices).
        self.mean_squares = []
        for v in self.variables_:
            with tf.device(slot_device or v.device):
                self.mean_squares.append(tf.Variable(tf.fill(v.shape, initial_mean_square), trainable=False,
                                                     name="ms"))

    def current_learning_rate(self, step: tf.Tensor) -> tf.Tensor:
        return step_decay(self.learning_rate, self.decay_rate, self.decay_steps, step)

    def apply_gradients(self, gradients: Sequence[tf.Tensor], step: tf.Tensor) -> None:
        """One update of every variable of the group; ``step`` (0-based) sets the learning rate."""
        lr = self.current_learning_rate(step)
        for variable, ms, grad in zip(self.variables_, self.mean_squares, gradients):
            with tf.device(ms.device):
                ms.assign(self.rms_decay * ms + (1.0 - self.rms_decay) * tf.square(grad))
                denominator = 1.0 + tf.sqrt(ms)
            with tf.device(variable.device):
                variable.assign_sub(lr * grad / denominator)


def make_optimizers(groups: dict[str, Sequence[tf.Variable]], config: Config, *,
                    slot_device: str | None = None) -> dict[str, ReferenceRMSProp]:
    """One ReferenceRMSProp per parameter group, with the config's learning rates and schedule.
    ``slot_device``: where the slots live (default: beside each variable)."""
    opt = config.optimizer
    return {
        name: ReferenceRMSProp(variables, config.learning_rates[name], decay_steps=config.lr_decay_steps,
                               decay_rate=opt.lr_decay_rate, rms_decay=opt.rms_decay,
                               initial_mean_square=opt.initial_mean_square, slot_device=slot_device,
                               name=f"rmsprop_{name}")
        for name, variables in groups.items()
    }

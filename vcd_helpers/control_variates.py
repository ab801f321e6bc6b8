"""Control variates (baselines) for VCD's score-function term.

The encoder's score-function term is (g(zT) - b) * grad log q0(z0): subtracting a baseline b
that does not depend on z0 leaves it unbiased and, when b tracks E[g(zT)], cuts its variance.
Kinds, each an exponential moving average with decay 0.9 of g(zT):

- ``none``: b = 0;
- ``global``: one scalar, updated with the batch mean of g(zT);
- ``local``: one value per training example (50,000 floats), updated for the examples in the
  batch, found through the index the data pipeline carries;
- ``scheduled`` (the paper): global for the first ``switch_step`` steps, local afterwards,
  with every local value starting from the global one at the switch.

``values(index, step)`` is read *before* ``update(index, g, step)`` in a training step, so a
step always uses the baseline from before its own update.
"""

from __future__ import annotations

import tensorflow as tf

from vcd_helpers.config import ControlVariateConfig


class ControlVariate(tf.Module):
    """Baseline state and its two operations. Shapes: index [B] int32, g [B] float32."""

    def __init__(self, config: ControlVariateConfig, num_examples: int):
        super().__init__(name="control_variate")
        self.kind = config.kind
        self.decay = config.decay
        self.switch_step = config.switch_step
        # Each state exists only where it is used: O(1) memory for the scalar, O(N) for the vector.
        self.global_value = (tf.Variable(0.0, trainable=False, name="global")
                             if self.kind in ("global", "scheduled") else None)
        self.local_values = (tf.Variable(tf.zeros([num_examples]), trainable=False, name="local")
                             if self.kind in ("local", "scheduled") else None)

    @property
    def state_bytes(self) -> int:
        """Bytes of the baselines' state: 0 (none), 4 (global), 4 N (local), 4 (1 + N) (scheduled)."""
        return sum(int(tf.size(v)) * v.dtype.size for v in self.variables)

    def _uses_local(self, step: tf.Tensor) -> tf.Tensor:
        if self.kind == "local":
            return tf.constant(True)
        if self.kind == "scheduled":
            return tf.cast(step, tf.int64) >= self.switch_step
        return tf.constant(False)

    def values(self, index: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
        """The baseline of each example in the batch: [B]."""
        batch = tf.shape(index)[0]
        if self.kind == "none":
            return tf.zeros([batch])
        if self.global_value is None:
            return tf.gather(self.local_values, index)
        global_values = tf.fill([batch], self.global_value)
        if self.local_values is None:
            return global_values
        return tf.where(self._uses_local(step), tf.gather(self.local_values, index), global_values)

    def update(self, index: tf.Tensor, g: tf.Tensor, step: tf.Tensor) -> None:
        """Move the baseline towards this step's g(zT) values."""
        if self.kind == "none":
            return
        if self.kind == "global" or self.kind == "scheduled":
            new_global = self.decay * self.global_value + (1.0 - self.decay) * tf.reduce_mean(g)
            self.global_value.assign(tf.where(self._uses_local(step), self.global_value, new_global))
        if self.local_values is None:
            return
        old = tf.gather(self.local_values, index)
        updated = self.decay * old + (1.0 - self.decay) * g
        new_local = tf.where(self._uses_local(step), updated, old)
        # scatter_update (not scatter_nd_update) also works on tf.distribute's mirrored variables.
        self.local_values.scatter_update(tf.IndexedSlices(new_local, index))
        if self.kind == "scheduled":
            # Entering the local phase: every example starts from the global value. Filling the
            # vector once at the switch is equivalent to filling it at every global step.
            tf.cond(tf.cast(step, tf.int64) == self.switch_step - 1,
                    lambda: self.local_values.assign(tf.fill(tf.shape(self.local_values), self.global_value)),
                    lambda: self.local_values)

"""Training steps and the host loop that drives them.

A *trainer* owns a model, one optimiser per parameter group and a step counter, and exposes
``train_step(index, x) -> metrics``: one optimiser step on one batch, compiled with
``tf.function`` (optionally XLA). ``fit`` is the plain host loop: it feeds batches from an
indexed dataset to the step and collects per-step metrics, with a progress bar.
"""

from __future__ import annotations

import time
from typing import Iterable, Protocol

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from vcd_helpers.config import Config
from vcd_helpers.model import VAE
from vcd_helpers.objectives import elbo
from vcd_helpers.optim import make_optimizers


class Trainer(Protocol):
    step: tf.Variable

    def train_step(self, index: tf.Tensor, x: tf.Tensor) -> dict[str, tf.Tensor]: ...


class VAETrainer(tf.Module):
    """The plain VAE: maximise the reparameterised ELBO (the loss is minus its batch sum)."""

    def __init__(self, model: VAE, config: Config, *, jit_compile: bool = False):
        super().__init__(name="vae_trainer")
        self.model = model
        self.config = config
        self.optimizers = make_optimizers(model.parameter_groups(), config)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.seed = tf.constant([config.seed, 1], tf.int32)
        self.train_step = tf.function(self._train_step, jit_compile=jit_compile)

    def _train_step(self, index: tf.Tensor, x: tf.Tensor) -> dict[str, tf.Tensor]:
        """index [B] int32 (unused by the VAE), x [B, 784] -> {'loss': mean negative ELBO per example}."""
        del index
        groups = self.model.parameter_groups()
        seed = tf.random.experimental.stateless_fold_in(self.seed, self.step)
        with tf.GradientTape() as tape:
            loss = -tf.reduce_sum(elbo(self.model, x, seed))
        gradients = tape.gradient(loss, groups)
        for name, optimizer in self.optimizers.items():
            optimizer.apply_gradients(gradients[name], self.step)
        self.step.assign_add(1)
        return {"loss": loss / tf.cast(tf.shape(x)[0], loss.dtype)}


def fit(trainer: Trainer, batches: Iterable, num_steps: int, *, progress: bool = True,
        description: str = "training") -> dict[str, np.ndarray]:
    """Run ``num_steps`` training steps from ``batches`` ((index, x) pairs) in a host loop.

    Returns each metric as a [num_steps] numpy array, plus 'step' and 'wall_time' (seconds since
    the first step started). Raises FloatingPointError on a non-finite loss.
    """
    history: dict[str, list] = {"step": [], "wall_time": []}
    iterator = iter(batches)
    start = time.perf_counter()
    bar = tqdm(total=num_steps, desc=description, disable=not progress, mininterval=0.5)
    for _ in range(num_steps):
        index, x = next(iterator)
        metrics = {name: float(value) for name, value in trainer.train_step(index, x).items()}
        step = int(trainer.step.numpy())
        for name, value in metrics.items():
            if not np.isfinite(value):
                bar.close()
                raise FloatingPointError(f"{name} is {value} at step {step}; stopping")
            history.setdefault(name, []).append(value)
        history["step"].append(step)
        history["wall_time"].append(time.perf_counter() - start)
        bar.update(1)
        if step % 50 == 0:
            bar.set_postfix({name: f"{value:.2f}" for name, value in metrics.items()})
    bar.close()
    return {name: np.asarray(values) for name, values in history.items()}

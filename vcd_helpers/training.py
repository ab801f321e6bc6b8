"""Training steps: one optimiser step of each method on one batch.

A *trainer* owns a model, one optimiser per parameter group and a step counter, and exposes
``train_step(index, x) -> metrics``: one optimiser step on one batch, compiled with
``tf.function`` (optionally XLA). ``loops`` runs many such steps per host call; ``variance``
measures VCD's gradient estimator at fixed parameters.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Protocol

import tensorflow as tf

from vcd_helpers.config import Config, ExecutionConfig
from vcd_helpers.control_variates import ControlVariate
from vcd_helpers.devices import compute_threads
from vcd_helpers.hmc import HMCResult, hmc_chain, sharded_target
from vcd_helpers.model import VAE
from vcd_helpers.objectives import elbo, hoffman_surrogate_losses, vcd_surrogate_losses
from vcd_helpers.optim import make_optimizers
from vcd_helpers.seeds import fold_in, split_seed, training_seed


class Trainer(Protocol):
    step: tf.Variable
    metric_names: tuple[str, ...]
    jit_compile: bool  # whether XLA compiles the step (pipelined: its HMC chain)
    steps_per_call: int  # steps ``fit`` runs per host call unless told otherwise (``Config.steps_per_call``)
    chain_shards: int | None  # blocks of the HMC chain's rows (None: no chain)

    def train_step(self, index: tf.Tensor, x: tf.Tensor) -> dict[str, tf.Tensor]: ...

    def checkpoint_objects(self) -> dict[str, tf.Module | tf.Variable]:
        """What the final weights hold, by name: the model and what the next step would read of
        the state carried from step to step (the optimisers' slots and the step are left out)."""
        ...


def chain_blocks(execution: ExecutionConfig) -> int:
    """Blocks of rows VCD's HMC chain is evaluated in: ``execution.chain_shards``, or one per
    compute thread for a plain step, one for a pipelined or replicated step (whose devices
    already run concurrently)."""
    if execution.kind != "plain":
        return 1
    return compute_threads() if execution.chain_shards is None else execution.chain_shards


class VCDEstimate(NamedTuple):
    """One draw of VCD's gradient estimator. gradients: {group: [tensor per variable]};
    encoder_loss, decoder_loss: batch sums; g: g(zT) [B] (None for Hoffman's method, which has
    no control variate); accept_rate, step_size: the chain's."""

    gradients: dict[str, list[tf.Tensor]]
    encoder_loss: tf.Tensor
    decoder_loss: tf.Tensor
    g: tf.Tensor | None
    accept_rate: tf.Tensor
    step_size: tf.Tensor


class VAETrainer(tf.Module):
    """The plain VAE: maximise the reparameterised ELBO (the loss is minus its batch sum)."""

    metric_names = ("loss",)
    chain_shards = None

    def __init__(self, model: VAE, config: Config):
        """``config`` sets XLA (``execution.jit_compile``) and ``steps_per_call``."""
        super().__init__(name="vae_trainer")
        self.model = model
        self.config = config
        self.jit_compile = config.execution.xla
        self.steps_per_call = config.steps_per_call
        self.optimizers = make_optimizers(model.parameter_groups(), config)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.seed = training_seed(config.seed, "vae")
        self.train_step = tf.function(self._train_step, jit_compile=self.jit_compile)

    def _train_step(self, index: tf.Tensor, x: tf.Tensor) -> dict[str, tf.Tensor]:
        """index [B] int32 (unused by the VAE), x [B, 784] -> {'loss': mean negative ELBO per example}."""
        del index
        groups = self.model.parameter_groups()
        seed = fold_in(self.seed, self.step)
        with tf.GradientTape() as tape:
            loss = -tf.reduce_sum(elbo(self.model, x, seed, self.config.precision))
        gradients = tape.gradient(loss, groups)
        for name, optimizer in self.optimizers.items():
            optimizer.apply_gradients(gradients[name], self.step)
        self.step.assign_add(1)
        return {"loss": loss / tf.cast(tf.shape(x)[0], loss.dtype)}

    def checkpoint_objects(self) -> dict[str, tf.Module | tf.Variable]:
        return {"model": self.model}


class ChainTrainer(tf.Module):
    """What VCD and Hoffman's method share: an encoder draw z0, an HMC chain from it to zT (off the
    gradient tape), two losses, one gradient per parameter group.

    A subclass names its ``method`` (its seed stream) and gives ``surrogate_losses``. State that
    persists across steps: the optimisers' slots, the adapted HMC step size and the step counter.
    """

    method: str
    metric_names = ("encoder_loss", "decoder_loss", "accept_rate", "step_size")

    def __init__(self, model: VAE, config: Config):
        """``config.execution`` sets XLA (``jit_compile``), ``steps_per_call`` and the blocks of rows
        the HMC chain's target is evaluated in (``chain_blocks``, ``hmc.sharded_target``), so that
        XLA keeps that many threads busy. They change the speed, not the maths (up to float
        round-off), and are no part of the trainer's state."""
        super().__init__(name=f"{self.method}_trainer")
        execution = config.execution
        self.model = model
        self.config = config
        self.jit_compile = execution.xla
        self.steps_per_call = config.steps_per_call
        self.chain_shards = chain_blocks(execution)
        slot_device = execution.pipeline.slot_device if execution.pipeline else None
        self.optimizers = make_optimizers(model.parameter_groups(), config, slot_device=slot_device)
        self.step_size = tf.Variable(config.hmc.initial_step_size, trainable=False, name="hmc_step_size")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.seed = training_seed(config.seed, self.method)
        self.train_step = tf.function(self._train_step, jit_compile=self.jit_compile)

    def checkpoint_objects(self) -> dict[str, tf.Module | tf.Variable]:
        return {"model": self.model, "step_size": self.step_size}

    def run_chain(self, x: tf.Tensor, z0: tf.Tensor, step_size: tf.Tensor, seed: tf.Tensor) -> HMCResult:
        """The step's HMC chain on log p(x, .) from z0 [B, D], x [B, 784], with the config's settings
        (its multiplies in ``config.precision``)."""
        hmc = self.config.hmc
        log_joint = functools.partial(self.model.log_joint, precision=self.config.precision)
        return hmc_chain(sharded_target(log_joint, x, self.chain_shards), z0, step_size,
                         num_iterations=hmc.num_iterations, seed=seed, **hmc.kernel_arguments())

    def estimate_gradients(self, x: tf.Tensor, baseline: tf.Tensor | None, seed: tf.Tensor) -> VCDEstimate:
        """One draw of the method's gradient estimator, without changing any state.

        x [B, 784]; baseline [B], VCD's control variate b (None for Hoffman's method); seed [2].
        The chain starts from the persistent ``step_size``. Chapter 5 calls this many times at
        fixed parameters to measure the estimator's variance; gradient accumulation calls it once
        per micro-batch. The networks multiply in ``config.precision``.
        """
        groups = self.model.parameter_groups()
        noise_seed, chain_seed = tf.unstack(split_seed(seed, 2))
        with tf.GradientTape(persistent=True) as tape:
            loc, scale = self.model.encoder(x, self.config.precision)
            z0 = loc + scale * tf.random.stateless_normal(tf.shape(loc), seed=noise_seed)
            with tape.stop_recording():  # the chain is not differentiated: keep it off the tape
                chain = self.run_chain(x, z0, self.step_size, chain_seed)
            encoder_loss, decoder_loss, g = self.surrogate_losses(x, loc, scale, z0, chain, baseline)
        encoder_groups = {name: groups[name] for name in ("encoder_mean", "encoder_scale")}
        gradients = tape.gradient(encoder_loss, encoder_groups)
        gradients["decoder"] = tape.gradient(decoder_loss, groups["decoder"])
        del tape
        return VCDEstimate(gradients, encoder_loss, decoder_loss, g, chain.accept_rate, chain.step_size)

    def apply_updates(self, x: tf.Tensor, estimate: VCDEstimate) -> dict[str, tf.Tensor]:
        """Apply the step's gradients, carry the adapted step size, count the step; returns the
        per-example metrics the two methods share."""
        for name, optimizer in self.optimizers.items():
            optimizer.apply_gradients(estimate.gradients[name], self.step)
        self.step_size.assign(estimate.step_size)
        self.step.assign_add(1)
        batch = tf.cast(tf.shape(x)[0], estimate.encoder_loss.dtype)
        return {"encoder_loss": estimate.encoder_loss / batch, "decoder_loss": estimate.decoder_loss / batch,
                "accept_rate": estimate.accept_rate, "step_size": estimate.step_size}


class VCDTrainer(ChainTrainer):
    """VCD: encoder sample z0, an HMC chain to zT, both surrogate losses, group-wise updates, and
    a control variate carried from step to step (``ControlVariate``)."""

    method = "vcd"
    metric_names = (*ChainTrainer.metric_names, "control_variate")

    def __init__(self, model: VAE, config: Config):
        super().__init__(model, config)
        self.control_variate = ControlVariate(config.control_variate, config.train_examples)
        # Held here as train_step is: chapter 5 draws the estimator again and again on one trainer.
        self.draw_gradients = tf.function(self._draw_gradients)

    def checkpoint_objects(self) -> dict[str, tf.Module | tf.Variable]:
        return {**super().checkpoint_objects(), "control_variate": self.control_variate}

    def surrogate_losses(self, x: tf.Tensor, loc: tf.Tensor, scale: tf.Tensor, z0: tf.Tensor, chain: HMCResult,
                         baseline: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``objectives.vcd_surrogate_losses``: (encoder_loss, decoder_loss, g(zT) [B])."""
        return vcd_surrogate_losses(self.model, x, loc, scale, z0, chain, baseline, self.config.precision)

    def _draw_gradients(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor,
                        groups: tuple[str, ...]) -> dict[str, list[tf.Tensor]]:
        """One draw of ``estimate_gradients``' gradients of ``groups``: {group: [[n] per variable]},
        each variable's flattened. ``draw_gradients`` compiles it once per tuple of groups."""
        gradients = self.estimate_gradients(x, baseline, seed).gradients
        return {name: [tf.reshape(g, [-1]) for g in gradients[name]] for name in groups}

    def batch_estimate(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor) -> VCDEstimate:
        """The step's gradient estimate on the batch (x [B, 784], baseline [B]).

        Here the plain estimator; the pipelined and replicated trainers compute the same sum over
        micro-batches or replicas instead.
        """
        return self.estimate_gradients(x, baseline, seed)

    def _train_step(self, index: tf.Tensor, x: tf.Tensor) -> dict[str, tf.Tensor]:
        """index [B] int32 (rows of the training set), x [B, 784] -> per-example metrics."""
        baseline, seed = self.step_inputs(index)
        return self.apply_estimate(index, x, baseline, self.batch_estimate(x, baseline, seed))

    def step_inputs(self, index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """This step's control variate b [B] for the rows ``index`` (from before the step's update)
        and its seed [2]."""
        return (self.control_variate.values(index, self.step),
                fold_in(self.seed, self.step))

    def apply_estimate(self, index: tf.Tensor, x: tf.Tensor, baseline: tf.Tensor,
                       estimate: VCDEstimate) -> dict[str, tf.Tensor]:
        """Update every piece of state from the step's estimate; returns the per-example metrics."""
        self.control_variate.update(index, estimate.g, self.step)
        return {**self.apply_updates(x, estimate), "control_variate": tf.reduce_mean(baseline)}


class HoffmanTrainer(ChainTrainer):
    """Hoffman (2017): VCD's chain and decoder update, the VAE's encoder update.

    The step draws z0 from the encoder and runs the same HMC chain from it (same settings, same
    adapted step size, carried from step to step); the decoder learns from the chain's end zT, as
    in VCD, and the encoder by the ELBO at z0, as in the plain VAE (``hoffman_surrogate_losses``).
    Beside VCD it isolates what VCD's encoder objective adds to "refine the encoder's draw with
    HMC". No score function, so no control variate; it is trained plain (one device).
    """

    method = "hoffman"

    def surrogate_losses(self, x: tf.Tensor, loc: tf.Tensor, scale: tf.Tensor, z0: tf.Tensor, chain: HMCResult,
                         baseline: None) -> tuple[tf.Tensor, tf.Tensor, None]:
        """``objectives.hoffman_surrogate_losses``: (encoder_loss, decoder_loss, None)."""
        del baseline
        return (*hoffman_surrogate_losses(self.model, x, loc, scale, z0, chain, self.config.precision), None)

    def _train_step(self, index: tf.Tensor, x: tf.Tensor) -> dict[str, tf.Tensor]:
        """index [B] int32 (unused: no per-row state), x [B, 784] -> per-example metrics."""
        del index
        return self.apply_updates(x, self.estimate_gradients(x, None, fold_in(self.seed, self.step)))


def accumulate_gradients(trainer: VCDTrainer, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor, *,
                         micro_batch_size: int) -> VCDEstimate:
    """The unpipelined reference: the plain estimator on each micro-batch, summed.

    x [B, 784] with B a multiple of ``micro_batch_size``; baseline [B]; seed [2], the step's
    seed. Micro-batch m uses ``fold_in(seed, m)`` and the persistent step size. Returns the
    estimate with gradients and losses summed over the micro-batches, g [B] in batch order, the
    mean accept rate and the mean adapted step size. Changes no state.
    """
    batch = int(x.shape[0])
    if batch % micro_batch_size:
        raise ValueError(f"batch of {batch} is not a multiple of micro_batch_size={micro_batch_size}")
    estimates = []
    for m in range(batch // micro_batch_size):
        rows = slice(m * micro_batch_size, (m + 1) * micro_batch_size)
        estimates.append(trainer.estimate_gradients(x[rows], baseline[rows],
                                                    fold_in(seed, m)))
    gradients = {name: [tf.add_n([e.gradients[name][k] for e in estimates]) for k in range(len(grads))]
                 for name, grads in estimates[0].gradients.items()}
    return VCDEstimate(gradients, tf.add_n([e.encoder_loss for e in estimates]),
                       tf.add_n([e.decoder_loss for e in estimates]), tf.concat([e.g for e in estimates], 0),
                       tf.reduce_mean([e.accept_rate for e in estimates]),
                       tf.reduce_mean([e.step_size for e in estimates]))


def max_relative_error(expected: VCDEstimate, actual: VCDEstimate) -> float:
    """How far two gradient estimates are apart: over every gradient tensor, the largest absolute
    difference divided by the tensor's largest expected magnitude; the worst tensor's value."""
    return max(float(tf.reduce_max(tf.abs(a - e)) / tf.reduce_max(tf.abs(e)))
               for name in expected.gradients for e, a in zip(expected.gradients[name], actual.gradients[name]))

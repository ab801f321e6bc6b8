"""Training steps, the in-graph loop that runs many of them per host call, and the host loop.

A *trainer* owns a model, one optimiser per parameter group and a step counter, and exposes
``train_step(index, x) -> metrics``: one optimiser step on one batch, compiled with
``tf.function`` (optionally XLA). ``make_training_loop`` wraps it in a ``tf.function`` that pulls
``k`` batches from a ``tf.data`` iterator *inside* the graph and returns the ``k`` steps' metrics
stacked (the portable form of an IPU infeed, ``loops.repeat`` and outfeed); an ``Outfeed`` also
streams each step's metrics to the host while the loop runs. ``fit`` drives either from the host,
with a progress bar.
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterable, NamedTuple, Protocol

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from vcd_helpers.config import Config, check_positive_int
from vcd_helpers.control_variates import ControlVariate
from vcd_helpers.devices import compute_threads
from vcd_helpers.hmc import HMCResult, hmc_chain, sharded_target
from vcd_helpers.model import VAE, matmul_precision
from vcd_helpers.objectives import elbo, vcd_surrogate_losses
from vcd_helpers.optim import make_optimizers
from vcd_helpers.seeds import fold_in, training_seed
from vcd_helpers.timing import Stopwatch


class Trainer(Protocol):
    step: tf.Variable
    metric_names: tuple[str, ...]
    jit_compile: bool  # whether XLA compiles the step (pipelined: its HMC chain)
    steps_per_call: int  # steps ``fit`` runs per host call unless told otherwise
    chain_shards: int | None  # blocks of the HMC chain's rows (None: no chain)

    def train_step(self, index: tf.Tensor, x: tf.Tensor) -> dict[str, tf.Tensor]: ...

    def checkpoint_objects(self) -> dict[str, tf.Module | tf.Variable]:
        """What the final weights hold, by name: the model and what the next step would read of
        the state carried from step to step (the optimisers' slots and the step are left out)."""
        ...


class VCDEstimate(NamedTuple):
    """One draw of VCD's gradient estimator. gradients: {group: [tensor per variable]};
    encoder_loss, decoder_loss: batch sums; g: g(zT) [B]; accept_rate, step_size: the chain's."""

    gradients: dict[str, list[tf.Tensor]]
    encoder_loss: tf.Tensor
    decoder_loss: tf.Tensor
    g: tf.Tensor
    accept_rate: tf.Tensor
    step_size: tf.Tensor


class VAETrainer(tf.Module):
    """The plain VAE: maximise the reparameterised ELBO (the loss is minus its batch sum)."""

    metric_names = ("loss",)
    steps_per_call = 1
    chain_shards = None

    def __init__(self, model: VAE, config: Config, *, jit_compile: bool = False):
        super().__init__(name="vae_trainer")
        self.model = model
        self.config = config
        self.jit_compile = jit_compile
        self.optimizers = make_optimizers(model.parameter_groups(), config)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.seed = training_seed(config.seed, "vae")
        self.train_step = tf.function(self._train_step, jit_compile=jit_compile)

    def _train_step(self, index: tf.Tensor, x: tf.Tensor) -> dict[str, tf.Tensor]:
        """index [B] int32 (unused by the VAE), x [B, 784] -> {'loss': mean negative ELBO per example}."""
        del index
        groups = self.model.parameter_groups()
        seed = fold_in(self.seed, self.step)
        with tf.GradientTape() as tape, matmul_precision(self.config.precision):
            loss = -tf.reduce_sum(elbo(self.model, x, seed))
        gradients = tape.gradient(loss, groups)
        for name, optimizer in self.optimizers.items():
            optimizer.apply_gradients(gradients[name], self.step)
        self.step.assign_add(1)
        return {"loss": loss / tf.cast(tf.shape(x)[0], loss.dtype)}

    def checkpoint_objects(self) -> dict[str, tf.Module | tf.Variable]:
        return {"model": self.model}


class VCDTrainer(tf.Module):
    """VCD: encoder sample z0, an HMC chain to zT, both surrogate losses, group-wise updates.

    State that persists across steps: the optimisers' slots, the control variate, the adapted
    HMC step size and the step counter.
    """

    metric_names = ("encoder_loss", "decoder_loss", "accept_rate", "step_size", "control_variate")
    steps_per_call = 1

    def __init__(self, model: VAE, config: Config, *, jit_compile: bool = False, slot_device: str | None = None,
                 chain_shards: int | None = None):
        """``chain_shards``: blocks of rows the HMC chain's target is evaluated in (``hmc.sharded_target``),
        so that XLA keeps that many threads busy; None takes ``devices.compute_threads()``. It changes
        the speed, not the maths (up to float round-off), and is no part of the trainer's state."""
        super().__init__(name="vcd_trainer")
        self.model = model
        self.config = config
        self.jit_compile = jit_compile
        self.chain_shards = compute_threads() if chain_shards is None else chain_shards
        check_positive_int("chain_shards", self.chain_shards)
        self.optimizers = make_optimizers(model.parameter_groups(), config, slot_device=slot_device)
        self.control_variate = ControlVariate(config.control_variate, config.train_examples)
        self.step_size = tf.Variable(config.hmc.initial_step_size, trainable=False, name="hmc_step_size")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.seed = training_seed(config.seed, "vcd")
        self.train_step = tf.function(self._train_step, jit_compile=jit_compile)

    def checkpoint_objects(self) -> dict[str, tf.Module | tf.Variable]:
        return {"model": self.model, "step_size": self.step_size, "control_variate": self.control_variate}

    def run_chain(self, x: tf.Tensor, z0: tf.Tensor, step_size: tf.Tensor, seed: tf.Tensor) -> HMCResult:
        """The step's HMC chain on log p(x, .) from z0 [B, D], x [B, 784], with the config's settings."""
        hmc = self.config.hmc
        return hmc_chain(sharded_target(self.model.log_joint, x, self.chain_shards), z0, step_size,
                         num_iterations=hmc.num_iterations, seed=seed, **hmc.kernel_arguments())

    def estimate_gradients(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor) -> VCDEstimate:
        """One draw of the VCD gradient estimator, without changing any state.

        x [B, 784]; baseline [B], the control variate b; seed [2]. The chain starts from the
        persistent ``step_size``. Chapter 4 calls this many times at fixed parameters to measure
        the estimator's variance; gradient accumulation calls it once per micro-batch. The networks
        multiply in ``config.precision``.
        """
        groups = self.model.parameter_groups()
        noise_seed, chain_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        with tf.GradientTape(persistent=True) as tape, matmul_precision(self.config.precision):
            loc, scale = self.model.encoder(x)
            z0 = loc + scale * tf.random.stateless_normal(tf.shape(loc), seed=noise_seed)
            with tape.stop_recording():  # the chain is not differentiated: keep it off the tape
                chain = self.run_chain(x, z0, self.step_size, chain_seed)
            encoder_loss, decoder_loss, g = vcd_surrogate_losses(self.model, x, loc, scale, z0, chain, baseline)
        encoder_groups = {name: groups[name] for name in ("encoder_mean", "encoder_scale")}
        gradients = tape.gradient(encoder_loss, encoder_groups)
        gradients["decoder"] = tape.gradient(decoder_loss, groups["decoder"])
        del tape
        return VCDEstimate(gradients, encoder_loss, decoder_loss, g, chain.accept_rate, chain.step_size)

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
        for name, optimizer in self.optimizers.items():
            optimizer.apply_gradients(estimate.gradients[name], self.step)
        self.control_variate.update(index, estimate.g, self.step)
        self.step_size.assign(estimate.step_size)
        self.step.assign_add(1)
        batch = tf.cast(tf.shape(x)[0], estimate.encoder_loss.dtype)
        return {"encoder_loss": estimate.encoder_loss / batch, "decoder_loss": estimate.decoder_loss / batch,
                "accept_rate": estimate.accept_rate, "step_size": estimate.step_size,
                "control_variate": tf.reduce_mean(baseline)}


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


class Outfeed:
    """A queue that a training loop fills with each step's metrics while it runs, and that the
    host drains from any thread: the portable counterpart of an IPU outfeed queue.

    ``enqueue`` runs inside the compiled loop; ``drain`` returns what has arrived so far
    without waiting. A queue op has no XLA kernel, so the loop around the (XLA) step is a plain
    ``tf.function``.
    """

    def __init__(self, names: tuple[str, ...], capacity: int = 100_000):
        self.names = tuple(names)
        self.queue = tf.queue.FIFOQueue(capacity, dtypes=[tf.float32] * len(self.names),
                                        shapes=[[]] * len(self.names))

    def enqueue(self, metrics: dict[str, tf.Tensor]) -> None:
        self.queue.enqueue([tf.cast(metrics[name], tf.float32) for name in self.names])

    def drain(self) -> dict[str, np.ndarray]:
        """Everything enqueued so far, as {name: [n] array} (n may be 0)."""
        count = int(self.queue.size())
        if count == 0:
            return {name: np.zeros([0], np.float32) for name in self.names}
        values = self.queue.dequeue_many(count)
        return {name: value.numpy() for name, value in zip(self.names, values)}


def make_training_loop(trainer: Trainer, outfeed: Outfeed | None = None) -> Callable:
    """``loop(iterator, num_steps) -> {metric: [num_steps]}``: run ``num_steps`` training steps in
    one host call.

    Each iteration takes the next (index, x) batch from the ``tf.data`` iterator inside the graph
    (no host round trip), runs ``trainer.train_step`` (XLA-compiled if the trainer was) and
    writes its metrics into TensorArrays, returned stacked; with an ``outfeed`` each step's
    metrics are also streamed out as it finishes. ``num_steps`` is a tensor, so changing it does
    not retrace.
    """
    names = trainer.metric_names

    @tf.function
    def loop(iterator, num_steps):
        arrays = {name: tf.TensorArray(tf.float32, size=num_steps) for name in names}
        for i in tf.range(num_steps):
            index, x = next(iterator)
            metrics = trainer.train_step(index, x)
            if outfeed is not None:
                outfeed.enqueue(metrics)
            arrays = {name: arrays[name].write(i, tf.cast(metrics[name], tf.float32)) for name in names}
        return {name: array.stack() for name, array in arrays.items()}

    return loop


StepCallback = Callable[[int, dict[str, float]], None]


class History:
    """``fit``'s record when its caller keeps none: every step's metrics, and the wall time
    (seconds since the record began) at the end of the call that ran the step."""

    def __init__(self) -> None:
        self.clock = Stopwatch()
        self.columns: dict[str, list[float]] = {"step": [], "wall_time": []}

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        self.columns["step"].append(step)
        self.columns["wall_time"].append(self.clock.elapsed)
        for name, value in metrics.items():
            self.columns.setdefault(name, []).append(value)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(values) for name, values in self.columns.items()}


def fit(trainer: Trainer, batches: Iterable, num_steps: int, *, steps_per_call: int | None = None,
        progress: bool = True, description: str = "training",
        on_step: StepCallback | None = None) -> dict[str, np.ndarray]:
    """Run ``num_steps`` training steps from ``batches`` ((index, x) pairs).

    ``steps_per_call`` = 1 calls the compiled step once per batch from Python; k > 1 runs k steps
    per call with ``make_training_loop`` (``batches`` must then be a ``tf.data.Dataset`` or its
    iterator); None takes the trainer's (a pipeline's ``device_iterations``, else 1).
    ``on_step(step, metrics)`` is called for every finite step, after the call that ran it (the
    training command logs and checkpoints there, so its boundaries must be multiples of
    ``steps_per_call``). Without ``on_step``, returns each metric as a [num_steps] numpy array,
    plus 'step' and 'wall_time' (a ``History``); with it, the caller keeps what it needs and fit
    returns {} (the training command's 400,000 steps would otherwise pile up in memory).
    Raises FloatingPointError on a non-finite metric, before ``on_step`` sees that step.
    """
    steps_per_call = trainer.steps_per_call if steps_per_call is None else steps_per_call
    check_positive_int("steps_per_call", steps_per_call)
    history = History() if on_step is None else None
    on_step = history if history is not None else on_step
    iterator = iter(batches)
    loop = make_training_loop(trainer) if steps_per_call > 1 else None
    bar = tqdm(total=num_steps, desc=description, disable=not progress, mininterval=0.5, unit="step")
    done = 0
    try:
        while done < num_steps:
            k = min(steps_per_call, num_steps - done)
            if loop is None:
                index, x = next(iterator)
                outputs = {name: value.numpy()[None] for name, value in trainer.train_step(index, x).items()}
            else:
                outputs = {name: value.numpy() for name, value in loop(iterator, tf.constant(k)).items()}
            first_step = int(trainer.step.numpy()) - k + 1
            for j in range(k):
                step = first_step + j
                metrics = {name: float(values[j]) for name, values in outputs.items()}
                for name, value in metrics.items():
                    if not np.isfinite(value):
                        raise FloatingPointError(f"{name} is {value} at step {step}; stopping")
                on_step(step, metrics)
            done += k
            bar.update(k)
            bar.set_postfix({name: f"{value:.3g}" for name, value in metrics.items()}, refresh=False)
    finally:
        bar.close()
    return history.arrays() if history is not None else {}


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

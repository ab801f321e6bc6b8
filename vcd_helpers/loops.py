"""The in-graph training loop that runs many steps per host call, and the host loop around it.

``make_training_loop`` wraps a trainer's ``train_step`` in a ``tf.function`` that pulls ``k``
batches from a ``tf.data`` iterator *inside* the graph and returns the ``k`` steps' metrics
stacked (the portable form of an IPU infeed, ``loops.repeat`` and outfeed); an ``Outfeed`` also
streams each step's metrics to the host while the loop runs. ``fit`` drives either from the host,
with a progress bar.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from vcd_helpers.config import check_positive_int
from vcd_helpers.timing import Stopwatch
from vcd_helpers.training import Trainer


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
        # A queue of one component dequeues a tensor, not a list of one: flatten both alike.
        values = tf.nest.flatten(self.queue.dequeue_many(count))
        return {name: value.numpy() for name, value in zip(self.names, values, strict=True)}


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
    iterator); None takes the trainer's (``Config.steps_per_call``).
    ``on_step(step, metrics)`` is called for every finite step, after the call that ran it (the
    training command logs and checkpoints there, so its boundaries must be multiples of
    ``steps_per_call``). Without ``on_step``, returns each metric as a [num_steps] numpy array,
    plus 'step' and 'wall_time' (a ``History``); with it, the caller keeps what it needs and fit
    returns {} (the training command's 400,000 steps would otherwise pile up in memory).
    Raises FloatingPointError on a non-finite metric, before ``on_step`` sees that step, and
    TypeError for k > 1 steps per call from batches that are not a ``tf.data`` dataset.
    """
    steps_per_call = trainer.steps_per_call if steps_per_call is None else steps_per_call
    check_positive_int("steps_per_call", steps_per_call)
    history = History() if on_step is None else None
    on_step = history if history is not None else on_step
    iterator = iter(batches)
    loop = make_training_loop(trainer) if steps_per_call > 1 else None
    if loop is not None and not isinstance(iterator, tf.data.Iterator):
        # The traced loop would call next() on a Python iterator once, at tracing, and train
        # every step of every call on that one batch.
        raise TypeError(f"steps_per_call={steps_per_call} takes its batches inside the compiled loop: give a "
                        f"tf.data.Dataset (e.g. data.indexed_batches), not a {type(batches).__name__}, or "
                        "steps_per_call=1")
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

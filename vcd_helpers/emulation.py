"""An emulated accelerator: the package's real training loop behind host calls of known cost.

On a CPU a host call of a compiled loop costs tens of microseconds, so running k training steps
per call (``loops.make_training_loop``) gains little; on an accelerator each call pays a launch,
a synchronisation and transfers, and the gain is large. ``EmulatedDevice`` makes that per-call
cost a known, configurable number: every call waits ``call_latency`` seconds on the host (the
cost λ of a launch), and, where the call moves data, ``feed_latency`` seconds plus bytes over
``bandwidth`` per transfer (an infeed of the call's batches, an outfeed of its results). The
waits are ``time.sleep``: they release the CPU, as a host waiting on a device does, so they do
not compete with the computation for the cores of a shared machine.

``emulated_training_loop`` runs k real training steps per call (the package's in-graph loop,
unchanged) on such a device, so that a call costs λ + 2 λ_feed + k (τ + bytes per step /
bandwidth), τ being the real step's time: per step, (λ + 2 λ_feed) / k + bytes / bandwidth + τ.
``per_step_model`` is that formula. Nothing here asserts speed: the waits are the only known part.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from vcd_helpers.loops import make_training_loop
from vcd_helpers.timing import wait_for
from vcd_helpers.training import Trainer


def _check_seconds(name: str, value: Any) -> float:
    """``value`` as a float if it is a finite number of seconds >= 0; else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} is invalid: must be a finite number of seconds >= 0")
    return float(value)


@dataclass
class EmulatedDevice:
    """A device whose host calls cost a known time.

    ``call_latency`` (λ, seconds): the wait of every call (launch, synchronisation);
    ``feed_latency`` (λ_feed, seconds) and ``bandwidth`` (bytes per second, ``math.inf`` for
    none): each transfer of ``n`` bytes waits ``feed_latency + n / bandwidth``; a call that moves
    no bytes one way makes no transfer that way. ``sleep`` is how the host waits (``time.sleep``;
    tests pass a recorder). ``calls`` counts the calls made and ``waited`` sums the seconds waited.

    Raises ValueError for a negative, infinite or non-numeric latency, or a bandwidth that is not
    a positive number (``math.inf`` allowed), naming the bad value.
    """

    call_latency: float = 0.0
    feed_latency: float = 0.0
    bandwidth: float = math.inf
    sleep: Callable[[float], None] = time.sleep
    calls: int = field(default=0, init=False)
    waited: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.call_latency = _check_seconds("call_latency", self.call_latency)
        self.feed_latency = _check_seconds("feed_latency", self.feed_latency)
        if isinstance(self.bandwidth, bool) or not isinstance(self.bandwidth, (int, float, np.integer, np.floating)) \
                or math.isnan(self.bandwidth) or self.bandwidth <= 0:
            raise ValueError(f"bandwidth={self.bandwidth!r} is invalid: must be a positive number of bytes per "
                             "second (math.inf for no limit)")
        self.bandwidth = float(self.bandwidth)

    def transfer_seconds(self, num_bytes: int) -> float:
        """Seconds one transfer of ``num_bytes`` costs: 0 for none, else λ_feed + bytes / bandwidth.
        Raises ValueError for a negative or non-integer byte count."""
        if isinstance(num_bytes, bool) or not isinstance(num_bytes, (int, np.integer)) or num_bytes < 0:
            raise ValueError(f"num_bytes={num_bytes!r} is invalid: must be an integer >= 0")
        return 0.0 if num_bytes == 0 else self.feed_latency + num_bytes / self.bandwidth

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self.sleep(seconds)
            self.waited += seconds

    def run(self, fn: Callable[..., Any], *args: Any, bytes_in: int = 0, bytes_out: int = 0,
            **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` as one host call of the device: wait λ plus the infeed of
        ``bytes_in``, run ``fn`` until its outputs are computed, wait the outfeed of
        ``bytes_out``; returns what ``fn`` returned, unchanged."""
        self._wait(self.call_latency + self.transfer_seconds(bytes_in))
        result = fn(*args, **kwargs)
        if bytes_out:
            wait_for(result)  # results leave the device once they exist
            self._wait(self.transfer_seconds(bytes_out))
        self.calls += 1
        return result


def element_bytes(dataset: tf.data.Dataset) -> int:
    """Bytes of one element of ``dataset`` (e.g. one (index, x) batch). Raises ValueError when a
    component's shape is not fully known (batches without ``drop_remainder``)."""
    total = 0
    for spec in tf.nest.flatten(dataset.element_spec):
        if not spec.shape.is_fully_defined():
            raise ValueError(f"element shape {spec.shape} is invalid: element_bytes needs fully known shapes")
        total += int(np.prod(spec.shape.as_list(), dtype=np.int64)) * spec.dtype.size
    return total


@dataclass(frozen=True)
class EmulatedLoop:
    """``call(k)`` runs k training steps on ``device`` in one host call; see ``emulated_training_loop``.

    ``batch_bytes``: bytes of one batch (the infeed moves k of them per call); ``metric_bytes``:
    bytes of one step's metrics (the outfeed moves k of them per call). The same compiled loop on
    another device: ``dataclasses.replace(emulated, device=EmulatedDevice(...))`` (no new trace)."""

    device: EmulatedDevice
    loop: Callable[[Iterator, tf.Tensor], dict[str, tf.Tensor]]
    iterator: Iterator
    batch_bytes: int
    metric_bytes: int

    def __call__(self, k: int) -> dict[str, tf.Tensor]:
        """k >= 0 training steps in one call: {metric: [k]}, exactly what the loop returned."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"k={k!r} is invalid: must be an integer >= 0 (training steps per call)")
        return self.device.run(self.loop, self.iterator, tf.constant(int(k)),
                               bytes_in=int(k) * self.batch_bytes, bytes_out=int(k) * self.metric_bytes)


def emulated_training_loop(trainer: Trainer, batches: tf.data.Dataset, device: EmulatedDevice) -> EmulatedLoop:
    """The package's in-graph training loop (``loops.make_training_loop(trainer)``) run on
    ``device``: ``call(k)`` waits λ, infeeds k batches of ``batches`` (one transfer), runs the k
    steps, and outfeeds their metrics (one transfer). The loop and its results are the real ones;
    only the waits are emulated. The loop is traced and compiled at its first call.
    """
    metric_bytes = 4 * len(trainer.metric_names)  # the loop returns each metric as float32
    return EmulatedLoop(device, make_training_loop(trainer), iter(batches), element_bytes(batches), metric_bytes)


def per_step_model(k: np.ndarray | int, call_latency: float, step_time: float, *, feed_latency: float = 0.0,
                   bytes_per_step: float = 0.0, bandwidth: float = math.inf) -> np.ndarray:
    """Seconds per step when k steps run per call: (λ + 2 λ_feed) / k + bytes_per_step /
    bandwidth + τ (one infeed and one outfeed per call; ``bytes_per_step`` counts both ways).
    ``k``: an int or an array of ints >= 1; returns an array of k's shape. Raises ValueError for
    k < 1 or a bad latency."""
    k = np.asarray(k)
    if k.size == 0 or np.any(k < 1):
        raise ValueError(f"k={k.tolist()!r} is invalid: steps per call must be >= 1")
    call_latency = _check_seconds("call_latency", call_latency)
    feed_latency = _check_seconds("feed_latency", feed_latency)
    step_time = _check_seconds("step_time", step_time)
    return (call_latency + 2 * feed_latency) / k + bytes_per_step / bandwidth + step_time


def fit_per_call(k: np.ndarray, seconds_per_step: np.ndarray, known_latency: np.ndarray) -> tuple[float, float]:
    """Fit seconds per step = (known_latency + λ₀) / k + τ to measured points.

    ``k``, ``seconds_per_step`` and ``known_latency`` (the emulated part of each point's per-call
    cost, seconds): [n] arrays with at least two different k. Least squares in the per-step time:
    t - known_latency / k = τ + λ₀ / k, a line in 1/k, each residual relative to its point's t
    (weights 1/t): a long emulated wait's small relative error (a sleep's overshoot) would
    otherwise outweigh the short points that alone resolve λ₀. Returns (τ, λ₀):
    the step time and the per-call cost the machine adds by itself, in seconds. Raises ValueError
    for mismatched shapes, k < 1 or fewer than two distinct k."""
    k, t, known = (np.asarray(a, dtype=np.float64) for a in (k, seconds_per_step, known_latency))
    if not k.shape == t.shape == known.shape or k.ndim != 1:
        raise ValueError(f"shapes {k.shape}, {t.shape}, {known.shape} are invalid: need three [n] arrays")
    if np.any(k < 1):
        raise ValueError(f"k={k.tolist()!r} is invalid: steps per call must be >= 1")
    if len(np.unique(k)) < 2:
        raise ValueError(f"k={k.tolist()!r} is invalid: the fit needs at least two different k")
    if not np.all(np.isfinite(t) & (t > 0)):
        raise ValueError(f"seconds_per_step={t.tolist()!r} is invalid: each must be a positive number of seconds")
    own_latency, step_time = np.polyfit(1 / k, t - known / k, 1, w=1 / t)
    return float(step_time), float(own_latency)

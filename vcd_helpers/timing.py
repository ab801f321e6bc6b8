"""The one way this package times things: warm up, time several calls, report the median.

``time_calls(fn)`` calls ``fn`` once untimed (tracing and XLA compilation are never timed), then
``repeats`` times, each time waiting for every tensor it returns, and gives a ``Timing``: the
seconds of each call, their median and spread, per unit of work (``units`` steps, chains or
evaluations per call). ``time_alternately`` times several variants turn by turn, so that a
machine's drift (another process, a clock change) hits all of them alike: the way to compare two
variants. ``Stopwatch`` is the wall clock of a long job (a training run, resumed across processes,
with its periodic evaluations left out).

Timings are for benchmarks and figures; no test depends on how fast a machine is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from vcd_helpers.config import check_positive_int


def wait_for(outputs: Any) -> Any:
    """``outputs`` with every tensor in it copied to the host: returns once they are computed."""
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, outputs)


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed call, per ``units`` of work, and what each call returned.

    ``seconds``: [repeats] seconds per call; ``units``: work per call (e.g. steps per call);
    ``outputs``: each timed call's return value, host copies (``median_output`` is the median call's);
    ``cpu_seconds``: [repeats] CPU seconds the whole process used during each call (all its threads).
    """

    seconds: tuple[float, ...]
    units: int = 1
    outputs: tuple[Any, ...] = ()
    cpu_seconds: tuple[float, ...] = ()

    @property
    def median(self) -> float:
        """Seconds per unit of the median call."""
        return float(np.median(self.seconds)) / self.units

    @property
    def median_ms(self) -> float:
        return 1000 * self.median

    @property
    def spread_ms(self) -> tuple[float, float]:
        """The fastest and the slowest call, in ms per unit."""
        return 1000 * min(self.seconds) / self.units, 1000 * max(self.seconds) / self.units

    @property
    def cores_used(self) -> float:
        """Process CPU time over wall time across the timed calls: 1.0 is one core kept busy."""
        return sum(self.cpu_seconds) / sum(self.seconds)

    @property
    def median_output(self) -> Any:
        return self.outputs[int(np.argsort(self.seconds)[len(self.seconds) // 2])]

    def __str__(self) -> str:
        low, high = self.spread_ms
        return f"{self.median_ms:.2f} ms (median of {len(self.seconds)}; {low:.2f}-{high:.2f})"


def time_calls(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1, units: int = 1) -> Timing:
    """Call ``fn()`` ``warmup`` times untimed, then ``repeats`` times timed (each until its
    outputs are computed); ``units`` is the work one call does. Raises ValueError for a
    non-positive ``repeats`` or ``units`` or a negative ``warmup``."""
    return time_alternately({"": fn}, repeats=repeats, warmup=warmup, units=units)[""]


def time_alternately(variants: dict[str, Callable[[], Any]], *, repeats: int = 5, warmup: int = 1,
                     units: int = 1) -> dict[str, Timing]:
    """``time_calls`` for each variant, interleaved: round r times every variant once, in turn."""
    check_positive_int("repeats", repeats)
    check_positive_int("units", units)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} is invalid: must be an integer >= 0")
    for fn in variants.values():
        for _ in range(warmup):
            wait_for(fn())
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, list[Any]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            result = wait_for(fn())
            seconds[name].append(time.perf_counter() - start)
            cpu_seconds[name].append(time.process_time() - cpu_start)
            outputs[name].append(result)
    return {name: Timing(tuple(seconds[name]), units, tuple(outputs[name]), tuple(cpu_seconds[name]))
            for name in variants}


class Stopwatch:
    """A wall clock that leaves some work out: ``elapsed`` counts from ``offset`` seconds (time
    already spent by an earlier process), minus every stretch handed to ``leave_out``."""

    def __init__(self, offset: float = 0.0):
        self._started = time.perf_counter()
        self._offset = offset
        self._left_out = 0.0

    @property
    def elapsed(self) -> float:
        return self._offset + time.perf_counter() - self._started - self._left_out

    def leave_out(self, seconds: float) -> None:
        """Take ``seconds`` (spent on work that is not the job's, e.g. an evaluation) off the clock."""
        self._left_out += seconds

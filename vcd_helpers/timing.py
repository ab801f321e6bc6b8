"""The one way this package times things: warm up, time several calls, report the median.

``time_calls(fn)`` calls ``fn`` once untimed (tracing and XLA compilation are never timed), then
``repeats`` times, each time waiting for every tensor it returns, and gives a ``Timing``: the
seconds of each call, their median and spread, per unit of work (``units`` steps, chains or
evaluations per call). ``time_alternately`` times several variants turn by turn, so that a
machine's drift (another process, a clock change) hits all of them alike: the way to compare two
variants; each round starts with the next variant, so that no variant always runs first.
``compare`` then says whether they differ: per variant, the ratio of its time to a baseline
variant's, round by round, with a bootstrap interval. Every timing carries ``MachineLoad``: what
else the machine was doing meanwhile, shown beside each verdict, since a busy machine slows and
blurs every timing. ``Stopwatch`` is the wall clock of a long job (a training run, resumed
across processes, with its periodic evaluations left out).

Timings are for benchmarks, figures and printed verdicts; no test and no check of a chapter
depends on how fast, or how quiet, a machine is.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from vcd_helpers.config import check_positive_int


def wait_for(outputs: Any) -> Any:
    """``outputs`` with every tensor in it copied to the host: returns once they are computed."""
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, outputs)


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) CPU time of the whole machine since boot, in clock ticks, from /proc/stat
    (Linux); None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and waiting for I/O
    return sum(fields[:8]) - idle, sum(fields[:8])


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # not on every platform
        return None


#: Cores other processes must keep busy, on average over a timing, for it to count as taken on a
#: busy machine: half a core takes a visible share of a 2-core machine's time.
OTHERS_BUSY = 0.5


@dataclass(frozen=True)
class MachineLoad:
    """What the whole machine did while something was timed.

    ``load_average``: the 1-minute load average when the timing ended (None where the platform
    has none); ``busy_cores``: cores kept busy by every process together during the timing (None
    without /proc/stat); ``own_cores``: cores this process kept busy; ``cores``: the machine's.
    """

    load_average: float | None
    busy_cores: float | None
    own_cores: float
    cores: int

    @property
    def busy(self) -> bool:
        """Whether other work competed for the cores: other processes kept at least
        ``OTHERS_BUSY`` of a core busy (without /proc/stat: the load average above the core
        count). The load average alone misleads: it counts this process's own runnable
        threads, and reads 2.3 on 2 cores while a timing keeps one core busy on a quiet machine."""
        if self.busy_cores is not None:
            return self.busy_cores - self.own_cores >= OTHERS_BUSY
        return self.load_average is not None and self.load_average > self.cores

    def __str__(self) -> str:
        load = "unknown" if self.load_average is None else f"{self.load_average:.1f}"
        busy = ("" if self.busy_cores is None
                else f"; {self.busy_cores:.1f} cores busy, {self.own_cores:.1f} of them by the timing")
        return f"load average {load} on {self.cores} cores{busy}"


class _LoadMeter:
    """Measures ``MachineLoad`` from its creation to ``stop``."""

    def __init__(self):
        self._jiffies, self._wall, self._cpu = _cpu_jiffies(), time.perf_counter(), time.process_time()

    def stop(self) -> MachineLoad:
        cores = os.cpu_count() or 1
        wall = max(time.perf_counter() - self._wall, 1e-9)
        end = _cpu_jiffies()
        busy = None
        if self._jiffies is not None and end is not None and end[1] > self._jiffies[1]:
            busy = cores * (end[0] - self._jiffies[0]) / (end[1] - self._jiffies[1])
        return MachineLoad(_load_average(), busy, (time.process_time() - self._cpu) / wall, cores)


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed call, per ``units`` of work, and what each call returned.

    ``seconds``: [repeats] seconds per call; ``units``: work per call (e.g. steps per call);
    ``outputs``: each timed call's return value, host copies (``median_output`` is the median call's);
    ``cpu_seconds``: [repeats] CPU seconds the whole process used during each call (all its threads);
    ``machine``: what the whole machine did meanwhile (None for a Timing built by hand).
    """

    seconds: tuple[float, ...]
    units: int = 1
    outputs: tuple[Any, ...] = ()
    cpu_seconds: tuple[float, ...] = ()
    machine: MachineLoad | None = None

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
    """``time_calls`` for each variant, interleaved: round r times every variant once, in turn,
    starting with variant r (mod the number of variants), so that each takes each place in the
    order equally often over a multiple of that many rounds."""
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
    names = list(variants)
    meter = _LoadMeter()
    for r in range(repeats):
        # Rotated: a variant that always ran first (or right after a given one) would carry an
        # order effect (caches, clock boost) that the per-round ratios of compare cannot see.
        for name in names[r % len(names):] + names[:r % len(names)]:
            start, cpu_start = time.perf_counter(), time.process_time()
            result = wait_for(variants[name]())
            seconds[name].append(time.perf_counter() - start)
            cpu_seconds[name].append(time.process_time() - cpu_start)
            outputs[name].append(result)
    machine = meter.stop()
    return {name: Timing(tuple(seconds[name]), units, tuple(outputs[name]), tuple(cpu_seconds[name]), machine)
            for name in variants}


#: The fewest alternated rounds whose bootstrap interval is worth the name (with fewer, the
#: bootstrap median can only take the few per-round ratios: the interval is about their range).
MIN_INTERVAL_ROUNDS = 10


@dataclass(frozen=True)
class RatioInterval:
    """A variant's time over the baseline's: the median of the per-round ratios and its interval.

    ``ratio``: median over rounds of (variant's seconds / baseline's seconds) per unit of work;
    ``low``, ``high``: the ``confidence`` bootstrap interval of that median; ``rounds``: how many
    alternated rounds it rests on; ``machine``: what the machine did while they were timed
    (shown beside the verdict). ``differs`` is True when the interval excludes 1.
    """

    ratio: float
    low: float
    high: float
    confidence: float
    rounds: int
    machine: MachineLoad | None = None
    is_baseline: bool = False  # the baseline against itself: exactly 1, nothing to resolve

    @property
    def differs(self) -> bool:
        """Whether the interval excludes 1: the variant is resolved as faster or slower."""
        return not self.low <= 1.0 <= self.high

    @property
    def verdict(self) -> str:
        """One of "slower", "faster" or "no difference resolved", as the interval says."""
        if not self.differs:
            return "no difference resolved"
        return "slower" if self.low > 1.0 else "faster"

    def phrase(self, variant: str, baseline: str) -> str:
        """The verdict as a clause for the prose, e.g. "eager is slower than XLA (1.840 x the time,
        interval [1.800, 1.900], clear of 1)" or "k = 10 and k = 1 do not differ beyond the noise
        (0.990 x the time, interval [0.970, 1.020], which includes 1)"; the digits are ``numbers``'."""
        if self.is_baseline:
            return f"{variant} is the baseline"
        ratio, low, high = self.numbers()
        if not self.differs:
            return (f"{variant} and {baseline} do not differ beyond the noise ({ratio} x the time, "
                    f"interval [{low}, {high}], which includes 1)")
        return f"{variant} is {self.verdict} than {baseline} ({ratio} x the time, interval [{low}, {high}], clear of 1)"

    def numbers(self, minimum_decimals: int = 3) -> tuple[str, str, str]:
        """The ratio and its interval as text, with the decimals they need: at least two
        significant digits each (0.0123, not 0.01), an interval that excludes 1 never printed
        with a bound of 1.000 (0.9995, not 1.000), so that the digits show the verdict, and an
        interval of nonzero width never printed as a point ([1.0021, 1.0024], not [1.002, 1.002])."""
        values = (self.ratio, self.low, self.high)
        decimals = minimum_decimals

        def printed(v: float) -> str:
            return f"{v:.{decimals}f}"

        while decimals < 8 and (any(0 < abs(v) < 10 ** (1 - decimals) for v in values)
                                or (self.differs and any(printed(v) == printed(1) for v in values))
                                or (self.low < self.high and printed(self.low) == printed(self.high))):
            decimals += 1
        return tuple(f"{v:.{decimals}f}" for v in values)

    def __str__(self) -> str:
        if self.is_baseline:
            return "1 x: the baseline itself"
        # Below MIN_INTERVAL_ROUNDS the bootstrap can only return the rounds' own ratios: say so.
        basis = (f"{self.confidence:.0%} interval, {self.rounds} rounds" if self.rounds >= MIN_INTERVAL_ROUNDS
                 else f"only {self.rounds} rounds: about their range, not a {self.confidence:.0%} interval")
        where = "" if self.machine is None else f" [{self.machine}]"
        ratio, low, high = self.numbers()
        return f"{ratio} x [{low}, {high}] ({basis}): {self.verdict}{where}"


def compare(timings: dict[str, Timing], baseline: str, *, confidence: float = 0.95, seed: int = 0,
            resamples: int = 10_000) -> dict[str, RatioInterval]:
    """Whether each variant timed by ``time_alternately`` differs from the ``baseline`` variant.

    Round r of ``time_alternately`` timed every variant once, close together in time, so the
    ratio seconds[variant][r] / seconds[baseline][r] (per unit of work) cancels whatever the
    machine's speed was in that round. The statistic is the median of these per-round ratios;
    its interval is the percentile bootstrap over rounds (``resamples`` resamples of the rounds,
    drawn with ``seed``). A variant ``differs`` when the interval excludes 1. Every variant is
    in the result, the baseline too (exactly 1, ``is_baseline``: it prints as the baseline).

    With few rounds the interval is coarse: the bootstrap median of r rounds can only take the
    values of the r ratios, so with 3 rounds the interval is their range. ``MIN_INTERVAL_ROUNDS``
    (10) or more give a usable interval; with fewer, the printed result says so.

    Raises ValueError for an unknown ``baseline``, fewer than 3 rounds, variants with different
    numbers of rounds, a non-positive call time, a ``confidence`` outside (0, 1) or a
    non-positive ``resamples``.
    """
    if baseline not in timings:
        raise ValueError(f"baseline={baseline!r} is invalid: must be one of the timed variants "
                         f"({', '.join(map(repr, timings)) or 'none given'})")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} is invalid: must lie in (0, 1)")
    check_positive_int("resamples", resamples)
    rounds = {name: len(t.seconds) for name, t in timings.items()}
    if len(set(rounds.values())) != 1:
        raise ValueError(f"rounds per variant {rounds} are invalid: compare needs variants timed "
                         "alternately, the same number of rounds each")
    num_rounds = rounds[baseline]
    if num_rounds < 3:
        raise ValueError(f"{num_rounds} rounds are too few: compare needs at least 3 alternated rounds")
    per_unit = {}
    for name, t in timings.items():
        seconds = np.asarray(t.seconds, dtype=np.float64) / t.units
        if not np.all(np.isfinite(seconds) & (seconds > 0)):
            raise ValueError(f"variant {name!r} has call times {t.seconds}: each must be a positive number of seconds")
        per_unit[name] = seconds
    # The same resampled rounds for every variant (each against the baseline of its own round).
    result = {}
    for name, seconds in per_unit.items():
        low, high = median_interval(seconds / per_unit[baseline], confidence=confidence, seed=seed, resamples=resamples)
        result[name] = RatioInterval(float(np.median(seconds / per_unit[baseline])), low, high, confidence, num_rounds,
                                     timings[baseline].machine, is_baseline=name == baseline)
    return result


def median_interval(values: np.ndarray, *, confidence: float = 0.95, seed: int = 0,
                    resamples: int = 10_000) -> tuple[float, float]:
    """The percentile bootstrap interval of the median of ``values`` [rounds], one value per
    alternated round (a ratio or a difference of two variants' times in that round). The same
    ``seed`` resamples the same rounds, so intervals of variants timed together are comparable."""
    values = np.asarray(values, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    tail = (1 - confidence) / 2
    low, high = np.quantile(np.median(values[picks], axis=1), [tail, 1 - tail])
    return float(low), float(high)


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

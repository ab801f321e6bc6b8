"""Reading finished runs and comparing them: the numbers chapters 8, 8b and 9 report.

A run is a results directory of the training command (the chapters read the committed copies in
``results/NAME``). Two kinds of comparison:

- *paired*, on the same test images: the per-image difference of two runs' estimates, its mean
  and a confidence interval (Student's t over the images). Image-to-image spread (some digits are
  harder than others) cancels, so a paired interval is far narrower than two separate ones.
- *across seeds*: the mean and standard deviation of a number over runs that differ only in their
  seed (initialisation, data order and every random draw), with a t interval for the mean.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import tensorflow_probability as tfp

from vcd_helpers.config import Config
from vcd_helpers.results import (CURVE_FILE, LOCAL_BASELINE_FILE, PER_EXAMPLE_FILE, RunDirectoryError,
                                   evaluation_file_name, read_array, read_config, read_curve, read_json_object,
                                   read_launches, read_metrics, read_results)


class Interval(NamedTuple):
    """A mean with a two-sided confidence interval [low, high] from ``n`` values."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly on one side of zero: a difference resolved from none."""
        return self.low > 0 or self.high < 0

    def __neg__(self) -> "Interval":
        """The interval of minus the quantity: ``-(a - b)`` is ``b - a``, its bounds swapped."""
        return Interval(-self.mean, -self.high, -self.low, self.n)

    def __format__(self, spec: str) -> str:
        """``f"{i:+.2f}"`` gives '+1.23 [+1.01, +1.45]': the mean, then [low, high], each in ``spec``."""
        if not spec:
            return str(self)
        return f"{self.mean:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def t_quantile(probability: float, degrees_of_freedom: int) -> float:
    """The ``probability`` quantile of Student's t with the given degrees of freedom."""
    return float(tfp.distributions.StudentT(df=float(degrees_of_freedom), loc=0.0, scale=1.0)
                 .quantile(probability).numpy())


def mean_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """The mean of ``values`` and its t interval. Raises ValueError for fewer than two finite values."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or len(values) < 2 or not np.all(np.isfinite(values)):
        raise ValueError(f"values of shape {values.shape} are invalid: need at least two finite numbers")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} is invalid: must lie in (0, 1)")
    mean = float(values.mean())
    half = t_quantile(0.5 + confidence / 2, len(values) - 1) * float(values.std(ddof=1)) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values))


def against_seeds(single: float, seed_values: Sequence[float] | np.ndarray, confidence: float = 0.95,
                  single_sd: float | None = None) -> Interval:
    """``single`` (one run's number, or another study's) minus the mean of ``seed_values`` (n seeds of
    one configuration), with the interval the spread over seeds alone allows for that difference:
    t(n - 1) x sd x sqrt(1 + 1/n), the spread of one more run minus the mean of n. Each seed's
    evaluation noise is in sd; what all the seeds share (the test images, the evaluation protocol)
    is not. It assumes ``single`` is independent of the seeds and varies over seeds as they do;
    ``single_sd``, if given, is the spread over seeds assumed for ``single`` instead (another
    method's run: t(n - 1) x sqrt(single_sd^2 + sd^2 / n)).
    Raises ValueError for fewer than two finite seed values, a non-finite ``single`` or a
    ``single_sd`` that is not a finite number >= 0."""
    spread = mean_interval(seed_values, confidence)  # refuses too few or non-finite values and a bad confidence
    if not math.isfinite(single):
        raise ValueError(f"single={single!r} is invalid: must be a finite number")
    if single_sd is None:
        half = spread.half_width * math.sqrt(spread.n + 1)  # t sd / sqrt(n) -> t sd sqrt(1 + 1/n)
    elif not (math.isfinite(single_sd) and single_sd >= 0):
        raise ValueError(f"single_sd={single_sd!r} is invalid: must be a finite number >= 0")
    else:
        sd = float(np.std(np.asarray(seed_values, dtype=np.float64), ddof=1))
        t = t_quantile(0.5 + confidence / 2, spread.n - 1)
        half = t * math.sqrt(single_sd ** 2 + sd ** 2 / spread.n)
    difference = float(single - spread.mean)
    return Interval(difference, difference - half, difference + half, spread.n)


def between_two_runs(seed_values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> float:
    """The half-width the spread over seeds alone allows for the difference of two single runs of
    one configuration: t(n - 1) x sd x sqrt(2), each run with the seeds' variance sd^2 (n seeds).
    Raises ValueError for fewer than two finite seed values."""
    spread = mean_interval(seed_values, confidence)  # refuses too few or non-finite values and a bad confidence
    return spread.half_width * math.sqrt(2 * spread.n)  # t sd / sqrt(n) -> t sd sqrt(2)


def paired_difference(a: np.ndarray, b: np.ndarray, confidence: float = 0.95) -> Interval:
    """Mean of ``a - b`` over the same images ([N] each) with its t interval."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"a has shape {a.shape} and b {b.shape}: a paired difference needs the same images")
    return mean_interval(a - b, confidence)


@dataclass(frozen=True)
class FinishedRun:
    """Everything a finished run left in its directory that the book reads.

    ``curve`` and ``per_example`` are None for runs made before the package wrote them."""

    name: str
    path: Path
    config: Config
    results: dict[str, Any]
    metrics: dict[str, np.ndarray]
    curve: dict[str, np.ndarray] | None
    per_example: np.ndarray | None
    launches: list[dict[str, Any]]

    @property
    def epochs(self) -> float:
        return self.config.num_steps / self.config.steps_per_epoch

    def evaluation(self, proposal: str = "hmc_moments", **protocol: Any) -> dict[str, Any]:
        """The final test log-likelihood record with ``proposal`` and the other fields of
        ``EvaluationConfig`` in ``protocol`` (e.g. ``num_starts=4, step_size_per_chain=True,
        num_examples=1000``): the configured protocol's is in results.json, the others in
        evaluation-*.json (``evaluation_file_name``); its per-image estimates under 'per_example'
        when stored. Raises FileNotFoundError naming the command that makes a missing one."""
        record = self.results["test_log_likelihood"]
        if record["proposal"] == proposal and not protocol:
            return record | {"per_example": self.per_example}
        path = self.path / evaluation_file_name(
            self.config.replace(evaluation={"proposal": proposal, **protocol}).evaluation)
        if not path.exists():
            options = "".join(f" {name}={value!r}" for name, value in protocol.items())
            raise FileNotFoundError(f"{path}: run {self.name} has no evaluation with proposal {proposal!r}{options}; "
                                    f"make it with: python -m vcd_helpers evaluate {self.path} --proposal {proposal} "
                                    "(see its --help for the other settings)")
        estimates = path.with_suffix(".npy")
        return read_json_object(path) | {"per_example": read_array(estimates) if estimates.exists() else None}

    def metric_mean(self, column: str, start_epoch: float, end_epoch: float) -> float:
        """The mean of a metrics.csv column over the rows logged after epoch ``start_epoch`` and up
        to epoch ``end_epoch``. Raises ValueError for a window that holds no row."""
        epoch = self.metrics["step"] / self.config.steps_per_epoch
        rows = (epoch > start_epoch) & (epoch <= end_epoch)
        if not rows.any():
            raise ValueError(f"epochs ({start_epoch}, {end_epoch}] hold no metrics row of run {self.name}: "
                             f"its rows span epochs {epoch[0]:g} to {epoch[-1]:g}")
        return float(self.metrics[column][rows].mean())

    def local_baseline(self) -> np.ndarray | None:
        """The final per-image control variate [50,000] (local and scheduled runs), or None."""
        path = self.path / LOCAL_BASELINE_FILE
        return read_array(path) if path.exists() else None


def paired_runs(a: FinishedRun, b: FinishedRun, confidence: float = 0.95) -> Interval:
    """Run ``a``'s final test log-likelihood minus ``b``'s on the same test images, with its t interval
    (``paired_difference`` of their per-image estimates). Raises ValueError when a run has no per-image
    estimates or the two were evaluated on different images."""
    for run in (a, b):
        if run.per_example is None:
            raise ValueError(f"run {run.name} has no per-image estimates ({PER_EXAMPLE_FILE}): it cannot be paired")
    return paired_difference(a.per_example, b.per_example, confidence)


def load_run(directory: str | os.PathLike) -> FinishedRun:
    """A finished run's files. Raises RunDirectoryError when the run has not finished."""
    path = Path(directory)
    config = read_config(path)
    if config is None:
        raise RunDirectoryError(f"{path} holds no config.json: not a results directory")
    results = read_results(path)
    curve = read_curve(path) if (path / CURVE_FILE).exists() else None
    per_example = read_array(path / PER_EXAMPLE_FILE) if (path / PER_EXAMPLE_FILE).exists() else None
    return FinishedRun(path.name, path, config, results, read_metrics(path), curve, per_example, read_launches(path))

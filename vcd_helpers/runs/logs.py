"""What a training writes as it goes: metrics.csv with TensorBoard scalars (and the comparison of
the rows a resumed run writes again), and the learning curve's periodic evaluations."""

from __future__ import annotations

import csv
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from vcd_helpers.config import Config
from vcd_helpers.data import load_binarized_mnist
from vcd_helpers.evaluation import make_evaluator
from vcd_helpers.files import write_atomic
from vcd_helpers.model import VAE
from vcd_helpers.results import CURVE_COLUMNS, CURVE_STRINGS, RunDirectoryError
from vcd_helpers.runs.directory import RunDirectory, keep_rows_up_to
from vcd_helpers.runs.evaluate import evaluation_record
from vcd_helpers.timing import time_calls


def window_means(window: dict[str, list[float]], names: list[str]) -> tuple[dict[str, float], list[str]]:
    """A logging window's mean of each metric, and those means as metrics.csv writes them (7
    significant digits: what a resumed run, or a replay, is compared by)."""
    means = {name: float(np.mean(window[name])) for name in names}
    return means, [f"{means[n]:.7g}" for n in names]


class ResumeDiffers(RunDirectoryError):
    """A resumed run wrote a row again that differs from the one it replaces: resumed this way,
    it would no longer be the run it was."""


class MetricsLog:
    """metrics.csv and TensorBoard scalars, one row per logging window of mean metrics.

    A resumed run writes again the rows its previous process wrote after the checkpoint; each
    such row is compared with the one it replaces (``resume_check``). Resume is exact, so they
    must be equal, also after the code changed in between; the first row that differs stops the
    run (``ResumeDiffers``) before it saves anything, with metrics.csv as the previous process
    left it."""

    def __init__(self, run: RunDirectory, names: list[str], resume_step: int,
                 on_replayed: Callable[[dict[str, Any]], None] | None = None, what_changed: str = ""):
        """``on_replayed(resume_check())`` is called once, as soon as every replaced row has been
        written again, or one differs (or at ``close`` for those that were), so a later kill
        cannot lose it. ``what_changed``: what differs from the process that wrote the replaced
        rows (code, machine, threads), for the message that refuses a difference."""
        self.what_changed = what_changed
        self.names = names
        self.columns = ["step", "wall_time", *names]
        self.replaced = {int(row[0]): row for row in keep_rows_up_to(run.metrics_file, self.columns, resume_step)}
        self.compared = 0
        self.max_relative_difference = 0.0
        self.on_replayed = on_replayed
        new_file = not run.metrics_file.exists()
        self.file = open(run.metrics_file, "a", newline="")
        self.writer = csv.writer(self.file)
        if new_file:
            self.writer.writerow(self.columns)
        self.summaries = tf.summary.create_file_writer(str(run.tensorboard_dir))
        self.window: dict[str, list[float]] = {name: [] for name in names}

    def add(self, metrics: dict[str, float]) -> None:
        for name in self.names:
            self.window[name].append(metrics[name])

    def write(self, step: int, wall_time: float) -> dict[str, float]:
        """Close the window at ``step``: one CSV row and TensorBoard scalars of the means."""
        means, cells = window_means(self.window, self.names)
        row = [str(step), f"{wall_time:.3f}", *cells]
        if step in self.replaced:  # skip the wall time: only the numbers must agree
            old_row = self.replaced.pop(step)
            old = np.array(old_row[2:], dtype=np.float64)
            new = np.array(row[2:], dtype=np.float64)
            difference = np.abs(new - old) / np.maximum(np.abs(old), np.finfo(np.float64).tiny)
            self.compared += 1
            self.max_relative_difference = max(self.max_relative_difference, float(np.max(difference, initial=0.0)))
            if self.max_relative_difference > 0:
                self._refuse(step, old_row)
            if not self.replaced:
                self._report()
        self.writer.writerow(row)
        self.file.flush()
        with self.summaries.as_default(step=step):
            for name, value in means.items():
                tf.summary.scalar(name, value)
            tf.summary.scalar("wall_time", wall_time)
        self.window = {name: [] for name in self.names}
        return means

    def resume_check(self) -> dict[str, Any] | None:
        """How the rows written again compare with the ones they replaced (None: none were)."""
        if not self.compared:
            return None
        return {"rows_compared": self.compared, "identical": self.max_relative_difference == 0.0,
                "max_relative_difference": self.max_relative_difference}

    def _refuse(self, step: int, old_row: list[str]) -> None:
        """Put back the rows this process would have replaced (the rows before ``step`` it wrote
        are equal to theirs), report the check, and raise ResumeDiffers."""
        for row in [old_row, *(self.replaced[s] for s in sorted(self.replaced))]:
            self.writer.writerow(row)
        self.file.flush()
        self.replaced = {}
        check = self.resume_check()
        self._report()
        raise ResumeDiffers(
            f"resume check: the metrics row of step {step}, computed again, differs from the one the run wrote "
            f"(by up to {check['max_relative_difference']:.2g}, relative): resumed this way, the run would no longer "
            f"be the run it was, so it stops here and saves nothing. {self.what_changed} Resume it where it ran, with "
            "the code and thread count that trained it, or train again into a new --results directory")

    def _report(self) -> None:
        check, self.compared = self.resume_check(), 0  # reported once
        if check is not None and self.on_replayed is not None:
            self.on_replayed(check)

    def close(self) -> None:
        self._report()
        self.file.close()
        self.summaries.close()


class LearningCurve:
    """learning_curve.csv: the run evaluates itself every ``config.curve_every_steps`` steps with
    ``config.curve`` (a fixed subset, a fixed seed), so the curve needs no stored checkpoints."""

    def __init__(self, run: RunDirectory, config: Config, model: VAE, resume_step: int):
        self.config = config
        self.path = run.curve_file
        keep_rows_up_to(self.path, CURVE_COLUMNS, resume_step, CURVE_STRINGS)
        if not self.path.exists():
            write_atomic(self.path, ",".join(CURVE_COLUMNS) + "\r\n")
        self.evaluate = make_evaluator(model, config.curve, config.hmc)
        self.images = load_binarized_mnist(config.curve.split)

    def due(self, step: int) -> bool:
        return step % self.config.curve_every_steps == 0

    def record(self, step: int, train_seconds: float) -> float:
        """Evaluate now, as step ``step``, and append the row; returns the seconds it took."""
        timed = time_calls(lambda: self.evaluate(self.images, self.config.seed), repeats=1, warmup=0)
        record, seconds = evaluation_record(timed.outputs[0], self.config.curve), timed.median
        row = [step, f"{step / self.config.steps_per_epoch:.4f}", f"{train_seconds:.3f}", f"{record['mean']:.6f}",
               record["standard_error"], record["num_examples"], record["num_samples"], record["proposal"],
               f"{seconds:.2f}"]
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerow(row)
        return seconds

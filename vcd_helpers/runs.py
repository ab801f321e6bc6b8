"""A training run in a results directory: resolved config, metrics, checkpoints, results.

Layout of a results directory ``DIR``:

    DIR/config.json      the resolved configuration (what ``Config.to_dict`` gives)
    DIR/metrics.csv      one row per logging window: step, wall_time and the window's mean metrics
    DIR/tensorboard/     the same scalars for TensorBoard
    DIR/checkpoints/     tf.train checkpoints (the newest few)
    DIR/results.json     written at the end: test log-likelihood, speed, device, versions, command
    DIR/evaluation.json  written by ``evaluate_run`` (``python -m vcd_helpers evaluate DIR``)

A checkpoint holds everything a run needs to continue exactly: the weights, the optimisers'
slots, the control variate, the adapted HMC step size, the step counter and the wall time so far.
The data position and every random draw are pure functions of (seed, step) (see
``data.indexed_batches`` and the trainers), so restoring the step counter restores them too.
Running the same command again on a directory whose run was interrupted therefore resumes from
the last checkpoint and produces the same rows and the same final metrics as a run that was never
interrupted. A directory holding a run with another configuration is refused.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from vcd_helpers.config import Config
from vcd_helpers.data import data_source, indexed_batches, load_binarized_mnist
from vcd_helpers.devices import device_summary, package_versions
from vcd_helpers.distributed import ReplicatedVCDTrainer, strategy_name
from vcd_helpers.evaluation import EvaluationResult, evaluate_log_likelihood
from vcd_helpers.model import VAE
from vcd_helpers.training import build_trainer, fit

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.csv"
RESULTS_FILE = "results.json"
EVALUATION_FILE = "evaluation.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
KEPT_CHECKPOINTS = 3
VERSION_PACKAGES = ("tensorflow", "tensorflow-probability", "numpy", "vcd_helpers")


class RunDirectoryError(RuntimeError):
    """The results directory cannot be used for this run (it holds something else)."""


def versions() -> dict[str, str]:
    """Python and the versions of the packages that decide a run's numbers."""
    return {"python": sys.version.split()[0]} | package_versions(VERSION_PACKAGES)


def _differences(stored: dict[str, Any], wanted: dict[str, Any], prefix: str = "") -> list[str]:
    """Human-readable list of the keys whose values differ between two config dicts."""
    out = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key, "<missing>"), wanted.get(key, "<missing>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, prefix=f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} in the directory, {b!r} requested")
    return out


@dataclass
class RunDirectory:
    """Paths of one results directory, and the rule for (re)using it."""

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    config_file = property(lambda self: self.path / CONFIG_FILE)
    metrics_file = property(lambda self: self.path / METRICS_FILE)
    results_file = property(lambda self: self.path / RESULTS_FILE)
    checkpoint_dir = property(lambda self: self.path / CHECKPOINT_DIR)
    tensorboard_dir = property(lambda self: self.path / TENSORBOARD_DIR)

    def stored_config(self) -> Config | None:
        if not self.config_file.exists():
            return None
        return Config.from_dict(json.loads(self.config_file.read_text()))

    def claim(self, config: Config) -> None:
        """Make the directory this run's, or raise RunDirectoryError if it holds another run.

        An empty or missing directory is claimed by writing ``config.json``. A directory with
        the same resolved config is reused (the run resumes). Anything else is refused.
        """
        stored = self.stored_config()
        if stored is None:
            if self.path.exists() and any(self.path.iterdir()):
                raise RunDirectoryError(
                    f"{self.path} is not empty and holds no {CONFIG_FILE}: it is not a results "
                    "directory of this package; choose an empty or new directory")
            self.path.mkdir(parents=True, exist_ok=True)
            self.config_file.write_text(config.to_json() + "\n")
            return
        differences = _differences(stored.to_dict(), config.to_dict())
        if differences:
            raise RunDirectoryError(
                f"{self.path} holds a run with a different configuration; refusing to overwrite it. "
                "Differences: " + "; ".join(differences)
                + ". Use a new --results directory, or the same options to resume that run.")


class MetricsLog:
    """metrics.csv and TensorBoard scalars, one row per logging window of mean metrics."""

    def __init__(self, run: RunDirectory, names: list[str], resume_step: int):
        self.names = names
        self.columns = ["step", "wall_time", *names]
        self._keep_rows_up_to(run.metrics_file, resume_step)
        new_file = not run.metrics_file.exists()
        self.file = open(run.metrics_file, "a", newline="")
        self.writer = csv.writer(self.file)
        if new_file:
            self.writer.writerow(self.columns)
        self.summaries = tf.summary.create_file_writer(str(run.tensorboard_dir))
        self.window: dict[str, list[float]] = {name: [] for name in names}

    def _keep_rows_up_to(self, path: Path, step: int) -> None:
        # Rows written after the checkpoint we resume from are written again by the resumed run.
        if not path.exists():
            return
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows or rows[0] != self.columns:
            raise RunDirectoryError(f"{path} has columns {rows[0] if rows else []}, expected {self.columns}")
        kept = [rows[0]] + [row for row in rows[1:] if int(row[0]) <= step]
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows(kept)

    def add(self, metrics: dict[str, float]) -> None:
        for name in self.names:
            self.window[name].append(metrics[name])

    def write(self, step: int, wall_time: float) -> dict[str, float]:
        """Close the window at ``step``: one CSV row and TensorBoard scalars of the means."""
        means = {name: float(np.mean(values)) for name, values in self.window.items()}
        self.writer.writerow([step, f"{wall_time:.3f}", *(f"{means[n]:.7g}" for n in self.names)])
        self.file.flush()
        with self.summaries.as_default(step=step):
            for name, value in means.items():
                tf.summary.scalar(name, value)
            tf.summary.scalar("wall_time", wall_time)
        self.window = {name: [] for name in self.names}
        return means

    def close(self) -> None:
        self.file.close()
        self.summaries.close()


def default_steps_per_call(config: Config) -> int:
    """Steps per host call of the training command: up to 10, dividing the logging interval so
    that every log row and checkpoint falls at the end of a call."""
    return math.gcd(config.log_every_steps, 10)


def train_run(config: Config, results_dir: str | os.PathLike, *, command: str = "", progress: bool = True,
              jit_compile: bool = True, steps_per_call: int | None = None,
              strategy: tf.distribute.Strategy | None = None) -> dict[str, Any]:
    """Train ``config`` into ``results_dir``, resuming from its last checkpoint if it has one.

    The step is compiled with XLA (``jit_compile``) and run ``steps_per_call`` steps per host
    call by the in-graph loop (default ``default_steps_per_call``); it must divide
    ``config.log_every_steps``. With a ``strategy`` (``distributed.build_strategy``) the VCD step
    runs data-parallel on its replicas (a plain ``tf.function``: ``jit_compile`` is ignored).

    Returns the contents of results.json. A run that already finished returns its results
    without training again. Raises RunDirectoryError for a directory holding another run, and
    FloatingPointError (naming the metric and step) when a loss becomes NaN or Inf; the last
    good checkpoint is left in place.
    """
    steps_per_call = steps_per_call or default_steps_per_call(config)
    if config.log_every_steps % steps_per_call:
        raise ValueError(f"steps_per_call={steps_per_call} is invalid: must divide "
                         f"log_every_steps={config.log_every_steps}")
    run = RunDirectory(Path(results_dir))
    run.claim(config)
    if run.results_file.exists():
        return json.loads(run.results_file.read_text())

    if strategy is None:
        trainer = build_trainer(config, jit_compile=jit_compile)
    elif config.method != "vcd":
        raise ValueError(f"method={config.method!r} is invalid with a distribution strategy: only 'vcd' is replicated")
    else:
        trainer = ReplicatedVCDTrainer(config, strategy)
        jit_compile = False
    wall_time = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="wall_time")
    checkpoint = tf.train.Checkpoint(trainer=trainer, wall_time=wall_time)
    manager = tf.train.CheckpointManager(checkpoint, run.checkpoint_dir, max_to_keep=KEPT_CHECKPOINTS)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    start_step = int(trainer.step.numpy())
    elapsed_before = float(wall_time.numpy())
    if progress and start_step:
        print(f"resuming {run.path} from step {start_step} of {config.num_steps}", flush=True)

    images = load_binarized_mnist("train")[: config.train_examples]
    batches = indexed_batches(images, config.batch_size, config.seed, start_step=start_step)
    log = MetricsLog(run, list(trainer.metric_names), resume_step=start_step)
    started = time.perf_counter()
    last_logged: dict[str, float] = {}
    window_ends: list[tuple[int, float]] = [(start_step, elapsed_before)]

    def on_step(step: int, metrics: dict[str, float]) -> None:
        nonlocal last_logged
        log.add(metrics)
        now = elapsed_before + time.perf_counter() - started
        if step % config.log_every_steps == 0 or step == config.num_steps:
            last_logged = log.write(step, now)
            window_ends.append((step, now))
        if step % config.checkpoint_every_steps == 0 or step == config.num_steps:
            wall_time.assign(now)
            manager.save(checkpoint_number=step)

    try:
        fit(trainer, batches, config.num_steps - start_step, steps_per_call=steps_per_call, progress=progress,
            description=f"{config.name} ({config.method})", on_step=on_step)
    except FloatingPointError as error:
        kept = manager.latest_checkpoint or "none yet"
        raise FloatingPointError(f"{error}. The run stopped; its last good checkpoint is {kept}") from None
    finally:
        log.close()
    train_seconds = elapsed_before + time.perf_counter() - started

    evaluation = _evaluate(trainer.model, config)
    results = {
        "name": config.name,
        "method": config.method,
        "steps": config.num_steps,
        "epochs": config.num_steps / config.steps_per_epoch,
        "batch_size": config.batch_size,
        "final_metrics": last_logged,
        "test_log_likelihood": _evaluation_record(evaluation, config),
        "train_seconds": round(train_seconds, 2),
        "examples_per_second": round(config.num_steps * config.batch_size / train_seconds, 1),
        "ms_per_step": round(1000 * train_seconds / config.num_steps, 2),
        "steady_ms_per_step": _steady_ms_per_step(window_ends),
        "data_source": data_source().source,
        "device": device_summary(),
        "versions": versions(),
        "jit_compile": jit_compile,
        "strategy": {"name": strategy_name(strategy), "replicas": strategy.num_replicas_in_sync if strategy else 1},
        "steps_per_call": steps_per_call,
        "command": command,
    }
    run.results_file.write_text(json.dumps(results, indent=2) + "\n")
    return results


def _steady_ms_per_step(window_ends: list[tuple[int, float]]) -> float | None:
    """Median ms per step over the logging windows of this process, leaving out its first
    window (it holds the compilation); None when there are fewer than two windows."""
    rates = [1000 * (t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(window_ends[1:], window_ends[2:])]
    return round(float(np.median(rates)), 2) if rates else None


def _evaluate(model: VAE, config: Config) -> EvaluationResult:
    images = load_binarized_mnist(config.evaluation.split)
    return evaluate_log_likelihood(model, images, config.evaluation, config.hmc, seed=config.seed)


def _evaluation_record(result: EvaluationResult, config: Config) -> dict[str, Any]:
    per_example = result.per_example
    return {
        "split": config.evaluation.split,
        "mean": result.mean_log_likelihood,
        "standard_error": float(per_example.std(ddof=1) / math.sqrt(len(per_example))) if len(per_example) > 1 else None,
        "num_examples": int(len(per_example)),
        "proposal": result.proposal,
        "num_samples": result.num_samples,
    }


def read_metrics(results_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """metrics.csv of a results directory as {column: [rows] array} (step as int)."""
    with open(Path(results_dir) / METRICS_FILE, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise RunDirectoryError(f"{results_dir} has no logged metrics yet")
    return {name: np.array([row[name] for row in rows], dtype=np.int64 if name == "step" else np.float64)
            for name in rows[0]}


def read_results(results_dir: str | os.PathLike) -> dict[str, Any]:
    """results.json of a finished run."""
    path = Path(results_dir) / RESULTS_FILE
    if not path.exists():
        raise RunDirectoryError(f"{results_dir} has no {RESULTS_FILE}: the run has not finished")
    return json.loads(path.read_text())


def restore_model(results_dir: str | os.PathLike) -> tuple[VAE, Config, int]:
    """The model of a results directory at its latest checkpoint: (model, config, step)."""
    run = RunDirectory(Path(results_dir))
    config = run.stored_config()
    if config is None:
        raise RunDirectoryError(f"{run.path} holds no {CONFIG_FILE}: not a results directory")
    latest = tf.train.latest_checkpoint(run.checkpoint_dir)
    if latest is None:
        raise RunDirectoryError(f"{run.path} has no checkpoint yet in {run.checkpoint_dir}")
    trainer = build_trainer(config, jit_compile=False)
    tf.train.Checkpoint(trainer=trainer).restore(latest).expect_partial()
    return trainer.model, config, int(trainer.step.numpy())


def evaluate_run(results_dir: str | os.PathLike) -> dict[str, Any]:
    """Recompute the configured log-likelihood from the latest checkpoint; writes evaluation.json."""
    model, config, step = restore_model(results_dir)
    record = _evaluation_record(_evaluate(model, config), config) | {"checkpoint_step": step}
    (Path(results_dir) / EVALUATION_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record

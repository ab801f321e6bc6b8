"""A training run in a results directory: resolved config, metrics, checkpoints, results.

The directory's layout, and the one way to read each of its files, are in ``run_files``.

A checkpoint holds everything a run needs to continue exactly: the weights, the optimisers'
slots, the control variate, the adapted HMC step size, the step counter and the wall time so far.
The data position and every random draw are pure functions of (seed, step) (see
``data.indexed_batches`` and the trainers), so restoring the step counter restores them too.
Running the same command again on a directory whose run was interrupted therefore resumes from
the last checkpoint and produces the same rows and the same final metrics as a run that was never
interrupted. A directory holding a run with another configuration is refused.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import hashlib
import io
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from vcd_helpers.config import Config, EvaluationConfig, check_positive_int
from vcd_helpers.data import data_source, indexed_batches, load_binarized_mnist
from vcd_helpers.devices import code_version, compute_threads, cpu_model, device_summary, package_versions
from vcd_helpers.distributed import strategy_name
from vcd_helpers.evaluation import EvaluationResult, ais_log_likelihood, make_evaluator
from vcd_helpers.files import npy_bytes, write_atomic
from vcd_helpers.model import VAE
# COMMITTED_RESULTS and read_results are imported for the chapters, which read them as runs.*.
from vcd_helpers.run_files import (CHECKPOINT_DIR, COMMITTED_RESULTS, CONFIG_FILE, CURVE_COLUMNS, CURVE_FILE,
                                   CURVE_STRINGS, LAUNCHES_FILE, LOCAL_BASELINE_FILE, LOCK_FILE, METRICS_FILE,
                                   MODEL_DIR, MODEL_PREFIX, PARTIAL_DIR, PER_EXAMPLE_FILE, RESULTS_FILE,
                                   RESUME_CHECKS_FILE, TENSORBOARD_DIR, RunDirectoryError, append_jsonl,
                                   checkpoint_steps, csv_rows, evaluation_file_name, finished_results, read_config,
                                   read_launches, read_metrics, read_partial, read_results, warn)
from vcd_helpers.timing import Stopwatch, time_calls
from vcd_helpers.trainers import build_trainer, check_chain_shards
from vcd_helpers.training import Trainer, fit

#: Version of results.json's layout: 2 added schema, code, warnings, evaluation and curve seconds.
RESULTS_SCHEMA = 2
KEPT_CHECKPOINTS = 3
VERSION_PACKAGES = ("tensorflow", "tensorflow-probability", "numpy", "vcd_helpers")


class RunInterrupted(KeyboardInterrupt):
    """Training stopped by SIGINT or SIGTERM; the message says where and how to resume."""


#: A model that gives every pixel probability 1/2 scores 784 log(1/2) = -543.4 nats per image.
COIN_FLIP_LOG_LIKELIHOOD = 784 * math.log(0.5)
#: A run ten times worse than that, in its test log-likelihood or its final per-image loss (an
#: untrained model starts near 600), has diverged even if nothing became NaN.
DIVERGED_FACTOR = 10


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
    curve_file = property(lambda self: self.path / CURVE_FILE)
    launches_file = property(lambda self: self.path / LAUNCHES_FILE)
    model_prefix = property(lambda self: self.path / MODEL_DIR / MODEL_PREFIX)
    lock_file = property(lambda self: self.path / LOCK_FILE)

    @contextlib.contextmanager
    def lock(self, holder: str):
        """Hold the directory for this process (an flock, released by the kernel however the
        process ends, so a killed run never blocks its own resume). Raises RunDirectoryError
        naming the holder when another process has it."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryError(f"{self.path} is a file, not a directory: give a new or existing directory")
        self.path.mkdir(parents=True, exist_ok=True)
        created = not self.lock_file.exists()
        with open(self.lock_file, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                raise RunDirectoryError(
                    f"{self.path} is in use by {f.read().strip() or 'another process'}; wait for it to "
                    "finish, or stop it (the same command resumes it)") from None
            f.truncate(0)
            f.write(f"process {os.getpid()}: {holder}\n")
            f.flush()
            try:
                yield
            finally:
                # A directory refused (not a run's) keeps no trace of the attempt.
                if created and not self.config_file.exists():
                    self.lock_file.unlink(missing_ok=True)
                fcntl.flock(f, fcntl.LOCK_UN)

    def holder(self) -> str | None:
        """Who holds the directory's lock now (a description), or None when nobody does."""
        if not self.lock_file.exists():
            return None
        with open(self.lock_file) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return f.read().strip() or "another process"
            fcntl.flock(f, fcntl.LOCK_UN)
        return None

    def stored_config(self) -> Config | None:
        """The config of the run this directory holds (None for a new directory).

        Raises RunDirectoryError naming config.json when it is damaged."""
        return read_config(self.path)

    def stored_results(self) -> dict[str, Any] | None:
        """results.json of a finished run; None when absent or damaged (``finished_results``: the
        run is then evaluated again, with a warning)."""
        results = finished_results(self.path)
        if results is None and self.results_file.exists():
            warn(None, f"{self.results_file} is damaged; evaluating the finished run again to rewrite it")
        return results

    def claim(self, config: Config) -> None:
        """Make the directory this run's, or raise RunDirectoryError if it holds another run.

        An empty or missing directory is claimed by writing ``config.json``. A directory with
        the same resolved config is reused (the run resumes). Anything else is refused.
        """
        stored = self.stored_config()
        if stored is None:
            if self.path.exists() and any(p.name != LOCK_FILE for p in self.path.iterdir()):
                raise RunDirectoryError(
                    f"{self.path} is not empty and holds no {CONFIG_FILE}: it is not a results "
                    "directory of this package; choose an empty or new directory")
            self.path.mkdir(parents=True, exist_ok=True)
            write_atomic(self.config_file, config.to_json() + "\n")
            return
        differences = _differences(stored.to_dict(), config.to_dict())
        if differences:
            raise RunDirectoryError(
                f"{self.path} holds a run with a different configuration; refusing to overwrite it. "
                "Differences: " + "; ".join(differences)
                + ". Use a new --results directory, or the same options to resume that run.")


def keep_rows_up_to(path: Path, columns: list[str], step: int, strings: tuple[str, ...] = ()) -> list[list[str]]:
    """Drop the rows of a CSV file (``run_files.csv_rows``) written after ``step``: a run resumed
    from the checkpoint at ``step`` writes them again, identically. Returns the dropped rows.
    Raises RunDirectoryError naming the file and line when it is damaged."""
    if not path.exists():
        return []
    _, rows = csv_rows(path, columns, strings)
    kept = [columns] + [row for _, row in rows if int(row[0]) <= step]
    buffer = io.StringIO()
    csv.writer(buffer).writerows(kept)
    write_atomic(path, buffer.getvalue())
    return [row for _, row in rows if int(row[0]) > step]


def _rows_up_to(path: Path, step: int, strings: tuple[str, ...] = ()) -> int:
    """How many rows of a CSV file (first column: step) are at or before ``step`` (0: no file).
    Raises RunDirectoryError naming the file and line when it is damaged."""
    if not path.exists():
        return 0
    return sum(1 for _, row in csv_rows(path, strings=strings)[1] if int(row[0]) <= step)


class MetricsLog:
    """metrics.csv and TensorBoard scalars, one row per logging window of mean metrics.

    A resumed run writes again the rows its previous process wrote after the checkpoint; each
    such row is compared with the one it replaces (``resume_check``): resume is exact, so they
    must agree, also after the code changed in between (up to float round-off, if the change
    touched the arithmetic)."""

    def __init__(self, run: RunDirectory, names: list[str], resume_step: int,
                 on_replayed: Callable[[dict[str, Any]], None] | None = None):
        """``on_replayed(resume_check())`` is called once, as soon as every replaced row has been
        written again (or at ``close`` for those that were), so a later kill cannot lose it."""
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
        means = {name: float(np.mean(values)) for name, values in self.window.items()}
        row = [str(step), f"{wall_time:.3f}", *(f"{means[n]:.7g}" for n in self.names)]
        if step in self.replaced:  # skip the wall time: only the numbers must agree
            old = np.array(self.replaced.pop(step)[2:], dtype=np.float64)
            new = np.array(row[2:], dtype=np.float64)
            difference = np.abs(new - old) / np.maximum(np.abs(old), np.finfo(np.float64).tiny)
            self.compared += 1
            self.max_relative_difference = max(self.max_relative_difference, float(np.max(difference, initial=0.0)))
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
        record, seconds = _evaluation_record(timed.outputs[0], self.config.curve), timed.median
        row = [step, f"{step / self.config.steps_per_epoch:.4f}", f"{train_seconds:.3f}", f"{record['mean']:.6f}",
               record["standard_error"], record["num_examples"], record["num_samples"], record["proposal"],
               f"{seconds:.2f}"]
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerow(row)
        return seconds


def _checkpoint_files(run: RunDirectory) -> dict[int, str]:
    """{step: checkpoint path prefix} of the checkpoints on disk, found by their files (the
    manager's index may be missing, or be written an instant after them)."""
    return {step: str(run.checkpoint_dir / f"ckpt-{step}") for step in checkpoint_steps(run.checkpoint_dir)}


def _newest_checkpoint_name(run: RunDirectory) -> str | None:
    files = _checkpoint_files(run)
    return Path(files[max(files)]).name if files else None


def _repair_checkpoint_index(run: RunDirectory, warnings: list[str]) -> None:
    """Rewrite the checkpoint index (``checkpoints/checkpoint``, which tf.train.CheckpointManager
    reads) from the checkpoint files when it cannot be parsed: garbage in it stopped a run whose
    checkpoints were all intact from resuming. Says so in a warning naming the file."""
    index = run.checkpoint_dir / "checkpoint"
    if not index.exists():
        return
    try:
        tf.train.get_checkpoint_state(str(run.checkpoint_dir))
        return
    except Exception as error:  # text_format.ParseError, UnicodeDecodeError: whatever the damage
        problem = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    files = _checkpoint_files(run)
    if files:
        tf.compat.v1.train.update_checkpoint_state(str(run.checkpoint_dir), files[max(files)],
                                                    [files[step] for step in sorted(files)])
    else:
        index.unlink()
    warn(warnings, f"{index} was damaged ({problem}); rewritten from the {len(files)} checkpoint file(s) there")


def _restore_newest(checkpoint: tf.train.Checkpoint, run: RunDirectory, warnings: list[str], *,
                    partial: bool = False) -> str | None:
    """Restore the newest checkpoint that restores, found from its files (the index may be
    missing or damaged); returns its path (None: no checkpoint, a fresh start). A damaged
    checkpoint is skipped with a warning; a directory whose checkpoints all fail is an error,
    never a silent restart from step 0 that would overwrite them. ``partial``: ``checkpoint``
    names only some of what the files hold (an evaluation reading the model)."""
    candidates = _checkpoint_files(run)
    if not candidates:
        return None
    failures = []
    for step in sorted(candidates, reverse=True):
        try:
            status = checkpoint.restore(candidates[step]).assert_existing_objects_matched()
            if partial:
                status.expect_partial()  # no warning about what the file holds beyond the objects asked for
        except (tf.errors.OpError, ValueError, IndexError, AssertionError) as error:
            failures.append(f"{Path(candidates[step]).name} ({type(error).__name__}: {str(error).splitlines()[0]})")
            continue
        for failure in failures:
            warn(warnings, f"checkpoint {failure} could not be restored; resuming from {Path(candidates[step]).name}")
        newer = sorted(n for n in checkpoint_steps(run.checkpoint_dir, "ckpt-*.data-*") - set(candidates) if n > step)
        if newer:
            warn(warnings, f"{', '.join(f'ckpt-{n}' for n in newer)} in {run.checkpoint_dir}: data without an .index "
                           f"file, which cannot be restored; resuming from {Path(candidates[step]).name}")
        return candidates[step]
    raise RunDirectoryError(f"no checkpoint in {run.checkpoint_dir} could be restored: {'; '.join(failures)}. "
                            "Move the directory aside and train into a new --results directory")


def _record_launch(run: RunDirectory, start_step: int, command: str, warnings: list[str],
                   chain_shards: int | None) -> None:
    """Append this process to launches.jsonl: which code and machine trained which steps, and how
    (threads, blocks of the chain: speed only; None for a trainer without a chain)."""
    launch = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "start_step": start_step,
              "pid": os.getpid(), "code": code_version(), "cpu_model": cpu_model(), "command": command,
              "compute_threads": compute_threads(), "chain_shards": chain_shards, "warnings": warnings}
    append_jsonl(run.launches_file, launch)


def _record_resume_check(run: RunDirectory, start_step: int, check: dict[str, Any]) -> None:
    """Append the comparison of the rows this process wrote again (``MetricsLog``) to
    resume_checks.jsonl, and say it: the long runs test every change of the code this way."""
    check = {"resumed_from": start_step, **check, "code": code_version()["commit"]}
    append_jsonl(run.path / RESUME_CHECKS_FILE, check)
    verdict = ("identical" if check["identical"]
               else f"DIFFERENT, by up to {check['max_relative_difference']:.2g} (relative)")
    print(f"resume check: {check['rows_compared']} row(s) after step {start_step} written again, {verdict}",
          file=sys.stderr, flush=True)


def default_steps_per_call(config: Config) -> int:
    """Steps per host call of the training command: up to 10, dividing the logging interval so
    that every log row and checkpoint falls at the end of a call."""
    return math.gcd(config.log_every_steps, 10)


def train_run(config: Config, results_dir: str | os.PathLike, *, command: str = "", progress: bool = True,
              jit_compile: bool | None = None, steps_per_call: int | None = None,
              strategy: tf.distribute.Strategy | None = None, chain_shards: int | None = None) -> dict[str, Any]:
    """Train ``config`` into ``results_dir``, resuming from its last checkpoint if it has one.

    The trainer is ``trainers.build_trainer(config, execution=strategy, jit_compile=jit_compile,
    chain_shards=chain_shards)`` (None: XLA wherever the execution allows; one block of the chain
    per compute thread), run ``steps_per_call`` steps per host call by the
    in-graph loop (default ``default_steps_per_call``); it must divide ``config.log_every_steps``.
    With a ``strategy`` (``distributed.build_strategy``) the VCD step runs data-parallel on its
    replicas.

    Returns the contents of results.json. A run that already finished returns its results
    without training again. Raises RunDirectoryError for a directory holding another run, and
    FloatingPointError (naming the metric and step) when a loss becomes NaN or Inf; the last
    good checkpoint is left in place.
    """
    # Everything is checked before the directory is touched.
    steps_per_call = default_steps_per_call(config) if steps_per_call is None else steps_per_call
    check_positive_int("steps_per_call", steps_per_call)
    if config.log_every_steps % steps_per_call:
        raise ValueError(f"steps_per_call={steps_per_call} is invalid: must divide "
                         f"log_every_steps={config.log_every_steps}")
    check_chain_shards(config, strategy, chain_shards)
    if strategy_name(strategy) != config.strategy:
        raise ValueError(f"strategy={strategy_name(strategy)!r} is invalid for a config with "
                         f"strategy={config.strategy!r}: build it with distributed.build_strategy(config)")
    run = RunDirectory(Path(results_dir))
    with run.lock(command or "train_run"):
        run.claim(config)
        stored = run.stored_results()
        if stored is not None:
            return stored
        return _train(config, run, command=command, progress=progress, jit_compile=jit_compile,
                      steps_per_call=steps_per_call, strategy=strategy, chain_shards=chain_shards)


def _train(config: Config, run: RunDirectory, *, command: str, progress: bool, jit_compile: bool | None,
           steps_per_call: int, strategy: tf.distribute.Strategy | None,
           chain_shards: int | None) -> dict[str, Any]:
    """``train_run`` on a claimed, locked directory: train to the end, then ``_finish``."""
    trainer = build_trainer(config, execution=strategy, jit_compile=jit_compile, chain_shards=chain_shards)
    train_seconds = _train_to_the_end(config, run, trainer, command=command, progress=progress,
                                      steps_per_call=steps_per_call)
    return _finish(config, run, trainer, train_seconds, command=command, steps_per_call=steps_per_call,
                   strategy=strategy)


def _train_to_the_end(config: Config, run: RunDirectory, trainer: Trainer, *, command: str, progress: bool,
                      steps_per_call: int) -> float:
    """Restore the newest checkpoint and train the rest of the run, logging, evaluating the
    learning curve and checkpointing on the way; returns the run's training seconds (over every
    process that trained it)."""
    # Seconds spent training, the learning curve's evaluations left out: the run's own clock.
    wall_time = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="wall_time")
    checkpoint = tf.train.Checkpoint(trainer=trainer, wall_time=wall_time)
    warnings: list[str] = []
    _repair_checkpoint_index(run, warnings)
    manager = tf.train.CheckpointManager(checkpoint, run.checkpoint_dir, max_to_keep=KEPT_CHECKPOINTS)
    restored = _restore_newest(checkpoint, run, warnings)
    start_step = int(trainer.step.numpy())
    if progress and restored:
        print(f"resuming {run.path} from step {start_step} of {config.num_steps}", flush=True)
    if start_step and not run.metrics_file.exists():
        warn(warnings, f"{run.metrics_file} was missing: its rows up to step {start_step} are lost (TensorBoard "
                        f"events in {run.tensorboard_dir} still hold them); logging continues from there")
    elif start_step and (kept := _rows_up_to(run.metrics_file, start_step)) < start_step // config.log_every_steps:
        warn(warnings, f"{run.metrics_file} holds {kept} of its {start_step // config.log_every_steps} row(s) up to "
                        f"step {start_step}: the others are lost (TensorBoard events in {run.tensorboard_dir} still "
                        "hold them); logging continues from there")
    due = start_step // config.curve_every_steps if config.curve_every_steps else 0
    if due and (kept := _rows_up_to(run.curve_file, start_step, CURVE_STRINGS)) < due:
        warn(warnings, f"{run.curve_file} holds {kept} of its {due} row(s) up to step {start_step}: the others are "
                       "lost, and cannot be computed again (the model at those steps is gone); the curve continues "
                       "from there")
    if start_step and not read_launches(run.path):
        warn(warnings, f"{run.launches_file} holds no record of the process(es) that trained steps up to {start_step}: "
                       "their records (code, machine) are lost; the run's numbers do not depend on them")
    _record_launch(run, start_step, command, warnings, getattr(trainer, "chain_shards", None))

    images = load_binarized_mnist("train")[: config.train_examples]
    batches = indexed_batches(images, config.batch_size, config.seed, start_step=start_step)
    log = MetricsLog(run, list(trainer.metric_names), resume_step=start_step,
                     on_replayed=lambda check: _record_resume_check(run, start_step, check))
    curve = LearningCurve(run, config, trainer.model, start_step) if config.curve_every_steps else None
    clock = Stopwatch(offset=float(wall_time.numpy()))  # the learning curve's evaluations are left out

    def on_step(step: int, metrics: dict[str, float]) -> None:
        log.add(metrics)
        now = clock.elapsed
        if step % config.log_every_steps == 0 or step == config.num_steps:
            log.write(step, now)
        # Before the checkpoint: a run killed during the evaluation resumes before it and redoes it.
        if curve is not None and curve.due(step):
            clock.leave_out(curve.record(step, now))
        if step % config.checkpoint_every_steps == 0 or step == config.num_steps:
            wall_time.assign(now)
            manager.save(checkpoint_number=step)

    try:
        fit(trainer, batches, config.num_steps - start_step, steps_per_call=steps_per_call, progress=progress,
            description=f"{config.name} ({config.method})", on_step=on_step)
    except FloatingPointError as error:
        kept = manager.latest_checkpoint or "none yet"
        raise FloatingPointError(f"{error}. The run stopped; its last good checkpoint is {kept}") from None
    except KeyboardInterrupt:
        kept = _newest_checkpoint_name(run) or "none yet (the run restarts from step 0)"
        raise RunInterrupted(f"interrupted at step {int(trainer.step.numpy())}; checkpoint {kept} kept; run the "
                             "same command to resume") from None
    finally:
        log.close()
    return clock.elapsed


def _finish(config: Config, run: RunDirectory, trainer: Trainer, train_seconds: float, *, command: str,
            steps_per_call: int, strategy: tf.distribute.Strategy | None) -> dict[str, Any]:
    """Save the final model (and local baseline), evaluate it, and write results.json."""
    tf.train.Checkpoint(model=trainer.model, **_chain_state_objects(trainer)).write(str(run.model_prefix))
    local_baseline = getattr(getattr(trainer, "control_variate", None), "local_values", None)
    if local_baseline is not None:  # one value per training image: how stale each one is, in chapter 7
        write_atomic(run.path / LOCAL_BASELINE_FILE, npy_bytes(local_baseline.numpy()))

    evaluation, evaluation_seconds, discard_batches = _evaluate(trainer.model, config.evaluation, config, run.path,
                                                                int(trainer.step.numpy()))
    write_atomic(run.path / PER_EXAMPLE_FILE, npy_bytes(evaluation.per_example.astype(np.float32)))
    try:
        metrics = read_metrics(run.path)
    except RunDirectoryError:  # metrics.csv was lost (a warning says so): nothing to summarise
        metrics = {"step": np.zeros([0], np.int64)}
    warnings: list[str] = []
    launches = read_launches(run.path, warnings)
    warnings = [w for launch in launches for w in launch.get("warnings", [])] + warnings
    loss = "decoder_loss" if "decoder_loss" in metrics else "loss"
    final_loss = float(metrics[loss][-1]) if len(metrics["step"]) else None
    mean = evaluation.mean_log_likelihood
    if not mean > DIVERGED_FACTOR * COIN_FLIP_LOG_LIKELIHOOD or (
            final_loss is not None and not final_loss < -DIVERGED_FACTOR * COIN_FLIP_LOG_LIKELIHOOD):
        warn(warnings, f"the run diverged: its final {loss} is {final_loss:.4g} and its test log-likelihood "
                        f"{mean:.4g}, where a model giving every pixel probability 1/2 scores "
                        f"{COIN_FLIP_LOG_LIKELIHOOD:.1f} nats; lower the learning rate")
    results = {
        "schema": RESULTS_SCHEMA,
        "name": config.name,
        "method": config.method,
        "steps": config.num_steps,
        "epochs": config.num_steps / config.steps_per_epoch,
        "batch_size": config.batch_size,
        "final_metrics": {name: float(values[-1]) for name, values in metrics.items()
                          if name not in ("step", "wall_time")},
        "test_log_likelihood": _evaluation_record(evaluation, config.evaluation),
        "train_seconds": round(train_seconds, 2),
        "examples_per_second": round(config.num_steps * config.batch_size / train_seconds, 1),
        "ms_per_step": round(1000 * train_seconds / config.num_steps, 2),
        "steady_ms_per_step": _steady_ms_per_step(metrics),
        "evaluation_seconds": round(evaluation_seconds, 2),
        "curve_seconds": _curve_seconds(run),
        "data_source": data_source().source,
        "device": device_summary(),
        "versions": versions(),
        "code": {"commits": list(dict.fromkeys(l["code"]["commit"] for l in launches)),
                 "dirty": any(l["code"]["dirty"] for l in launches)},
        "jit_compile": trainer.jit_compile,
        "strategy": {"name": strategy_name(strategy), "replicas": strategy.num_replicas_in_sync if strategy else 1},
        "steps_per_call": steps_per_call,
        "command": command,
        "warnings": warnings,
    }
    write_atomic(run.results_file, json.dumps(results, indent=2) + "\n")
    discard_batches()  # only now: a failure before this line resumes from the saved batches
    return results


def _curve_seconds(run: RunDirectory) -> float:
    """Seconds the learning curve's evaluations took, over every process that trained the run."""
    if not run.curve_file.exists():
        return 0.0
    _, rows = csv_rows(run.curve_file, CURVE_COLUMNS, CURVE_STRINGS)
    return round(sum(float(row[CURVE_COLUMNS.index("eval_seconds")]) for _, row in rows), 2)


def _steady_ms_per_step(metrics: dict[str, np.ndarray]) -> float | None:
    """Median ms per step over the logging windows of metrics.csv (the median leaves out the
    windows that hold a compilation); None when there are fewer than two rows."""
    if len(metrics["step"]) < 2:
        return None
    rates = 1000 * np.diff(metrics["wall_time"]) / np.diff(metrics["step"])
    return round(float(np.median(rates)), 2)


def _evaluate(model: VAE, evaluation: EvaluationConfig, config: Config, results_dir: Path,
              step: int) -> tuple[EvaluationResult, float, Callable[[], None]]:
    """The evaluation of the model at ``step``, the seconds it took over every process that
    worked on it, and a function that discards its saved batches. Each batch is saved as it
    finishes (in ``DIR/partial/``): the full protocol takes tens of minutes on a CPU, and a run
    killed during it resumes from its last batch with the same numbers (batch k's draws depend on
    the seed and k alone). The caller discards the batches once what they serve is written, so
    that a failure in between never costs the evaluation again."""
    key = {"evaluation": dataclasses.asdict(evaluation), "hmc": dataclasses.asdict(config.hmc),
           "seed": config.seed, "step": step}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    partial = results_dir / PARTIAL_DIR / f"{Path(evaluation_file_name(evaluation)).stem}-{digest}"
    done, seconds_before = read_partial(partial)
    clock = Stopwatch(offset=seconds_before)
    last = clock.elapsed

    def save(k: int, estimates: np.ndarray) -> None:
        nonlocal last
        now = clock.elapsed
        partial.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, estimates=estimates, seconds=now - last)
        write_atomic(partial / f"batch-{k:05d}.npz", buffer.getvalue())
        last = now

    images = load_binarized_mnist(evaluation.split)
    result = make_evaluator(model, evaluation, config.hmc)(images, config.seed, done=done, on_batch=save)
    seconds = clock.elapsed

    def discard() -> None:
        shutil.rmtree(partial, ignore_errors=True)
        with contextlib.suppress(OSError):  # other evaluations may still be in progress there
            partial.parent.rmdir()
    return result, seconds, discard


def _summary(per_example: np.ndarray, split: str) -> dict[str, Any]:
    """Mean and standard error of per-image estimates; JSON has no Infinity, so a diverged
    model's are recorded as unknown (None)."""
    with np.errstate(invalid="ignore", over="ignore"):
        mean = float(per_example.mean())
        spread = float(per_example.std(ddof=1) / math.sqrt(len(per_example))) if len(per_example) > 1 else math.nan
    return {"split": split, "mean": mean if math.isfinite(mean) else None,
            "standard_error": spread if math.isfinite(spread) else None, "num_examples": int(len(per_example))}


def _evaluation_record(result: EvaluationResult, evaluation: EvaluationConfig) -> dict[str, Any]:
    return _summary(result.per_example, evaluation.split) | {"proposal": result.proposal,
                                                             "num_samples": result.num_samples}


def _chain_state_objects(trainer: Any) -> dict[str, tf.Module | tf.Variable]:
    """What a VCD trainer carries from step to step around its chain (nothing for the VAE)."""
    return ({"step_size": trainer.step_size, "control_variate": trainer.control_variate}
            if hasattr(trainer, "control_variate") else {})


def _read_final_or_latest(run: RunDirectory, objects: dict[str, tf.Module | tf.Variable], num_steps: int) -> int:
    """Read ``objects`` (named as the trainer names them) from the final weights when the run
    finished, else from its newest checkpoint; returns the step read. Damaged final weights are
    read from the checkpoint of the final step instead (the same weights), with a warning; with
    no such checkpoint, RunDirectoryError names model/ and what to do."""
    damaged = None
    if run.model_prefix.with_suffix(".index").exists():
        try:  # the file may hold more (the chain's state) than the objects asked for
            status = tf.train.Checkpoint(**objects).read(str(run.model_prefix))
            status.assert_existing_objects_matched().expect_partial()
            return num_steps
        except AssertionError as error:
            raise RunDirectoryError(f"{run.model_prefix} lacks {', '.join(objects)}: it was written before the "
                                    f"final weights carried the chain's state ({error})") from None
        except (tf.errors.OpError, ValueError, IndexError) as error:
            damaged = (f"the final weights in {run.model_prefix.parent} are damaged ({type(error).__name__}: "
                       f"{str(error).splitlines()[0] if str(error) else ''})")
    step = tf.Variable(0, dtype=tf.int64)
    # Matched by name inside the trainer: nothing else (optimiser slots) is built or read. Found
    # from the files, falling back past a damaged newest checkpoint as training does.
    restored = _restore_newest(tf.train.Checkpoint(trainer=tf.train.Checkpoint(step=step, **objects)), run, [],
                               partial=True)
    if damaged is None:
        if restored is None:
            raise RunDirectoryError(f"{run.path} has no checkpoint yet in {run.checkpoint_dir}")
        return int(step.numpy())
    if restored is None or int(step.numpy()) != num_steps:
        raise RunDirectoryError(
            f"{damaged}, and no checkpoint of the final step is left in {run.checkpoint_dir}. Restore "
            f"{run.model_prefix.parent} from a copy of the run, or delete it and {run.results_file.name} and run the "
            f"training command on {run.path} again: it saves them again from its last checkpoint and evaluates again")
    warn(None, f"{damaged}; read from checkpoint {Path(restored).name} instead, which holds the same step")
    return num_steps


def _stored_config(run: RunDirectory) -> Config:
    config = run.stored_config()
    if config is None:
        raise RunDirectoryError(f"{run.path} holds no {CONFIG_FILE}: not a results directory")
    return config


def restore_model(results_dir: str | os.PathLike) -> tuple[VAE, Config, int]:
    """The model of a results directory, alone: its final weights (``model/``) when the run
    finished, else its latest checkpoint. Returns (model, config, step)."""
    run = RunDirectory(Path(results_dir))
    config = _stored_config(run)
    model = VAE(config.model, seed=config.seed)
    return model, config, _read_final_or_latest(run, {"model": model}, config.num_steps)


def restore_trainer(results_dir: str | os.PathLike, *, jit_compile: bool | None = None) -> Trainer:
    """A trainer (``build_trainer``) at a run's final state, or its newest checkpoint's while it
    trains, to measure the estimator there: the model and, for VCD, the chain's adapted step size
    and the control variate as the next step would read them; ``step`` is that step.

    The optimisers' slots are not restored (the final weights do not keep them): to train on,
    run the training command on the directory. Raises RunDirectoryError when it holds no state."""
    run = RunDirectory(Path(results_dir))
    config = _stored_config(run)
    trainer = build_trainer(config, jit_compile=jit_compile)
    trainer.step.assign(_read_final_or_latest(run, {"model": trainer.model, **_chain_state_objects(trainer)},
                                              config.num_steps))
    return trainer


def evaluate_run(results_dir: str | os.PathLike, **overrides: Any) -> dict[str, Any]:
    """Recompute the log-likelihood of a run's model (``restore_model``) with its configured
    evaluation, changed by ``overrides`` (fields of EvaluationConfig: proposal, num_samples,
    num_examples, ...). Writes evaluation-*.json (``evaluation_file_name``) and the estimate of
    every image beside it (.npy); returns the record."""
    model, config, step = _restore_writable(results_dir)
    evaluation = dataclasses.replace(config.evaluation, **{k: v for k, v in overrides.items() if v is not None})
    evaluation = dataclasses.replace(evaluation, chunk_size=min(evaluation.chunk_size, evaluation.num_samples))
    result, seconds, discard_batches = _evaluate(model, evaluation, config, Path(results_dir), step)
    record = _save_evaluation(Path(results_dir) / evaluation_file_name(evaluation),
                              _evaluation_record(result, evaluation), result.per_example, step, seconds)
    discard_batches()
    return record


def evaluate_run_ais(results_dir: str | os.PathLike, *, num_examples: int = 100, num_temperatures: int = 1000,
                     num_chains: int = 16) -> dict[str, Any]:
    """The annealed importance sampling estimate of log p(x) (``evaluation.ais_log_likelihood``)
    of the first ``num_examples`` images of the run's evaluation split, with the run's HMC
    settings: an independent check of the importance-sampled number. Writes
    evaluation-ais-T{temperatures}-K{chains}-N{examples}.json and .npy; returns the record."""
    model, config, step = _restore_writable(results_dir)
    # The importance-sampling evaluation's own check: positive, and no more than the split holds.
    evaluation = dataclasses.replace(config.evaluation, num_examples=num_examples)
    images = load_binarized_mnist(evaluation.split)[:evaluation.num_examples]
    timed = time_calls(lambda: ais_log_likelihood(model, images, config.hmc, num_temperatures=num_temperatures,
                                                  num_chains=num_chains, seed=config.seed), repeats=1, warmup=0)
    per_example = timed.outputs[0]
    record = _summary(per_example, config.evaluation.split) | {"method": "ais", "num_temperatures": num_temperatures,
                                                               "num_chains": num_chains}
    name = f"evaluation-ais-T{num_temperatures}-K{num_chains}-N{len(images)}.json"
    return _save_evaluation(Path(results_dir) / name, record, per_example, step, timed.median)


def _restore_writable(results_dir: str | os.PathLike) -> tuple[VAE, Config, int]:
    """``restore_model``, after checking that the evaluation it serves can be saved there."""
    model, config, step = restore_model(results_dir)
    if not os.access(results_dir, os.W_OK):
        raise RunDirectoryError(f"{results_dir} is not writable: the evaluation could not be saved there; "
                                "make it writable, or copy the run to a writable directory first")
    return model, config, step


def _save_evaluation(path: Path, record: dict[str, Any], per_example: np.ndarray, step: int,
                     seconds: float) -> dict[str, Any]:
    record = record | {"checkpoint_step": step, "seconds": round(seconds, 2), "cpu_model": cpu_model(),
                       "code": code_version()}
    write_atomic(path.with_suffix(".npy"), npy_bytes(per_example.astype(np.float32)))
    write_atomic(path, json.dumps(record, indent=2) + "\n")
    return record

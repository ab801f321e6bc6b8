"""A training run in a results directory: ``train_run``, the function behind ``python -m
vcd_helpers train``.

A checkpoint holds everything a run needs to continue exactly: the weights, the optimisers'
slots, the control variate, the adapted HMC step size, the step counter and the wall time so far.
The data position and every random draw are pure functions of (seed, step) (see
``data.indexed_batches`` and the trainers), so restoring the step counter restores them too.
Running the same command again on a directory whose run was interrupted therefore resumes from
the last checkpoint and produces the same rows and the same final metrics as a run that was never
interrupted. A directory holding a run with another configuration is refused.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from vcd_helpers.config import Config
from vcd_helpers.data import data_source, indexed_batches, load_binarized_mnist
from vcd_helpers.devices import device_summary
from vcd_helpers.files import npy_bytes, write_atomic
from vcd_helpers.loops import fit
from vcd_helpers.results import (CURVE_COLUMNS, CURVE_STRINGS, LOCAL_BASELINE_FILE, PER_EXAMPLE_FILE,
                                 RunDirectoryError, csv_rows, finished_results, read_launches, read_metrics, warn)
from vcd_helpers.runs.checkpoints import (KEPT_CHECKPOINTS, newest_checkpoint_name, repair_checkpoint_index,
                                          restore_newest)
from vcd_helpers.runs.directory import (RunDirectory, launch_changes, record_launch, record_resume_check, rows_up_to,
                                        versions)
from vcd_helpers.runs.evaluate import evaluate_saving_batches, evaluation_record
from vcd_helpers.runs.logs import LearningCurve, MetricsLog
from vcd_helpers.timing import Stopwatch
from vcd_helpers.trainers import build_trainer
from vcd_helpers.training import Trainer

#: Version of results.json's layout: 2 added schema, code, warnings, evaluation and curve seconds.
RESULTS_SCHEMA = 2

class RunInterrupted(KeyboardInterrupt):
    """Training stopped by SIGINT or SIGTERM; the message says where and how to resume."""


#: A model that gives every pixel probability 1/2 scores 784 log(1/2) = -543.4 nats per image.
COIN_FLIP_LOG_LIKELIHOOD = 784 * math.log(0.5)
#: A run ten times worse than that, in its test log-likelihood or its final per-image loss (an
#: untrained model starts near 600), has diverged even if nothing became NaN.
DIVERGED_FACTOR = 10

def train_run(config: Config, results_dir: str | os.PathLike, *, command: str = "",
              progress: bool = True) -> dict[str, Any]:
    """Train ``config`` into ``results_dir``, resuming from its last checkpoint if it has one.

    The trainer is ``trainers.build_trainer(config)``, run ``config.steps_per_call`` steps per
    host call by the in-graph loop.

    Returns the contents of results.json. A run that already finished returns its results
    without training again. Raises RunDirectoryError for a directory holding another run, and
    FloatingPointError (naming the metric and step) when a loss becomes NaN or Inf; the last
    good checkpoint is left in place.
    """
    trainer = build_trainer(config)  # first: what it refuses (e.g. a missing device) leaves no directory
    run = RunDirectory(Path(results_dir))
    if finished_results(run.path) is None:  # a finished run returns its results: it needs no data
        # The data too: a set-up that fails (a bad $VCD_DATA_SOURCE, an unwritable cache) claims
        # nothing. load_binarized_mnist keeps each split for the process: later calls cost nothing.
        for split in dict.fromkeys(["train", config.evaluation.split]):
            load_binarized_mnist(split)
    with run.lock(command or "train_run"):
        run.claim(config)
        stored = run.stored_results()
        if stored is not None:
            return stored
        train_seconds = _train_to_the_end(config, run, trainer, command=command, progress=progress)
        return _finish(config, run, trainer, train_seconds, command=command)


def _train_to_the_end(config: Config, run: RunDirectory, trainer: Trainer, *, command: str,
                      progress: bool) -> float:
    """Restore the newest checkpoint and train the rest of the run, logging, evaluating the
    learning curve and checkpointing on the way; returns the run's training seconds (over every
    process that trained it)."""
    # Seconds spent training, the learning curve's evaluations left out: the run's own clock.
    wall_time = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="wall_time")
    checkpoint = tf.train.Checkpoint(trainer=trainer, wall_time=wall_time)
    warnings: list[str] = []
    repair_checkpoint_index(run, warnings)
    manager = tf.train.CheckpointManager(checkpoint, run.checkpoint_dir, max_to_keep=KEPT_CHECKPOINTS)
    restored = restore_newest(checkpoint, run, warnings)
    start_step = int(trainer.step.numpy())
    if progress and restored:
        print(f"resuming {run.path} from step {start_step} of {config.num_steps}", flush=True)
    if start_step and not run.metrics_file.exists():
        warn(warnings, f"{run.metrics_file} was missing: its rows up to step {start_step} are lost (TensorBoard "
                        f"events in {run.tensorboard_dir} still hold them); logging continues from there")
    elif start_step and (kept := rows_up_to(run.metrics_file, start_step)) < start_step // config.log_every_steps:
        warn(warnings, f"{run.metrics_file} holds {kept} of its {start_step // config.log_every_steps} row(s) up to "
                        f"step {start_step}: the others are lost (TensorBoard events in {run.tensorboard_dir} still "
                        "hold them); logging continues from there")
    due = start_step // config.curve_every_steps if config.curve_every_steps else 0
    if due and (kept := rows_up_to(run.curve_file, start_step, CURVE_STRINGS)) < due:
        warn(warnings, f"{run.curve_file} holds {kept} of its {due} row(s) up to step {start_step}: the others are "
                       "lost, and cannot be computed again (the model at those steps is gone); the curve continues "
                       "from there")
    if start_step and not read_launches(run.path):
        warn(warnings, f"{run.launches_file} holds no record of the process(es) that trained steps up to {start_step}: "
                       "their records (code, machine) are lost; the run's numbers do not depend on them")
    record_launch(run, start_step, command, warnings, trainer.chain_shards)

    images = load_binarized_mnist("train")[: config.train_examples]
    batches = indexed_batches(images, config.batch_size, config.seed, start_step=start_step)
    log = MetricsLog(run, list(trainer.metric_names), resume_step=start_step,
                     on_replayed=lambda check: record_resume_check(run, start_step, check),
                     what_changed=launch_changes(read_launches(run.path)))
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
        fit(trainer, batches, config.num_steps - start_step, progress=progress,
            description=f"{config.name} ({config.method})", on_step=on_step)
    except FloatingPointError as error:
        kept = manager.latest_checkpoint or "none yet"
        raise FloatingPointError(f"{error}. The run stopped; its last good checkpoint is {kept}") from None
    except KeyboardInterrupt:
        kept = newest_checkpoint_name(run) or "none yet (the run restarts from step 0)"
        raise RunInterrupted(f"interrupted at step {int(trainer.step.numpy())}; checkpoint {kept} kept; run the "
                             "same command to resume") from None
    finally:
        log.close()
    return clock.elapsed


def _finish(config: Config, run: RunDirectory, trainer: Trainer, train_seconds: float, *,
            command: str) -> dict[str, Any]:
    """Save the final model (and local baseline), evaluate it, and write results.json."""
    tf.train.Checkpoint(**trainer.checkpoint_objects()).write(str(run.model_prefix))
    control_variate = trainer.checkpoint_objects().get("control_variate")
    # One value per training image: how stale each one is, in chapter 8.
    if control_variate is not None and control_variate.local_values is not None:
        write_atomic(run.path / LOCAL_BASELINE_FILE, npy_bytes(control_variate.local_values.numpy()))

    evaluation, evaluation_seconds, discard_batches = evaluate_saving_batches(trainer.model, config.evaluation, config, run.path,
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
        "test_log_likelihood": evaluation_record(evaluation, config.evaluation),
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
        "strategy": {"name": config.execution.strategy, "replicas": config.execution.replicas},
        "steps_per_call": trainer.steps_per_call,
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

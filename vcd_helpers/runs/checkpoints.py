"""Checkpoints of a training in progress: found from their files, a damaged index rewritten, a
damaged newest checkpoint skipped for the one before; and a run's latest state (its final
weights, or its newest checkpoint while it trains) read back for evaluation.
"""

from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf

from vcd_helpers.config import Config, ExecutionConfig
from vcd_helpers.model import VAE
from vcd_helpers.results import (DamagedWeights, RunDirectoryError, read_final_weights,
                                 require_config, warn)
from vcd_helpers.runs.directory import RunDirectory, checkpoint_steps
from vcd_helpers.trainers import build_trainer
from vcd_helpers.training import Trainer

KEPT_CHECKPOINTS = 3

def checkpoint_files(run: RunDirectory) -> dict[int, str]:
    """{step: checkpoint path prefix} of the checkpoints on disk, found by their files (the
    manager's index may be missing, or be written an instant after them)."""
    return {step: str(run.checkpoint_dir / f"ckpt-{step}") for step in checkpoint_steps(run.checkpoint_dir)}


def newest_checkpoint_name(run: RunDirectory) -> str | None:
    files = checkpoint_files(run)
    return Path(files[max(files)]).name if files else None


def repair_checkpoint_index(run: RunDirectory, warnings: list[str]) -> None:
    """Rewrite the checkpoint index (``checkpoints/checkpoint``, which tf.train.CheckpointManager
    reads) from the checkpoint files when it cannot be parsed: garbage in it stopped a run whose
    checkpoints were all intact from resuming. Says so in a warning naming the file."""
    index = run.checkpoint_dir / "checkpoint"
    if not index.exists():
        return
    try:
        # None: TensorFlow could not parse it (it says so only in its log, and the manager would
        # then lose track of the checkpoints listed there).
        if tf.train.get_checkpoint_state(str(run.checkpoint_dir)) is not None:
            return
        problem = "not a checkpoint index"
    except Exception as error:  # UnicodeDecodeError, ValueError: whatever the damage
        problem = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    files = checkpoint_files(run)
    if files:
        tf.compat.v1.train.update_checkpoint_state(str(run.checkpoint_dir), files[max(files)],
                                                    [files[step] for step in sorted(files)])
    else:
        index.unlink()
    warn(warnings, f"{index} was damaged ({problem}); rewritten from the {len(files)} checkpoint file(s) there")


def restore_newest(checkpoint: tf.train.Checkpoint, run: RunDirectory, warnings: list[str], *,
                    partial: bool = False) -> str | None:
    """Restore the newest checkpoint that restores, found from its files (the index may be
    missing or damaged); returns its path (None: no checkpoint, a fresh start). A damaged
    checkpoint is skipped with a warning; a directory whose checkpoints all fail is an error,
    never a silent restart from step 0 that would overwrite them. ``partial``: ``checkpoint``
    names only some of what the files hold (an evaluation reading the model)."""
    candidates = checkpoint_files(run)
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
        using = f"{'reading' if partial else 'resuming from'} {Path(candidates[step]).name}"
        for failure in failures:
            warn(warnings, f"checkpoint {failure} could not be restored; {using}")
        newer = sorted(n for n in checkpoint_steps(run.checkpoint_dir, "ckpt-*.data-*") - set(candidates) if n > step)
        if newer:
            warn(warnings, f"{', '.join(f'ckpt-{n}' for n in newer)} in {run.checkpoint_dir}: data without an .index "
                           f"file, which cannot be restored; {using}")
        return candidates[step]
    raise RunDirectoryError(f"no checkpoint in {run.checkpoint_dir} could be restored: {'; '.join(failures)}. "
                            "Move the directory aside and train into a new --results directory")


def read_final_or_latest(run: RunDirectory, objects: dict[str, tf.Module | tf.Variable], num_steps: int) -> int:
    """Read ``objects`` (``Trainer.checkpoint_objects``) from the final weights when the run
    finished, else from its newest checkpoint; returns the step read. Damaged final weights are
    read from the checkpoint of the final step instead (the same weights), with a warning; with
    no such checkpoint, RunDirectoryError names model/ and what to do."""
    try:
        read_final_weights(run.path, objects)
        return num_steps
    except FileNotFoundError:
        damaged = None
    except DamagedWeights as error:
        damaged = str(error)
    step = tf.Variable(0, dtype=tf.int64)
    # Matched by name inside the trainer: nothing else (optimiser slots) is built or read. Found
    # from the files, falling back past a damaged newest checkpoint as training does.
    restored = restore_newest(tf.train.Checkpoint(trainer=tf.train.Checkpoint(step=step, **objects)), run, [],
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


def latest_model(results_dir: str | os.PathLike) -> tuple[VAE, Config, int]:
    """The model of a results directory at its latest state (``read_final_or_latest``): its final
    weights when the run finished, else its newest checkpoint. Returns (model, config, step)."""
    config = require_config(results_dir)
    model = VAE(config.model, seed=config.seed)
    return model, config, read_final_or_latest(RunDirectory(Path(results_dir)), {"model": model}, config.num_steps)


def latest_trainer(results_dir: str | os.PathLike, *, jit_compile: bool | None = None) -> Trainer:
    """``trainers.restore_trainer``, also for a run still training (its newest checkpoint): the
    model and the chain's state as the next step would read them; ``step`` is that step.
    Raises RunDirectoryError when the directory holds no state."""
    config = require_config(results_dir)
    trainer = build_trainer(config.replace(execution=ExecutionConfig(jit_compile=jit_compile)))  # plain, as restore_trainer
    trainer.step.assign(read_final_or_latest(RunDirectory(Path(results_dir)), trainer.checkpoint_objects(),
                                             config.num_steps))
    return trainer

"""The final evaluation of a run, resumable batch by batch, and ``python -m vcd_helpers evaluate``:
a run's log-likelihood again, with another proposal or by annealed importance sampling."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vcd_helpers.config import Config, EvaluationConfig, check_positive_int
from vcd_helpers.data import load_binarized_mnist
from vcd_helpers.devices import code_version, cpu_model
from vcd_helpers.evaluation import EvaluationResult, ais_log_likelihood, make_evaluator
from vcd_helpers.files import npy_bytes, write_atomic
from vcd_helpers.model import VAE
from vcd_helpers.results import PARTIAL_DIR, RunDirectoryError, evaluation_file_name
from vcd_helpers.runs.checkpoints import latest_model
from vcd_helpers.runs.directory import RunDirectory, read_partial
from vcd_helpers.timing import Stopwatch, time_calls

def evaluate_saving_batches(model: VAE, evaluation: EvaluationConfig, config: Config, results_dir: Path,
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


def evaluation_record(result: EvaluationResult, evaluation: EvaluationConfig) -> dict[str, Any]:
    """The record of an evaluation: split, mean, standard error, images, proposal and samples and,
    for a protocol other than the paper's one chain with a shared step size, its ``num_starts`` and
    ``step_size_per_chain`` (the paper's records keep their fields, as its file names keep theirs)."""
    protocol = ({"num_starts": evaluation.num_starts, "step_size_per_chain": evaluation.step_size_per_chain}
                if evaluation.num_starts > 1 or evaluation.step_size_per_chain else {})
    return _summary(result.per_example, evaluation.split) | {"proposal": result.proposal,
                                                             "num_samples": result.num_samples} | protocol


def evaluate_run(results_dir: str | os.PathLike, **overrides: Any) -> dict[str, Any]:
    """Recompute the log-likelihood of a run's model (``checkpoints.latest_model``) with its configured
    evaluation, changed by ``overrides`` (fields of EvaluationConfig: proposal, num_samples,
    num_examples, ...; None sets None, as in ``Config.replace``). Writes evaluation-*.json
    (``evaluation_file_name``) and the estimate of every image beside it (.npy); returns the record.
    Holds the directory's lock while it works, as training does (``--status`` shows the run
    evaluating). Raises RunDirectoryError naming the holder when another process has the
    directory, and ValueError naming an unknown or bad override."""
    model, config, step = _restore_writable(results_dir)
    evaluation = config.replace(evaluation=overrides).evaluation
    with RunDirectory(Path(results_dir)).lock(f"evaluate, proposal {evaluation.proposal}"):
        result, seconds, discard_batches = evaluate_saving_batches(model, evaluation, config, Path(results_dir), step)
        record = _save_evaluation(Path(results_dir) / evaluation_file_name(evaluation),
                                  evaluation_record(result, evaluation), result.per_example, step, seconds)
        discard_batches()
    return record


#: ``evaluate_run_ais``'s defaults: images, intermediate distributions and chains per image.
AIS_EXAMPLES, AIS_TEMPERATURES, AIS_CHAINS = 100, 1000, 16


def evaluate_run_ais(results_dir: str | os.PathLike, *, num_examples: int = AIS_EXAMPLES,
                     num_temperatures: int = AIS_TEMPERATURES, num_chains: int = AIS_CHAINS) -> dict[str, Any]:
    """The annealed importance sampling estimate of log p(x) (``evaluation.ais_log_likelihood``)
    of the first ``num_examples`` images of the run's evaluation split, with the run's HMC
    settings: an independent check of the importance-sampled number. Writes
    evaluation-ais-T{temperatures}-K{chains}-N{examples}.json and .npy; returns the record.
    Holds the directory's lock while it works, as ``evaluate_run`` does. Raises ValueError naming
    a count that is not a positive integer, before any work."""
    check_positive_int("num_temperatures", num_temperatures)
    check_positive_int("num_chains", num_chains)
    model, config, step = _restore_writable(results_dir)
    # The importance-sampling evaluation's own check: positive, and no more than the split holds.
    evaluation = config.replace(evaluation={"num_examples": num_examples}).evaluation
    images = load_binarized_mnist(evaluation.split)[:evaluation.num_examples]
    with RunDirectory(Path(results_dir)).lock("evaluate --ais"):
        timed = time_calls(lambda: ais_log_likelihood(model, images, config.hmc, num_temperatures=num_temperatures,
                                                      num_chains=num_chains, seed=config.seed), repeats=1, warmup=0)
        per_example = timed.outputs[0]
        record = _summary(per_example, config.evaluation.split) | {"method": "ais", "num_temperatures": num_temperatures,
                                                                   "num_chains": num_chains}
        name = f"evaluation-ais-T{num_temperatures}-K{num_chains}-N{len(images)}.json"
        return _save_evaluation(Path(results_dir) / name, record, per_example, step, timed.median)


def _restore_writable(results_dir: str | os.PathLike) -> tuple[VAE, Config, int]:
    """``latest_model``, after checking that the evaluation it serves can be saved there."""
    model, config, step = latest_model(results_dir)
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

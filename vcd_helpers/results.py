"""A results directory's files, and the one way to read each of them.

Layout of a results directory ``DIR`` (the training command writes it; the chapters, the
evaluation command and the experiment runner read it):

    DIR/config.json      what the run computes (``Config.identity``: the config without speed settings)
    DIR/metrics.csv      one row per logging window: step, wall_time and the window's mean metrics
    DIR/tensorboard/     the same scalars for TensorBoard
    DIR/checkpoints/     tf.train checkpoints (the newest few)
    DIR/learning_curve.csv  the periodic evaluation (``curve_every_epochs``): step, epoch, training
                         seconds so far and the test log-likelihood on a fixed subset
    DIR/launches.jsonl   one line per process that trained the run: time, start step, code commit, CPU
    DIR/resume_checks.jsonl  per resume: the rows written again against the ones they replaced
    DIR/model/           the final weights, a few MB, with, for VCD, the chain's adapted step size
                         and the control variate
    DIR/results.json     written at the end: test log-likelihood, speed, device, versions, command
    DIR/per_example_log_likelihood.npy  the final evaluation's estimate for each image, [N] float32
    DIR/local_baseline.npy  the final local control variate (local and scheduled kinds), [50,000]
    DIR/evaluation-*.json  written by ``python -m vcd_helpers evaluate DIR``, with its .npy
    DIR/partial/         the batches of an evaluation in progress, so that a killed one resumes
    DIR/.lock            held (flock) by the process training the run: a second one is refused

Each reader here returns what its file holds, or recovers what is intact and says so in a
warning naming the file, or raises ``RunDirectoryError`` naming the file and what to do. None
returns garbage, and none raises anything else on a damaged file. It is the library's bottom
floor for finished runs: the chapters read committed runs (``COMMITTED_RESULTS``) through it,
and it imports no training code. The run service (``vcd_helpers.runs``), which writes these
directories, reads them through it too.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from vcd_helpers.config import Config, EvaluationConfig
from vcd_helpers.model import VAE

#: The runs committed with this checkout, one directory each (results/NAME): what the chapters read.
COMMITTED_RESULTS = Path(__file__).resolve().parent.parent / "results"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.csv"
RESULTS_FILE = "results.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
CURVE_FILE = "learning_curve.csv"
LAUNCHES_FILE = "launches.jsonl"
RESUME_CHECKS_FILE = "resume_checks.jsonl"
MODEL_DIR = "model"
MODEL_PREFIX = "weights"
PER_EXAMPLE_FILE = "per_example_log_likelihood.npy"
LOCAL_BASELINE_FILE = "local_baseline.npy"
LOCK_FILE = ".lock"
PARTIAL_DIR = "partial"
#: The small files of a finished run, copied into results/NAME for committing (with evaluation-*).
SMALL_FILES = (CONFIG_FILE, METRICS_FILE, CURVE_FILE, RESULTS_FILE, LAUNCHES_FILE, PER_EXAMPLE_FILE,
               LOCAL_BASELINE_FILE, RESUME_CHECKS_FILE)
#: What the training command prints of a finished run's results.json: without them it is damaged.
SUMMARY_KEYS = ("name", "steps", "ms_per_step", "examples_per_second", "test_log_likelihood")
CURVE_COLUMNS = ["step", "epoch", "train_seconds", "log_likelihood", "standard_error", "num_examples",
                 "num_samples", "proposal", "eval_seconds"]
#: learning_curve.csv's one column that is not a number.
CURVE_STRINGS = ("proposal",)


def evaluation_file_name(evaluation: EvaluationConfig) -> str:
    """evaluation-PROPOSAL[-M{starts}][-per_chain]-S{samples}-N{examples}.json: one file per protocol
    (the paper's, one start and a shared step size, has neither tag)."""
    examples = evaluation.num_examples or "all"
    starts = f"-M{evaluation.num_starts}" if evaluation.num_starts > 1 else ""
    per_chain = "-per_chain" if evaluation.step_size_per_chain else ""
    return f"evaluation-{evaluation.proposal}{starts}{per_chain}-S{evaluation.num_samples}-N{examples}.json"


class RunDirectoryError(RuntimeError):
    """The results directory cannot be used for this run (it holds something else, or is damaged)."""


class DamagedWeights(RunDirectoryError):
    """The final weights in model/ cannot be read."""


def warn(warnings: list[str] | None, message: str) -> None:
    """Print ``message`` as a warning and keep it in ``warnings`` (results.json records them)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)
    if warnings is not None:
        warnings.append(message)


def read_text(path: Path, what_to_do: str = "restore it from a copy of the run, or delete it if the run can do "
                                            "without it") -> str:
    """The file as UTF-8 text. Raises FileNotFoundError when it is missing, RunDirectoryError
    naming it (and ``what_to_do``) when it cannot be read or decoded."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError as error:
        raise RunDirectoryError(f"{path} is damaged: not UTF-8 text (byte {error.start}); {what_to_do}") from None
    except OSError as error:
        raise RunDirectoryError(f"{path} cannot be read ({error.strerror or error})") from None


#: What a training writes beside config.json: a directory holding any of them holds a run.
RUN_FILES = (CHECKPOINT_DIR, METRICS_FILE, LAUNCHES_FILE, CURVE_FILE, MODEL_DIR, RESULTS_FILE, PARTIAL_DIR)


def read_config(directory: str | os.PathLike) -> Config | None:
    """config.json: which run the directory holds (None when it holds none yet). Raises
    RunDirectoryError naming it when it is damaged, or missing beside a run's other files."""
    path = Path(directory) / CONFIG_FILE
    try:
        return Config.from_dict(json.loads(read_text(path, "it records which run this directory holds: restore "
                                                           "it (e.g. from a copy of the run), or train into a new "
                                                           "--results directory")))
    except FileNotFoundError:
        found = [name for name in RUN_FILES if (Path(directory) / name).exists()]
        if found:
            raise RunDirectoryError(
                f"{path} is missing, though {directory} holds a run ({', '.join(found)}): it records which run "
                "this is. Restore it (e.g. from a copy of the run; launches.jsonl holds the command that trained "
                "it), or train into a new --results directory") from None
        return None
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise RunDirectoryError(
            f"{path} is damaged ({type(error).__name__}: {error}): it records which run this directory holds. "
            "Restore it (e.g. from a copy of the run), or train into a new --results directory") from None


def require_config(directory: str | os.PathLike) -> Config:
    """``read_config``, for a directory that must hold a run. Raises RunDirectoryError otherwise."""
    config = read_config(directory)
    if config is None:
        raise RunDirectoryError(f"{directory} holds no {CONFIG_FILE}: not a results directory; give the "
                                "directory a training command wrote (its --results)")
    return config


def read_final_weights(directory: str | os.PathLike, objects: dict[str, tf.Module | tf.Variable]) -> None:
    """Fill ``objects`` (named as ``Trainer.checkpoint_objects`` names them) from a finished run's
    final weights (model/); the file may hold more than they ask for.

    Raises FileNotFoundError when there are none (the run has not finished), RunDirectoryError
    naming model/ when they lack one of ``objects``, and DamagedWeights naming model/ when they
    cannot be read."""
    prefix = Path(directory) / MODEL_DIR / MODEL_PREFIX
    if not prefix.with_suffix(".index").exists():
        if list(prefix.parent.glob(f"{MODEL_PREFIX}.data-*")):
            raise DamagedWeights(f"the final weights in {prefix.parent} are damaged (their data has no "
                                 f"{prefix.name}.index)")
        raise FileNotFoundError(f"{prefix.parent} holds no final weights: the run has not finished")
    try:
        tf.train.Checkpoint(**objects).read(str(prefix)).assert_existing_objects_matched().expect_partial()
    except AssertionError as error:
        raise RunDirectoryError(f"{prefix} lacks {', '.join(objects)}: it was written before the final weights "
                                f"carried the chain's state ({error})") from None
    except (tf.errors.OpError, ValueError, IndexError) as error:
        raise DamagedWeights(f"the final weights in {prefix.parent} are damaged ({type(error).__name__}: "
                             f"{str(error).splitlines()[0] if str(error) else ''})") from None


def restore_model(directory: str | os.PathLike) -> tuple[VAE, Config]:
    """A finished run's model, from its final weights (``read_final_weights``), and its config."""
    config = require_config(directory)
    model = VAE(config.model, seed=config.seed)
    read_final_weights(directory, {"model": model})
    return model, config


def finished_results(directory: str | os.PathLike) -> dict[str, Any] | None:
    """results.json when the run has finished: a JSON object holding ``SUMMARY_KEYS`` with a test
    mean. None when it is missing or damaged (the training command then evaluates again)."""
    try:
        results = json.loads(read_text(Path(directory) / RESULTS_FILE))
    except (FileNotFoundError, RunDirectoryError, ValueError):
        return None
    if (isinstance(results, dict) and all(key in results for key in SUMMARY_KEYS)
            and isinstance(results["test_log_likelihood"], dict) and "mean" in results["test_log_likelihood"]):
        return results
    return None


def read_results(directory: str | os.PathLike) -> dict[str, Any]:
    """results.json of a finished run. Raises RunDirectoryError when the run has not finished
    or the file is damaged."""
    path = Path(directory) / RESULTS_FILE
    results = finished_results(directory)
    if results is None:
        if not path.exists():
            raise RunDirectoryError(f"{directory} has no {RESULTS_FILE}: the run has not finished")
        raise RunDirectoryError(f"{path} is damaged: run the training command on {directory} again, which "
                                "evaluates the finished run again and rewrites it")
    return results


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object (an evaluation-*.json). Raises FileNotFoundError when it is
    missing, RunDirectoryError naming it when it is damaged."""
    try:
        record = json.loads(read_text(path))
    except ValueError as error:
        record, problem = None, f"not JSON: {error}"
    else:
        problem = f"a JSON {type(record).__name__}, not an object"
    if not isinstance(record, dict):
        raise RunDirectoryError(f"{path} is damaged ({problem}): make it again (python -m vcd_helpers evaluate "
                                f"{path.parent} with the same options) or restore it from a copy")
    return record


def csv_rows(path: Path, columns: list[str] | None = None,
             strings: tuple[str, ...] = ()) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """A CSV file whose first column is the step: its header and its (line number, row) pairs,
    blank lines skipped; every column but ``strings`` holds numbers. ``columns``: the header it
    must have (None: any starting with step). Raises FileNotFoundError when it is missing,
    RunDirectoryError naming the file (and the line) when it is damaged."""
    lines = [(number, row) for number, row in enumerate(csv.reader(io.StringIO(read_text(path), newline="")), 1)
             if row]
    header = lines[0][1] if lines else []
    if (columns is not None and header != columns) or not header or header[0] != "step":
        expected = columns or ["step", "..."]
        raise RunDirectoryError(f"{path} has columns {header}, expected {expected}: it is not this package's "
                                "file (or lost its header); move it aside to start it anew")
    numeric = [index for index, name in enumerate(header) if name not in strings]
    for number, row in lines[1:]:
        if len(row) != len(header) or not row[0].isdigit() or not all(_is_number(row[i]) for i in numeric):
            raise RunDirectoryError(f"{path}, line {number}, is damaged ({','.join(row)[:80]!r}); delete that line "
                                    "(a resumed run rewrites the rows after its checkpoint)")
    return header, lines[1:]


def read_columns(path: Path, *, integers: tuple[str, ...] = ("step",), strings: tuple[str, ...] = (),
                 columns: list[str] | None = None, rows_required: bool = True) -> dict[str, np.ndarray]:
    """A CSV file of ``csv_rows`` as {column: [rows] array}: integers, strings, the rest float64.
    Raises RunDirectoryError when it is damaged, or has no rows yet and ``rows_required``."""
    header, rows = csv_rows(path, columns, strings)
    if not rows and rows_required:
        raise RunDirectoryError(f"{path} has no rows yet")

    def kind(name: str) -> type:
        return str if name in strings else np.float64
    # Integer columns go through float64: "40" and "40.0" are the same step.
    columns_read = {name: np.array([row[index] for _, row in rows], dtype=kind(name))
                    for index, name in enumerate(header)}
    return {name: values.astype(np.int64) if name in integers else values for name, values in columns_read.items()}


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def read_metrics(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """metrics.csv of a results directory as {column: [rows] array} (step as int)."""
    return read_columns(Path(directory) / METRICS_FILE)


def read_curve(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """learning_curve.csv of a results directory as {column: [rows] array}; no rows for a run
    shorter than the curve's interval."""
    return read_columns(Path(directory) / CURVE_FILE, integers=("step", "num_examples", "num_samples"),
                        strings=CURVE_STRINGS, columns=CURVE_COLUMNS, rows_required=False)


def read_jsonl(path: Path, valid: Callable[[Any], bool], warnings: list[str] | None = None,
               *, lost: str = "") -> list[dict[str, Any]]:
    """The records of a JSON-lines file (empty when it is missing). A damaged line (cut short,
    garbage bytes, not a record ``valid`` accepts) loses only that record: it is skipped and
    named in a warning (``lost`` says what that costs) when a ``warnings`` list is given."""
    try:
        raw_lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise RunDirectoryError(f"{path} cannot be read ({error.strerror or error})") from None
    records, damaged = [], []
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
            if not valid(record):
                raise TypeError
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            damaged.append(number)
            continue
        records.append(record)
    if damaged and warnings is not None:
        warn(warnings, f"{path}: line(s) {', '.join(map(str, damaged))} damaged and skipped{lost}")
    return records


def _is_launch(record: Any) -> bool:
    return isinstance(record["code"]["commit"], (str, type(None))) and "dirty" in record["code"]


def read_launches(directory: str | os.PathLike, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """launches.jsonl: one record per process that trained the run (empty when the run predates
    it). The run's numbers never depend on this file, so its damage never stops a run."""
    return read_jsonl(Path(directory) / LAUNCHES_FILE, _is_launch, warnings,
                      lost=": the record of the process(es) that wrote them is lost; the run's numbers do not "
                           "depend on it")


def read_array(path: Path) -> np.ndarray:
    """A .npy file (per-image estimates, the local baseline). Raises FileNotFoundError when it is
    missing, RunDirectoryError naming it when it is damaged."""
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError) as error:
        raise RunDirectoryError(f"{path} is damaged ({type(error).__name__}: {error}); restore it from a copy of "
                                "the run, or evaluate the run again (python -m vcd_helpers evaluate)") from None

"""A results directory: its paths, the lock that keeps it to one process, the rule for reusing it,
and the provenance records a training appends to it (launches.jsonl, resume_checks.jsonl).

The files' layout and readers are the library's (``vcd_helpers.results``); this module adds what
only a process writing the directory needs.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import os
import sys
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from vcd_helpers.config import Config
from vcd_helpers.devices import code_version, compute_threads, cpu_model, package_versions
from vcd_helpers.files import write_atomic
from vcd_helpers.results import (CHECKPOINT_DIR, CONFIG_FILE, CURVE_FILE, LAUNCHES_FILE, LOCK_FILE, METRICS_FILE,
                                 MODEL_DIR, MODEL_PREFIX, RESULTS_FILE, RESUME_CHECKS_FILE, TENSORBOARD_DIR,
                                 RunDirectoryError, csv_rows, finished_results, read_config, warn)

VERSION_PACKAGES = ("tensorflow", "tensorflow-probability", "numpy", "vcd_helpers")

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

        An empty or missing directory is claimed by writing ``config.json`` (``Config.identity``).
        A directory with the same identity is reused (the run resumes). Anything else is refused.
        """
        reason = self.refusal(config)
        if reason is not None:
            raise RunDirectoryError(reason)
        if self.stored_config() is None:
            self.path.mkdir(parents=True, exist_ok=True)
            write_atomic(self.config_file, json.dumps(config.identity(), indent=2, sort_keys=True) + "\n")

    def refusal(self, config: Config) -> str | None:
        """Why ``claim(config)`` refuses this directory, or None when it would claim or reuse it."""
        stored = self.stored_config()
        if stored is None:
            if self.path.exists() and any(p.name != LOCK_FILE for p in self.path.iterdir()):
                return (f"{self.path} is not empty and holds no {CONFIG_FILE}: it is not a results "
                        "directory of this package; choose an empty or new directory")
            return None
        differences = _differences(stored.identity(), config.identity())
        if not differences:
            return None
        return (f"{self.path} holds a run with a different configuration; refusing to overwrite it. "
                "Differences: " + "; ".join(differences)
                + ". Use a new --results directory, or the same options to resume that run.")


def keep_rows_up_to(path: Path, columns: list[str], step: int, strings: tuple[str, ...] = ()) -> list[list[str]]:
    """Drop the rows of a CSV file (``results.csv_rows``) written after ``step``: a run resumed
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


def rows_up_to(path: Path, step: int, strings: tuple[str, ...] = ()) -> int:
    """How many rows of a CSV file (first column: step) are at or before ``step`` (0: no file).
    Raises RunDirectoryError naming the file and line when it is damaged."""
    if not path.exists():
        return 0
    return sum(1 for _, row in csv_rows(path, strings=strings)[1] if int(row[0]) <= step)

def record_launch(run: RunDirectory, start_step: int, command: str, warnings: list[str],
                   chain_shards: int | None) -> None:
    """Append this process to launches.jsonl: which code and machine trained which steps, and how
    (threads, blocks of the chain: speed only; None for a trainer without a chain)."""
    launch = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "start_step": start_step,
              "pid": os.getpid(), "code": code_version(), "cpu_model": cpu_model(), "command": command,
              "compute_threads": compute_threads(), "chain_shards": chain_shards, "warnings": warnings}
    append_jsonl(run.launches_file, launch)


#: What a launch records that can change a run's round-off, with how the refusal names it.
_LAUNCH_SETTINGS = (("code", "code commit"), ("cpu_model", "CPU"), ("compute_threads", "compute threads"),
                    ("chain_shards", "blocks of the chain"))


def launch_changes(launches: list[dict[str, Any]]) -> str:
    """What the last launch (this process) does differently from the one before it, among what
    can change the numbers: e.g. "Since the process that wrote them: compute threads 1 -> 2.";
    a sentence saying none differs when none does (another machine of the same model, or a
    library)."""
    if len(launches) < 2:
        return "No record says which process wrote those rows."
    before, now = launches[-2], launches[-1]
    value = lambda launch, key: (launch.get("code") or {}).get("commit") if key == "code" else launch.get(key)
    changes = [f"{name} {value(before, key)} -> {value(now, key)}" for key, name in _LAUNCH_SETTINGS
               if value(before, key) != value(now, key)]
    if not changes:
        return ("The process that wrote them had the same code commit, CPU model, compute threads and blocks of the "
                "chain (another library version, or a change not yet committed, can change the round-off too).")
    return "Since the process that wrote them: " + ", ".join(changes) + "."


def record_resume_check(run: RunDirectory, start_step: int, check: dict[str, Any]) -> None:
    """Append the comparison of the rows this process wrote again (``MetricsLog``) to
    resume_checks.jsonl, and say it: the long runs test every change of the code this way."""
    check = {"resumed_from": start_step, **check, "code": code_version()["commit"]}
    append_jsonl(run.path / RESUME_CHECKS_FILE, check)
    verdict = ("identical" if check["identical"]
               else f"DIFFERENT, by up to {check['max_relative_difference']:.2g} (relative): refused")
    print(f"resume check: {check['rows_compared']} row(s) after step {start_step} written again, {verdict}",
          file=sys.stderr, flush=True)


def checkpoint_steps(checkpoint_dir: Path, pattern: str = "ckpt-*.index") -> set[int]:
    """Steps of the checkpoints in ``checkpoint_dir`` that have a file matching ``pattern``
    (``ckpt-STEP.index``; ``ckpt-*.data-*`` for their data)."""
    names = (p.name[len("ckpt-"):].split(".", 1)[0] for p in checkpoint_dir.glob(pattern))
    return {int(name) for name in names if name.isdigit()}


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append a record as one line, on a line of its own even when the file was cut mid-line
    (the cut line alone is then lost, never the new record)."""
    with open(path, "ab+") as f:  # appends go to the end whatever the position read from
        size = f.seek(0, os.SEEK_END)
        cut = False
        if size:
            f.seek(size - 1)
            cut = f.read(1) != b"\n"
        f.write((b"\n" if cut else b"") + json.dumps(record).encode() + b"\n")


def read_partial(partial: Path) -> tuple[dict[int, np.ndarray], float]:
    """The batches an interrupted evaluation saved in ``partial/``, and the seconds they took. A
    damaged batch is skipped with a warning naming it: it is computed again (the same numbers:
    batch k's draws depend on the seed and k alone)."""
    done, seconds = {}, 0.0
    for file in sorted(partial.glob("batch-*.npz")):
        try:
            with np.load(file) as saved:
                estimates, took = np.asarray(saved["estimates"]), float(saved["seconds"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            problem = (str(error).splitlines() or [""])[0][:80]
            warn(None, f"{file} is damaged ({type(error).__name__}: {problem}); computing that batch again")
            continue
        done[int(file.stem.removeprefix("batch-"))], seconds = estimates, seconds + took
    return done, seconds

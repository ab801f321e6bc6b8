"""The long runs behind chapter 8: the whole plan, run in priority order, resumed after any stop.

    .venv/bin/python tools/run_experiments.py             # start, or resume, every unfinished run
    .venv/bin/python tools/run_experiments.py --status    # each run's progress, speed, expected finish
    .venv/bin/python tools/run_experiments.py --collect   # copy finished runs' small files into results/

Every run is one ``python -m vcd_helpers train`` command (its options are in ``plan.PLAN``)
writing into RUNS/runs/NAME, outside the repository (RUNS: ``--runs-dir``, ``$VCD_RUNS_DIR`` or
``~/vcd-runs``); runs 1-3 are then evaluated with the two other proposals (``python -m
vcd_helpers evaluate``). Its trainings and evaluations die with it, however it dies (``kill -9``
included: the kernel sends each a SIGTERM, on which it saves a checkpoint and exits), and a
runner started while one of them is still saving waits for it. Started again after any stop
(even ``kill -9`` of everything), the runner gives each unfinished run its original command,
which resumes it exactly from its last checkpoint; finished work is skipped, and so is a run
whose results are committed in results/NAME (a runs directory lost with a machine does not cost
those runs again). It runs at a low priority (``yield_cores``) and runs ``--jobs`` runs at once,
each on an equal share of the cores.

The code a run uses is a snapshot of the repository's last commit (``git archive HEAD`` into
RUNS/code/COMMIT), so edits to the work tree never reach a run; a runner started after a new
commit resumes the runs with the new code, and each run's launches.jsonl records which commit
trained which steps. When a run is done its small files (config, metrics, learning curve,
results, per-image estimates, launches; the final weights of the runs that keep them) are copied into
results/NAME for committing.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

from vcd_helpers.devices import COMMIT_FILE, cpu_model
from vcd_helpers.results import (CHECKPOINT_DIR, COMMITTED_RESULTS as RESULTS, CURVE_FILE, METRICS_FILE, MODEL_DIR,
                                 RESULTS_FILE, SMALL_FILES, RunDirectoryError, evaluation_file_name,
                                 finished_results, read_config, read_text)
from vcd_helpers.runs.cli import SUPERVISOR_ENV, config_from_options
from vcd_helpers.runs.directory import RunDirectory, checkpoint_steps
from vcd_helpers.plan import PLAN, PlannedRun

#: The repository the runs' code is exported from (a snapshot of its last commit).
ROOT = RESULTS.parent


def runs_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("VCD_RUNS_DIR") or Path.home() / "vcd-runs").expanduser()


# ------------------------------------------------------------------------------------ state

def _missing_evaluations(run: PlannedRun, directory: Path) -> list[str]:
    config = read_config(directory)
    if config is None:
        raise RunDirectoryError(f"{directory} holds no config.json")
    return [p for p in run.extra_proposals
            if not (directory / evaluation_file_name(config.replace(evaluation={"proposal": p}).evaluation)).exists()]


def _is_done(run: PlannedRun, directory: Path) -> bool:
    """Finished and evaluated; a run whose config.json is damaged is not (its training command then
    names the file, and the runner logs that and goes on with the other runs)."""
    try:
        return finished_results(directory) is not None and not _missing_evaluations(run, directory)
    except RunDirectoryError:
        return False


def _is_committed(run: PlannedRun) -> bool:
    """Whether results/NAME holds the run finished, so that a lost runs directory does not
    train it again."""
    return _is_done(run, RESULTS / run.name)


def _tail_rows(path: Path, n: int) -> list[list[str]]:
    try:
        lines = read_text(path).splitlines()
    except FileNotFoundError:
        return []
    return [line.split(",") for line in lines[1:] if line.strip()][-n:]


# ------------------------------------------------------------------------------------ running

def snapshot(root: Path) -> tuple[str, Path]:
    """The repository's HEAD exported to root/code/COMMIT (once), with a COMMIT file."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    code = root / "code" / commit
    if not (code / COMMIT_FILE).exists():
        partial = code.with_name(commit + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
        (partial / COMMIT_FILE).write_text(commit + "\n")
        shutil.rmtree(code, ignore_errors=True)
        partial.rename(code)
    return commit, code


def collect(run: PlannedRun, directory: Path) -> Path:
    """Copy a finished run's small files (and the final weights of a run that keeps them) into results/."""
    target = RESULTS / run.name
    target.mkdir(parents=True, exist_ok=True)
    names = [*SMALL_FILES, *(p.name for p in directory.glob("evaluation-*"))]
    for name in names:
        if (directory / name).exists():
            shutil.copy2(directory / name, target / name)
    if run.keeps_weights:
        shutil.copytree(directory / MODEL_DIR, target / MODEL_DIR, dirs_exist_ok=True)
    return target


class Runner:
    def __init__(self, root: Path, code: Path, jobs: int, log):
        self.root, self.code, self.jobs, self.log = root, code, jobs, log
        self.processes: set[subprocess.Popen] = set()
        self.stopping = False
        self.pending: list[PlannedRun] = []
        self.active = 0  # runs a worker has taken and not finished
        self.guard = threading.Lock()
        # Each job gets its share of the cores: two single-threaded runs keep two cores busier
        # than two runs that each try to use both.
        self.threads = max(1, (os.cpu_count() or 1) // jobs)
        # SUPERVISOR_ENV: every training and evaluation dies with this runner, however it dies (its
        # worker thread, which the kernel watches, waits on the process to the end).
        # Each process's intra-op threads are set at its launch (threads_for).
        self.env = os.environ | {"TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
                                 SUPERVISOR_ENV: str(os.getpid())}
        self.poll_seconds = 5.0
        self.env.pop("PYTHONPATH", None)

    def threads_for(self, command: str) -> int:
        """Compute threads for a process running ``command``: the job's share of the cores, or every
        core for an evaluation no other run can join (none pending, none other active), which would
        leave the other cores idle. Its numbers do not depend on the threads; a training's chain is
        cut into one block per thread, so a training keeps its share whatever runs beside it."""
        with self.guard:
            alone = command == "evaluate" and self.active <= 1 and not self.pending
        return (os.cpu_count() or 1) if alone else self.threads

    def _call(self, name: str, argv: list[str]) -> int:
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        threads = self.threads_for(argv[0])
        with open(logs / f"{name}.log", "a") as out:
            out.write(f"\n[{datetime.now():%Y-%m-%d %H:%M:%S}] {' '.join(argv)} ({threads} threads)\n")
            out.flush()
            process = subprocess.Popen([sys.executable, "-m", "vcd_helpers", *argv], cwd=self.code,
                                       env=self.env | {"TF_NUM_INTRAOP_THREADS": str(threads)},
                                       stdout=out, stderr=subprocess.STDOUT)
            self.processes.add(process)
            code = process.wait()
            self.processes.discard(process)
        return code

    def _wait_for_holder(self, run: PlannedRun, directory: Path) -> bool:
        """Wait while another process holds the run's directory: a training of a runner killed a
        moment ago (it saves its checkpoint and exits on the SIGTERM its runner's death sent), or
        one started by hand. False when this runner is stopped meanwhile."""
        announced = False
        while (holder := RunDirectory(directory).holder()) is not None:
            if self.stopping:
                return False
            if not announced:
                self.log(f"{run.name}: waiting for {holder}, which holds its directory")
                announced = True
            time.sleep(self.poll_seconds)
        return True

    def work(self, run: PlannedRun) -> str:
        directory = self.root / "runs" / run.name
        if self.stopping or not self._wait_for_holder(run, directory):
            return "not started"
        code = self._call(run.name, ["train", "--results", str(directory), "--quiet", *run.options])
        if code and self.stopping:
            return "stopped"  # terminated by stop(): it resumes from its last checkpoint next time
        if code:
            return f"train exited {code} (see logs/{run.name}.log)"
        for proposal in _missing_evaluations(run, directory):
            if self.stopping:
                return "stopped"
            code = self._call(run.name, ["evaluate", str(directory), "--proposal", proposal])
            if code and self.stopping:
                return "stopped"
            if code:
                return f"evaluate --proposal {proposal} exited {code}"
        collect(run, directory)
        return "done; small files in " + str((RESULTS / run.name).relative_to(ROOT))

    def run(self, plan: list[PlannedRun]) -> int:
        self.pending = [run for run in plan if not (_is_done(run, self.root / "runs" / run.name) or _is_committed(run))]
        self.log(f"{len(plan) - len(self.pending)} of {len(plan)} runs done; {len(self.pending)} to go, "
                 f"{self.jobs} at a time")
        failures = 0

        def worker() -> None:
            nonlocal failures
            while True:
                with self.guard:
                    if not self.pending or self.stopping:
                        return
                    run = self.pending.pop(0)
                    self.active += 1
                self.log(f"{run.name}: started")
                outcome = self.work(run)
                with self.guard:
                    self.active -= 1
                    failures += not outcome.startswith(("done", "not started", "stopped"))
                self.log(f"{run.name}: {outcome}")

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(self.jobs)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            time.sleep(1)
        return 1 if failures else 0

    def stop(self, *_: object) -> None:
        self.stopping = True
        for process in list(self.processes):
            process.terminate()  # the run resumes from its last checkpoint next time


@contextlib.contextmanager
def runner_lock(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "runner.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            sys.exit(f"another runner holds {root} ({f.read().strip()}); --status shows what it is doing")
        f.truncate(0)
        f.write(f"process {os.getpid()}, started {datetime.now():%Y-%m-%d %H:%M}\n")
        f.flush()
        yield


# ------------------------------------------------------------------------------------ status

def _format_duration(seconds: float) -> str:
    hours, minutes = divmod(int(seconds) // 60, 60)
    return f"{hours}h{minutes:02d}" if hours else f"{minutes}m"


def status(root: Path) -> str:
    """One line per planned run: state, progress, recent speed, curve, expected finish."""
    width = max(len(run.name) for run in PLAN)
    lines = [f"runs in {root / 'runs'}; CPU {cpu_model()}",
             f"{'run':<{width}} {'state':<10} {'epoch':>11} {'ms/step':>8} {'curve LL':>9} {'left':>6}  finish"]
    for run in PLAN:
        try:
            lines.append(_status_line(run, root / "runs" / run.name, width))
        except RunDirectoryError as error:  # one damaged run must not hide where the others stand
            lines.append(f"{run.name:<{width}} {'damaged':<10} {error}")
    lines.append("left/finish: training and curve evaluations still to run at the recent speed (the final "
                 "evaluations come on top)")
    return "\n".join(lines)


@contextlib.contextmanager
def _naming(path: Path):
    """Re-raise what a damaged file's contents raise as RunDirectoryError naming the file."""
    try:
        yield
    except (ValueError, IndexError, ZeroDivisionError) as error:
        raise RunDirectoryError(f"{path} is damaged ({type(error).__name__}: {error})") from None


def _status_line(run: PlannedRun, directory: Path, width: int) -> str:
    """``status``'s line for one run. Raises RunDirectoryError naming a damaged config.json,
    results.json, metrics.csv or learning_curve.csv."""
    results = finished_results(directory)
    holder = RunDirectory(directory).holder()
    config = read_config(directory)
    if config is None:
        return f"{run.name:<{width}} {'committed' if _is_committed(run) else 'pending':<10}"
    if results is None and (directory / RESULTS_FILE).exists():
        raise RunDirectoryError(f"{directory / RESULTS_FILE} is damaged: the run's training command (which the "
                                "runner gives it) evaluates the finished run again and rewrites it")
    with _naming(directory / METRICS_FILE):
        rows = _tail_rows(directory / METRICS_FILE, 6)
        step = int(rows[-1][0]) if rows else 0
        ms = (sorted(1000 * (float(b[1]) - float(a[1])) / (int(b[0]) - int(a[0])) for a, b in zip(rows, rows[1:]))
              if len(rows) > 1 else [])
    ms_per_step = ms[len(ms) // 2] if ms else float("nan")
    with _naming(directory / CURVE_FILE):
        curve = _tail_rows(directory / CURVE_FILE, 1)
        curve_ll = f"{float(curve[-1][3]):.2f}" if curve else "-"
        curve_seconds = float(curve[-1][8]) if curve else 0.0
    # Rows lost from the logs show against the newest checkpoint (written after its step's rows).
    newest = max(checkpoint_steps(directory / CHECKPOINT_DIR), default=0)
    if newest > step:
        raise RunDirectoryError(f"{directory / METRICS_FILE} ends at step {step}, before checkpoint ckpt-{newest}: "
                                "rows were lost (the training command says so when it resumes)")
    if config.curve_every_steps and newest >= config.curve_every_steps and not curve:
        raise RunDirectoryError(f"{directory / CURVE_FILE} holds no row, though checkpoint ckpt-{newest} is past the "
                                "curve's first evaluation: its rows were lost (the training command says so)")
    epoch = f"{step / config.steps_per_epoch:.0f}/{config.num_steps / config.steps_per_epoch:.0f}"
    if _is_done(run, directory):
        state, left = "done", 0.0
    elif (refusal := RunDirectory(directory).refusal(config_from_options(run.options))) is not None:
        # Its training command refuses the directory (another run's config): say why, not "stopped".
        return f"{run.name:<{width}} {'refused':<10} {refusal}"
    else:
        # After the last step a run is evaluating: its final estimate, then (runs 1-3) the other proposals.
        evaluating = results is not None or step >= config.num_steps
        state = ("evaluating" if evaluating else "training") if holder else ("stopped" if step else "starting")
        curve_left = ((config.num_steps - step) // config.curve_every_steps * curve_seconds
                      if config.curve_every_steps else 0.0)
        left = (config.num_steps - step) * ms_per_step / 1000 + curve_left if ms else float("nan")
    finish = (f"{datetime.now() + timedelta(seconds=left):%a %H:%M}" if holder and left == left else "")
    left_text = "" if left != left else _format_duration(left)
    ms_text = f"{ms_per_step:.1f}" if ms else "-"
    return f"{run.name:<{width}} {state:<10} {epoch:>11} {ms_text:>8} {curve_ll:>9} {left_text:>6}  {finish}"


NICENESS = 10


def yield_cores(autogroup: Path = Path("/proc/self/autogroup")) -> None:
    """Lower the runner's priority, and so its runs', below interactive work on the same cores.

    Linux orders processes by their nice value only within one autogroup (one session); between
    autogroups it shares the cores by each group's own nice value. A runner started with
    ``setsid`` (as the README starts it) leads a session of its own, so ``os.nice`` alone leaves
    it an equal share against a shell; it also sets its autogroup's nice value, which then covers
    just the runner and its runs. A runner started inside a terminal's session leaves that
    session's value alone (it would slow the terminal too); kernels without autogroups are fine.
    """
    os.nice(NICENESS)
    if os.getsid(0) == os.getpid():
        with contextlib.suppress(OSError):
            autogroup.write_text(f"{NICENESS}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", help="where the runs live (default $VCD_RUNS_DIR or ~/vcd-runs)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2: one per core)")
    parser.add_argument("--only", nargs="+", choices=[run.name for run in PLAN], help="run only these")
    parser.add_argument("--status", action="store_true", help="print where every run stands, and exit")
    parser.add_argument("--collect", action="store_true", help="copy finished runs into results/, and exit")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs} is invalid: must be a positive integer")
    root = runs_dir(args.runs_dir)
    if root.exists() and not root.is_dir():
        parser.error(f"the runs directory {root} (--runs-dir, $VCD_RUNS_DIR or ~/vcd-runs) is a file: give a directory")
    if root.is_symlink() and not root.exists():
        parser.error(f"the runs directory {root} (--runs-dir, $VCD_RUNS_DIR or ~/vcd-runs) is a symbolic link that "
                     "leads nowhere (a loop, or a missing target): give a directory")
    if args.status:
        print(status(root))
        return 0
    if args.collect:
        for run in PLAN:
            if _is_done(run, root / "runs" / run.name):
                print(f"{run.name} -> {collect(run, root / 'runs' / run.name).relative_to(ROOT)}")
        return 0

    try:  # a runs directory it cannot create or write (under a file, a read-only mount) is refused here
        root.mkdir(parents=True, exist_ok=True)
        (root / "runner.lock").open("a+").close()
    except OSError as error:
        parser.error(f"the runs directory {root} (--runs-dir, $VCD_RUNS_DIR or ~/vcd-runs) is unusable: "
                     f"{error.strerror or error}; give a directory this user can write")

    def log(message: str) -> None:
        print(f"[{datetime.now():%Y-%m-%d %H:%M:%S}] {message}", flush=True)

    with runner_lock(root):
        yield_cores()
        commit, code = snapshot(root)
        log(f"code: commit {commit[:12]} (snapshot {code})")
        runner = Runner(root, code, args.jobs, log)
        signal.signal(signal.SIGTERM, runner.stop)
        signal.signal(signal.SIGINT, runner.stop)
        plan = [run for run in PLAN if not args.only or run.name in args.only]
        return runner.run(plan)


if __name__ == "__main__":
    sys.exit(main())

"""Every file a run reads, every kind of damage, every entry point (issue 35).

One small run is trained once per module: its final evaluation is interrupted after its first
batch (UNFINISHED: checkpoints at steps 20 and 40, model/, partial/ with one saved batch, no
results.json), and a copy then finishes (FINISHED). Each probe copies one of them, damages one
file in one way and runs one entry point in this process (``cli.main``, or the runner's
``--status`` with VCD_RUNS_DIR set), then checks:

- no exception escapes (a traceback on the command line);
- exit code 0, and then the numbers are the intact run's, or a warning names the file that was
  recovered or lost; or exit code 2 with one line naming the file and what to do;
- a refusal deletes nothing: every file of the run but the damaged one is still there (the
  saved evaluation batches above all: issue 35's run that could never finish);
- the saved evaluation batch is used unless it was damaged;
- the outcome is the one in ``EXPECTED``, with the message in ``SAYS`` where it matters (so that
  a change of behaviour is seen, not only a crash).

Each entry point gets every damage of the files whose contents it reads (``READS``), and one or
two of the others. Two probes run the real commands in a subprocess, where a traceback, or
TensorFlow's start-up lines, would show on stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

from vcd_helpers import data
from vcd_helpers import results as layout
from vcd_helpers.runs import evaluate as run_evaluation
from vcd_helpers.runs import runner
from vcd_helpers.runs.cli import main
from vcd_helpers.runs.directory import append_jsonl

# The fault matrix drives the real commands over every damaged file: a minute or more.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# The package's own quiet start (no "failed call to cuInit" line on a CPU machine), whatever the caller set.
SUBPROCESS_ENV = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}

# ----------------------------------------------------------------------------- the damages

GARBAGE = b"garbage: not what this file held\x00\x01\n"


def _middle_flipped(raw: bytes) -> bytes:
    start = len(raw) // 2 - 32 if len(raw) > 128 else 0
    return raw[:start] + bytes(b ^ 0xFF for b in raw[start:start + 64]) + raw[start + 64:]


DAMAGES = {
    "deleted": None,
    "emptied": lambda raw: b"",
    "truncated": lambda raw: raw[: len(raw) // 2],
    "header only": lambda raw: raw.split(b"\n", 1)[0] + b"\n",
    "garbage bytes": lambda raw: GARBAGE,
    "non-UTF-8 bytes": lambda raw: raw[: len(raw) // 2] + b"\xff\xfe" + raw[len(raw) // 2:],
    "bytes flipped": _middle_flipped,
    "wrong JSON type": lambda raw: b"[1, 2]\n",
}
#: Which damages apply to which kind of file: a CSV has a header, a binary file no text encoding.
KINDS = {
    "json": ("deleted", "emptied", "truncated", "garbage bytes", "non-UTF-8 bytes", "wrong JSON type"),
    "jsonl": ("deleted", "emptied", "truncated", "garbage bytes", "non-UTF-8 bytes", "wrong JSON type"),
    "csv": ("deleted", "emptied", "truncated", "header only", "garbage bytes", "non-UTF-8 bytes"),
    "text": ("deleted", "emptied", "truncated", "garbage bytes", "non-UTF-8 bytes"),
    "binary": ("deleted", "emptied", "truncated", "garbage bytes", "bytes flipped"),
}


def _damage(path: Path, how: str) -> None:
    if DAMAGES[how] is None:
        path.unlink()
    else:
        path.write_bytes(DAMAGES[how](path.read_bytes()))


# ----------------------------------------------------------------------------- the files

DATA = "$VCD_DATA_DIR/"
#: file (as the probes name it) -> (its kind, the text that names it in a message). The data
#: cache's files are under $VCD_DATA_DIR (a copy per probe), the rest in the run's directory.
FILES = {
    "config.json": ("json", "config.json"),
    "metrics.csv": ("csv", "metrics.csv"),
    "learning_curve.csv": ("csv", "learning_curve.csv"),
    "launches.jsonl": ("jsonl", "launches.jsonl"),
    "resume_checks.jsonl": ("jsonl", "resume_checks.jsonl"),
    "results.json": ("json", "results.json"),
    "checkpoints/checkpoint": ("text", "checkpoints/checkpoint"),
    "checkpoints/ckpt-40.index": ("binary", "ckpt-40"),
    "checkpoints/ckpt-40.data-00000-of-00001": ("binary", "ckpt-40"),
    "model/weights.index": ("binary", "/model "),  # "the final weights in DIR/model are damaged"
    "model/weights.data-00000-of-00001": ("binary", "/model "),
    "partial/batch-00000.npz": ("binary", "batch-00000.npz"),
    DATA + "train.npy": ("binary", "_train.npy"),  # binarized_mnist_SOURCE_train.npy
    DATA + "test.npy": ("binary", "_test.npy"),
    DATA + "manifest.json": ("json", "manifest.json"),
}
#: entry point -> the state of the run it is given.
ENTRY_POINTS = {"resume": "unfinished", "rerun": "finished", "evaluate": "unfinished", "status": "both"}
#: entry point -> the files whose contents it reads. Each of them gets every damage of its kind;
#: the other files of the run get two (deleted, garbage bytes), which show that it does not
#: depend on them. "rerun" reads the rest only when results.json is damaged (then as "resume").
READS = {
    "resume": {"config.json", "metrics.csv", "learning_curve.csv", "launches.jsonl", "checkpoints/checkpoint",
               "checkpoints/ckpt-40.index", "checkpoints/ckpt-40.data-00000-of-00001", "partial/batch-00000.npz",
               DATA + "train.npy", DATA + "test.npy", DATA + "manifest.json"},
    "rerun": {"config.json", "results.json"},
    "evaluate": {"config.json", "checkpoints/ckpt-40.index", "checkpoints/ckpt-40.data-00000-of-00001",
                 "model/weights.index", "model/weights.data-00000-of-00001", "partial/batch-00000.npz",
                 DATA + "test.npy", DATA + "manifest.json"},
    "status": {"config.json", "results.json", "metrics.csv", "learning_curve.csv"},
}
NOT_READ = ("deleted", "garbage bytes")
#: evaluate, the costliest probe but one, gets one damage of a file it does not read.
NOT_READ_BY_EVALUATE = ("garbage bytes",)
#: A damaged newest checkpoint costs a resume 20 steps of training again (3 s a probe): it gets the
#: damages that take different paths (no index: data without one; no data; data cut short; data
#: altered). evaluate passes over it with the same function (checkpoints.restore_newest), for
#: every damage.
COSTLY = {("resume", "checkpoints/ckpt-40.index"): ("deleted", "garbage bytes"),
          ("resume", "checkpoints/ckpt-40.data-00000-of-00001"): ("deleted", "truncated", "bytes flipped")}

# What each probe must give: "same" (exit 0, the intact run's numbers, no warning), "warned"
# (exit 0, a warning naming the file), "refused" (exit 2, one line naming the file and what to
# do); for the status, per run (finished/unfinished): "same" (the intact line), "named" (the
# run's line names the file), or the state shown. Probes not listed must give "same".
EXPECTED: dict[tuple[str, str, str], str] = {}


def _expect(entry: str, file: str, outcome: str, damages=None) -> None:
    for how in damages or KINDS[FILES[file][0]]:
        EXPECTED[(entry, file, how)] = outcome


READ_DAMAGES = ("emptied", "truncated", "garbage bytes", "bytes flipped", "non-UTF-8 bytes", "wrong JSON type")
CSV_REFUSED = ("emptied", "truncated", "garbage bytes", "non-UTF-8 bytes")  # a row or the header is damaged
# The training command resuming the unfinished run.
_expect("resume", "config.json", "refused")
for _file in ("metrics.csv", "learning_curve.csv"):
    _expect("resume", _file, "warned", ["deleted", "header only"])  # the rows lost are said
    _expect("resume", _file, "refused", CSV_REFUSED)
_expect("resume", "launches.jsonl", "warned")
_expect("resume", "checkpoints/checkpoint", "warned", READ_DAMAGES)  # rewritten from the checkpoint files
_expect("resume", "checkpoints/ckpt-40.index", "warned")  # resumed from ckpt-20
_expect("resume", "checkpoints/ckpt-40.data-00000-of-00001", "warned")
_expect("resume", "partial/batch-00000.npz", "warned", READ_DAMAGES)  # the batch is computed again
for _file in ("train.npy", "test.npy"):
    _expect("resume", DATA + _file, "refused", READ_DAMAGES)  # deleted: cached again
_expect("resume", DATA + "manifest.json", "refused")
# The training command run again on the finished run.
_expect("rerun", "config.json", "refused")
_expect("rerun", "results.json", "warned", READ_DAMAGES)  # evaluated again (deleted: silently, as unfinished)
# The evaluation command.
_expect("evaluate", "config.json", "refused")
_expect("evaluate", "checkpoints/ckpt-40.index", "warned")  # read from ckpt-20
# Bytes flipped in the middle of ckpt-40's data fall in the optimiser's slots, which evaluate does not read.
_expect("evaluate", "checkpoints/ckpt-40.data-00000-of-00001", "warned", ["deleted", "emptied", "truncated",
                                                                           "garbage bytes"])
_expect("evaluate", "model/weights.index", "warned")  # read from ckpt-40, the same step
_expect("evaluate", "model/weights.data-00000-of-00001", "warned")
_expect("evaluate", "partial/batch-00000.npz", "warned", READ_DAMAGES)
_expect("evaluate", DATA + "test.npy", "refused", READ_DAMAGES)
_expect("evaluate", DATA + "manifest.json", "refused")
# The runner's status: finished/unfinished run.
for _file in ("config.json", "metrics.csv", "learning_curve.csv"):
    _expect("status", _file, "named/named")
_expect("status", "results.json", "named/same", READ_DAMAGES)
_expect("status", "results.json", "stopped/same", ["deleted"])  # as if it had not finished: evaluated again


#: What the message naming the file must also say, where it matters which message it is.
SAYS: dict[tuple[str, str, str], str] = {}


def _say(entry: str, file: str, text: str, damages) -> None:
    SAYS.update({(entry, file, how): text for how in damages})


for _entry in ("resume", "rerun", "evaluate"):  # it cannot be done without: restore it
    _say(_entry, "config.json", "or train into a new --results directory", KINDS["json"])
    _say(_entry, "config.json", "config.json is missing, though", ["deleted"])
_say("resume", "metrics.csv", "metrics.csv was missing: its rows up to step 40 are lost", ["deleted"])
_say("resume", "metrics.csv", "metrics.csv holds 0 of its 4 row(s) up to step 40", ["header only"])
_say("resume", "learning_curve.csv", "learning_curve.csv holds 0 of its 2 row(s) up to step 40",
     ["deleted", "header only"])
_say("resume", "launches.jsonl", "launches.jsonl: line(s) 1 damaged and skipped", KINDS["jsonl"][2:])
_say("resume", "checkpoints/checkpoint", "rewritten from the 2 checkpoint file(s)", READ_DAMAGES)
_say("resume", "checkpoints/ckpt-40.index", "ckpt-40 in ", ["deleted"])  # "data without an .index file"
for _file, _damages in (("checkpoints/ckpt-40.index", ["garbage bytes"]),
                        ("checkpoints/ckpt-40.data-00000-of-00001", ["deleted", "truncated", "bytes flipped"])):
    _say("resume", _file, "could not be restored; resuming from ckpt-20", _damages)
_say("evaluate", "checkpoints/ckpt-40.data-00000-of-00001", "could not be restored; reading ckpt-20",
     ["deleted", "truncated"])
for _entry in ("resume", "evaluate"):
    _say(_entry, "partial/batch-00000.npz", "batch-00000.npz is damaged", READ_DAMAGES)
_say("rerun", "results.json", "results.json is damaged; evaluating the finished run again", READ_DAMAGES)
for _file in ("model/weights.index", "model/weights.data-00000-of-00001"):
    _say("evaluate", _file, "read from checkpoint ckpt-40 instead", KINDS["binary"])


def _cases():
    cases = []
    for entry, state in ENTRY_POINTS.items():
        for file, (kind, _) in FILES.items():
            if _exists_in(file, state):
                not_read = NOT_READ_BY_EVALUATE if entry == "evaluate" else NOT_READ
                for how in COSTLY.get((entry, file), KINDS[kind] if file in READS[entry] else not_read):
                    cases.append(pytest.param(entry, file, how, id=f"{entry}-{file}-{how}"))
    return cases


def _exists_in(file: str, state: str) -> bool:
    if file == "results.json":
        return state in ("finished", "both")
    if file.startswith("partial/"):
        return state in ("unfinished", "both")
    return True


# ----------------------------------------------------------------------------- the runs

def _small_config() -> dict:
    from vcd_helpers.config import load_config

    values = load_config("tiny").to_dict()
    # Two images in two batches of one, so that an interrupted evaluation leaves one batch saved.
    # The encoder's proposal: the probes are about files, which an HMC proposal reads no
    # differently, and tracing its chain would cost each probe a second more.
    values["evaluation"].update(proposal="encoder", num_examples=2, batch_size=1, num_samples=10, chunk_size=10)
    values["curve"].update(proposal="encoder", num_examples=2, batch_size=2, num_samples=5, chunk_size=5)
    values["curve_every_epochs"] = 1.0  # rows at steps 20 and 40
    return values


def _train_argv(config: Path, run: Path) -> list[str]:
    # One step per call: the in-graph loop of ten would cost a longer tracing in each probe.
    return ["train", "--config", str(config), "--results", str(run), "--quiet", "--no-xla", "--steps-per-call", "1"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The config file, the two runs, the saved batch's directory and the finished run's numbers."""
    root = tmp_path_factory.mktemp("matrix")
    config = root / "small.json"
    config.write_text(json.dumps(_small_config()))
    unfinished, finished = root / "unfinished", root / "finished"
    real_write = run_evaluation.write_atomic

    def killed_after_one_batch(path, contents):
        real_write(path, contents)
        if Path(path).name.startswith("batch-"):
            raise KeyboardInterrupt  # as a kill during the final evaluation would
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_evaluation, "write_atomic", killed_after_one_batch)
        assert main(_train_argv(config, unfinished)) == 130
    # As if resumed once before: the record a resume that wrote rows again appends.
    append_jsonl(unfinished / layout.RESUME_CHECKS_FILE, {"resumed_from": 20, "rows_compared": 2,
                                                                 "identical": True, "max_relative_difference": 0.0,
                                                                 "code": None})
    (unfinished / layout.LOCK_FILE).unlink()
    partial = next((unfinished / layout.PARTIAL_DIR).iterdir())
    assert sorted(p.name for p in partial.iterdir()) == ["batch-00000.npz"]
    assert not (unfinished / layout.RESULTS_FILE).exists()
    shutil.copytree(unfinished, finished)
    assert main(_train_argv(config, finished)) == 0
    (finished / layout.LOCK_FILE).unlink()
    results = json.loads((finished / layout.RESULTS_FILE).read_text())
    return {"config": config, "unfinished": unfinished, "finished": finished, "partial": partial.name,
            "mean": results["test_log_likelihood"]["mean"], "final_metrics": results["final_metrics"]}


def _path(run: Path, data_dir: Path, file: str, partial: str) -> Path:
    if file.startswith(DATA):
        name = file.removeprefix(DATA)
        if name == "manifest.json":
            return data_dir / name
        return next(data_dir.glob(f"binarized_mnist_*_{name}"))
    if file.startswith("partial/"):
        return run / layout.PARTIAL_DIR / partial / file.removeprefix("partial/")
    return run / file


def _files(run: Path) -> set[str]:
    return {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and p.name != layout.LOCK_FILE}


@contextlib.contextmanager
def _data_copy(tmp_path: Path, monkeypatch):
    """$VCD_DATA_DIR pointing to a copy of the data cache (its arrays and manifest), read afresh."""
    source = data.data_source()
    copy = tmp_path / "data"
    copy.mkdir()
    for path in [source.cache_dir / "manifest.json", *source.cache_dir.glob(f"binarized_mnist_{source.source}_*.npy")]:
        shutil.copy2(path, copy)
    monkeypatch.setenv(data.DATA_DIR_ENV, str(copy))
    monkeypatch.setenv(data.SOURCE_ENV, source.source)
    monkeypatch.setattr(data, "_chosen_source", {})
    monkeypatch.setattr(data, "_loaded", {})
    yield copy


def _status(tmp_path: Path, runs_of: dict[str, Path], monkeypatch, capfd) -> tuple[int, str, str]:
    """The runner's --status on a runs directory laid out as the runner lays it out (RUNS/runs/NAME,
    RUNS/logs, RUNS/runner.lock), holding ``runs_of`` {plan name: run} (moved there)."""
    root = tmp_path / "vcd-runs"
    (root / "runs").mkdir(parents=True)
    (root / "logs").mkdir()
    (root / "runner.lock").write_text("")
    for name, run in runs_of.items():
        shutil.move(run, root / "runs" / name)
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "committed")  # none committed
    _planned_as_built(monkeypatch)
    monkeypatch.setenv("VCD_RUNS_DIR", str(root))
    monkeypatch.setattr(sys, "argv", ["run_experiments.py", "--status"])
    capfd.readouterr()
    code = runner.main()
    out, err = capfd.readouterr()
    return code, out, err


STATUS_NAMES = {"finished": "vcd_global_e100_s1", "unfinished": "vcd_global_e100_s2"}


def _planned_as_built(monkeypatch) -> None:
    """The small runs stand in for two planned runs: the plan's config, for status, is theirs (with
    the plan's own, status shows them as the runs their training command refuses)."""
    from vcd_helpers.runs.cli import config_from_options

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "small.json").write_text(json.dumps(_small_config()))
        small = config_from_options(_train_argv(Path(tmp) / "small.json", Path(tmp) / "run")[1:])
    monkeypatch.setattr(runner, "config_from_options", lambda options: small)


def _status_lines(out: str) -> dict[str, str]:
    return {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in
            STATUS_NAMES.values()}


@pytest.fixture(scope="module")
def intact_status(built, tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("intact-status")
    copies = {STATUS_NAMES[s]: _copy_run(built[s], tmp / s) for s in STATUS_NAMES}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "RESULTS", tmp / "committed")
        _planned_as_built(patch)
        root = tmp / "vcd-runs"
        (root / "runs").mkdir(parents=True)
        for name, run in copies.items():
            shutil.move(run, root / "runs" / name)
        lines = _status_lines(runner.status(root))
    return {state: lines[name] for state, name in STATUS_NAMES.items()}


def _copy_run(run: Path, target: Path) -> Path:
    shutil.copytree(run, target)
    return target


# ----------------------------------------------------------------------------- the probes

ERROR = re.compile(r"^error: .+$")
WHAT_TO_DO = re.compile(r"\b(restore|delete|move|run the|train into|rebuild|remove|choose|give)\b", re.I)


def _outcome(code: int, out: str, err: str, named_by: str) -> str:
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    if code == 0:
        if any(named_by in w for w in warnings):
            return "warned"
        assert not warnings, f"a warning that does not name {named_by}: {warnings}"
        return "same"
    assert code == 2, (code, err)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert len(lines) == 1 and ERROR.match(lines[0]), f"not a one-line error: {err!r}"
    assert named_by in lines[0], f"the error does not name {named_by}: {lines[0]}"
    assert WHAT_TO_DO.search(lines[0].split(named_by, 1)[1]), f"the error does not say what to do: {lines[0]}"
    return "refused"


@pytest.mark.parametrize("entry, file, how", _cases())
def test_damage(entry, file, how, built, intact_status, tmp_path, monkeypatch, capfd):
    kind, named_by = FILES[file]
    with contextlib.ExitStack() as stack:
        data_dir = (stack.enter_context(_data_copy(tmp_path, monkeypatch)) if file.startswith(DATA)
                    else data.data_source().cache_dir)
        if entry == "status":
            copies = {s: _copy_run(built[s], tmp_path / s) for s in STATUS_NAMES}
            for state, run in copies.items():
                if _exists_in(file, state) and not file.startswith(DATA):
                    _damage(_path(run, data_dir, file, built["partial"]), how)
            if file.startswith(DATA):
                _damage(_path(None, data_dir, file, built["partial"]), how)
            code, out, err = _status(tmp_path, {STATUS_NAMES[s]: r for s, r in copies.items()}, monkeypatch, capfd)
            assert code == 0 and "Traceback" not in err, err
            lines = _status_lines(out)
            outcomes = []
            for state, name in STATUS_NAMES.items():
                line = lines[name]
                if line == intact_status[state]:
                    outcomes.append("same")
                elif " damaged " in line:
                    assert named_by in line, line
                    outcomes.append("named")
                else:
                    outcomes.append(line.split()[1])  # the state it shows
            outcome = "/".join(outcomes)
            assert outcome == EXPECTED.get((entry, file, how), "same/same"), (outcome, out)
            return

        state = ENTRY_POINTS[entry]
        run = _copy_run(built[state], tmp_path / "run")
        if entry == "evaluate" and file.startswith("checkpoints/"):
            shutil.rmtree(run / layout.MODEL_DIR)  # a run still training: evaluate reads its checkpoints
        before = _files(run)
        target = _path(run, data_dir, file, built["partial"])
        _damage(target, how)
        capfd.readouterr()
        argv = _train_argv(built["config"], run) if entry in ("resume", "rerun") else ["evaluate", str(run)]
        computed, real_write = [], run_evaluation.write_atomic

        def saving(path, contents):  # which batches of the final evaluation were computed
            computed.append(Path(path).name)
            real_write(path, contents)
        monkeypatch.setattr(run_evaluation, "write_atomic", saving)
        try:
            code = main(argv)
        except BaseException as error:  # what the command line would show as a traceback
            pytest.fail(f"{type(error).__name__} escaped: {error}")
        out, err = capfd.readouterr()
        assert "Traceback" not in err, err
        outcome = _outcome(code, out, err, named_by)
        after = _files(run)
        damaged = str(target.relative_to(run)) if target.is_relative_to(run) else None
        if outcome == "refused":
            # Nothing a later step needs is gone (the saved evaluation batch above all), nothing is written.
            assert before - after <= {damaged}, f"deleted though refused: {sorted(before - after - {damaged})}"
            written = [name for name in after - before if name.startswith(("results.json", "evaluation-", "per_"))]
            assert not written, f"written though refused: {written}"
        elif entry in ("resume", "rerun"):
            # Whatever was recovered, the model and its evaluation are the intact run's.
            results = json.loads((run / layout.RESULTS_FILE).read_text())
            assert json.loads(out)["test_log_likelihood"] == results["test_log_likelihood"]
            assert results["test_log_likelihood"]["mean"] == pytest.approx(built["mean"], abs=1e-4)
            if outcome == "same":
                assert results["final_metrics"] == built["final_metrics"]
            assert not (run / layout.PARTIAL_DIR).exists()  # discarded once results.json was written
        else:
            record = json.loads(out)
            # A damaged newest checkpoint is passed over for ckpt-20; damaged final weights are
            # read from ckpt-40, the same step.
            step = 20 if outcome == "warned" and file.startswith("checkpoints/ckpt-40") else 40
            assert record["checkpoint_step"] == step
            if step == 40:
                assert record["mean"] == pytest.approx(built["mean"], abs=1e-4)
        if outcome != "refused" and ENTRY_POINTS[entry] == "unfinished":
            # The saved batch is used unless it was damaged (or the model evaluated is another step's).
            reused = not file.startswith("partial/") and not (entry == "evaluate" and outcome == "warned"
                                                              and file.startswith("checkpoints/ckpt-40"))
            batches = [name for name in computed if name.startswith("batch-")]
            assert batches == (["batch-00001.npz"] if reused else ["batch-00000.npz", "batch-00001.npz"]), batches
        assert outcome == EXPECTED.get((entry, file, how), "same"), (outcome, err)
        assert SAYS.get((entry, file, how), "") in err


# ----------------------------------------------------------------------------- for real

def test_no_traceback_from_the_real_training_command(built, tmp_path):
    """Issue 35's run that could never finish: its final evaluation interrupted, then its launch
    records damaged. It finishes, with the saved batch used and the damaged line named."""
    run = _copy_run(built["unfinished"], tmp_path / "run")
    _damage(run / layout.LAUNCHES_FILE, "non-UTF-8 bytes")
    process = subprocess.run([sys.executable, "-m", "vcd_helpers", *_train_argv(built["config"], run)],
                             env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0 and "Traceback" not in process.stderr, process.stderr
    assert process.stderr.splitlines() == [
        f"warning: {run / layout.LAUNCHES_FILE} holds no record of the process(es) that trained steps up to 40: their "
        "records (code, machine) are lost; the run's numbers do not depend on them",
        f"warning: {run / layout.LAUNCHES_FILE}: line(s) 1 damaged and skipped: the record of the process(es) that "
        "wrote them is lost; the run's numbers do not depend on it"]
    assert json.loads(process.stdout)["test_log_likelihood"]["mean"] == pytest.approx(built["mean"], abs=1e-4)
    assert not (run / layout.PARTIAL_DIR).exists()


def test_no_traceback_from_the_real_status(built, tmp_path):
    """tools/run_experiments.py --status on a runs directory with a damaged run beside an intact one."""
    root = tmp_path / "vcd-runs"
    for state, name in STATUS_NAMES.items():
        _copy_run(built[state], root / "runs" / name)
    _damage(root / "runs" / STATUS_NAMES["finished"] / layout.CONFIG_FILE, "non-UTF-8 bytes")
    process = subprocess.run([sys.executable, str(ROOT / "tools" / "run_experiments.py"), "--status"],
                             env=SUBPROCESS_ENV | {"VCD_RUNS_DIR": str(root)}, capture_output=True, text=True,
                             timeout=300)
    assert process.returncode == 0 and process.stderr == "", process.stderr
    lines = _status_lines(process.stdout)
    assert lines[STATUS_NAMES["finished"]].split()[1] == "damaged" and "config.json" in lines[STATUS_NAMES["finished"]]
    # The stand-in's config is not the planned run's: its training command would refuse it, and says why.
    unfinished = lines[STATUS_NAMES["unfinished"]]
    assert unfinished.split()[1] == "refused" and "holds a run with a different configuration" in unfinished

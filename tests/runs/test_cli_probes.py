"""Every entry point refuses bad input cleanly (issue 50): a probe table.

Each probe runs one entry point - ``train``, ``evaluate``, ``bench`` (``cli.main``), the runner
(``tools/run_experiments.py``) or ``tools/replay_g_terms.py`` - with one bad value or one bad
environment variable, in this process, and checks what a user at a terminal sees:

- exit code 2;
- the last line of stderr names the bad value (an argparse error may print its usage above it;
  anything else prints exactly one line), and no traceback;
- no results directory claimed, no runs directory created;
- nothing overwritten: a finished run's files and the committed ``results/`` keep their bytes.

The thread-count variables abort TensorFlow at its first op (SIGABRT, a native stack), and a
Ctrl-C while the package imports TensorFlow used to print a traceback: those probes run the real
commands in a subprocess, where that would show.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vcd_helpers.config import load_config
from vcd_helpers.results import COMMITTED_RESULTS
from vcd_helpers.runs import runner
from vcd_helpers.runs.cli import main

# A finished run is trained once, and a few probes start Python: about a minute.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("replay_g_terms", ROOT / "tools" / "replay_g_terms.py")
replay_g_terms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay_g_terms)


def _tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` by relative path, with its bytes' SHA-256."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> dict[str, Path]:
    """A finished tiny run, the bad files the probes name, and a fresh path for each probe's results."""
    root = tmp_path_factory.mktemp("probes")
    finished = root / "finished"
    assert main(["train", "--config", "tiny", "--results", str(finished), "--quiet"]) == 0
    tiny = json.loads((ROOT / "vcd_helpers" / "presets" / "tiny.json").read_text())
    (root / "nested.json").write_text('{"a":' * 5000 + "1" + "}" * 5000)
    (root / "huge_step.json").write_text(json.dumps(tiny | {"hmc": tiny["hmc"] | {"initial_step_size": 1e308}}))
    (root / "huge_floor.json").write_text(json.dumps(tiny | {"model": {"min_scale": 1e30}}))
    (root / "a_directory").mkdir()
    (root / "a_file").write_text("not a directory\n")
    os.symlink(root / "loop_b", root / "loop_a")
    os.symlink(root / "loop_a", root / "loop_b")
    return {"root": root, "finished": finished, "new": root / "new"}


# (entry point, arguments, environment, what the last line must name). In arguments and environment,
# {root}, {finished} and {new} stand for the fixture's paths; {new} must still not exist afterwards.
PROBES = [
    ("train", "--config tiny --results {new} --batch-size 0", {}, "batch_size=0"),
    ("train", "--config tiny --results {new} --learning-rate nan", {}, "learning_rate=nan"),
    ("train", "--config tiny --results {new} --chain-shards 51", {}, "execution.chain_shards=51"),
    ("train", "--config tiny --results {new} --steps-per-call 0", {}, "execution.steps_per_call=0"),
    ("train", "--config {root}/nested.json --results {new}", {}, "nests its JSON too deeply"),
    ("train", "--config {root}/huge_step.json --results {new}", {}, "hmc.initial_step_size=1e+308"),
    ("train", "--config {root}/huge_floor.json --results {new}", {}, "model.min_scale=1e+30 is invalid: must lie in (0, 1)"),
    ("train", "--config {root}/a_directory --results {new}", {}, "a_directory' is a directory"),
    ("train", "--config tiny --results {root}/loop_a", {}, "loop_a: it is a symbolic link that leads nowhere"),
    ("train", "--config tiny --results ", {}, "argument --results: '' is invalid"),
    ("train", "--config tiny --results {new}", {"VCD_DATA_SOURCE": "garbage", "VCD_DATA_DIR": "{root}/data"},
     "$VCD_DATA_SOURCE='garbage'"),
    ("train", "--config tiny --results {new}", {"VCD_DATA_DIR": "{root}/a_file"}, "a_file ($VCD_DATA_DIR, or its default): it is a file, not a directory"),
    ("train", "--config tiny --results {new} --strategy multi_worker", {"TF_CONFIG": "garbage"},
     "TF_CONFIG is not valid JSON"),
    ("evaluate", "", {}, "argument results: '' is invalid"),
    ("evaluate", "{root}/absent", {}, "absent"),
    ("evaluate", "{finished} --temperatures 5", {}, "--temperatures is invalid without --ais"),
    ("evaluate", "{finished} --ais --samples 3", {}, "--samples is invalid with --ais"),
    ("evaluate", "{finished} --ais --starts 4", {}, "--starts is invalid with --ais"),
    ("evaluate", "{finished} --ais --step-size-per-chain", {}, "--step-size-per-chain is invalid with --ais"),
    ("evaluate", "{finished} --starts 0", {}, "argument --starts: '0' is invalid"),
    ("evaluate", "{finished} --proposal encoder --starts 4", {}, "num_starts=4 is invalid: the encoder proposal runs no chain"),
    ("evaluate", "{finished} --ais --temperatures 0", {}, "argument --temperatures: '0' is invalid"),
    ("evaluate", "{finished} --ais --chains -3", {}, "argument --chains: '-3' is invalid"),
    ("evaluate", "{finished} --examples 999999", {}, "num_examples=999999 is invalid: the test split has 10000"),
    ("evaluate", "{finished} --proposal encoder --samples 0", {}, "argument --samples: '0' is invalid"),
    ("bench", "--breakdown --evaluation", {}, "--breakdown and --evaluation are invalid together"),
    ("bench", "--configs tiny --examples 5", {}, "--examples 5 is invalid without --evaluation"),
    ("bench", "--configs tiny --batch-sizes 50 --chain-shards 1000 --calls 1", {}, "execution.chain_shards=1000"),
    ("bench", "--configs tiny --evaluation --examples 20000 --calls 1", {}, "20000"),
    ("bench", "--configs tiny --batch-sizes 0", {}, "argument --batch-sizes: '0' is invalid"),
    ("runner", "--status --runs-dir {root}/loop_a", {}, "loop_a (--runs-dir"),
    ("runner", "--status --runs-dir {root}/a_file", {}, "a_file (--runs-dir, $VCD_RUNS_DIR or ~/vcd-runs) is a file"),
    ("runner", "--jobs 0 --runs-dir {new}", {}, "--jobs 0 is invalid"),
    ("runner", "--only bogus_run --runs-dir {new}", {}, "'bogus_run'"),
    ("replay", "bogus_run", {}, "'bogus_run'"),
    ("replay", "vcd_local_e100_s0 --epochs nan", {}, "'nan'"),
    ("replay", "vcd_local_e100_s0 --every 0", {}, "'0'"),
]


def _filled(text: str, place: dict[str, Path]) -> str:
    return text.format(**{key: str(path) for key, path in place.items()})


def _run(entry: str, argv: list[str]) -> int:
    """One entry point in this process: its exit code, whether returned or raised by argparse."""
    try:
        if entry in ("train", "evaluate", "bench"):
            return main([entry, *argv])
        if entry == "runner":
            sys.argv = ["run_experiments.py", *argv]
            return runner.main()
        return replay_g_terms.main(argv)
    except SystemExit as exit_:
        return exit_.code


@pytest.mark.parametrize("entry, arguments, environment, named", PROBES,
                         ids=[f"{p[0]} {p[1]} {' '.join(f'{k}={v}' for k, v in p[2].items())}".strip() for p in PROBES])
def test_a_bad_value_is_refused_in_one_line_naming_it(place, monkeypatch, capsys, entry, arguments, environment,
                                                      named):
    argv = [_filled(a, place) for a in arguments.split(" ")] if arguments else [""]
    for key, value in environment.items():
        monkeypatch.setenv(key, _filled(value, place))
    monkeypatch.setattr(sys, "argv", sys.argv)  # the runner's probes set it
    monkeypatch.setattr(replay_g_terms, "replay", lambda *args: pytest.fail("replayed despite a bad argument"))
    monkeypatch.setattr(runner, "runner_lock", lambda root: pytest.fail("the runner went on to lock its directory"))
    finished, committed = _tree_digest(place["finished"]), _tree_digest(COMMITTED_RESULTS)
    code = _run(entry, argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and lines, err
    assert named in lines[-1], err
    argparse_error = ": error: " in lines[-1]
    assert len(lines) == 1 or argparse_error, err  # argparse prints its usage above its error line
    assert not place["new"].exists(), "a refused command claimed its results directory"
    assert _tree_digest(place["finished"]) == finished and _tree_digest(COMMITTED_RESULTS) == committed


# The real commands, where TensorFlow's abort or a traceback would show.
COMMANDS = {
    "train": [sys.executable, "-m", "vcd_helpers", "train", "--config", "tiny", "--results", "{new}", "--quiet"],
    "evaluate": [sys.executable, "-m", "vcd_helpers", "evaluate", "{finished}"],
    "bench": [sys.executable, "-m", "vcd_helpers", "bench", "--configs", "tiny", "--calls", "1"],
    "runner": [sys.executable, str(ROOT / "tools" / "run_experiments.py"), "--status"],
    "replay": [sys.executable, str(ROOT / "tools" / "replay_g_terms.py"), "vcd_local_e100_s0"],
}


@pytest.mark.parametrize("entry", COMMANDS)
@pytest.mark.parametrize("variable, value", [("TF_NUM_INTRAOP_THREADS", "-3"), ("TF_NUM_INTEROP_THREADS", "garbage")])
def test_a_bad_thread_count_is_refused_in_one_line_before_tensorflow_runs(place, entry, variable, value):
    argv = [_filled(a, place) for a in COMMANDS[entry]]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=os.environ | {variable: value})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"error: ${variable}={value!r} is invalid: must be a whole number of threads, "
                                   "0 or more (0 lets TensorFlow choose), or unset"), done.stderr
    assert not place["new"].exists()


@pytest.mark.parametrize("entry", ["train", "evaluate"])
def test_ctrl_c_while_the_package_imports_is_one_line(place, entry):
    process = subprocess.Popen([_filled(a, place) for a in COMMANDS[entry]], cwd=ROOT, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Interrupt once TensorFlow's library is being loaded (its import takes seconds), whatever the load.
    maps = Path(f"/proc/{process.pid}/maps")
    deadline = time.monotonic() + 120
    while "tensorflow" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and err.strip() == "interrupted", err


def test_sigterm_stops_evaluate_with_a_word(place, monkeypatch, capsys):
    from vcd_helpers.runs import evaluate as run_evaluation

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        pytest.fail("SIGTERM did not stop evaluate")

    monkeypatch.setattr(run_evaluation, "evaluate_run", killed)
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, lambda *args: None)  # what evaluate must replace (train set one earlier)
    try:
        code = main(["evaluate", str(place["finished"])])
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert code == 130 and capsys.readouterr().err.strip() == "interrupted"


def test_evaluate_passes_only_the_options_given(place, monkeypatch, capsys):
    # An option left out keeps the run's setting; passed as None it would set None (the whole split).
    from vcd_helpers.runs import evaluate as run_evaluation

    calls = []
    monkeypatch.setattr(run_evaluation, "evaluate_run", lambda results, **overrides: calls.append(overrides) or {})
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert main(["evaluate", str(place["finished"]), "--samples", "7"]) == 0
        assert main(["evaluate", str(place["finished"]), "--starts", "4", "--step-size-per-chain"]) == 0
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert calls == [{"num_samples": 7}, {"num_starts": 4, "step_size_per_chain": True}]


def test_the_runner_names_why_it_refuses_a_run(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    run = runner.PLAN[0]
    directory = tmp_path / "runs" / run.name
    directory.mkdir(parents=True)
    other = load_config("default", seed=99)
    (directory / "config.json").write_text(json.dumps(other.identity()))
    (directory / "metrics.csv").write_text("step,wall_time,loss\n100,5.0,1\n200,10.0,1\n")
    line = runner.status(tmp_path).splitlines()[2]
    assert line.startswith(f"{run.name} ") and " refused " in line and "seed" in line and "99" in line, line

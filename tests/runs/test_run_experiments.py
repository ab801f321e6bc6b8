"""The experiment runner's plan: every run is a valid training command of the stated length,
and the status and collection steps work on a runs directory."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vcd_helpers.runs import runner
from vcd_helpers.runs.cli import config_from_options
from vcd_helpers.runs.directory import RunDirectory
from vcd_helpers.plan import PLAN

ROOT = Path(__file__).resolve().parents[2]


#: What results.json holds at least once a run has finished (results.SUMMARY_KEYS).
FINISHED = {"steps": 400_000, "ms_per_step": 50.0, "examples_per_second": 2000.0, "test_log_likelihood": {"mean": -96.5}}


def _config(run):
    return config_from_options(run.options)


def test_every_committed_config_reads_and_each_planned_run_is_the_run_it_committed():
    # The identity a run is resumed under: the files written before the execution section (top-level
    # strategy and replicas) read as the same runs that the plan's options resolve to today.
    from vcd_helpers.config import Config
    from vcd_helpers.results import COMMITTED_RESULTS, read_config

    stored = {path.name: read_config(path) for path in sorted(COMMITTED_RESULTS.iterdir())
              if (path / "config.json").exists()}
    assert len(stored) >= 20
    for config in stored.values():
        assert Config.from_dict(config.identity()).identity() == config.identity()
    planned = [run for run in PLAN if run.name in stored]
    assert len(planned) >= 13
    for run in planned:
        assert _config(run).identity() == stored[run.name].identity(), run.name


def test_the_plan_is_the_issue_list_of_valid_runs():
    configs = {run.name: _config(run) for run in PLAN}
    assert len(configs) == len(PLAN) == 30
    headline = [run.name for run in PLAN if run.headline]
    # Runs 1-3 first, then the 1,600-epoch run (claim 4), which thus takes one of the two slots.
    assert headline == ["vcd_scheduled_e800_s0", "vae_e800_s0", "vcd_global_e800_s0", "vcd_scheduled_e1600_s0"]
    assert [run.name for run in PLAN[:4]] == headline
    for name in headline:
        assert configs[name].num_steps == 400_000 * (2 if "e1600" in name else 1)
        assert configs[name].evaluation.num_examples is None
        assert configs[name].evaluation.num_samples == 20_000 and configs[name].evaluation.proposal == "hmc_moments"
    # Claim 4: the paper's run but twice as long, the decay stretched in proportion.
    assert configs["vcd_scheduled_e1600_s0"] == configs["vcd_scheduled_e800_s0"].replace(
        epochs=1600, optimizer={"lr_decay_epochs": 60.0})
    assert configs["vcd_scheduled_e1600_s0"].lr_decay_steps == 30_000
    assert configs["vcd_scheduled_e800_s0"].control_variate.kind == "scheduled"
    assert configs["vcd_global_e800_s0"].control_variate.kind == "global"
    assert configs["vae_e800_s0"].method == "vae"
    assert configs["vcd_local_e100_s2"].control_variate.kind == "local" and configs["vcd_local_e100_s2"].seed == 2
    # Claim 1's seeds at the paper's length: runs 1 and 2 but for the seed and the learning curve,
    # their weights kept, no other proposals; the four first in line after the headline runs.
    seeds = [f"{kind}_e800_s{seed}" for kind in ("vcd_scheduled", "vae") for seed in (1, 2)]
    assert [run.name for run in PLAN[4:8]] == seeds
    for run in PLAN[4:8]:
        assert run.keeps_weights and not run.extra_proposals and not run.headline
        base = configs[run.name.replace(run.name[-2:], "s0")]
        assert configs[run.name] == base.replace(seed=int(run.name[-1]), curve_every_epochs=None)
    # Hoffman (2017) next: the paper's VCD run but for the method, three seeds at 100 epochs, one at 800.
    hoffman = [f"hoffman_e100_s{seed}" for seed in (0, 1, 2)] + ["hoffman_e800_s0"]
    assert [run.name for run in PLAN[8:12]] == hoffman
    for name in hoffman:
        vcd = configs[name.replace("hoffman", "vcd_scheduled")]
        assert configs[name] == vcd.replace(method="hoffman"), name
    assert [run.name for run in PLAN if run.keeps_weights] == headline + seeds + ["hoffman_e800_s0"]
    # bf16 against float32: the same run but for the multiplies' precision.
    assert configs["vcd_scheduled_e100_s0_bf16"] == configs["vcd_scheduled_e100_s0"].replace(precision="bfloat16")
    # The batch-size study: 100 epochs at the tuned rates, the decay timescale scaled with the length.
    assert configs["bs1024_e100"].optimizer.learning_rate == 1.3e-3
    assert configs["bs16_e100"].num_steps == 100 * 50_000 // 16
    assert configs["bs128_e100"].lr_decay_steps == round(3.75 * 50_000 / 128)
    assert all(c.curve_every_epochs == (None if name in seeds else 25) for name, c in configs.items())


def test_status_and_collect_on_a_runs_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    status = runner.status(tmp_path)
    assert status.count("pending") == len(PLAN)
    run = PLAN[0]
    directory = tmp_path / "runs" / run.name
    (directory / "model").mkdir(parents=True)
    (directory / "config.json").write_text(_config(run).to_json())
    (directory / "metrics.csv").write_text("step,wall_time,loss\n100,5.0,1\n200,10.0,1\n")
    (directory / "model" / "weights.index").write_text("w")
    (directory / "checkpoints").mkdir()
    assert "stopped" in runner.status(tmp_path).splitlines()[2] and "50.0" in runner.status(tmp_path)
    with RunDirectory(directory).lock("the training command"):
        assert "training" in runner.status(tmp_path).splitlines()[2]
        with open(directory / "metrics.csv", "a") as f:
            f.write(f"{_config(run).num_steps},20.0,1\n")
        assert "evaluating" in runner.status(tmp_path).splitlines()[2]  # the final evaluation
    (directory / "results.json").write_text(json.dumps(FINISHED | {"name": run.name}))
    for proposal in run.extra_proposals:
        (directory / f"evaluation-{proposal}-S20000-Nall.json").write_text("{}")
    assert runner._is_done(run, directory)
    assert not runner._is_committed(run)
    target = runner.collect(run, directory)
    assert sorted(p.name for p in target.iterdir()) == sorted(
        ["config.json", "metrics.csv", "results.json", "model", "evaluation-encoder-S20000-Nall.json",
         "evaluation-hmc_mean-S20000-Nall.json"])
    assert not (target / "checkpoints").exists()
    # Committed, the run is finished even with its runs directory gone (a lost machine).
    assert runner._is_committed(run)
    empty = tmp_path / "elsewhere"
    assert runner.status(empty).count("pending") == len(PLAN) - 1 and "committed" in runner.status(empty)


@pytest.mark.parametrize("name, keeps", [("vae_e800_s1", True), ("vae_e100_s1", False)])
def test_collect_copies_the_final_weights_of_a_run_that_keeps_them_only(tmp_path, monkeypatch, name, keeps):
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    run = next(run for run in PLAN if run.name == name)
    directory = tmp_path / "runs" / run.name
    (directory / "model").mkdir(parents=True)
    (directory / "model" / "weights.index").write_text("w")
    (directory / "results.json").write_text(json.dumps(FINISHED | {"name": run.name}))
    target = runner.collect(run, directory)
    assert (target / "model" / "weights.index").exists() == keeps
    assert (target / "results.json").exists()


def test_a_committed_run_is_not_trained_again(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    committed, fresh = PLAN[-2], PLAN[-1]  # two short runs of the plan, neither a headline run
    (tmp_path / "results" / committed.name).mkdir(parents=True)
    (tmp_path / "results" / committed.name / "config.json").write_text(_config(committed).to_json())
    (tmp_path / "results" / committed.name / "results.json").write_text(json.dumps(FINISHED | {"name": committed.name}))
    started = []
    work = runner.Runner(tmp_path, tmp_path, jobs=1, log=lambda message: None)
    monkeypatch.setattr(work, "work", lambda run: started.append(run.name) or "done")
    assert work.run([committed, fresh]) == 0
    assert started == [fresh.name]


def test_the_runner_refuses_a_second_runner(tmp_path):
    with runner.runner_lock(tmp_path):
        with pytest.raises(SystemExit, match="another runner holds"):
            with runner.runner_lock(tmp_path):
                pass


def test_a_run_terminated_by_stop_is_stopped_not_failed(tmp_path, monkeypatch):
    work = runner.Runner(tmp_path, tmp_path, jobs=1, log=lambda message: None)

    def terminated(name, argv):
        work.stop()
        return 130  # what the training command exits with when stop() terminates it
    monkeypatch.setattr(work, "_call", terminated)
    assert work.work(PLAN[-1]) == "stopped"
    monkeypatch.setattr(work, "_call", lambda name, argv: 1)
    work.stopping = False
    assert work.work(PLAN[-1]).startswith("train exited 1")


@pytest.mark.parametrize("leads_its_session", [True, False])
def test_the_runner_yields_to_interactive_work(tmp_path, monkeypatch, leads_its_session):
    niced = []
    monkeypatch.setattr(runner.os, "nice", niced.append)
    monkeypatch.setattr(runner.os, "getsid", lambda pid: runner.os.getpid() if leads_its_session else 1)
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("0\n")
    runner.yield_cores(autogroup)
    assert niced == [runner.NICENESS]
    # Its session's priority too, but only when the session is the runner's own (under setsid).
    assert autogroup.read_text() == (f"{runner.NICENESS}\n" if leads_its_session else "0\n")
    runner.yield_cores(tmp_path / "missing" / "autogroup")  # no autogroups on this kernel: nice alone


def test_a_run_still_held_by_another_process_is_waited_for_not_failed(tmp_path, monkeypatch):
    messages, started = [], []
    work = runner.Runner(tmp_path, tmp_path, jobs=1, log=messages.append)
    work.poll_seconds = 0.02
    monkeypatch.setattr(work, "_call", lambda name, argv: started.append(argv[0]) or 1)
    run = PLAN[-1]
    held, release = threading.Event(), threading.Event()

    def training_left_by_a_killed_runner():
        with RunDirectory(tmp_path / "runs" / run.name).lock("a training still saving its checkpoint"):
            held.set()
            release.wait()
    holder = threading.Thread(target=training_left_by_a_killed_runner)
    holder.start()
    held.wait()
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(work.work(run)))
    worker.start()
    time.sleep(0.3)
    assert started == [] and messages == [
        f"{run.name}: waiting for process {os.getpid()}: a training still saving its checkpoint, which holds its directory"]
    release.set()
    holder.join()
    worker.join(timeout=10)
    assert started == ["train"] and outcome[0].startswith("train exited 1")


def _trainings(pid: int) -> list[int]:
    """The runner's child processes running the package (not the snapshot's git and tar)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and b"vcd_helpers" in (stat.parent / "cmdline").read_bytes():
                found.append(int(stat.parent.name))
    return found


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return "(gone)"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.slow
def test_a_runner_killed_with_9_leaves_no_training_running(tmp_path):
    # The issue's probe: kill -9 of the runner left its trainings running, unmanaged. The runner
    # skips a run committed in results/, so it runs here with none committed (bs16_e100 is).
    start = ("import sys; from pathlib import Path; from vcd_helpers.runs import runner; "
             "runner.RESULTS = Path(sys.argv[1]); sys.argv[1:2] = []; sys.exit(runner.main())")
    process = subprocess.Popen([sys.executable, "-c", start, str(tmp_path / "committed"), "--jobs", "1",
                                "--only", "bs16_e100"], env=os.environ | {"VCD_RUNS_DIR": str(tmp_path)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (trainings := _trainings(process.pid)) and time.monotonic() < deadline:
        assert process.poll() is None, f"the runner ended (exit code {process.returncode}) before it started a training"
        time.sleep(0.2)
    assert trainings, "the runner started no training within two minutes"
    time.sleep(2)  # the training is importing TensorFlow, or past it: either way it must end
    process.kill()
    process.wait()
    # SIGTERM interrupts Python between two bytecodes: a training inside a long XLA compilation
    # (tens of seconds on a loaded 2-core machine; the test run's other worker and the experiment
    # runner share the cores) takes its signal when the compilation returns.
    deadline = time.monotonic() + 180
    while any(map(_alive, trainings)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(_alive, trainings)), [(pid, _command(pid)) for pid in trainings if _alive(pid)]


@pytest.mark.parametrize("file, damage, shown", [
    ("config.json", b"{not json", "is damaged (JSONDecodeError: Expecting"),
    ("metrics.csv", b"step,wall_time,loss\n100,5.0,1\n\xff,x\n", "is damaged: not UTF-8 text (byte 30)"),
    ("metrics.csv", b"step,wall_time,loss\n100,5.0,1\n200,x,1\n", "is damaged (ValueError: "),
    ("learning_curve.csv", b"step,epoch\n5000,10\n", "is damaged (IndexError: "),
])
def test_status_names_a_damaged_run_and_shows_the_others(tmp_path, monkeypatch, file, damage, shown):
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    run = PLAN[0]
    directory = tmp_path / "runs" / run.name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(_config(run).to_json())
    (directory / "metrics.csv").write_text("step,wall_time,loss\n100,5.0,1\n200,10.0,1\n")
    (directory / file).write_bytes(damage)
    lines = runner.status(tmp_path).splitlines()
    assert lines[2].startswith(f"{run.name} ") and f"damaged    {directory / file} {shown}" in lines[2], lines[2]
    assert sum("pending" in line for line in lines) == len(PLAN) - 1  # the others are still shown
    assert not runner._is_done(run, directory)


def test_a_runs_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "run_experiments.py"), "--runs-dir",
                           str(tmp_path / "file"), "--status"], capture_output=True, text=True)
    assert done.returncode == 2 and f"the runs directory {tmp_path / 'file'} (--runs-dir" in done.stderr


@pytest.mark.parametrize("where, reason", [("under_a_file", "Not a directory"), ("read_only", "Read-only file system")])
def test_a_runs_directory_it_cannot_write_is_refused_in_one_line(tmp_path, monkeypatch, capsys, where, reason):
    (tmp_path / "file").write_text("x")
    root = tmp_path / "file" / "runs" if where == "under_a_file" else tmp_path / "mount"
    if where == "read_only":  # root writes through permissions: a read-only mount, as the kernel says it
        def read_only(self, *args, **kwargs):
            raise OSError(30, "Read-only file system", str(self))
        monkeypatch.setattr(runner.Path, "mkdir", read_only)
    monkeypatch.setattr(sys, "argv", ["run_experiments.py", "--runs-dir", str(root)])
    monkeypatch.setattr(runner, "runner_lock", lambda root: pytest.fail("went on to lock an unusable directory"))
    with pytest.raises(SystemExit) as exit_:
        runner.main()
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"the runs directory {root} (--runs-dir" in error and f"is unusable: {reason}" in error, error


@pytest.mark.parametrize("lost, named", [("metrics rows", "metrics.csv ends at step 12500, before checkpoint ckpt-20000"),
                                         ("curve rows", "learning_curve.csv holds no row, though checkpoint ckpt-20000")])
def test_status_names_log_rows_lost_before_the_newest_checkpoint(tmp_path, monkeypatch, lost, named):
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    run = PLAN[0]  # a learning curve every 25 epochs: 12,500 steps
    directory = tmp_path / "runs" / run.name
    (directory / "checkpoints").mkdir(parents=True)
    (directory / "config.json").write_text(_config(run).to_json())
    (directory / "checkpoints" / "ckpt-20000.index").write_text("")
    last = 12_500 if lost == "metrics rows" else 20_000
    (directory / "metrics.csv").write_text(f"step,wall_time,loss\n{last - 100},5.0,1\n{last},10.0,1\n")
    if lost == "metrics rows":
        (directory / "learning_curve.csv").write_text("step,epoch,train_seconds,log_likelihood,standard_error,num_examples,"
                                                      "num_samples,proposal,eval_seconds\n"
                                                      "12500,25,600,-110.5,0.5,1000,2000,hmc_moments,60\n")
    lines = runner.status(tmp_path).splitlines()
    assert f"damaged    {directory}/{named}" in lines[2], lines[2]


def test_an_evaluation_no_other_run_can_join_gets_every_core(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    launched = []

    class Process:  # records what the runner gives the command, and ends at once
        def __init__(self, argv, *, env, **_):
            launched.append((argv[3], env["TF_NUM_INTRAOP_THREADS"]))

        def wait(self):
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", Process)
    jobs = runner.Runner(tmp_path, tmp_path, 2, log=lambda message: None)
    for active, pending in [(2, []), (1, PLAN[:1]), (1, [])]:
        jobs.active, jobs.pending = active, pending
        for command in ("train", "evaluate"):
            jobs._call("run", [command])
    # Two runs, or one with more to come: each process its share; the last run's evaluation: all four.
    assert launched == [("train", "2"), ("evaluate", "2"), ("train", "2"), ("evaluate", "2"),
                        ("train", "2"), ("evaluate", "4")]

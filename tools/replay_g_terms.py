"""Replay the first epochs of a planned run and measure the terms of VCD's g along the way.

    .venv/bin/python tools/replay_g_terms.py vcd_local_e100_s0 --epochs 10 --every 100

Trains the run's configuration from step 0 as the runner's training command does (the same
batches, the same in-graph loop of 10 steps per call, one thread), and compares each of its
logging windows with the run's row of metrics.csv when results/NAME holds it, as text: identical
rows show that the replay is the run itself (on the CPU model and code that trained it, the sums
come out bit for bit the same); a run trained on another CPU or by code that sums in another order
differs in the last digits first. Every ``--every`` steps it measures ``variance.g_terms`` on the
batch the next step takes, with that step's seed: the draws the step itself makes, so the g
measured is the step's own. Nothing it measures changes the training.

Writes results/g_terms/NAME.csv, one row per measurement: the step, quantiles over the batch of
log p(x, zT), of the quadratic term 1/2 sum_d ((zT_d - mu_d) / sigma_d)^2, of |g - b| and of b,
and the share of the encoder's scales within twice their floor (model.min_scale); and
NAME.json: the comparison with the run's rows, the command, code commit and CPU. Chapter 8 reads
these files; the book's reproducibility appendix lists them.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
from pathlib import Path

VCD_COMMAND_LINE = True  # vcd_helpers answers a bad environment or a Ctrl-C while importing in one line

import vcd_helpers  # noqa: F401, E402  (first: it imports TensorFlow without its start-up log lines)

import numpy as np
import tensorflow as tf

from vcd_helpers.config import Config
from vcd_helpers.data import indexed_batches, load_binarized_mnist
from vcd_helpers.devices import code_version, cpu_model
from vcd_helpers.files import write_atomic
from vcd_helpers.loops import fit
from vcd_helpers.results import COMMITTED_RESULTS, METRICS_FILE
from vcd_helpers.runs.cli import _positive_int, config_from_options
from vcd_helpers.runs.logs import window_means
from vcd_helpers.plan import PLAN
from vcd_helpers.seeds import fold_in
from vcd_helpers.trainers import build_trainer
from vcd_helpers.variance import g_terms

OUT_DIR = COMMITTED_RESULTS / "g_terms"
COLUMNS = ["step", "epoch", "log_joint_p50", "quadratic_p50", "quadratic_p90", "quadratic_max",
           "abs_g_minus_b_p50", "abs_g_minus_b_p90", "baseline_p50", "scale_p50", "floor_share"]


def summary(step: int, steps_per_epoch: int, terms, min_scale: float) -> list[str]:
    """One CSV row of ``COLUMNS`` from a measurement's terms (numpy arrays)."""
    gap = np.abs(terms["log_joint"] + terms["quadratic"] - terms["baseline"])
    values = [np.median(terms["log_joint"]), np.median(terms["quadratic"]), np.percentile(terms["quadratic"], 90),
              terms["quadratic"].max(), np.median(gap), np.percentile(gap, 90), np.median(terms["baseline"]),
              np.median(terms["scale"]), np.mean(terms["scale"] < 2 * min_scale)]
    return [str(step), f"{step / steps_per_epoch:g}", *(f"{v:.6g}" for v in values)]


def replay(config: Config, steps: int, every: int, committed: Path | None = None) -> tuple[list[list[str]], dict]:
    """Train ``config`` for ``steps`` steps from its start, measuring g's terms every ``every``
    steps. Returns the CSV rows (``COLUMNS``) and the comparison of its logging windows with
    ``committed`` (a run's metrics.csv) as far as both go: rows compared, rows identical as text,
    the first step that differs (None) and the largest relative difference of a metric. Raises
    SystemExit when ``every`` is not a multiple of the logging window dividing ``steps``."""
    if every % config.log_every_steps or steps % every:
        raise SystemExit(f"--every {every} must be a multiple of log_every_steps={config.log_every_steps} and "
                         f"divide the replayed {steps} steps")
    rows = list(csv.reader(committed.open()))[1:] if committed is not None and committed.exists() else []
    trainer = build_trainer(config)
    images = load_binarized_mnist("train")[: config.train_examples]
    measure = tf.function(lambda index, x, seed: g_terms(trainer, index, x, seed)._asdict())
    window: dict[str, list[float]] = {n: [] for n in trainer.metric_names}
    out = []
    comparison = {"rows_compared": 0, "rows_identical": 0, "first_difference": None, "max_relative_difference": 0.0}

    def record(step: int) -> None:
        index, x = next(iter(indexed_batches(images, config.batch_size, config.seed, start_step=step)))
        terms = {k: v.numpy() for k, v in measure(index, x, fold_in(trainer.seed, trainer.step)).items()}
        out.append(summary(step, config.steps_per_epoch, terms, config.model.min_scale))

    def on_step(step: int, metrics: dict[str, float]) -> None:
        for n in window:
            window[n].append(metrics[n])
        if step % config.log_every_steps == 0:
            row = [str(step), *window_means(window, list(trainer.metric_names))[1]]
            for n in window:
                window[n].clear()
            if step <= len(rows) * config.log_every_steps:
                theirs = rows[step // config.log_every_steps - 1]
                theirs = [theirs[0], *theirs[2:]]
                comparison["rows_compared"] += 1
                if theirs == row:
                    comparison["rows_identical"] += 1
                else:
                    comparison["first_difference"] = comparison["first_difference"] or step
                    difference = max(abs(float(a) - float(b)) / max(abs(float(b)), 1e-30)
                                     for a, b in zip(row[1:], theirs[1:]))
                    comparison["max_relative_difference"] = max(comparison["max_relative_difference"], difference)
        if step % every == 0:
            record(step)

    record(0)
    fit(trainer, indexed_batches(images, config.batch_size, config.seed), steps, progress=False,
        on_step=on_step)
    return out, comparison


def _positive_epochs(text: str) -> float:
    """--epochs: a positive, finite number of epochs (argparse names the option when refused)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: must be a positive, finite number of epochs")
    return value


def _measurements(path: Path) -> int:
    """How many measurements a g-terms file holds (0 when there is none)."""
    try:
        return max(len(path.read_text().splitlines()) - 1, 0)
    except FileNotFoundError:
        return 0


def main(argv: list[str] | None = None) -> int:
    plan = {run.name: run for run in PLAN}
    parser = argparse.ArgumentParser(prog="tools/replay_g_terms.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", choices=sorted(plan), metavar="NAME",
                        help="planned runs (tools/run_experiments.py --status lists them)")
    parser.add_argument("--epochs", type=_positive_epochs, default=10.0)
    parser.add_argument("--every", type=_positive_int, default=100, help="steps between measurements")
    args = parser.parse_args(argv)
    # Every refusal comes before any training, and nothing is written before the last replay ends:
    # results/g_terms/ is committed, and a replay shorter than what it holds would lose rows.
    jobs = []
    for name in args.names:
        config = config_from_options(plan[name].options)
        steps = round(args.epochs * config.steps_per_epoch)
        if steps < args.every or args.every % config.log_every_steps or steps % args.every:
            parser.error(f"--epochs {args.epochs:g} and --every {args.every} are invalid for {name}: --every must be "
                         f"a multiple of its logging window ({config.log_every_steps} steps) that divides the "
                         f"{steps} steps replayed")
        held = _measurements(OUT_DIR / f"{name}.csv")
        if steps // args.every + 1 < held:
            parser.error(f"--epochs {args.epochs:g} --every {args.every} would replace the {held} measurements of "
                         f"{OUT_DIR / name}.csv with {steps // args.every + 1}: a replay never shrinks a "
                         "committed result (give at least as many epochs, or delete the file yourself)")
        jobs.append((name, config, steps))
    for name, config, steps in jobs:
        out, comparison = replay(config, steps, args.every, COMMITTED_RESULTS / name / METRICS_FILE)
        OUT_DIR.mkdir(exist_ok=True)
        path = OUT_DIR / f"{name}.csv"
        table = io.StringIO()
        csv.writer(table).writerows([COLUMNS, *out])  # \r\n, as the committed files
        command = f"python tools/replay_g_terms.py {name} --epochs {args.epochs:g} --every {args.every}"
        record = {"run": name, "steps": steps, **comparison, "command": command, "code": code_version(),
                  "cpu_model": cpu_model()}
        write_atomic(path, table.getvalue())
        write_atomic(OUT_DIR / f"{name}.json", json.dumps(record, indent=2) + "\n")
        print(f"{name}: {steps} steps replayed; {comparison['rows_identical']} of {comparison['rows_compared']} "
              f"metrics rows identical to the run's; {len(out)} measurements in {path}")
    return 0


if __name__ == "__main__":
    # The runner trains each run on one thread (its two runs share two cores): the same thread
    # count sums the same floats in the same order, so the replay's metrics equal the run's.
    # TensorFlow reads these when it runs its first op, which is after this; set here, not in
    # main, so that a caller's process (a test calling main) keeps its own environment.
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
    sys.exit(main())

"""Run the experiments of chapter 7 with the training command, a few at a time.

    .venv/bin/python tools/run_experiments.py --jobs 2            # everything, two runs at once
    .venv/bin/python tools/run_experiments.py --only bs512 bs1024  # some of them

Each experiment is one ``python -m vcd_helpers train`` command writing into results/NAME/.
Interrupted runs resume from their checkpoints when this is run again; finished runs are
skipped (the training command returns their stored results). The exact command of each run is
recorded in its results.json; this file is the list of them.

Scale: EPOCHS epochs per run on a 2-core CPU (the sweep: SWEEP_EPOCHS), evaluated on the first
2,000 test images (the sweep: 1,000 validation images) with 1,000 importance samples each; the
paper: 800 epochs, all 10,000 test images, 20,000 samples.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
EPOCHS = 12
SWEEP_EPOCHS = 4
EVAL = ["--eval-examples", "2000", "--eval-samples", "1000"]
SWEEP_EVAL = ["--eval-examples", "1000", "--eval-samples", "1000"]

EXPERIMENTS: dict[str, list[str]] = {
    # Claim 2: local (the paper's schedule) versus global control variates, batch 100.
    "vcd_scheduled_bs100": ["--config", "default", "--epochs", str(EPOCHS), *EVAL],
    "vcd_global_bs100": ["--config", "global_cv", "--epochs", str(EPOCHS), *EVAL],
    # The plain VAE on the same budget, for reference.
    "vae_bs100": ["--config", "default", "--method", "vae", "--epochs", str(EPOCHS), *EVAL],
    # Claim 3: batch sizes at their tuned learning rates, global control variate.
    **{f"bs{b}": ["--config", "bs_experiment", "--batch-size", str(b), "--epochs", str(EPOCHS), *EVAL]
       for b in (16, 128, 512, 1024)},
    # A second seed of the two control-variate runs.
    "vcd_scheduled_bs100_seed1": ["--config", "default", "--epochs", str(EPOCHS), "--seed", "1", *EVAL],
    "vcd_global_bs100_seed1": ["--config", "global_cv", "--epochs", str(EPOCHS), "--seed", "1", *EVAL],
    # How the tuned table was found: a learning-rate sweep at batch 128 on the validation split.
    **{f"lr_sweep_bs128_lr{lr}": ["--config", "bs_experiment", "--batch-size", "128", "--learning-rate", lr,
                                  "--epochs", str(SWEEP_EPOCHS), "--eval-split", "valid", *SWEEP_EVAL]
       for lr in ("3e-4", "9e-4", "2.7e-3")},
}


def run(name: str) -> tuple[str, int, float]:
    start = time.time()
    command = [sys.executable, "-m", "vcd_helpers", "train", "--results", f"results/{name}", "--quiet",
               *EXPERIMENTS[name]]
    log = RESULTS / f"{name}.log"
    RESULTS.mkdir(exist_ok=True)
    with open(log, "a") as out:
        code = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
    return name, code, time.time() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (XLA's step uses about one core)")
    parser.add_argument("--only", nargs="*", choices=list(EXPERIMENTS), help="run only these")
    args = parser.parse_args()
    names = args.only or list(EXPERIMENTS)
    failed = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for name, code, seconds in pool.map(run, names):
            print(f"{name}: {'ok' if code == 0 else f'exit {code}'} in {seconds / 60:.1f} min", flush=True)
            failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

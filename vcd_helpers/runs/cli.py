"""The command line: ``python -m vcd_helpers train | evaluate | bench``.

    python -m vcd_helpers train --config default --results results/default
    python -m vcd_helpers train --config bs_experiment --batch-size 512 --epochs 20 --results runs/bs512
    python -m vcd_helpers train --resume --results results/default      # continue with the stored config
    python -m vcd_helpers train --config default --strategy mirrored --replicas 2 --results runs/dp2
    python -m vcd_helpers evaluate results/default
    python -m vcd_helpers bench --batch-sizes 100 512                   # ms per step, GFLOP/s
    python -m vcd_helpers bench --evaluation --calls 1                  # the final evaluation's speed

Running the same ``train`` command again resumes an interrupted run from its last checkpoint.
Changing the batch size without giving a learning rate takes the tuned rate for that batch size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from typing import Sequence

from vcd_helpers.config import (CONTROL_VARIATE_KINDS, METHODS, PRECISIONS, PROFILES, PROPOSALS, STRATEGIES, Config,
                                EvaluationConfig, get_profile, load_config, merge_values, preset_values)
from vcd_helpers.runs.evaluate import AIS_CHAINS, AIS_EXAMPLES, AIS_TEMPERATURES


def _positive_int(text: str) -> int:
    """An option's count: refused by argparse, naming the option, unless a positive integer."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: must be a positive integer")
    return value


def _directory(text: str) -> str:
    """A results directory: an empty name would mean the current directory, never meant."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: give a directory name")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vcd_helpers", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model into a results directory (resumes if interrupted)")
    train.add_argument("--config", help="preset name (default, global_cv, bs_experiment, smoke, tiny) or a JSON file")
    train.add_argument("--results", required=True, type=_directory, help="results directory (created; reused only by the same run)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --results; without --config its stored config is used")
    train.add_argument("--method", choices=METHODS)
    train.add_argument("--batch-size", type=int)
    train.add_argument("--learning-rate", type=float,
                       help="encoder-mean and decoder rate (the scale net gets half); default: the "
                            "preset's, or the tuned rate when --batch-size is given")
    length = train.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=float)
    length.add_argument("--steps", type=int)
    train.add_argument("--seed", type=int)
    train.add_argument("--lr-decay-epochs", type=float,
                       help="epochs per learning-rate decay by 0.9 (the paper: 30 in an 800-epoch run)")
    train.add_argument("--curve-every-epochs", type=float,
                       help="evaluate a fixed test subset every N epochs while training (learning_curve.csv)")
    train.add_argument("--control-variate", choices=CONTROL_VARIATE_KINDS)
    train.add_argument("--profile", choices=list(PROFILES),
                       help="size the run by a run profile: its training steps and evaluation")
    train.add_argument("--eval-split", choices=["valid", "test"])
    train.add_argument("--eval-examples", type=int, help="evaluate on the first N images of the split")
    train.add_argument("--eval-samples", type=int, help="importance samples per image")
    train.add_argument("--eval-proposal", choices=PROPOSALS)
    train.add_argument("--no-xla", action="store_true",
                       help="compile the step without XLA (slower; other round-off, so part of the run: a resume keeps it)")
    train.add_argument("--precision", choices=PRECISIONS,
                       help="the networks' multiplies in training (default float32; bfloat16: bf16 operands, "
                            "float32 sums and state; evaluation is always float32)")
    train.add_argument("--chain-shards", type=int,
                       help="blocks of chains whose HMC evaluations run concurrently (VCD; the same maths summed in "
                            "another order, so part of the run: a resume keeps it); default: one per compute thread")
    train.add_argument("--steps-per-call", type=int,
                       help="training steps per host call of the in-graph loop (default: up to 10, "
                            "dividing the logging interval)")
    train.add_argument("--strategy", choices=STRATEGIES,
                       help="data-parallel replicas: mirrored (GPUs, or logical CPUs split from the CPU) or "
                            "multi_worker (one process per worker, set up by TF_CONFIG); default none")
    train.add_argument("--replicas", type=int, help="replicas of the mirrored strategy (default 2)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")

    bench = commands.add_parser("bench", help="time the training step: ms/step, examples/s, GFLOP/s")
    bench.add_argument("--configs", nargs="+", default=["default", "global_cv"])
    bench.add_argument("--batch-sizes", nargs="+", type=_positive_int, default=[16, 100, 128, 512, 1024])
    bench.add_argument("--steps-per-call", type=_positive_int, default=10)
    bench.add_argument("--calls", type=_positive_int, default=5, help="timed calls per row (median reported)")
    bench.add_argument("--chain-shards", type=int, help="blocks of the VCD chain (default: one per compute thread)")
    bench.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["float32"],
                       help="time each row in each of these precisions (see train --precision)")
    bench.add_argument("--breakdown", action="store_true",
                       help="instead: where the first config's VCD step spends its time, at the first batch size, "
                            "with the chain in one block and in --chain-shards blocks")
    bench.add_argument("--evaluation", action="store_true",
                       help="instead: the first config's final evaluation (the paper's protocol) on --examples "
                            "test images with each --proposal: s/image, GFLOP/s, minutes for the test set")
    bench.add_argument("--proposal", nargs="+", choices=PROPOSALS, default=["hmc_moments"],
                       help="with --evaluation: the proposals to time")
    bench.add_argument("--examples", type=_positive_int, help="with --evaluation: test images (default: one evaluation batch)")

    evaluate = commands.add_parser("evaluate", help="recompute the log-likelihood from the latest checkpoint")
    evaluate.add_argument("results", type=_directory, help="a results directory written by train")
    evaluate.add_argument("--proposal", choices=PROPOSALS, help="default: the run's configured proposal")
    evaluate.add_argument("--samples", type=_positive_int, help="importance samples per image (default: the run's)")
    evaluate.add_argument("--examples", type=_positive_int, help="the first N images of the split (default: the "
                                                                f"run's; with --ais, {AIS_EXAMPLES})")
    evaluate.add_argument("--starts", type=_positive_int,
                          help="HMC chains per image, the first from the encoder mean, the others from encoder "
                               "draws; the proposal is the mixture over them (default: the run's, 1 in the paper)")
    evaluate.add_argument("--step-size-per-chain", action="store_true", default=None,
                          help="each evaluation chain adapts its own step size (the paper: one per batch)")
    evaluate.add_argument("--ais", action="store_true",
                          help="annealed importance sampling instead: an independent check of the estimate")
    evaluate.add_argument("--temperatures", type=_positive_int,
                          help=f"AIS: intermediate distributions (default {AIS_TEMPERATURES})")
    evaluate.add_argument("--chains", type=_positive_int, help=f"AIS: chains per image (default {AIS_CHAINS})")
    return parser


def _check_combinations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse options that the chosen mode would ignore (argparse's exit 2, naming them)."""
    if args.command == "evaluate":
        unused = (["--proposal", "--samples", "--starts", "--step-size-per-chain"] if args.ais
                  else ["--temperatures", "--chains"])
        given = [name for name in unused if getattr(args, name[2:].replace("-", "_")) is not None]
        if given:
            parser.error(f"evaluate: {' and '.join(given)} {'is' if len(given) == 1 else 'are'} invalid "
                         + ("with --ais: AIS draws no importance samples" if args.ais
                            else "without --ais: they set annealed importance sampling (add --ais)"))
    if args.command == "bench" and args.breakdown and args.evaluation:
        parser.error("bench: --breakdown and --evaluation are invalid together: each is its own table; "
                     "run them one at a time")
    if args.command == "bench" and args.examples is not None and not args.evaluation:
        parser.error(f"bench: --examples {args.examples} is invalid without --evaluation: training steps are "
                     "timed on --batch-sizes")


def config_from_options(options: Sequence[str]) -> Config:
    """The Config that ``train`` resolves from these options (a planned run's, e.g.)."""
    return resolve_config(_parser().parse_args(["train", "--results", "/nonexistent", *options]))


def resolve_config(args: argparse.Namespace) -> Config:
    """The run's Config from the parsed ``train`` options."""
    if args.config is None:
        if not args.resume:
            raise ValueError("--config is required (a preset name or a JSON file), unless --resume is given")
        from vcd_helpers.runs.directory import RunDirectory  # imports TensorFlow: only when needed

        stored = RunDirectory(args.results).stored_config()
        if stored is None:
            raise ValueError(f"--resume: {args.results} holds no run to resume (no config.json)")
        values = stored.to_dict()
    else:
        values = preset_values(args.config)
    # Each option given overrides its key (merge_values, as load_config's overrides do); None unsets.
    given = lambda **options: {key: value for key, value in options.items() if value is not None}  # noqa: E731
    overrides = given(method=args.method, batch_size=args.batch_size, seed=args.seed, steps=args.steps,
                      curve_every_epochs=args.curve_every_epochs, precision=args.precision)
    overrides["optimizer"] = given(lr_decay_epochs=args.lr_decay_epochs, learning_rate=args.learning_rate)
    if args.batch_size is not None and args.learning_rate is None:
        overrides["optimizer"]["learning_rate"] = None  # the tuned rate of that batch size, or a clear error
    if args.epochs is not None:
        overrides |= {"epochs": args.epochs, "steps": args.steps}
    overrides["evaluation"] = {}
    if args.profile is not None:  # the profile's length and evaluation; the --eval-* options on top
        profile = get_profile(args.profile)
        sized = profile.evaluation_config(EvaluationConfig(**values["evaluation"]))
        overrides |= {"steps": profile.train_steps, "evaluation": dataclasses.asdict(sized)}
    overrides["evaluation"] |= given(split=args.eval_split, num_examples=args.eval_examples,
                                     num_samples=args.eval_samples, proposal=args.eval_proposal)
    overrides["control_variate"] = given(kind=args.control_variate)
    execution = overrides["execution"] = given(chain_shards=args.chain_shards, steps_per_call=args.steps_per_call)
    if args.no_xla:
        execution["jit_compile"] = False
    if args.strategy is not None:
        replicas = {"none": 1, "mirrored": 2}.get(args.strategy)
        if replicas is None:  # multi_worker: one replica per worker of TF_CONFIG
            from vcd_helpers.distributed import tf_config_workers

            replicas = len(tf_config_workers()[0])
        execution |= {"strategy": args.strategy, "replicas": replicas}
    if args.replicas is not None:
        strategy = execution.get("strategy", values["execution"]["strategy"])
        if strategy != "mirrored":
            raise ValueError(f"--replicas {args.replicas} is invalid with strategy={strategy!r}: only "
                             "--strategy mirrored takes a number of replicas")
        execution["replicas"] = args.replicas
    return Config.from_dict(merge_values(values, overrides))


#: Set (to a pipe's file descriptor) in a multi-worker training process started by ``_supervise``.
READY_FD_ENV = "VCD_WORKER_READY_FD"


def _supervise(argv: list[str]) -> int:
    """Run a multi-worker ``train`` in a child process and watch it join its cluster.

    MultiWorkerMirroredStrategy's constructor blocks inside TensorFlow, holding Python's lock,
    until every worker of TF_CONFIG has started: a process waiting there can neither time out nor
    react to Ctrl-C or SIGTERM. So the training runs in a child that reports through a pipe once
    its strategy exists; this process stays responsive, stops the child after
    ``runs.workers.worker_timeout()`` seconds naming the workers that never answered, and passes
    SIGINT and SIGTERM on. Returns the exit code.
    """
    from vcd_helpers.distributed import tf_config_workers
    from vcd_helpers.runs.workers import WORKER_TIMEOUT_ENV, unreachable, worker_timeout

    workers, index = tf_config_workers()
    timeout = worker_timeout()
    received: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: received.append(signum))
    read_end, write_end = os.pipe()
    child = subprocess.Popen([sys.executable, "-m", "vcd_helpers", *argv], pass_fds=(write_end,),
                             env=os.environ | {READY_FD_ENV: str(write_end)})
    os.close(write_end)
    deadline = time.monotonic() + timeout
    with os.fdopen(read_end, "rb") as ready:
        while not select.select([ready], [], [], 0.2)[0]:
            if child.poll() is not None:
                return child.returncode
            if received or time.monotonic() > deadline:
                child.kill()
                child.wait()
                if received:
                    print("interrupted while waiting for the workers of TF_CONFIG to join", file=sys.stderr)
                    return 130
                peers = [w for k, w in enumerate(workers) if k != index]
                print(f"error: strategy='multi_worker': worker(s) {', '.join(unreachable(peers) or peers)} of "
                      f"TF_CONFIG did not join within {timeout:g} s; start every worker with the same command "
                      f"and its own task index, or check the addresses (set ${WORKER_TIMEOUT_ENV} to the seconds "
                      "to wait: longer for workers started by hand, shorter to fail sooner)", file=sys.stderr)
                return 2
    for signum in (signal.SIGINT, signal.SIGTERM):  # the child handles them now
        signal.signal(signum, lambda signum, frame: child.send_signal(signum))
    for signum in received:
        child.send_signal(signum)
    return child.wait()


def _report_ready() -> None:
    """Tell a supervising process (``_supervise``) that this worker's strategy exists."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is not None:
        os.write(int(fd), b"1")
        os.close(int(fd))


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _stop_on_signals() -> None:
    """SIGTERM stops a command as Ctrl-C does: with a word, not silently. SIGINT too, explicitly:
    a process started in the background (a shell's '&', a test worker) inherits it ignored."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise_interrupt)


def _error_message(error: BaseException, place: str | None) -> str | None:
    """A one-line account of a file-system or TensorFlow I/O error, naming the file (or the
    ``place``, a results directory, when the system names none), or None."""
    if isinstance(error, OSError):
        where = error.filename or (f"a file in {place}" if place else "a file")
        if error.filename and os.path.islink(where) and not os.path.exists(where):
            return (f"cannot use {where}: it is a symbolic link that leads nowhere (a loop, or a missing "
                    "target); remove it or give another path")
        return (f"cannot use {where}: {error.strerror or error}. Check that the path is a writable directory "
                "on a disk with free space, or choose another one")
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(error, tf.errors.OpError):
        return f"TensorFlow could not read or write a file: {error.message}"
    return None


def _train(args: argparse.Namespace, argv: list[str]) -> int:
    """``train``: resolve the config, set up the strategy, run (or resume) the run, print its summary."""
    config = resolve_config(args)
    if config.execution.strategy == "multi_worker" and READY_FD_ENV not in os.environ:
        return _supervise(argv)
    from vcd_helpers.distributed import strategy_for

    strategy_for(config.execution)  # before any other TensorFlow op; the trainer gets the same one
    _report_ready()
    from vcd_helpers.results import SUMMARY_KEYS
    from vcd_helpers.runs.directory import RunDirectory
    from vcd_helpers.runs.train import train_run

    if args.resume and RunDirectory(args.results).stored_config() is None:
        raise ValueError(f"--resume: {args.results} holds no run to resume (no config.json)")
    _stop_on_signals()
    results = train_run(config, args.results, command=shlex.join(["python", "-m", "vcd_helpers", *argv]),
                        progress=not args.quiet)
    summary = {k: results[k] for k in SUMMARY_KEYS}
    print(json.dumps(summary, indent=2))
    return 0


def _bench(args: argparse.Namespace) -> int:
    """``bench``: the table of step timings, or ``--breakdown`` of one step."""
    from vcd_helpers.bench import format_breakdown, matmul_gflops, step_breakdown
    from vcd_helpers.runs.bench import benchmark_evaluation, format_benchmark, format_evaluation, run_benchmark
    from vcd_helpers.devices import compute_threads, cpu_model

    _stop_on_signals()
    if args.evaluation:
        config = load_config(args.configs[0])
        rows = [benchmark_evaluation(config, proposal=p, num_examples=args.examples, calls=args.calls)
                for p in args.proposal]
        print(format_evaluation(rows, matmul_gflops()))
        print(f"(median of {args.calls} call(s) after a tracing call; {config.evaluation.burn_in} + "
              f"{config.evaluation.kept} HMC iterations for the HMC proposals; fresh weights: the work does not "
              "depend on them)")
        return 0
    if args.breakdown:
        if args.precision != ["float32"]:
            raise ValueError(f"--precision {' '.join(args.precision)} is invalid with --breakdown: the "
                             "breakdown times float32 multiplies only")
        config = load_config(args.configs[0], batch_size=args.batch_sizes[0], optimizer={"learning_rate": 5e-4})
        print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")
        for shards in dict.fromkeys([1, args.chain_shards or compute_threads()]):
            print(format_breakdown(step_breakdown(config.replace(execution={"chain_shards": shards}), calls=args.calls,
                                                  steps_per_call=args.steps_per_call)))
        return 0
    rows = run_benchmark(args.configs, args.batch_sizes, steps_per_call=args.steps_per_call, calls=args.calls,
                         chain_shards=args.chain_shards, precisions=args.precision)
    print(format_benchmark(rows, matmul_gflops()))
    print(f"(median of {args.calls} calls of {args.steps_per_call} steps each, after a warm-up call; "
          "XLA step in the in-graph loop, as the training command runs it)")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    """``evaluate``: a finished or interrupted run's log-likelihood, by importance sampling or AIS."""
    from vcd_helpers.runs.evaluate import evaluate_run, evaluate_run_ais

    _stop_on_signals()
    if args.ais:
        given = {"num_examples": args.examples, "num_temperatures": args.temperatures, "num_chains": args.chains}
        record = evaluate_run_ais(args.results, **{k: v for k, v in given.items() if v is not None})
    else:
        given = {"proposal": args.proposal, "num_samples": args.samples, "num_examples": args.examples,
                 "num_starts": args.starts, "step_size_per_chain": args.step_size_per_chain}
        record = evaluate_run(args.results, **{k: v for k, v in given.items() if v is not None})
    print(json.dumps(record, indent=2))
    return 0


#: Set by a supervisor (``runner``) to its process id: the command then dies with it.
SUPERVISOR_ENV = "VCD_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_supervisor() -> None:
    """When ``$VCD_SUPERVISOR_PID`` names this process's parent, have the kernel send this process
    SIGTERM when the parent dies, however it dies (``kill -9`` included): a training then saves
    its checkpoint and exits, so a killed runner leaves no training running unmanaged. Linux only
    (prctl); elsewhere, and without the variable, it does nothing.

    Raises SystemExit when the parent died before the request took effect (nothing was done yet)."""
    supervisor = os.environ.get(SUPERVISOR_ENV)
    if not supervisor or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl(PR_SET_PDEATHSIG) failed, asked by {SUPERVISOR_ENV}={supervisor}")
    if str(os.getppid()) != supervisor:  # the supervisor died before the request was made
        raise SystemExit(f"error: the supervisor (process {supervisor}, {SUPERVISOR_ENV}) has gone: not starting")


def main(argv: Sequence[str] | None = None) -> int:
    die_with_supervisor()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    _check_combinations(parser, args)
    try:
        if args.command == "train":
            return _train(args, argv)
        if args.command == "bench":
            return _bench(args)
        return _evaluate(args)
    except FloatingPointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    except KeyboardInterrupt as error:
        from vcd_helpers.runs.train import RunInterrupted

        print(str(error) if isinstance(error, RunInterrupted) else "interrupted", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        message = _error_message(error, getattr(args, "results", None))
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2

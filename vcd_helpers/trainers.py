"""The one way to build a trainer: ``build_trainer(config, execution=..., jit_compile=...)``;
``restore_trainer(directory)`` builds one at a finished run's final state.

The execution says how a step runs; the trainer's state (weights, optimiser slots, control
variate, HMC step size, step counter) is the same in all three, so their checkpoints are
interchangeable:

- ``None``: one step of ``config.method`` on one device (``VAETrainer`` or ``VCDTrainer``);
- a ``pipeline.PipelineConfig``: VCD's step cut into three stages on three devices, micro-batches
  flowing through them (``PipelinedVCDTrainer``);
- a ``tf.distribute.Strategy``: VCD's step data-parallel on the strategy's replicas
  (``ReplicatedVCDTrainer``; ``distributed.build_strategy`` makes one from a config).
"""

from __future__ import annotations

import os
from typing import Union

import tensorflow as tf

from vcd_helpers.config import Config, check_positive_int
from vcd_helpers.distributed import ReplicatedVCDTrainer
from vcd_helpers.model import VAE
from vcd_helpers.pipeline import PipelineConfig, PipelinedVCDTrainer
from vcd_helpers.results import read_final_weights, require_config
from vcd_helpers.training import VAETrainer, VCDTrainer

Execution = Union[PipelineConfig, tf.distribute.Strategy, None]


def execution_name(execution: Execution) -> str:
    """'plain', 'pipelined' or 'replicated'."""
    if execution is None:
        return "plain"
    return "pipelined" if isinstance(execution, PipelineConfig) else "replicated"


def check_chain_shards(config: Config, execution: Execution, chain_shards: int | None) -> None:
    """Raise ValueError unless ``chain_shards`` is None, or a positive integer for plain VCD."""
    if chain_shards is None:
        return
    check_positive_int("chain_shards", chain_shards)
    kind = execution_name(execution)
    if kind != "plain" or config.method != "vcd":
        raise ValueError(f"chain_shards={chain_shards!r} is invalid with method={config.method!r} and a {kind} "
                         "execution: only plain VCD's chain is sharded (leave it unset)")


def build_trainer(config: Config, *, execution: Execution = None, jit_compile: bool | None = None,
                  chain_shards: int | None = None) -> VAETrainer | VCDTrainer:
    """A trainer of ``config`` on a freshly initialised model (seeded by ``config.seed``).

    ``jit_compile`` chooses XLA for what the execution can compile: the whole step (plain), the
    HMC chain (pipelined: the stages stay separate ops, so that the executor runs the devices
    concurrently) or nothing (replicated: a step under a strategy is a plain ``tf.function``).
    None compiles whatever the execution allows; the trainer's ``jit_compile`` says what it did.
    A pipelined trainer's ``steps_per_call`` is its ``device_iterations``; the others' is 1.
    ``chain_shards`` (plain VCD only): blocks of rows of the HMC chain's target, evaluated
    concurrently (``VCDTrainer``); None: one per compute thread.

    Raises ValueError for a pipeline or strategy with the VAE (only VCD's step is pipelined or
    replicated), for ``jit_compile=True`` with a strategy, and for a pipeline whose micro-batches
    do not make up ``config.batch_size``, and for ``chain_shards`` with anything but plain VCD.
    """
    check_chain_shards(config, execution, chain_shards)
    kind = execution_name(execution)
    if kind != "plain" and config.method != "vcd":
        raise ValueError(f"method={config.method!r} is invalid with a {kind} execution: "
                         "only VCD's step is pipelined or replicated")
    if kind == "replicated":
        if jit_compile:
            raise ValueError("jit_compile=True is invalid with a distribution strategy: the replicated step is a "
                             "plain tf.function; pass jit_compile=None or False")
        return ReplicatedVCDTrainer(config, execution)
    jit_compile = True if jit_compile is None else jit_compile
    if kind == "pipelined":
        return PipelinedVCDTrainer(config, execution, jit_compile=jit_compile)
    model = VAE(config.model, seed=config.seed)
    if config.method == "vae":
        return VAETrainer(model, config, jit_compile=jit_compile)
    return VCDTrainer(model, config, jit_compile=jit_compile, chain_shards=chain_shards)


def restore_trainer(results_dir: str | os.PathLike, *, jit_compile: bool | None = None) -> VAETrainer | VCDTrainer:
    """A trainer (``build_trainer``) at a finished run's final state, to measure the estimator
    there: the model and, for VCD, the chain's adapted step size and the control variate as the
    next step would read them (``checkpoint_objects``); ``step`` is the run's last.

    The optimisers' slots are not restored (the final weights do not keep them): to train on,
    run the training command on the directory. Raises FileNotFoundError when the run has not
    finished, RunDirectoryError when its files are damaged."""
    config = require_config(results_dir)
    trainer = build_trainer(config, jit_compile=jit_compile)
    read_final_weights(results_dir, trainer.checkpoint_objects())
    trainer.step.assign(config.num_steps)
    return trainer

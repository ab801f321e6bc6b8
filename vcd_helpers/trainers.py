"""The one way to build a trainer: ``build_trainer(config)``; ``restore_trainer(directory)``
builds one at a finished run's final state.

``config.execution`` says how a step runs; the trainer's state (weights, optimiser slots, control
variate, HMC step size, step counter) is the same in all three, so their checkpoints are
interchangeable:

- plain: one step of ``config.method`` on one device (``VAETrainer``, ``VCDTrainer`` or ``HoffmanTrainer``);
- pipelined (``execution.pipeline``): VCD's step cut into three stages on three devices,
  micro-batches flowing through them (``PipelinedVCDTrainer``);
- replicated (``execution.strategy``): VCD's step data-parallel on the strategy's replicas
  (``ReplicatedVCDTrainer``).
"""

from __future__ import annotations

import contextlib
import os

from vcd_helpers.config import Config, ExecutionConfig
from vcd_helpers.distributed import ReplicatedVCDTrainer, strategy_for
from vcd_helpers.model import VAE
from vcd_helpers.pipeline import PipelinedVCDTrainer
from vcd_helpers.results import read_final_weights, require_config
from vcd_helpers.training import ChainTrainer, HoffmanTrainer, VAETrainer, VCDTrainer

_TRAINERS = {("vae", "plain"): VAETrainer, ("vcd", "plain"): VCDTrainer, ("hoffman", "plain"): HoffmanTrainer,
             ("vcd", "pipelined"): PipelinedVCDTrainer, ("vcd", "replicated"): ReplicatedVCDTrainer}


def build_trainer(config: Config) -> VAETrainer | ChainTrainer:
    """A trainer of ``config`` on a freshly initialised model (seeded by ``config.seed``), run as
    ``config.execution`` says. Every trainer gets its model the same way: made here, under the
    strategy's scope when replicated, its networks on their stages' devices when pipelined."""
    execution = config.execution
    strategy = strategy_for(execution)
    pipeline = execution.pipeline
    devices = {"encoder": pipeline.device(0), "decoder": pipeline.device(1)} if pipeline and pipeline.devices else None
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = VAE(config.model, seed=config.seed, devices=devices)
    return _TRAINERS[config.method, execution.kind](model, config)


def restore_trainer(results_dir: str | os.PathLike, *, jit_compile: bool | None = None) -> VAETrainer | ChainTrainer:
    """A trainer (``build_trainer``) at a finished run's final state, to measure the estimator
    there: the model and, for VCD, the chain's adapted step size and the control variate as the
    next step would read them (``checkpoint_objects``); ``step`` is the run's last.

    The optimisers' slots are not restored (the final weights do not keep them): to train on,
    run the training command on the directory. Raises FileNotFoundError when the run has not
    finished, RunDirectoryError when its files are damaged."""
    config = require_config(results_dir)
    # A plain trainer whatever the run's execution: the state is the same in all of them.
    trainer = build_trainer(config.replace(execution=ExecutionConfig(jit_compile=jit_compile)))
    read_final_weights(results_dir, trainer.checkpoint_objects())
    trainer.step.assign(config.num_steps)
    return trainer

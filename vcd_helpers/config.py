"""Configuration: one frozen dataclass holding every hyperparameter, presets, and run profiles.

``Config`` holds the settings listed in the book's page "The algorithm at a glance"
(book/algorithm.md); its defaults are the paper's.
Every field is validated when the object is built, so a bad value fails at once with a
ValueError that names the field, the value and what is allowed.

Presets are JSON files in ``presets/`` holding only the fields that differ from the defaults:
``default`` (the paper), ``global_cv``, ``bs_experiment`` (batch size from the user, learning
rate from the tuned table), ``smoke`` (one short epoch) and ``tiny`` (40 steps of a tiny model on
1,000 images, every piece of a run's state exercised: the tests' and demos' run). ``load_config`` reads a preset by
name or a JSON file by path and applies overrides.

Overrides follow one rule on every path (``Config.replace``, ``load_config``, ``merge_values``):
a key replaces its value, a dict merges into its section, a section object replaces the section,
and ``None`` is a value like any other: it sets the field to None, the field's own "unset" (the
tuned learning rate, no pipeline, ``Config.steps_per_call``'s default, the whole split). A caller
whose options may be absent leaves them out (the command line keeps only the options given). A
section of a Config changes through ``Config.replace`` too (``config.replace(evaluation={...})
.evaluation``), which checks it against the rest and names an unknown key.

Run profiles size the *notebooks* (how many steps a chapter trains, how many importance samples
it draws): ``test`` (seconds, used automatically by the test run), ``book`` (minutes per chapter
on a 2-core CPU) and ``paper``. ``VCD_PROFILE`` picks one; ``active_profile()`` reads it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

PRESET_DIR = Path(__file__).parent / "presets"
NUM_PIXELS = 784
#: Images in each split of binarised MNIST (Larochelle's files; the reference trains on "train").
SPLIT_SIZES = {"train": 50_000, "valid": 10_000, "test": 10_000}
NUM_TRAIN_EXAMPLES = SPLIT_SIZES["train"]

#: Learning rates tuned per batch size by Graphcore (blog); the scale net gets half of each.
TUNED_LEARNING_RATES: dict[int, float] = {16: 5e-4, 100: 5e-4, 128: 9e-4, 512: 9e-4, 1024: 1.3e-3}

CONTROL_VARIATE_KINDS = ("none", "global", "local", "scheduled")
#: vcd: Ruiz & Titsias (2019); vae: the plain ELBO; hoffman: Hoffman (2017), the decoder trained on
#: the HMC chain's end as in VCD, the encoder by the ELBO.
METHODS = ("vcd", "vae", "hoffman")
#: The methods whose step runs an HMC chain (whose rows ``execution.chain_shards`` cuts into blocks).
CHAIN_METHODS = ("vcd", "hoffman")
PROPOSALS = ("encoder", "hmc_mean", "hmc_moments")
EVAL_SPLITS = ("valid", "test")
#: How a VCD step is spread over devices: one device, mirrored replicas, or one process per worker.
STRATEGIES = ("none", "mirrored", "multi_worker")
#: The pipelined step's stages (one device each) and the orders it can run their tasks in.
STAGE_NAMES = ("encoder", "hmc", "decoder")
NUM_STAGES = len(STAGE_NAMES)
SCHEDULES = ("sequential", "grouped", "interleaved")
#: What the networks' matrix multiplies take as operands in a training step (``model.matmul``):
#: float32, or bfloat16 operands whose products are summed in float32. Everything else stays float32.
PRECISIONS = ("float32", "bfloat16")


# The package's argument checks: each raises ValueError "NAME=VALUE is invalid: WHAT IS ALLOWED".

def _fail(name: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{name}={value!r} is invalid: {allowed}")


def check_positive_int(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int (not a bool) >= 1: the one
    check every count in the package (steps, sizes, replicas, draws) goes through."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _fail(name, value, "must be a positive integer")


def check_non_negative_int(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int (not a bool) >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _fail(name, value, "must be a non-negative integer")


#: The largest finite float32: every number of a run is computed in float32, where more is infinity.
FLOAT32_MAX = 3.4028234663852886e38


def check_positive_number(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int or float > 0 that float32, the
    precision the package computes in, holds as a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        _fail(name, value, "must be a positive finite number")
    if value > FLOAT32_MAX:
        _fail(name, value, f"must be at most {FLOAT32_MAX:.4g} (float32's largest number, the precision runs use)")


def check_fraction(name: str, value: Any, *, inclusive_low: bool = False) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a number in (0, 1) (or [0, 1))."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value < 1
    ok = ok and (value >= 0 if inclusive_low else value > 0)
    if not ok:
        _fail(name, value, "must lie in " + ("[0, 1)" if inclusive_low else "(0, 1)"))


def check_one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Raise ValueError naming ``name`` and the allowed values unless ``value`` is one of them."""
    if value not in allowed:
        _fail(name, value, f"must be one of {', '.join(allowed)}")


@dataclass(frozen=True)
class ModelConfig:
    """The VAE's shape: latent size, hidden width, and the scale floor of the encoder."""

    latent_dim: int = 10
    hidden_units: int = 200
    min_scale: float = 1e-4

    def __post_init__(self) -> None:
        check_positive_int("model.latent_dim", self.latent_dim)
        check_positive_int("model.hidden_units", self.hidden_units)
        # A floor on the encoder's standard deviations: below the prior's 1, or the encoder is no
        # narrower than the prior it refines (and at float32's limits its densities overflow).
        check_fraction("model.min_scale", self.min_scale)


@dataclass(frozen=True)
class HMCConfig:
    """HMC inside each VCD step: 8 iterations of 5 leapfrog steps, step size adapted to 0.9."""

    num_iterations: int = 8
    num_leapfrog_steps: int = 5
    initial_step_size: float = 0.05
    target_accept_rate: float = 0.9
    adaptation_rate: float = 0.01

    def __post_init__(self) -> None:
        check_positive_int("hmc.num_iterations", self.num_iterations)
        check_positive_int("hmc.num_leapfrog_steps", self.num_leapfrog_steps)
        check_positive_number("hmc.initial_step_size", self.initial_step_size)
        check_fraction("hmc.target_accept_rate", self.target_accept_rate)
        check_positive_number("hmc.adaptation_rate", self.adaptation_rate)

    def kernel_arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``hmc.hmc_chain`` (and of the samplers built on it) that set
        its kernel: leapfrog steps per iteration, acceptance target and adaptation rate. The
        chain's length and starting step size depend on the use, so the caller passes them."""
        return {"num_leapfrog_steps": self.num_leapfrog_steps, "target_accept_rate": self.target_accept_rate,
                "adaptation_rate": self.adaptation_rate}


@dataclass(frozen=True)
class OptimizerConfig:
    """The reference RMSProp variant and its step-decay schedule.

    ``learning_rate`` is the rate of the encoder's mean net and of the decoder; the scale net
    uses ``scale_learning_rate_ratio`` times it. ``None`` means: take it from
    ``TUNED_LEARNING_RATES`` for the configured batch size (resolved by ``Config``).
    """

    learning_rate: float | None = 5e-4
    scale_learning_rate_ratio: float = 0.5
    rms_decay: float = 0.9
    initial_mean_square: float = 0.01
    lr_decay_rate: float = 0.9
    lr_decay_epochs: float = 30.0

    def __post_init__(self) -> None:
        if self.learning_rate is not None:
            check_positive_number("optimizer.learning_rate", self.learning_rate)
        check_positive_number("optimizer.scale_learning_rate_ratio", self.scale_learning_rate_ratio)
        check_fraction("optimizer.rms_decay", self.rms_decay)
        check_positive_number("optimizer.initial_mean_square", self.initial_mean_square)
        check_positive_number("optimizer.lr_decay_rate", self.lr_decay_rate)
        if self.lr_decay_rate > 1:
            _fail("optimizer.lr_decay_rate", self.lr_decay_rate, "must lie in (0, 1]")
        check_positive_number("optimizer.lr_decay_epochs", self.lr_decay_epochs)


@dataclass(frozen=True)
class ControlVariateConfig:
    """The score-function baseline: none, global (scalar), local (per example) or scheduled."""

    kind: str = "scheduled"
    decay: float = 0.9
    switch_step: int = 3000

    def __post_init__(self) -> None:
        check_one_of("control_variate.kind", self.kind, CONTROL_VARIATE_KINDS)
        check_fraction("control_variate.decay", self.decay, inclusive_low=True)
        check_non_negative_int("control_variate.switch_step", self.switch_step)


@dataclass(frozen=True)
class EvaluationConfig:
    """Importance-sampled log-likelihood: proposal, sample count, and the HMC that builds it.

    ``num_examples`` of ``None`` means the whole split. The defaults are the paper's protocol: one
    chain per image from the encoder mean, a step size shared by a batch. ``num_starts`` = M > 1
    runs M chains per image (the first from the encoder mean, the others from draws of the encoder)
    and makes the proposal the equal-weight mixture of their widened Gaussians;
    ``step_size_per_chain`` lets each chain adapt a step size of its own (``robust``: both).
    """

    split: str = "test"
    proposal: str = "hmc_moments"
    num_samples: int = 20_000
    chunk_size: int = 100  # samples per chunk (at most num_samples): chunk x batch x 784 logits live at once
    widen: float = 1.2
    burn_in: int = 300
    kept: int = 300
    num_examples: int | None = None
    batch_size: int = 500
    num_starts: int = 1
    step_size_per_chain: bool = False

    def __post_init__(self) -> None:
        check_one_of("evaluation.split", self.split, EVAL_SPLITS)
        check_one_of("evaluation.proposal", self.proposal, PROPOSALS)
        check_positive_int("evaluation.num_samples", self.num_samples)
        check_positive_int("evaluation.chunk_size", self.chunk_size)
        check_positive_number("evaluation.widen", self.widen)
        check_non_negative_int("evaluation.burn_in", self.burn_in)
        check_positive_int("evaluation.kept", self.kept)
        if self.num_examples is not None:
            check_positive_int("evaluation.num_examples", self.num_examples)
            if self.num_examples > SPLIT_SIZES[self.split]:
                _fail("evaluation.num_examples", self.num_examples,
                      f"the {self.split} split has {SPLIT_SIZES[self.split]} images")
        check_positive_int("evaluation.batch_size", self.batch_size)
        check_positive_int("evaluation.num_starts", self.num_starts)
        if not isinstance(self.step_size_per_chain, bool):
            _fail("evaluation.step_size_per_chain", self.step_size_per_chain, "must be true or false")
        if self.proposal == "encoder" and (self.num_starts > 1 or self.step_size_per_chain):
            changed = "num_starts" if self.num_starts > 1 else "step_size_per_chain"
            _fail(f"evaluation.{changed}", getattr(self, changed),
                  "the encoder proposal runs no chain: use an HMC proposal (hmc_mean, hmc_moments)")

    def robust(self, num_starts: int = 4) -> "EvaluationConfig":
        """This protocol with ``num_starts`` chains per image, each adapting its own step size."""
        return dataclasses.replace(self, num_starts=num_starts, step_size_per_chain=True)


#: The learning curve's evaluation while a run trains: the paper's proposal and HMC, on a fixed
#: subset of 1,000 images with 2,000 samples each (the final evaluation uses all 10,000 and 20,000).
CURVE_EVALUATION = EvaluationConfig(num_examples=1000, num_samples=2000)

def _distinct_names(devices: Any, count: int) -> bool:
    """Whether ``devices`` is a tuple of ``count`` distinct device names."""
    return (isinstance(devices, tuple) and len(devices) == count and len(set(devices)) == count
            and all(isinstance(d, str) and d for d in devices))


@dataclass(frozen=True)
class PipelineConfig:
    """How a VCD step is pipelined over three devices (``pipeline.PipelinedVCDTrainer``).

    schedule: 'sequential' (one task at a time, in micro-batch order: sharded execution, for
      debugging), 'grouped' (each device runs all its forwards, then all its backwards) or
      'interleaved' (one forward, one backward: 1F1B).
    micro_batch_size x gradient_accumulation must equal the Config's batch_size: the optimiser
      step sees the same batch as without pipelining.
    devices: one device name per stage, or () to leave placement to TensorFlow.
    recompute_encoder: keep only the encoder's input from forward to backward and recompute its
      activations in the backward task (``tf.recompute_grad``).
    slot_device: where the optimiser slots live (None: beside their weights).
    """

    schedule: str = "interleaved"
    micro_batch_size: int = 25
    gradient_accumulation: int = 4
    devices: tuple[str, ...] = ()
    recompute_encoder: bool = False
    slot_device: str | None = None

    def __post_init__(self) -> None:
        check_one_of("pipeline.schedule", self.schedule, SCHEDULES)
        check_positive_int("pipeline.micro_batch_size", self.micro_batch_size)
        check_positive_int("pipeline.gradient_accumulation", self.gradient_accumulation)
        if self.schedule != "sequential" and self.gradient_accumulation < NUM_STAGES:
            _fail("pipeline.gradient_accumulation", self.gradient_accumulation,
                  f"the {self.schedule} schedule of {NUM_STAGES} stages needs at least {NUM_STAGES} micro-batches "
                  "per step to fill (with fewer, some stage idles for the whole step); use the sequential schedule "
                  "or accumulate more")
        if self.devices != () and not _distinct_names(self.devices, NUM_STAGES):
            _fail("pipeline.devices", self.devices,
                  f"must be a tuple of one distinct device name per stage ({', '.join(STAGE_NAMES)}), or () for no placement")
        if not isinstance(self.recompute_encoder, bool):
            _fail("pipeline.recompute_encoder", self.recompute_encoder, "must be true or false")
        if self.slot_device is not None and not isinstance(self.slot_device, str):
            _fail("pipeline.slot_device", self.slot_device, "must be a device name or null")

    @property
    def batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation

    def device(self, stage: int) -> str | None:
        return self.devices[stage] if self.devices else None


@dataclass(frozen=True)
class ExecutionConfig:
    """How a step runs: on one device (plain), pipelined over three, or replicated.

    strategy, replicas: 'none' (one replica), 'mirrored' (``replicas`` on one machine, on
      ``devices`` or, when empty, ``distributed.replica_devices``) or 'multi_worker' (one per
      TF_CONFIG worker). pipeline: a ``PipelineConfig``, or None. Pipelining and replication
      are not combined here.
    jit_compile: XLA for what the execution can compile: the whole step (plain), the HMC chain
      (pipelined) or nothing (replicated, whose step is a plain ``tf.function``); None: whatever
      it allows. chain_shards (plain VCD only): blocks of rows of the HMC chain's target,
      evaluated concurrently; None: one per compute thread. steps_per_call: optimiser steps per
      host call of the in-graph loop (None: ``Config.steps_per_call`` decides).
    devices and steps_per_call (``SPEED_ONLY``), and the pipeline's placement, change the
    speed and not a bit of the numbers (tests/test_speed_only.py trains with each and compares
    every weight): ``Config.identity`` leaves them out, so a run may resume with others.
    jit_compile and chain_shards change the float round-off (another kernel, another order of
    the same sums), which training amplifies: they are part of the run.
    """

    strategy: str = "none"
    replicas: int = 1
    devices: tuple[str, ...] = ()
    pipeline: PipelineConfig | None = None
    jit_compile: bool | None = None
    chain_shards: int | None = None
    steps_per_call: int | None = None

    def __post_init__(self) -> None:
        check_one_of("execution.strategy", self.strategy, STRATEGIES)
        check_positive_int("execution.replicas", self.replicas)
        if self.strategy == "none" and self.replicas != 1:
            _fail("execution.replicas", self.replicas,
                  "must be 1 without a strategy (--strategy mirrored or multi_worker)")
        if self.devices != ():
            if self.strategy != "mirrored" or not _distinct_names(self.devices, self.replicas):
                _fail("execution.devices", self.devices, "must be a tuple of one distinct device name per replica of the "
                      f"mirrored strategy (here {self.replicas}), or ()")
        if self.pipeline is not None:
            if not isinstance(self.pipeline, PipelineConfig):
                _fail("execution.pipeline", self.pipeline, "must be a PipelineConfig or None")
            if self.strategy != "none":
                _fail("execution.pipeline", self.pipeline,
                      f"is not combined with strategy={self.strategy!r} here: choose one")
        if self.jit_compile is not None and not isinstance(self.jit_compile, bool):
            _fail("execution.jit_compile", self.jit_compile, "must be true, false or null")
        if self.jit_compile and self.strategy != "none":
            _fail("execution.jit_compile", self.jit_compile,
                  "a step under a distribution strategy is a plain tf.function: give null or false")
        if self.chain_shards is not None:
            check_positive_int("execution.chain_shards", self.chain_shards)
            if self.kind != "plain":
                _fail("execution.chain_shards", self.chain_shards,
                      f"only plain VCD's chain is sharded, not a {self.kind} step's (leave it unset)")
        if self.steps_per_call is not None:
            check_positive_int("execution.steps_per_call", self.steps_per_call)

    @property
    def kind(self) -> str:
        """'plain', 'pipelined' or 'replicated'."""
        if self.pipeline is not None:
            return "pipelined"
        return "plain" if self.strategy == "none" else "replicated"

    @property
    def xla(self) -> bool:
        """Whether XLA compiles what the execution can compile (``jit_compile`` resolved)."""
        return self.kind != "replicated" if self.jit_compile is None else self.jit_compile


#: Execution settings that change a run's speed and not a bit of its numbers (each proven by
#: tests/test_speed_only.py): not part of its identity. Whatever changes the round-off is: XLA or
#: not, the chain's blocks, the pipeline's schedule (sequential sums in another order than grouped
#: and interleaved) and its recomputed encoder; so are the micro-batches (each draws its own noise).
SPEED_ONLY = ("devices", "steps_per_call")
PIPELINE_SPEED_ONLY = ("devices", "slot_device")

_SECTIONS = {"model": ModelConfig, "hmc": HMCConfig, "optimizer": OptimizerConfig,
             "control_variate": ControlVariateConfig, "evaluation": EvaluationConfig, "curve": EvaluationConfig,
             "execution": ExecutionConfig}
_SUBSECTIONS = {ExecutionConfig: {"pipeline": PipelineConfig}}
_NULLABLE_SECTIONS = ("pipeline",)  # None: no such section (a plain step)


@dataclass(frozen=True)
class Config:
    """Everything one training run needs. Defaults are the paper's VCD run.

    ``steps`` sets the length of the run when given, else ``epochs`` (``num_steps``).
    ``optimizer.learning_rate`` must be set; ``from_dict``, ``replace`` and ``load_config`` fill
    an unset one with the tuned rate of the batch size (``TUNED_LEARNING_RATES``).
    """

    name: str = "default"
    method: str = "vcd"
    batch_size: int | None = 100
    epochs: float | None = 800
    steps: int | None = None
    seed: int = 0
    train_examples: int = NUM_TRAIN_EXAMPLES
    log_every_steps: int = 100
    checkpoint_every_steps: int = 2000
    curve_every_epochs: float | None = None
    precision: str = "float32"
    model: ModelConfig = field(default_factory=ModelConfig)
    hmc: HMCConfig = field(default_factory=HMCConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    control_variate: ControlVariateConfig = field(default_factory=ControlVariateConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    curve: EvaluationConfig = field(default_factory=lambda: CURVE_EVALUATION)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            _fail("name", self.name, "must be a non-empty string")
        check_one_of("method", self.method, METHODS)
        if self.batch_size is None:
            _fail(
                "batch_size",
                None,
                "this preset needs a batch size (e.g. --batch-size 128); tuned ones are "
                + ", ".join(map(str, TUNED_LEARNING_RATES)),
            )
        check_positive_int("batch_size", self.batch_size)
        if self.steps is None and self.epochs is None:
            _fail("epochs", None, "give epochs or steps")
        if self.steps is not None:
            check_positive_int("steps", self.steps)
        if self.epochs is not None:
            check_positive_number("epochs", self.epochs)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**31:
            _fail("seed", self.seed, "must be an integer in [0, 2**31)")
        check_positive_int("train_examples", self.train_examples)
        if self.train_examples > NUM_TRAIN_EXAMPLES:
            _fail("train_examples", self.train_examples, f"must be at most {NUM_TRAIN_EXAMPLES}")
        if self.batch_size > self.train_examples:
            _fail("batch_size", self.batch_size, f"must not exceed train_examples={self.train_examples}")
        check_positive_int("log_every_steps", self.log_every_steps)
        check_positive_int("checkpoint_every_steps", self.checkpoint_every_steps)
        if self.checkpoint_every_steps % self.log_every_steps:
            # A resumed run then restarts on a logging-window boundary and writes the same rows.
            _fail("checkpoint_every_steps", self.checkpoint_every_steps,
                  f"must be a multiple of log_every_steps={self.log_every_steps}")
        check_one_of("precision", self.precision, PRECISIONS)
        if self.curve_every_epochs is not None:
            check_positive_number("curve_every_epochs", self.curve_every_epochs)
        for name, kind in _SECTIONS.items():
            if not isinstance(getattr(self, name), kind):
                _fail(name, getattr(self, name), f"must be a {kind.__name__}")
        self._check_execution()
        if self.optimizer.learning_rate is None:
            if self.batch_size not in TUNED_LEARNING_RATES:
                _fail(
                    "batch_size",
                    self.batch_size,
                    "has no tuned learning rate; give optimizer.learning_rate (--learning-rate) "
                    "or use a tuned batch size: " + ", ".join(map(str, TUNED_LEARNING_RATES)),
                )
            _fail("optimizer.learning_rate", None, "give a rate, or build the config with Config.from_dict or "
                  "load_config, which take the tuned rate of the batch size")

    def _check_execution(self) -> None:
        """The execution section against the rest: what only VCD's step does, and batch sizes."""
        execution = self.execution
        if execution.kind != "plain" and self.method != "vcd":
            name, value = (("execution.pipeline", execution.pipeline) if execution.pipeline is not None
                           else ("execution.strategy", execution.strategy))
            _fail(name, value, f"only VCD's step is pipelined or replicated, not method={self.method!r}")
        if execution.chain_shards is not None and self.method not in CHAIN_METHODS:
            _fail("execution.chain_shards", execution.chain_shards,
                  f"only a method with an HMC chain ({', '.join(CHAIN_METHODS)}) has one to shard, not "
                  f"method={self.method!r} (leave it unset)")
        if execution.chain_shards is not None and execution.chain_shards > self.batch_size:
            _fail("execution.chain_shards", execution.chain_shards,
                  f"must be at most batch_size={self.batch_size}: a block holds at least one chain")
        if self.batch_size % execution.replicas:
            _fail("batch_size", self.batch_size, f"must be a multiple of execution.replicas={execution.replicas}")
        if execution.pipeline is not None and execution.pipeline.batch_size != self.batch_size:
            pipe = execution.pipeline
            _fail("execution.pipeline", f"{pipe.micro_batch_size} x {pipe.gradient_accumulation}",
                  f"micro_batch_size x gradient_accumulation = {pipe.batch_size} must equal batch_size="
                  f"{self.batch_size}: the optimiser step sees the configured batch")
        if execution.steps_per_call is not None and self.log_every_steps % execution.steps_per_call:
            _fail("execution.steps_per_call", execution.steps_per_call,
                  f"must divide log_every_steps={self.log_every_steps}, so that every log row falls at the end "
                  "of a host call")

    # Derived quantities: computed, never stored, so they cannot disagree with the fields.
    @property
    def steps_per_epoch(self) -> int:
        """Batches per pass over the training examples (the last partial batch is dropped)."""
        return self.train_examples // self.batch_size

    @property
    def num_steps(self) -> int:
        """Length of the run in optimiser steps."""
        if self.steps is not None:
            return self.steps
        return max(1, round(self.epochs * self.steps_per_epoch))

    @property
    def curve_every_steps(self) -> int | None:
        """Steps between the learning curve's evaluations (``None``: no curve): every
        ``curve_every_epochs`` epochs, rounded to a whole number of logging windows so that each
        evaluation falls where a host call of the training loop ends."""
        if self.curve_every_epochs is None:
            return None
        windows = round(self.curve_every_epochs * self.steps_per_epoch / self.log_every_steps)
        return max(1, windows) * self.log_every_steps

    @property
    def steps_per_call(self) -> int:
        """Steps per host call of the in-graph loop, wherever a trainer runs: ``execution.steps_per_call``
        when given, else up to 10 dividing ``log_every_steps`` (so that every log row and checkpoint
        falls at the end of a call). Speed only: any value trains the same bits."""
        given = self.execution.steps_per_call
        return math.gcd(self.log_every_steps, 10) if given is None else given

    @property
    def lr_decay_steps(self) -> int:
        """Steps per learning-rate decay: ``lr_decay_epochs`` epochs of 50,000 examples."""
        return max(1, round(self.optimizer.lr_decay_epochs * NUM_TRAIN_EXAMPLES / self.batch_size))

    @property
    def learning_rates(self) -> dict[str, float]:
        """Initial learning rate of each parameter group."""
        base = self.optimizer.learning_rate
        return {"encoder_mean": base, "encoder_scale": base * self.optimizer.scale_learning_rate_ratio,
                "decoder": base}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def identity(self) -> dict[str, Any]:
        """What the run computes (``to_dict`` without the execution's ``SPEED_ONLY`` and the
        pipeline's ``PIPELINE_SPEED_ONLY`` settings): two configs with the same identity train the
        same numbers, so a run resumes under either."""
        values = self.to_dict()
        execution = values["execution"] = {k: v for k, v in values["execution"].items() if k not in SPEED_ONLY}
        if execution["pipeline"] is not None:
            execution["pipeline"] = {k: v for k, v in execution["pipeline"].items() if k not in PIPELINE_SPEED_ONLY}
        return values

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "Config":
        """Build a Config from nested plain values; an unknown key is a ValueError. Files written
        before the execution section (top-level ``strategy`` and ``replicas``) read the same."""
        return _build(cls, _upgrade(values), prefix="")

    def replace(self, **overrides: Any) -> "Config":
        """A copy with ``overrides`` merged in by the module's rule (None sets None); nested sections
        take dicts (``hmc={...}``, merged into the section) or section objects
        (``execution=ExecutionConfig(...)``, replacing it). Raises ValueError naming a bad key."""
        # A section object gives every key of its section, so merging it replaces the section.
        return Config.from_dict(_merge(self.to_dict(), _plain(overrides), prefix=""))


#: Top-level keys of files written before the execution section, and where they live now.
_MOVED_TO_EXECUTION = ("strategy", "replicas")


def _upgrade(values: Any) -> Any:
    """``values`` with the keys of files written before the execution section moved into it.
    Raises ValueError when a file holds both (which of the two was meant is unknown)."""
    if not isinstance(values, Mapping) or not any(key in values for key in _MOVED_TO_EXECUTION):
        return values
    if "execution" in values:
        raise ValueError(f"configuration keys {', '.join(k for k in _MOVED_TO_EXECUTION if k in values)} belong "
                         "in the execution section, which is given too: keep only execution.strategy and "
                         "execution.replicas")
    values = dict(values)
    values["execution"] = {key: values.pop(key) for key in _MOVED_TO_EXECUTION if key in values}
    return values


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every section object (a dataclass) turned into its dict."""
    return {key: dataclasses.asdict(value) if dataclasses.is_dataclass(value)
            else _plain(value) if isinstance(value, Mapping) else value for key, value in values.items()}


def _build(kind: type, values: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(values, Mapping):
        _fail(prefix.rstrip(".") or "config", values, "must be a JSON object")
    known = {f.name for f in dataclasses.fields(kind)}
    for key in values:
        if key not in known:
            raise ValueError(
                f"unknown configuration key {prefix + key!r}: allowed keys are {', '.join(sorted(known))}"
            )
    sections = _SECTIONS if kind is Config else _SUBSECTIONS.get(kind, {})
    kwargs = {}
    for key, value in values.items():
        if key in sections and value is not None:
            value = _build(sections[key], value, prefix=f"{prefix}{key}.")
        kwargs[key] = tuple(value) if isinstance(value, list) else value  # JSON arrays are the tuples
    if kind is Config:
        optimizer, batch_size = kwargs.get("optimizer", OptimizerConfig()), kwargs.get("batch_size", Config.batch_size)
        if optimizer.learning_rate is None and batch_size in TUNED_LEARNING_RATES:
            kwargs["optimizer"] = dataclasses.replace(optimizer, learning_rate=TUNED_LEARNING_RATES[batch_size])
    return kind(**kwargs)


def merge_values(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (nested plain values, e.g. ``preset_values``) with ``overrides`` merged in, section
    by section, by the module's rule (None sets None). Raises ValueError naming an unknown key."""
    return _merge(base, _plain(overrides), prefix="")


def _merge(base: dict[str, Any], overrides: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if key not in merged:
            raise ValueError(
                f"unknown configuration key {prefix + key!r}: allowed keys are {', '.join(sorted(merged))}"
            )
        if isinstance(merged[key], dict) and not (value is None and key in _NULLABLE_SECTIONS):
            if not isinstance(value, Mapping):
                raise ValueError(f"configuration key {prefix + key!r} is a section: it takes an object of its keys "
                                 f"({', '.join(sorted(merged[key]))}), not {json.dumps(value)}")
            merged[key] = _merge(merged[key], value, prefix=f"{prefix}{key}.")
        else:
            merged[key] = value
    return merged


def available_presets() -> list[str]:
    """Names of the JSON presets shipped with the package."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def preset_values(name_or_path: str | os.PathLike = "default") -> dict[str, Any]:
    """The plain nested values of a preset (by name) or a JSON file (by path), merged over the
    defaults and not yet validated: a preset may leave ``batch_size`` unset for the caller."""
    path = Path(name_or_path)
    if str(name_or_path) in available_presets():
        path = PRESET_DIR / f"{name_or_path}.json"
    elif path.is_dir():
        raise ValueError(f"config file {str(path)!r} is a directory: give a preset name or a .json file")
    elif path.suffix != ".json":
        raise ValueError(f"unknown preset {str(name_or_path)!r}: presets are {', '.join(available_presets())}, "
                         "or give a path to a .json file")
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"config file {str(path)!r} is not valid UTF-8 JSON: {error}") from None
    except RecursionError:
        raise ValueError(f"config file {str(path)!r} nests its JSON too deeply to read: a config is an object "
                         "of sections, one level deep") from None
    if not isinstance(values, dict):
        raise ValueError(f"config file {str(path)!r} holds a JSON {type(values).__name__}: it must hold an "
                         "object of configuration keys, e.g. {\"batch_size\": 128}")
    try:
        return _merge(Config().to_dict(), _upgrade(values), prefix="")
    except ValueError as error:
        raise ValueError(f"config file {str(path)!r}: {error}") from None


def load_config(name_or_path: str | os.PathLike = "default", **overrides: Any) -> Config:
    """Load a preset by name (``default``, ``global_cv``, ``bs_experiment``, ``smoke``, ``tiny``) or a JSON
    file by path, then apply ``overrides`` (top-level fields; dicts or section objects for sections)
    by the module's rule: ``None`` sets None. Raises ValueError naming a bad or unknown key.
    """
    # The preset may leave batch_size or learning_rate unset (bs_experiment); overrides fill them.
    return Config.from_dict(merge_values(preset_values(name_or_path), overrides))


# --------------------------------------------------------------------------------------------
# Run profiles: how big the notebooks' experiments are.

PROFILE_ENV_VAR = "VCD_PROFILE"


@dataclass(frozen=True)
class RunProfile:
    """How much work each chapter does.

    ``train_steps``: optimiser steps of a chapter's training run; ``eval_examples``,
    ``eval_samples``, ``eval_burn_in``, ``eval_kept``: the importance-sampled evaluation;
    ``hmc_examples``: test digits in the HMC demonstrations; ``gradient_draws``: independent
    draws of the gradient estimator when chapter 5 measures its variance. What the timing
    chapters (4 to 6) measure: ``timed_preset``, the preset of the step they time (the paper's, or
    a small one whose compilations take seconds); ``timed_calls``, timed calls behind each median;
    ``timed_steps``, the length of their timed loops; ``batch_sizes``, the batch sizes they sweep.
    How chapter 2 checks the evaluation: ``sample_sweep``, the numbers of importance samples S it
    compares, and ``ais_temperatures``, the length of its annealed importance sampling schedule.
    """

    name: str
    train_steps: int
    eval_examples: int
    eval_samples: int
    eval_burn_in: int
    eval_kept: int
    hmc_examples: int
    gradient_draws: int
    timed_preset: str
    timed_calls: int
    timed_steps: int
    batch_sizes: tuple[int, ...]
    sample_sweep: tuple[int, ...]
    ais_temperatures: int

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.type == "int":
                check_positive_int(f"profile.{f.name}", getattr(self, f.name))
        if self.timed_preset not in available_presets():
            raise ValueError(f"profile.timed_preset {self.timed_preset!r} is invalid: must be one of "
                             f"{', '.join(available_presets())}")
        for name in ("batch_sizes", "sample_sweep"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(f"profile.{name} {values!r} is invalid: must be positive integers")

    def evaluation_config(self, base: EvaluationConfig | None = None) -> EvaluationConfig:
        """``base`` (default: the paper's) resized to this profile."""
        return dataclasses.replace(
            base or EvaluationConfig(),
            num_examples=self.eval_examples,
            num_samples=self.eval_samples,
            burn_in=self.eval_burn_in,
            kept=self.eval_kept,
        )


_BOOK_SWEEP = (16, 100, 128, 512, 1024)
_SAMPLE_SWEEP = (10, 100, 1_000, 20_000)  # up to the paper's S
PROFILES: dict[str, RunProfile] = {
    "test": RunProfile("test", train_steps=30, eval_examples=20, eval_samples=100,
                       eval_burn_in=10, eval_kept=10, hmc_examples=8, gradient_draws=6,
                       timed_preset="tiny", timed_calls=1, timed_steps=20, batch_sizes=(16, 128),
                       sample_sweep=(10, 100), ais_temperatures=50),
    "book": RunProfile("book", train_steps=3000, eval_examples=1000, eval_samples=1000,
                       eval_burn_in=100, eval_kept=100, hmc_examples=100, gradient_draws=50,
                       timed_preset="default", timed_calls=3, timed_steps=200, batch_sizes=_BOOK_SWEEP,
                       sample_sweep=_SAMPLE_SWEEP, ais_temperatures=1000),
    "paper": RunProfile("paper", train_steps=400_000, eval_examples=10_000, eval_samples=20_000,
                        eval_burn_in=300, eval_kept=300, hmc_examples=1000, gradient_draws=200,
                        timed_preset="default", timed_calls=5, timed_steps=200, batch_sizes=_BOOK_SWEEP,
                        sample_sweep=_SAMPLE_SWEEP, ais_temperatures=1000),
}
DEFAULT_PROFILE = "book"


def get_profile(name: str) -> RunProfile:
    if name not in PROFILES:
        raise ValueError(f"profile {name!r} is invalid: must be one of {', '.join(PROFILES)}")
    return PROFILES[name]


def active_profile() -> RunProfile:
    """The profile named by ``$VCD_PROFILE`` (``book`` when unset)."""
    name = os.environ.get(PROFILE_ENV_VAR, "").strip() or DEFAULT_PROFILE
    try:
        return get_profile(name)
    except ValueError as error:
        raise ValueError(f"${PROFILE_ENV_VAR}: {error}") from None

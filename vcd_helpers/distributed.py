"""Data-parallel VCD over replicas with ``tf.distribute``: one machine (MirroredStrategy over
GPUs or logical CPUs) or several worker processes (MultiWorkerMirroredStrategy, set up by
``TF_CONFIG``).

Every replica receives the global batch from the same input pipeline and takes its own rows
(replica r of N takes rows [r B/N, (r+1) B/N)); real multi-worker input would shard the files
instead (``strategy.distribute_datasets_from_function``), but this keeps the data position a
function of (seed, step), as checkpoint-and-resume needs. Replica r draws its randomness from
``fold_in(step_seed, r)``. The replicas' gradients are summed (VCD's losses are sums over the
batch, so the sum is the global batch's gradient), their g values gathered for the control
variate, and their adapted HMC step sizes averaged. A step on N replicas therefore computes
exactly what ``training.accumulate_gradients`` computes with N micro-batches: data parallelism
and gradient accumulation are the same sum, spread over devices or over time.
"""

from __future__ import annotations

import functools
import json
import os

import tensorflow as tf

from vcd_helpers.config import STRATEGIES, Config, ExecutionConfig, check_one_of, check_positive_int
from vcd_helpers.devices import split_physical_device
from vcd_helpers.model import VAE
from vcd_helpers.seeds import fold_in
from vcd_helpers.training import VCDEstimate, VCDTrainer

TF_CONFIG_EXAMPLE = '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}'


def tf_config_workers() -> tuple[list[str], int]:
    """The worker addresses and this process's index, from the TF_CONFIG environment variable.

    Raises ValueError naming TF_CONFIG when it is missing or malformed.
    """
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ValueError(f"strategy='multi_worker' needs the TF_CONFIG environment variable: {TF_CONFIG_EXAMPLE}")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}): it must be like {TF_CONFIG_EXAMPLE}") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ValueError(f"TF_CONFIG={raw} is invalid: it must be an object like {TF_CONFIG_EXAMPLE}")
    workers = config["cluster"].get("worker")
    if not isinstance(workers, list) or not workers or not all(isinstance(w, str) and ":" in w for w in workers):
        raise ValueError(f"TF_CONFIG cluster.worker={workers!r} is invalid: must be a list of 'host:port' strings")
    task = config.get("task")
    if (not isinstance(task, dict) or task.get("type") != "worker" or not isinstance(task.get("index"), int)
            or not 0 <= task["index"] < len(workers)):
        raise ValueError(f"TF_CONFIG task={task!r} is invalid: must be {{'type': 'worker', 'index': i}} with "
                         f"0 <= i < {len(workers)}")
    return workers, task["index"]


def make_strategy(name: str, devices: list[str] | None = None) -> tf.distribute.Strategy | None:
    """The ``tf.distribute`` strategy called ``name``.

    'none': no strategy (None). 'mirrored': MirroredStrategy over ``devices`` (default: every
    GPU, else the logical CPUs; see ``devices.split_physical_device``). 'multi_worker':
    MultiWorkerMirroredStrategy from the TF_CONFIG environment variable, which must name this
    process's task; create it before any other TensorFlow op.
    """
    check_one_of("strategy", name, STRATEGIES)
    if name == "none":
        return None
    if name == "mirrored":
        if devices is None:
            gpus = tf.config.list_logical_devices("GPU")
            devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        # Logical CPUs have no NCCL; the ring of copies works on any device type.
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    tf_config_workers()  # a clear error for a missing or malformed TF_CONFIG, before TensorFlow reads it
    return tf.distribute.MultiWorkerMirroredStrategy()


def replica_devices(num_replicas: int) -> list[str]:
    """Devices for ``num_replicas`` mirrored replicas: the first GPUs if there are enough, else
    logical CPUs split from the CPU (so call it before TensorFlow initialises its devices)."""
    check_positive_int("replicas", num_replicas)
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= num_replicas:
        return [f"/GPU:{k}" for k in range(num_replicas)]
    return split_physical_device(num_replicas)


def strategy_for(execution: ExecutionConfig) -> tf.distribute.Strategy | None:
    """The strategy of an execution section, made once per process (for 'multi_worker', before
    any other TensorFlow op): ``execution.replicas`` mirrored replicas on ``execution.devices``
    (empty: ``replica_devices``), one replica per TF_CONFIG worker, or None. Sections that differ
    only in speed settings get the same strategy.

    Raises ValueError when the strategy has another number of replicas than the section."""
    return _strategy(execution.strategy, execution.replicas, execution.devices)


@functools.cache
def _strategy(name: str, replicas: int, devices: tuple[str, ...]) -> tf.distribute.Strategy | None:
    strategy = make_strategy(name, (list(devices) or replica_devices(replicas)) if name == "mirrored" else None)
    if strategy is not None and strategy.num_replicas_in_sync != replicas:
        raise ValueError(f"execution.replicas={replicas} is invalid: the {name} strategy has "
                         f"{strategy.num_replicas_in_sync} replicas")
    return strategy


class ReplicatedVCDTrainer(VCDTrainer):
    """A VCD trainer whose step runs on the replicas of ``config.execution``'s strategy.

    Every variable (weights, slots, control variate, step size, step) is mirrored: build it with
    ``trainers.build_trainer(config)``, which makes the model under ``strategy.scope()`` too.
    ``train_step(index, x)`` takes the global batch, index [B] and x [B, 784], B a multiple of
    the number of replicas.
    """

    def __init__(self, model: VAE, config: Config):
        """Raises ValueError for a model made outside the strategy's scope (its weights would not
        be mirrored)."""
        self.strategy = strategy_for(config.execution)
        self.num_replicas = self.strategy.num_replicas_in_sync
        if not all(self.strategy.extended.variable_created_in_scope(v) for v in model.variables):
            raise ValueError("the model was made outside the strategy's scope, so its weights are not mirrored: "
                             "build the trainer with trainers.build_trainer(config)")
        with self.strategy.scope():
            super().__init__(model, config)

    def _replica_estimate(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor) -> VCDEstimate:
        """In replica context: this replica's rows of the global batch and its estimate."""
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group
        rows = tf.shape(x)[0] // self.num_replicas
        begin = replica * rows
        return self.estimate_gradients(x[begin:begin + rows], baseline[begin:begin + rows],
                                       fold_in(seed, replica))

    def batch_estimate(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor) -> VCDEstimate:
        """The estimate summed over the replicas (cross-replica context); changes no state."""
        per_replica = self.strategy.run(self._replica_estimate, args=(x, baseline, seed))
        total = lambda value: self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
        mean = lambda value: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        gradients = {name: [total(g) for g in grads] for name, grads in per_replica.gradients.items()}
        return VCDEstimate(gradients, total(per_replica.encoder_loss), total(per_replica.decoder_loss),
                           self.strategy.gather(per_replica.g, axis=0), mean(per_replica.accept_rate),
                           mean(per_replica.step_size))

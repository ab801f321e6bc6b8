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
exactly what ``pipeline.accumulate_gradients`` computes with N micro-batches: data parallelism
and gradient accumulation are the same sum, spread over devices or over time.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from vcd_helpers.config import Config
from vcd_helpers.devices import split_physical_device
from vcd_helpers.model import VAE
from vcd_helpers.training import VCDEstimate, VCDTrainer

STRATEGIES = ("none", "mirrored", "multi_worker")


def make_strategy(name: str, devices: list[str] | None = None) -> tf.distribute.Strategy | None:
    """The ``tf.distribute`` strategy called ``name``.

    'none': no strategy (None). 'mirrored': MirroredStrategy over ``devices`` (default: every
    GPU, else the logical CPUs; see ``devices.split_physical_device``). 'multi_worker':
    MultiWorkerMirroredStrategy from the TF_CONFIG environment variable, which must name this
    process's task; create it before any other TensorFlow op.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is invalid: must be one of {', '.join(STRATEGIES)}")
    if name == "none":
        return None
    if name == "mirrored":
        if devices is None:
            gpus = tf.config.list_logical_devices("GPU")
            devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        # Logical CPUs have no NCCL; the ring of copies works on any device type.
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    config = os.environ.get("TF_CONFIG")
    if not config:
        raise ValueError("strategy='multi_worker' needs the TF_CONFIG environment variable: "
                         '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}')
    task = json.loads(config).get("task", {})
    if task.get("type") != "worker" or not isinstance(task.get("index"), int):
        raise ValueError(f"TF_CONFIG task={task!r} is invalid: must be {{'type': 'worker', 'index': <int>}}")
    return tf.distribute.MultiWorkerMirroredStrategy()


def strategy_name(strategy: tf.distribute.Strategy | None) -> str:
    """The name ``make_strategy`` knows ``strategy`` by ('none', 'mirrored' or 'multi_worker')."""
    if strategy is None:
        return "none"
    return "multi_worker" if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) else "mirrored"


def replica_devices(num_replicas: int) -> list[str]:
    """Devices for ``num_replicas`` mirrored replicas: the first GPUs if there are enough, else
    logical CPUs split from the CPU (so call it before TensorFlow initialises its devices)."""
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"replicas={num_replicas!r} is invalid: must be a positive integer")
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= num_replicas:
        return [f"/GPU:{k}" for k in range(num_replicas)]
    return split_physical_device(num_replicas)


def build_strategy(name: str, replicas: int | None = None) -> tf.distribute.Strategy | None:
    """The strategy the training command asks for: ``replicas`` (mirrored only, default 2)
    chooses the devices with ``replica_devices``."""
    if name != "mirrored" and replicas is not None:
        raise ValueError(f"replicas={replicas} is invalid with strategy={name!r}: only 'mirrored' takes replicas")
    return make_strategy(name, replica_devices(replicas or 2) if name == "mirrored" else None)


class ReplicatedVCDTrainer(VCDTrainer):
    """A VCD trainer whose step runs on ``strategy.num_replicas_in_sync`` replicas.

    Build it under nothing: it enters ``strategy.scope()`` itself so that every variable (weights,
    slots, control variate, step size, step) is mirrored. ``train_step(index, x)`` takes the
    global batch, index [B] and x [B, 784], B a multiple of the number of replicas.
    """

    def __init__(self, config: Config, strategy: tf.distribute.Strategy):
        self.strategy = strategy
        self.num_replicas = strategy.num_replicas_in_sync
        if config.batch_size % self.num_replicas:
            raise ValueError(f"batch_size={config.batch_size} is invalid for {self.num_replicas} replicas: "
                             "must be a multiple of the number of replicas")
        with strategy.scope():
            super().__init__(VAE(config.model, seed=config.seed), config)

    def _replica_estimate(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor) -> VCDEstimate:
        """In replica context: this replica's rows of the global batch and its estimate."""
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group
        rows = tf.shape(x)[0] // self.num_replicas
        begin = replica * rows
        return self.estimate_gradients(x[begin:begin + rows], baseline[begin:begin + rows],
                                       tf.random.experimental.stateless_fold_in(seed, replica))

    def batch_estimate(self, x: tf.Tensor, baseline: tf.Tensor, seed: tf.Tensor) -> VCDEstimate:
        """The estimate summed over the replicas (cross-replica context); changes no state."""
        per_replica = self.strategy.run(self._replica_estimate, args=(x, baseline, seed))
        total = lambda value: self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
        mean = lambda value: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        gradients = {name: [total(g) for g in grads] for name, grads in per_replica.gradients.items()}
        return VCDEstimate(gradients, total(per_replica.encoder_loss), total(per_replica.decoder_loss),
                           self.strategy.gather(per_replica.g, axis=0), mean(per_replica.accept_rate),
                           mean(per_replica.step_size))

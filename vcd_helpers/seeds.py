"""Stateless seeds: every random draw in the package takes an explicit ``[2]`` int32 seed.

A run with a given integer seed is reproducible on the same machine, whatever was run before
it, because no op reads a global random state. Seeds are split, never reused: ``split_seed``
derives independent child seeds from a parent, and ``salted_seed`` makes the root seed of each use
of an integer seed (each method's training steps keep their own stream: ``training_seed``).
"""

from __future__ import annotations

import hashlib

import tensorflow as tf

SeedLike = int | tf.Tensor

#: Each method's training steps draw from their own stream of the run's seed: [seed, stream].
TRAINING_STREAMS = {"vae": 1, "vcd": 2, "hoffman": 3}


def as_seed(seed: SeedLike) -> tf.Tensor:
    """A stateless seed, shape [2], int32, from an int or an existing seed tensor (cast to int32,
    as TFP's ``samplers.sanitize_seed`` does).

    Raises ValueError for a tensor of another shape."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        return tf.constant([0, seed], dtype=tf.int32)
    return tf.cast(_seed_tensor(seed), tf.int32)


def _seed_tensor(seed: tf.Tensor) -> tf.Tensor:
    seed = tf.convert_to_tensor(seed)
    if seed.shape != (2,):
        raise ValueError(f"seed has shape {seed.shape}: a stateless seed has shape [2]")
    return seed


def split_seed(seed: SeedLike, num: int = 2) -> tf.Tensor:
    """``num`` independent seeds derived from ``seed``: shape [num, 2].

    An int becomes ``as_seed(seed)``; a seed tensor keeps its dtype (the trainers split the int64
    seeds ``fold_in`` makes from their step counter: a cast would change every draw of a run).
    Raises ValueError for a tensor whose shape is not [2]."""
    seed = as_seed(seed) if isinstance(seed, int) else _seed_tensor(seed)
    return tf.random.experimental.stateless_split(seed, num=num)


def fold_in(seed: SeedLike, data: int | tf.Tensor) -> tf.Tensor:
    """A seed for the ``data``-th use of ``seed`` (e.g. a step counter): shape [2].

    A Python int ``data`` folds in as int32; a tensor keeps its integer dtype, which the result
    takes (the trainers fold their int64 step counter into their seed), and a seed tensor is used
    as it is: the draws are those of ``tf.random.experimental.stateless_fold_in`` on the same
    tensors (a cast would change every draw of a resumed run)."""
    seed = as_seed(seed) if isinstance(seed, int) else tf.convert_to_tensor(seed)
    data = tf.constant(data, tf.int32) if isinstance(data, int) else tf.convert_to_tensor(data)
    return tf.random.experimental.stateless_fold_in(seed, data)


def training_seed(seed: int, method: str) -> tf.Tensor:
    """The base seed [2] int32 of ``method``'s training steps in a run seeded ``seed``; step k
    draws from ``fold_in(training_seed(seed, method), k)``."""
    return tf.constant([seed, TRAINING_STREAMS[method]], tf.int32)


def salted_seed(seed: int, salt: str) -> tf.Tensor:
    """The root seed [2] int32 of one use of the integer ``seed``: ``fold_in(seed, salt)``, so that
    two uses of one seed (a variance's draws, a toy fit, a benchmark's chain) draw independently,
    as TFP's ``samplers.sanitize_seed(seed, salt=...)`` makes them. The salt folds in as the first
    31 bits of its SHA-256 (Python's ``hash`` of a string changes from process to process).

    Raises ValueError for a seed that is not an int or an empty salt."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r} is invalid: a root seed is made from an int")
    if not isinstance(salt, str) or not salt:
        raise ValueError(f"salt={salt!r} is invalid: must be a non-empty string naming the seed's use")
    salt_value = int.from_bytes(hashlib.sha256(salt.encode()).digest()[:4], "little") & 0x7FFFFFFF
    return fold_in(seed, salt_value)

"""vcd_helpers.seeds: stateless seeds, split and folded in as TensorFlow's raw ops do."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers import seeds


def test_seeds_are_stateless_and_split():
    a = tf.random.stateless_normal([3], seed=seeds.as_seed(5))
    b = tf.random.stateless_normal([3], seed=seeds.as_seed(5))
    np.testing.assert_array_equal(a, b)
    children = seeds.split_seed(5, 3).numpy()
    assert children.shape == (3, 2) and len({tuple(c) for c in children}) == 3
    assert not np.array_equal(seeds.fold_in(5, 1), seeds.fold_in(5, 2))
    # fold_in draws what the raw TF op draws on the same tensors: the trainers' int64 step keeps its
    # dtype (the runs' checkpoints depend on it), a Python int folds in as int32.
    step_seed = seeds.fold_in(seeds.training_seed(3, "vcd"), tf.constant(7, tf.int64))
    raw = tf.random.experimental.stateless_fold_in(tf.constant([3, 2], tf.int32), tf.constant(7, tf.int64))
    np.testing.assert_array_equal(step_seed, raw)
    assert step_seed.dtype == tf.int64
    np.testing.assert_array_equal(seeds.fold_in(step_seed, 4), tf.random.experimental.stateless_fold_in(step_seed, 4))
    with pytest.raises(ValueError, match=r"seed has shape \(3,\)"):
        seeds.as_seed(tf.constant([1, 2, 3]))
    # split_seed splits an int64 step seed as the raw op does (every trainer's draws depend on it);
    # as_seed casts to int32 first, as the HMC kernel does, which changes the children.
    children = seeds.split_seed(step_seed, 2)
    assert children.dtype == tf.int64
    np.testing.assert_array_equal(children, tf.random.experimental.stateless_split(step_seed, 2))
    assert not np.array_equal(seeds.split_seed(seeds.as_seed(step_seed), 2), children)
    np.testing.assert_array_equal(seeds.split_seed(5, 3), tf.random.experimental.stateless_split([0, 5], 3))
    with pytest.raises(ValueError, match=r"seed has shape \(1, 2\)"):
        seeds.split_seed(tf.constant([[1, 2]]))


def test_a_salted_seed_separates_the_uses_of_one_seed():
    a, b = seeds.salted_seed(3, "estimator_variance"), seeds.salted_seed(3, "step_breakdown")
    assert a.dtype == tf.int32 and a.shape == (2,)
    assert not np.array_equal(a, b) and not np.array_equal(a, seeds.salted_seed(4, "estimator_variance"))
    np.testing.assert_array_equal(a, seeds.salted_seed(3, "estimator_variance"))
    # The same in every process: the salt folds in as the first 31 bits of its SHA-256.
    salt = int.from_bytes(hashlib.sha256(b"estimator_variance").digest()[:4], "little") & 0x7FFFFFFF
    np.testing.assert_array_equal(a, tf.random.experimental.stateless_fold_in(tf.constant([0, 3]), salt))


@pytest.mark.parametrize("seed, salt, message", [(True, "a", "seed=True is invalid"), (1.5, "a", "seed=1.5 is invalid"),
                                                 (1, "", "salt='' is invalid"), (1, None, "salt=None is invalid")])
def test_a_salted_seed_refuses_what_it_cannot_salt(seed, salt, message):
    with pytest.raises(ValueError, match=message):
        seeds.salted_seed(seed, salt)


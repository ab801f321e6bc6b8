"""vcd_helpers.optim: the reference RMSProp variant against a hand computation."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from vcd_helpers.config import load_config
from vcd_helpers.optim import ReferenceRMSProp, make_optimizers, step_decay


def test_two_steps_match_a_hand_computation():
    theta = tf.Variable([1.0, -2.0])
    opt = ReferenceRMSProp([theta], learning_rate=0.1, decay_steps=1, decay_rate=0.5)
    g1, g2 = np.array([0.5, -1.0]), np.array([2.0, 0.0])
    opt.apply_gradients([tf.constant(g1, tf.float32)], step=tf.constant(0))
    opt.apply_gradients([tf.constant(g2, tf.float32)], step=tf.constant(1))
    # By hand: ms starts at 0.01; the learning rate halves at step 1 (decay_steps=1).
    ms1 = 0.9 * 0.01 + 0.1 * g1**2
    t1 = np.array([1.0, -2.0]) - 0.1 * g1 / (1 + np.sqrt(ms1))
    ms2 = 0.9 * ms1 + 0.1 * g2**2
    t2 = t1 - 0.05 * g2 / (1 + np.sqrt(ms2))
    np.testing.assert_allclose(opt.mean_squares[0].numpy(), ms2, rtol=1e-6)
    np.testing.assert_allclose(theta.numpy(), t2, rtol=1e-6)


def test_step_decay_schedule():
    rates = [float(step_decay(5e-4, 0.9, 15_000, tf.constant(s))) for s in (0, 14_999, 15_000, 45_001)]
    np.testing.assert_allclose(rates, [5e-4, 5e-4, 4.5e-4, 5e-4 * 0.9**3], rtol=1e-6)


def test_make_optimizers_uses_group_rates():
    config = load_config("default")
    groups = {"encoder_mean": [tf.Variable(0.0)], "encoder_scale": [tf.Variable(0.0)], "decoder": [tf.Variable(0.0)]}
    optimizers = make_optimizers(groups, config)
    assert {k: o.learning_rate for k, o in optimizers.items()} == config.learning_rates
    assert all(o.decay_steps == 15_000 for o in optimizers.values())


def test_a_reduced_run_decays_the_learning_rate_every_30_epochs_of_50000_images():
    # 1,000 training images in batches of 50 (the tiny preset): 20 steps an epoch of its own, but the
    # rate falls by 0.9 only after 30 x 50,000 / 50 = 30,000 steps, as in the paper's schedule.
    config = load_config("tiny")
    assert config.train_examples == 1_000 and config.batch_size == 50
    optimizers = make_optimizers({"decoder": [tf.Variable(0.0)]}, config)
    rates = [float(optimizers["decoder"].current_learning_rate(tf.constant(s, tf.int64)))
             for s in (0, 600, 29_999, 30_000, 60_000)]
    np.testing.assert_allclose(rates, [5e-4, 5e-4, 5e-4, 4.5e-4, 5e-4 * 0.81], rtol=1e-6)


def test_slots_are_not_trainable_and_live_where_they_are_told():
    # Trainable slots would be collected as weights (and checkpointed, differentiated) with the model's.
    with tf.device("/CPU:0"):
        weights = [tf.Variable(tf.zeros([3])), tf.Variable(tf.zeros([2, 2]))]
    beside = ReferenceRMSProp(weights, 0.1, decay_steps=10)
    offloaded = ReferenceRMSProp(weights, 0.1, decay_steps=10, slot_device="/CPU:1")
    assert not any(slot.trainable for slot in beside.mean_squares + offloaded.mean_squares)
    assert {id(v) for v in beside.trainable_variables} == {id(w) for w in weights}  # the weights alone
    assert all(slot.device.endswith("CPU:0") for slot in beside.mean_squares)
    assert all(slot.device.endswith("CPU:1") for slot in offloaded.mean_squares)


def test_the_mean_square_takes_one_minus_rms_decay_of_the_new_square_for_any_decay():
    # rms_decay = 0.9 cannot tell (1 - rho) from other expressions equal to 0.1 there (1 % 0.9); 0.3 can.
    theta = tf.Variable([1.0])
    opt = ReferenceRMSProp([theta], learning_rate=0.1, decay_steps=10, rms_decay=0.3, initial_mean_square=0.5)
    opt.apply_gradients([tf.constant([2.0])], step=tf.constant(0))
    ms = 0.3 * 0.5 + 0.7 * 4.0
    np.testing.assert_allclose(opt.mean_squares[0].numpy(), [ms], rtol=1e-6)
    np.testing.assert_allclose(theta.numpy(), [1.0 - 0.1 * 2.0 / (1 + np.sqrt(ms))], rtol=1e-6)

"""vcd_helpers.control_variates: each kind's values and updates, and the state it holds."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers.config import ControlVariateConfig, load_config
from vcd_helpers.control_variates import ControlVariate


@pytest.mark.parametrize("kind", ["none", "global", "local", "scheduled"])
def test_control_variate_values_and_updates(kind):
    cv = ControlVariate(ControlVariateConfig(kind=kind, decay=0.9, switch_step=2), num_examples=5)
    index = tf.constant([0, 3])
    g = tf.constant([10.0, 20.0])
    np.testing.assert_array_equal(cv.values(index, tf.constant(0)), [0.0, 0.0])
    for step in range(4):
        before = cv.values(index, tf.constant(step)).numpy()
        cv.update(index, g, tf.constant(step))
        after = cv.values(index, tf.constant(step + 1)).numpy()
        if kind == "none":
            assert np.all(after == 0)
        elif kind == "global" or (kind == "scheduled" and step < 1):
            np.testing.assert_allclose(after, [0.9 * before[0] + 1.5] * 2, rtol=1e-6)
        elif kind == "local" or (kind == "scheduled" and step >= 2):
            np.testing.assert_allclose(after, 0.9 * before + 0.1 * g.numpy(), rtol=1e-6)
    if kind == "scheduled":
        # At the switch every example, seen or not, starts from the global value.
        assert cv.local_values.numpy()[1] == pytest.approx(float(cv.global_value))
    assert (cv.local_values is None) == (kind in ("none", "global"))


@pytest.mark.parametrize("kind", ["global", "local", "scheduled"])
def test_a_control_variate_holds_state_not_weights(kind):
    # A trainable baseline would be collected with the model's weights (and differentiated, checkpointed as one).
    baseline = ControlVariate(ControlVariateConfig(kind=kind), num_examples=10)
    assert baseline.variables and not baseline.trainable_variables


def test_a_control_variate_counts_the_bytes_of_its_state():
    sizes = {kind: ControlVariate(ControlVariateConfig(kind=kind), num_examples=10).state_bytes
             for kind in ("none", "global", "local", "scheduled")}
    assert sizes == {"none": 0, "global": 4, "local": 40, "scheduled": 44}  # float32: O(1) against O(N)


def test_a_scheduled_control_variate_read_from_a_preset_switches_to_local():
    # The kind read from the preset's JSON is a string equal to "scheduled" but not the literal itself:
    # the kind is compared by value. Switch after step 0: the local values start from the global one
    # (1.5) and move towards each example's own g.
    config = load_config("tiny", control_variate={"switch_step": 1}).control_variate
    assert config.kind == "scheduled"
    cv = ControlVariate(config, num_examples=5)
    index, g = tf.constant([0, 3]), tf.constant([10.0, 20.0])
    cv.update(index, g, tf.constant(0))
    cv.update(index, g, tf.constant(1))
    np.testing.assert_allclose(cv.values(index, tf.constant(2)), [0.9 * 1.5 + 1.0, 0.9 * 1.5 + 2.0], rtol=1e-6)


@pytest.mark.parametrize("kind", ["global", "local"])
def test_a_control_variate_moves_by_one_minus_decay_for_any_decay(kind):
    # At decay 0.9, 1 - decay cannot be told from 1 % decay (both 0.1); at 0.25 it can (0.75 against 0).
    cv = ControlVariate(ControlVariateConfig(kind=kind, decay=0.25), num_examples=5)
    index, g = tf.constant([0, 3]), tf.constant([10.0, 20.0])
    cv.update(index, g, tf.constant(0))
    expected = [0.75 * 15.0] * 2 if kind == "global" else [7.5, 15.0]
    np.testing.assert_allclose(cv.values(index, tf.constant(1)), expected, rtol=1e-6)

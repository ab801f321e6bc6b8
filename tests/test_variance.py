"""vcd_helpers.variance: the estimator's variance at fixed parameters, and the terms of its g."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers.config import load_config
from vcd_helpers.trainers import build_trainer

INDEX = tf.constant([3, 1, 4, 15, 9, 2, 6, 5])


def _batch(n: int, stream: int) -> tf.Tensor:
    """n binarised stand-in images [n, 784], drawn from seed [0, stream]."""
    return tf.cast(tf.random.stateless_uniform([n, 784], seed=[0, stream]) < 0.2, tf.float32)


def _vcd_trainer(**hmc):
    # A small model; a large step size and a fast adaptation, so that the chain's step size moves far.
    config = load_config("tiny", model={"hidden_units": 16, "latent_dim": 3},
                         hmc={"initial_step_size": 0.5, "adaptation_rate": 0.3} | hmc)
    return build_trainer(config.replace(execution={"jit_compile": False}))


def test_a_baseline_near_g_reduces_the_estimators_variance():
    from vcd_helpers.variance import estimator_variance

    config = load_config("tiny")
    trainer = build_trainer(config.replace(execution={"jit_compile": False}))
    x = _batch(16, stream=1)
    g = trainer.estimate_gradients(x, tf.zeros([16]), tf.constant([9, 9])).g
    none = estimator_variance(trainer, x, tf.zeros([16]), num_draws=8)
    tracked = estimator_variance(trainer, x, g, num_draws=8)
    for group in none:
        assert tracked[group] < none[group], (group, tracked[group], none[group])
    # Traced once, by the trainer that holds it, whatever the batch's values and baselines; the same draws again.
    assert trainer.draw_gradients.experimental_get_tracing_count() == 1
    assert estimator_variance(trainer, x, g, num_draws=8) == tracked
    with pytest.raises(ValueError, match="num_draws=1"):
        estimator_variance(trainer, x, g, num_draws=1)
    # Nothing else holds the compiled draws: they go with the trainer.
    held = weakref.ref(trainer)
    del trainer
    gc.collect()
    assert held() is None



def test_g_terms_are_the_terms_of_the_steps_g_and_change_no_state():
    from vcd_helpers.variance import g_terms

    trainer = _vcd_trainer(num_iterations=2)
    x, seed = _batch(8, stream=36), tf.constant([7, 11])
    trainer._train_step(INDEX, x)  # a baseline and an adapted step size that are not the initial ones
    baseline = trainer.control_variate.values(INDEX, trainer.step)
    step, step_size = int(trainer.step), float(trainer.step_size)
    terms = g_terms(trainer, INDEX, x, seed)
    estimate = trainer.estimate_gradients(x, baseline, seed)
    np.testing.assert_allclose(terms.g, estimate.g, rtol=1e-5)
    np.testing.assert_array_equal(terms.baseline, baseline)
    assert np.all(terms.quadratic > 0) and terms.scale.shape == (8, 3)
    np.testing.assert_array_equal(terms.scale, trainer.model.encoder(x)[1])
    assert (int(trainer.step), float(trainer.step_size)) == (step, step_size)

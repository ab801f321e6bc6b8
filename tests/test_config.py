"""vcd_helpers.config: presets, overrides, validation messages, run profiles."""

from __future__ import annotations

import dataclasses
import json

import pytest

from vcd_helpers import config
from vcd_helpers.config import Config, OptimizerConfig, load_config


def test_defaults_are_the_paper():
    c = load_config("default")
    assert (c.batch_size, c.num_steps, c.steps_per_epoch) == (100, 400_000, 500)
    assert c.learning_rates == {"encoder_mean": 5e-4, "encoder_scale": 2.5e-4, "decoder": 5e-4}
    assert c.lr_decay_steps == 15_000
    assert (c.hmc.num_iterations, c.hmc.num_leapfrog_steps, c.hmc.initial_step_size) == (8, 5, 0.05)
    assert (c.control_variate.kind, c.control_variate.switch_step) == ("scheduled", 3000)
    assert (c.evaluation.num_samples, c.evaluation.proposal) == (20_000, "hmc_moments")


@pytest.mark.parametrize("name", config.available_presets())
def test_every_preset_loads(name):
    overrides = {"batch_size": 128} if name == "bs_experiment" else {}
    assert load_config(name, **overrides).name == name


def test_preset_specifics():
    assert load_config("global_cv").control_variate.kind == "global"
    assert load_config("smoke").num_steps == 500
    bs = load_config("bs_experiment", batch_size=1024)
    assert bs.learning_rates["decoder"] == 1.3e-3 and bs.learning_rates["encoder_scale"] == 6.5e-4
    assert bs.lr_decay_steps == round(307 * 50_000 / 1024)
    assert load_config("bs_experiment", batch_size=64, optimizer={"learning_rate": 7e-4}).learning_rates["decoder"] == 7e-4


def test_bs_experiment_needs_a_batch_size_and_a_tuned_or_given_rate():
    with pytest.raises(ValueError, match="batch_size=None is invalid: this preset needs a batch size"):
        load_config("bs_experiment")
    with pytest.raises(ValueError, match="batch_size=64 is invalid: has no tuned learning rate"):
        load_config("bs_experiment", batch_size=64)


def test_an_unset_learning_rate_takes_the_tuned_one_when_built_from_values_and_is_refused_otherwise():
    values = {"batch_size": 512, "optimizer": {"learning_rate": None}}
    assert Config.from_dict(values).optimizer.learning_rate == 9e-4
    assert Config().replace(**values).optimizer.learning_rate == 9e-4
    with pytest.raises(ValueError, match="optimizer.learning_rate=None is invalid: give a rate"):
        Config(batch_size=512, optimizer=OptimizerConfig(learning_rate=None))


@pytest.mark.parametrize("overrides, message", [
    ({"batch_size": 0}, "batch_size=0 is invalid: must be a positive integer"),
    ({"optimizer": {"learning_rate": -0.1}}, "optimizer.learning_rate=-0.1 is invalid: must be a positive"),
    ({"hmc": {"num_leapfrog_steps": 0}}, "hmc.num_leapfrog_steps=0 is invalid"),
    ({"hmc": {"target_accept_rate": 1.5}}, r"hmc.target_accept_rate=1.5 is invalid: must lie in \(0, 1\)"),
    ({"control_variate": {"kind": "loco"}}, "control_variate.kind='loco' is invalid: must be one of none, global, local, scheduled"),
    ({"method": "gan"}, "method='gan' is invalid"),
    ({"batch_size": 60_000}, "batch_size=60000 is invalid: must not exceed train_examples"),
    ({"seed": -1}, "seed=-1 is invalid"),
    ({"evaluation": {"proposal": "prior"}}, "evaluation.proposal='prior' is invalid"),
    ({"steps": 2.5}, "steps=2.5 is invalid"),
    ({"precision": "float16"}, "precision='float16' is invalid: must be one of float32, bfloat16"),
])
def test_bad_values_are_rejected_with_field_value_and_rule(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("default", **overrides)


def test_unknown_keys_are_rejected_in_json_and_overrides(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"hmc": {"leapfrog": 3}}))
    with pytest.raises(ValueError, match="unknown configuration key 'hmc.leapfrog': allowed keys are"):
        load_config(path)
    with pytest.raises(ValueError, match="unknown configuration key 'batchsize'"):
        load_config("default", batchsize=10)
    with pytest.raises(ValueError, match="unknown preset 'paper'"):
        load_config("paper")


def test_json_file_round_trip_and_overrides(tmp_path):
    c = load_config("global_cv", batch_size=16, hmc={"num_iterations": 4})
    assert (c.batch_size, c.hmc.num_iterations, c.hmc.num_leapfrog_steps, c.seed) == (16, 4, 5, 0)
    path = tmp_path / "run.json"
    path.write_text(c.to_json())
    assert load_config(path) == c
    assert Config.from_dict(json.loads(c.to_json())) == c


#: Every path that applies overrides: the preset's loader, a Config's copy and the plain values' merge.
OVERRIDE_PATHS = {
    "load_config": lambda **o: load_config("tiny", **o),
    "Config.replace": lambda **o: load_config("tiny").replace(**o),
    "merge_values": lambda **o: Config.from_dict(config.merge_values(config.preset_values("tiny"), o)),
}


@pytest.mark.parametrize("path", OVERRIDE_PATHS)
def test_none_in_overrides_sets_none_on_every_path(path):
    apply = OVERRIDE_PATHS[path]
    # tiny evaluates 20 images; None is the whole split, not "keep the preset's".
    assert apply(evaluation={"num_examples": None}).evaluation.num_examples is None
    assert apply(execution={"steps_per_call": 5}).replace(execution={"steps_per_call": None}).steps_per_call == 10
    assert apply(batch_size=128, optimizer={"learning_rate": None}).optimizer.learning_rate == 9e-4  # the tuned rate
    with pytest.raises(ValueError, match="seed=None is invalid"):
        apply(seed=None)
    with pytest.raises(ValueError, match="unknown configuration key 'evaluation.bogus'"):
        apply(evaluation={"bogus": 1})


def test_config_is_frozen_and_replace_validates():
    c = Config()
    with pytest.raises(Exception):
        c.batch_size = 3  # type: ignore[misc]
    assert c.replace(steps=10).num_steps == 10
    with pytest.raises(ValueError, match="hmc.num_iterations=0"):
        c.replace(hmc={"num_iterations": 0})


def test_profiles(monkeypatch):
    monkeypatch.setenv(config.PROFILE_ENV_VAR, "test")
    assert config.active_profile().name == "test"
    monkeypatch.delenv(config.PROFILE_ENV_VAR)
    assert config.active_profile().name == "book"
    monkeypatch.setenv(config.PROFILE_ENV_VAR, "huge")
    with pytest.raises(ValueError, match="VCD_PROFILE: profile 'huge' is invalid: must be one of test, book, paper"):
        config.active_profile()
    ev = config.get_profile("test").evaluation_config()
    assert (ev.num_examples, ev.num_samples, ev.chunk_size) == (20, 100, 100)
    assert config.get_profile("paper").evaluation_config().num_samples == 20_000


def test_the_learning_curve_falls_on_whole_logging_windows():
    assert load_config("default").curve_every_steps is None
    assert load_config("default", curve_every_epochs=25).curve_every_steps == 12_500
    # batch 16: 3,125 steps an epoch; 25 epochs is 78,125 steps, rounded to a multiple of 100.
    assert load_config("default", batch_size=16, curve_every_epochs=25).curve_every_steps == 78_100
    with pytest.raises(ValueError, match="curve_every_epochs=0 is invalid"):
        load_config("default", curve_every_epochs=0)


@pytest.mark.parametrize("log_every, given, expected", [
    (100, None, 10), (50, None, 10), (10, None, 10), (4, None, 2), (5, None, 5), (3, None, 1), (100, 4, 4)])
def test_steps_per_call_is_the_given_one_else_up_to_10_dividing_the_logging_interval(log_every, given, expected):
    # One decision for every trainer, the training command's and the chapters' alike.
    cfg = load_config("default", log_every_steps=log_every, checkpoint_every_steps=100 * log_every,
                      execution={"steps_per_call": given})
    assert cfg.steps_per_call == expected and cfg.execution.steps_per_call == given


def test_profile_validation_names_the_bad_value():
    book = config.get_profile("book")
    with pytest.raises(ValueError, match="profile.timed_calls"):
        dataclasses.replace(book, timed_calls=0)
    with pytest.raises(ValueError, match="profile.timed_preset 'huge' is invalid: must be one of"):
        dataclasses.replace(book, timed_preset="huge")
    with pytest.raises(ValueError, match=r"profile.batch_sizes \(16, -1\) is invalid"):
        dataclasses.replace(book, batch_sizes=(16, -1))
    with pytest.raises(ValueError, match=r"profile.sample_sweep \(\) is invalid"):
        dataclasses.replace(book, sample_sweep=())
    with pytest.raises(ValueError, match="profile.ais_temperatures"):
        dataclasses.replace(book, ais_temperatures=0)
    for profile in config.PROFILES.values():  # every profile's timed step loads
        config.load_config(profile.timed_preset)


@pytest.mark.parametrize("preset, overrides, batch_size", [
    ("tiny", {}, 50),  # 1,000 training images
    ("default", {"train_examples": 5_000}, 100),
    ("default", {"train_examples": 5_000, "steps": 40}, 100),
    ("smoke", {"train_examples": 2_000, "batch_size": 16}, 16),
])
def test_a_reduced_training_set_still_decays_every_30_epochs_of_50000_images(preset, overrides, batch_size):
    # The decay interval is the paper's 30 epochs of the full 50,000 images, whatever a reduced run
    # trains on: not 30 of its own (shorter) epochs.
    c = load_config(preset, **overrides)
    assert c.train_examples < config.NUM_TRAIN_EXAMPLES == 50_000 and c.batch_size == batch_size
    assert c.optimizer.lr_decay_epochs == 30
    assert c.lr_decay_steps == round(30 * 50_000 / batch_size)
    assert c.lr_decay_steps > 30 * c.steps_per_epoch


def _library_calls():
    """Calls of the library with one bad argument each, and the message its check gives."""
    import numpy as np
    import tensorflow as tf

    from vcd_helpers import data, devices, evaluation, hmc, objectives, pipeline
    from vcd_helpers.model import VAE

    x = tf.zeros([2, 784])
    target = lambda z: -tf.reduce_sum(z ** 2, -1)  # noqa: E731
    fit = dict(target_log_prob_fn=target, objective="elbo", initial_loc=[0.0], initial_scale=[1.0], num_steps=2, batch_size=2,
               learning_rate=0.1, num_iterations=1, num_leapfrog_steps=1, step_size=0.1)
    return [
        (lambda: evaluation.importance_sampled_log_likelihood(VAE(seed=0).log_joint, x, tf.zeros([2, 10]),
                                                              tf.ones([2, 10]), num_samples=0, chunk_size=1, seed=0),
         "num_samples=0 is invalid: must be a positive integer"),
        (lambda: evaluation.hmc_posterior_chain(VAE(seed=0), x, burn_in=-1, kept=1, step_size=0.1,
                                                     num_leapfrog_steps=1, seed=0),
         "burn_in=-1 is invalid: must be a non-negative integer"),
        (lambda: evaluation.hmc_posterior_chain(VAE(seed=0), x, burn_in=0, kept=1, step_size=float("nan"),
                                                     num_leapfrog_steps=1, seed=0),
         "step_size=nan is invalid: must be a positive finite number"),
        (lambda: objectives.fit_diagonal_gaussian(**(fit | {"objective": "kl"})), "objective='kl' is invalid: must be one of"),
        (lambda: objectives.fit_diagonal_gaussian(**(fit | {"batch_size": 0})), "batch_size=0 is invalid: must be a positive integer"),
        (lambda: objectives.fit_diagonal_gaussian(**(fit | {"learning_rate": -1.0})),
         "learning_rate=-1.0 is invalid: must be a positive finite number"),
        (lambda: hmc.StepSizeAdaptation(hmc.HamiltonianMonteCarlo(target, 0.1, 1), target_accept_rate=1.0),
         r"target_accept_rate=1.0 is invalid: must lie in \(0, 1\)"),
        (lambda: pipeline.device_orders("zigzag", 3, 3), "schedule='zigzag' is invalid: must be one of"),
        (lambda: data.load_binarized_mnist("training"), "split='training' is invalid: must be one of"),
        (lambda: data.last_visits(10, batch_size=2, seed=0, step=-1), "step=-1 is invalid: must be a non-negative integer"),
        (lambda: data.indexed_batches(np.zeros([10, 784], np.float32), 2, 0, start_step=-1),
         "start_step=-1 is invalid: must be a non-negative integer"),
        (lambda: devices.split_physical_device(2, "TPU"), "device_type='TPU' is invalid: must be one of CPU, GPU"),
    ]


@pytest.mark.parametrize("index", range(12))
def test_the_library_checks_its_arguments_with_the_configs_validators(index):
    call, message = _library_calls()[index]
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("execution, allowed", [({"chain_shards": 3}, True), ({"strategy": "mirrored", "replicas": 2}, False)])
def test_the_config_takes_its_chain_blocks_but_not_a_replicated_step(execution, allowed):
    if allowed:
        assert load_config("tiny", batch_size=6).replace(method="hoffman", execution=execution).execution.chain_shards == 3
    else:
        with pytest.raises(ValueError, match="only VCD's step is pipelined or replicated, not method='hoffman'"):
            load_config("tiny", batch_size=6).replace(method="hoffman", execution=execution)

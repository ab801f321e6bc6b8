"""The trainers' steps, pinned by value: the VAE's loss is minus the ELBO and training raises the ELBO;
the adapted HMC step size is carried from one VCD step to the next; the VCD step's chain starts at
the encoder's sample z0; and its encoder gradient equals the estimator's closed form."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from vcd_helpers.config import Config, load_config
from vcd_helpers.hmc import value_and_gradient
from vcd_helpers.objectives import elbo
from vcd_helpers.seeds import fold_in
from vcd_helpers.trainers import build_trainer

INDEX = tf.constant([3, 1, 4, 15, 9, 2, 6, 5])
# The steps run eagerly (``_train_step``, the function that ``train_step`` compiles): the same code, without
# the seconds that tracing it costs; tests/test_training_loop.py and tests/test_training.py run compiled steps.


def _batch(n=8, seed=0):
    return tf.cast(tf.random.stateless_uniform([n, 784], seed=[seed, 36]) < 0.2, tf.float32)


def _mean_elbo(model, x, draws=16):
    """The batch's mean ELBO over ``draws`` fixed noise seeds: the same noise before and after training."""
    return float(np.mean([tf.reduce_mean(elbo(model, x, tf.constant([36, k]))) for k in range(draws)]))


@pytest.fixture(scope="module")
def vae_trainer():
    return build_trainer(load_config("tiny", method="vae", model={"hidden_units": 32}, execution={"jit_compile": False}))


def test_the_vae_reports_minus_the_elbo_of_its_step(vae_trainer):
    # The step's loss is -ELBO per example on the step's own noise (fold_in(seed, step)), at the
    # parameters before the step's update.
    x = _batch()
    before = float(tf.reduce_mean(elbo(vae_trainer.model, x, fold_in(vae_trainer.seed, vae_trainer.step))))
    assert before < -100  # an untrained model: the sign of the loss is not in doubt
    loss = float(vae_trainer._train_step(INDEX, x)["loss"])
    np.testing.assert_allclose(loss, -before, rtol=1e-5)


def test_a_few_vae_steps_raise_the_elbo(vae_trainer):
    # Gradient ascent on the ELBO: five steps on one batch raise its ELBO (from about -3,000 nats per
    # image by about 1,200 here), and lower the reported loss.
    x = _batch(seed=1)
    before = _mean_elbo(vae_trainer.model, x)
    losses = [float(vae_trainer._train_step(INDEX, x)["loss"]) for _ in range(5)]
    after = _mean_elbo(vae_trainer.model, x)
    assert after - before > 100.0, (before, after)
    assert losses[-1] < losses[0], losses


def _vcd_trainer(**hmc):
    # A small model; a large step size and a fast adaptation, so that the chain's step size moves far.
    config = load_config("tiny", model={"hidden_units": 16, "latent_dim": 3},
                         hmc={"initial_step_size": 0.5, "adaptation_rate": 0.3} | hmc)
    return build_trainer(config.replace(execution={"jit_compile": False}))


def _record_chains(trainer):
    """Make the trainer's ``run_chain`` keep what each call gives it and gets from it: the step size the
    chain starts from (``seen``) and (z0, chain) in ``calls`` (eager calls)."""
    seen = tf.Variable(-1.0, trainable=False)
    calls = []
    run_chain = trainer.run_chain

    def recording(x, z0, step_size, seed):
        seen.assign(step_size)
        chain = run_chain(x, z0, step_size, seed)
        calls.append((z0, chain))
        return chain

    trainer.run_chain = recording  # the step looks it up on the trainer, eagerly or when traced
    return seen, calls


def test_the_adapted_step_size_is_carried_to_the_next_step():
    # Compared with the chain's own adapted value, not with 0.05 (float32(0.05) != 0.05 always holds).
    trainer = _vcd_trainer()
    seen, _ = _record_chains(trainer)
    initial = float(np.float32(0.5))
    x = _batch()
    first = trainer._train_step(INDEX, x)
    assert float(seen) == initial  # the first chain starts from the configured step size
    adapted = float(first["step_size"])
    assert abs(adapted - initial) > 0.05, adapted  # the chain's adaptation moved it (to 0.29 here)
    assert float(trainer.step_size) == adapted  # the trainer keeps the chain's adapted step size ...
    second = trainer._train_step(INDEX, x)
    assert float(seen) == adapted  # ... and the next step's chain starts from it
    assert float(trainer.step_size) == float(second["step_size"]) != adapted


def _eager_estimate(trainer, x, baseline, seed):
    _, calls = _record_chains(trainer)
    estimate = trainer.estimate_gradients(x, baseline, seed)
    assert len(calls) == 1
    return estimate, calls[0]


def test_the_step_chain_starts_at_the_encoder_sample_z0():
    # z0 = loc + scale * eps with eps from the first half of the step's seed (the second drives the
    # chain); the chain's first evaluation, which the encoder loss reuses, is log p(x, z0) there.
    trainer = _vcd_trainer()
    model, x, seed = trainer.model, _batch(), tf.constant([7, 11])
    _, (start, chain) = _eager_estimate(trainer, x, tf.zeros([8]), seed)
    loc, scale = model.encoder(x)
    noise_seed = tf.random.experimental.stateless_split(seed, 2)[0]
    z0 = loc + scale * tf.random.stateless_normal(tf.shape(loc), seed=noise_seed)
    assert float(tf.reduce_min(tf.abs(z0 - loc) / scale)) > 1e-3  # z0 is a draw, not the encoder mean
    np.testing.assert_allclose(start, z0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(chain.initial_log_prob, model.log_joint(x, z0), rtol=1e-6)
    np.testing.assert_allclose(chain.initial_gradient, value_and_gradient(lambda z: model.log_joint(x, z), z0)[1],
                               rtol=1e-5, atol=1e-5)


def test_a_bfloat16_step_multiplies_in_bfloat16_and_the_model_stays_float32():
    # config.precision reaches the chain and the losses of the traced step; the model's own calls
    # (evaluation's) stay float32.
    trainer = build_trainer(load_config("tiny", model={"hidden_units": 16, "latent_dim": 3}, precision="bfloat16", execution={"jit_compile": False}))
    model, x, seed = trainer.model, _batch(), tf.constant([7, 11])
    _, (start, chain) = _eager_estimate(trainer, x, tf.zeros([8]), seed)
    reduced, full = model.log_joint(x, start, "bfloat16"), model.log_joint(x, start)
    assert np.max(np.abs(reduced - full)) > 1e-3
    np.testing.assert_allclose(chain.initial_log_prob, reduced, rtol=1e-6)
    vae = build_trainer(load_config("tiny", method="vae", model={"hidden_units": 16}, precision="bfloat16", execution={"jit_compile": False}))
    before = {p: -float(tf.reduce_mean(elbo(vae.model, x, fold_in(vae.seed, vae.step), p))) for p in ("float32", "bfloat16")}
    assert abs(before["bfloat16"] - before["float32"]) > 1e-2, before
    np.testing.assert_allclose(float(vae._train_step(INDEX, x)["loss"]), before["bfloat16"], rtol=1e-6)


def test_the_encoder_gradient_is_the_estimators_closed_form():
    """The VCD encoder gradient, at the encoder's outputs mu, sigma (z0 = mu + sigma eps, zT the chain's
    end, g = log p(x, zT) + 1/2 sum ((zT - mu) / sigma)^2, b the baseline), is per example

        d/d mu    = -grad log p(x, z0)       - (zT - mu) / sigma^2    + (g - b) (z0 - mu) / sigma^2
        d/d sigma = -grad log p(x, z0) * eps - (zT - mu)^2 / sigma^3  + (g - b) ((z0 - mu)^2 / sigma^3 - 1 / sigma)

    (pathwise, the g term through mu and sigma only, the score-function term with g - b held fixed),
    carried back to the encoder's weights by the chain rule. Computed here in float64 from the step's
    own z0 and zT; the trainer's gradient must equal it to float32 round-off."""
    trainer = _vcd_trainer()
    model, x = trainer.model, _batch(seed=2)
    # An untrained scale net puts sigma anywhere in [1e-4, 20], where float32 loses the comparison:
    # its last layer is shrunk so that sigma ~ softplus(0) ~ 0.7 (the mean net is left as it is).
    last = model.encoder.scale_net
    last.weights[-1].assign(0.05 * last.weights[-1])
    last.biases[-1].assign(tf.zeros_like(last.biases[-1]))
    baseline = tf.fill([8], -450.0)
    seed = tf.constant([5, 3])
    estimate, (start, chain) = _eager_estimate(trainer, x, baseline, seed)
    with tf.GradientTape(persistent=True) as tape:
        loc, scale = model.encoder(x)
    noise_seed = tf.random.experimental.stateless_split(seed, 2)[0]
    eps = tf.random.stateless_normal(tf.shape(loc), seed=noise_seed).numpy().astype(np.float64)
    mu, sigma = loc.numpy().astype(np.float64), scale.numpy().astype(np.float64)
    assert 0.3 < sigma.min() and sigma.max() < 1.5
    z0 = start.numpy().astype(np.float64)  # the float32 z0 of the step (= mu + sigma eps, as tested above)
    _, grad_z0 = value_and_gradient(lambda z: model.log_joint(x, z), start)
    grad_z0 = grad_z0.numpy().astype(np.float64)
    zT = chain.final_state.numpy().astype(np.float64)
    g = (model.log_joint(x, chain.final_state).numpy().astype(np.float64)
         + 0.5 * np.sum(((zT - mu) / sigma) ** 2, axis=-1))
    np.testing.assert_allclose(estimate.g, g, rtol=1e-5)
    assert np.min(np.abs(g - baseline.numpy())) > 1.0  # the score-function term weighs in
    weight = (g - baseline.numpy())[:, None]
    d_mu = -grad_z0 - (zT - mu) / sigma**2 + weight * (z0 - mu) / sigma**2
    d_sigma = -grad_z0 * eps - (zT - mu) ** 2 / sigma**3 + weight * ((z0 - mu) ** 2 / sigma**3 - 1 / sigma)
    groups = model.parameter_groups()
    expected = {  # the chain rule through each net: vector-Jacobian products with the closed forms
        "encoder_mean": tape.gradient(loc, groups["encoder_mean"], output_gradients=tf.constant(d_mu, tf.float32)),
        "encoder_scale": tape.gradient(scale, groups["encoder_scale"],
                                       output_gradients=tf.constant(d_sigma, tf.float32))}
    errors = {}  # per tensor: the largest difference over the largest expected magnitude
    for name, tensors in expected.items():
        for k, (actual, want) in enumerate(zip(estimate.gradients[name], tensors)):
            errors[f"{name}[{k}]"] = float(tf.reduce_max(tf.abs(actual - want)) / tf.reduce_max(tf.abs(want)))
    assert max(errors.values()) < 1e-4, errors


# build_trainer: which trainer each execution and method gets, and what it refuses --------------

def test_only_a_plain_step_cuts_its_chain_into_blocks(monkeypatch):
    # A replicated or pipelined step's devices already run concurrently: one block; a plain step
    # takes execution.chain_shards, else one block per compute thread.
    from vcd_helpers import training
    from vcd_helpers.config import PipelineConfig

    monkeypatch.setattr(training, "compute_threads", lambda: 4)
    vcd = load_config("tiny")
    pipeline = PipelineConfig(micro_batch_size=10, gradient_accumulation=5)
    assert training.chain_blocks(vcd.execution) == 4
    assert training.chain_blocks(vcd.replace(execution={"chain_shards": 3}).execution) == 3
    assert training.chain_blocks(vcd.replace(execution={"strategy": "mirrored", "replicas": 2}).execution) == 1
    assert training.chain_blocks(vcd.replace(execution={"pipeline": pipeline}).execution) == 1


def test_each_execution_and_method_gets_its_trainer():
    from vcd_helpers.config import PipelineConfig
    from vcd_helpers.pipeline import PipelinedVCDTrainer
    from vcd_helpers.training import VAETrainer, VCDTrainer

    small = {"model": {"hidden_units": 16, "latent_dim": 3}}
    vae, vcd = load_config("tiny", method="vae", **small), load_config("tiny", **small)
    pipeline = PipelineConfig(micro_batch_size=10, gradient_accumulation=5)
    assert [c.execution.kind for c in (vcd, vcd.replace(execution={"pipeline": pipeline}),
                                       vcd.replace(execution={"strategy": "mirrored", "replicas": 2}))] == \
        ["plain", "pipelined", "replicated"]
    built = {"vae": build_trainer(vae), "vcd": build_trainer(vcd.replace(execution={"jit_compile": False})),
             "pipelined": build_trainer(vcd.replace(execution={"pipeline": pipeline}))}
    assert type(built["vae"]) is VAETrainer and type(built["vcd"]) is VCDTrainer
    assert type(built["pipelined"]) is PipelinedVCDTrainer
    # None compiles whatever the execution allows; False is kept.
    assert built["vae"].jit_compile is True and built["pipelined"].jit_compile is True
    assert built["vcd"].jit_compile is False


@pytest.mark.parametrize("method, execution, named", [
    ("vae", {"chain_shards": 2},
     "execution.chain_shards=2 is invalid: only a method with an HMC chain (vcd, hoffman) has one to shard, not method='vae'"),
    ("vcd", {"pipeline": {"micro_batch_size": 25}, "chain_shards": 2}, "execution.chain_shards=2 is invalid: only plain VCD's chain is "
                                                  "sharded, not a pipelined step's"),
    ("vcd", {"strategy": "mirrored", "replicas": 2, "chain_shards": 1},
     "execution.chain_shards=1 is invalid: only plain VCD's chain is sharded, not a replicated step's"),
    ("vae", {"pipeline": {"micro_batch_size": 25}}, "execution.pipeline=PipelineConfig(schedule='interleaved', "
     "micro_batch_size=25, gradient_accumulation=4, devices=(), recompute_encoder=False, slot_device=None) "
     "is invalid: only VCD's step is pipelined or replicated, not method='vae'"),
    ("vae", {"strategy": "mirrored", "replicas": 2}, "execution.strategy='mirrored' is invalid: only VCD's step"),
    ("vcd", {"strategy": "mirrored", "replicas": 2, "jit_compile": True},
     "execution.jit_compile=True is invalid: a step under a distribution strategy is a plain tf.function"),
    ("vcd", {"strategy": "mirrored", "replicas": 2, "pipeline": {"micro_batch_size": 25}}, "is not combined with strategy='mirrored'"),
    ("vcd", {"jit_compile": "yes"}, "execution.jit_compile='yes' is invalid: must be true, false or null"),
    ("vcd", {"steps_per_call": 0}, "execution.steps_per_call=0 is invalid: must be a positive integer"),
])
def test_the_config_refuses_what_the_execution_cannot_run(method, execution, named):
    with pytest.raises(ValueError) as error:
        load_config("tiny", method=method, batch_size=100, execution=execution)
    assert named in str(error.value)


def test_speed_only_execution_settings_are_no_part_of_a_runs_identity(tmp_path):
    # A run may resume with other steps per call: they change the speed, not a bit of the numbers
    # (tests/test_speed_only.py); XLA and the chain's blocks change the round-off, so they are the run's.
    config = load_config("tiny")
    fast = config.replace(execution={"steps_per_call": 5})
    assert fast != config and fast.identity() == config.identity()
    assert "steps_per_call" not in config.identity()["execution"]
    for other in ({"jit_compile": False}, {"chain_shards": 3}):
        assert config.replace(execution=other).identity() != config.identity(), other
    replicated = config.replace(batch_size=100, execution={"strategy": "mirrored", "replicas": 2})
    assert replicated.identity()["execution"] != config.replace(batch_size=100).identity()["execution"]
    # The pipeline's placement is speed too; its schedule, recomputed encoder and micro-batches are
    # not (each micro-batch draws its own noise).
    piped = config.replace(batch_size=100, execution={"pipeline": {"micro_batch_size": 25}})
    assert piped.replace(execution={"pipeline": {"slot_device": "/CPU:0"}}).identity() == piped.identity()
    for other in ({"schedule": "grouped"}, {"recompute_encoder": True},
                  {"micro_batch_size": 20, "gradient_accumulation": 5}):
        assert piped.replace(execution={"pipeline": other}).identity() != piped.identity(), other
    # Files written before the execution section read the same, through every reader; both forms at once are refused.
    old = config.to_dict()
    old |= {"strategy": "none", "replicas": 1}
    del old["execution"]
    assert Config.from_dict(old) == config
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert load_config(path) == config
    with pytest.raises(ValueError, match="configuration keys strategy, replicas belong in the execution section"):
        Config.from_dict(old | {"execution": {"strategy": "mirrored", "replicas": 2}})


# The step's bookkeeping ---------------------------------------------------------------------------

def test_the_vae_step_counter_starts_at_zero_and_advances_once_a_step():
    # The counter seeds the step's noise (fold_in(seed, step)) and sets the learning rate.
    trainer = build_trainer(load_config("tiny", method="vae", model={"hidden_units": 16, "latent_dim": 3}, execution={"jit_compile": False}))
    assert int(trainer.step) == 0
    trainer._train_step(INDEX, _batch(seed=2))
    assert int(trainer.step) == 1


def test_the_vcd_step_reports_per_example_losses_and_trains_only_the_model():
    # apply_estimate reports the batch's summed losses divided by the batch size; the trainer's only
    # trainable variables are the model's (step, step size, optimiser slots, baselines are state).
    trainer = _vcd_trainer()
    x, baseline = _batch(), tf.zeros([8])
    estimate = trainer.estimate_gradients(x, baseline, tf.constant([7, 11]))
    metrics = trainer.apply_estimate(INDEX, x, baseline, estimate)
    assert int(trainer.step) == 1
    np.testing.assert_allclose(float(metrics["encoder_loss"]), float(estimate.encoder_loss) / 8, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["decoder_loss"]), float(estimate.decoder_loss) / 8, rtol=1e-6)
    assert {id(v) for v in trainer.trainable_variables} == {id(v) for v in trainer.model.trainable_variables}


def test_the_reported_losses_are_the_batch_sums_divided_exactly_by_the_batch_size():
    # 12 / 8 = 1.5 and -20 / 8 = -2.5, not rounded (an untrained model's summed encoder loss, about
    # 1e9 in float32, is already an integer and would hide a floor division).
    trainer = _vcd_trainer()
    x, baseline = _batch(), tf.zeros([8])
    estimate = trainer.estimate_gradients(x, baseline, tf.constant([7, 11]))
    estimate = estimate._replace(encoder_loss=tf.constant(12.0), decoder_loss=tf.constant(-20.0))
    metrics = trainer.apply_estimate(INDEX, x, baseline, estimate)
    assert float(metrics["encoder_loss"]) == 1.5 and float(metrics["decoder_loss"]) == -2.5


def test_the_trainers_take_model_and_config_and_read_the_execution_from_the_config():
    from vcd_helpers.model import VAE
    from vcd_helpers.training import VAETrainer, VCDTrainer

    config = load_config("tiny", method="vae", model={"hidden_units": 8, "latent_dim": 2},
                         execution={"jit_compile": False, "steps_per_call": 5})
    model = VAE(config.model, seed=0)
    vae = VAETrainer(model=model, config=config)
    assert (vae.jit_compile, vae.steps_per_call) == (False, 5)
    with pytest.raises(TypeError):
        VAETrainer(model, config, True)
    vcd = config.replace(method="vcd", execution={"chain_shards": 3})
    assert VCDTrainer(model=model, config=vcd).chain_shards == 3
    with pytest.raises(TypeError):
        VCDTrainer(model, vcd, False)


def test_fit_takes_python_batches_one_per_call_and_refuses_them_for_more():
    # One step per call takes one (index, x) from any Python iterator per step. The in-graph loop of
    # k > 1 would read a Python iterator once, at tracing, and train every step on that batch.
    from vcd_helpers.loops import fit

    config = load_config("tiny", method="vae", model={"hidden_units": 8, "latent_dim": 2}, execution={"jit_compile": False})
    trainer = build_trainer(config)
    batches = iter([(INDEX, _batch(seed=s)) for s in range(3)])
    history = fit(trainer, batches, 3, steps_per_call=1, progress=False)
    assert next(batches, None) is None and int(trainer.step) == 3 and len(history["loss"]) == 3
    assert trainer.steps_per_call == config.steps_per_call == 10
    with pytest.raises(TypeError, match="steps_per_call=10 takes its batches inside the compiled loop: give a tf.data"):
        fit(trainer, [(INDEX, _batch(seed=s)) for s in range(3)], 3, progress=False)
    assert int(trainer.step) == 3


def test_accumulate_gradients_takes_the_micro_batch_size_by_name_only():
    from vcd_helpers.training import accumulate_gradients

    trainer = _vcd_trainer()
    with pytest.raises(TypeError):
        accumulate_gradients(trainer, _batch(), tf.zeros([8]), tf.constant([1, 2]), 4)

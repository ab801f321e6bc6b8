"""Importance-sampled log-likelihood, the test metric of the paper.

    log p(x) ~= logsumexp_s [log p(x, z_s) - log r(z_s)] - log S,   z_s ~ r(z | x)

with S = 20,000 samples per example in the paper. The S samples are drawn and scored in chunks
and combined with a streaming logsumexp (a running maximum and a rescaled running sum), so
memory grows with the chunk size, not with S.

Proposals r, all diagonal Gaussians widened by 1.2 (heavier than the posterior, so the weights
have finite variance):
- ``encoder``:     N(mu_q, (1.2 sigma_q)^2);
- ``hmc_mean``:    N(HMC mean, (1.2 sigma_q)^2);
- ``hmc_moments``: N(HMC mean, (1.2 HMC std)^2), the one the authors report.
The HMC statistics come from a chain started at the encoder mean: ``burn_in`` iterations that
adapt the step size, then ``kept`` iterations at a fixed step size whose states give the mean
and standard deviation (the reference adapts during burn-in only).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, NamedTuple

import numpy as np
import tensorflow as tf

from vcd_helpers.config import EvaluationConfig, HMCConfig, check_positive_int
from vcd_helpers.hmc import hmc_chain
from vcd_helpers.model import VAE
from vcd_helpers.objectives import posterior_distribution
from vcd_helpers.seeds import SeedLike, as_seed, fold_in, split_seed

LogJointFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def importance_sampled_log_likelihood(log_joint_fn: LogJointFn, x: tf.Tensor, proposal_loc: tf.Tensor,
                                      proposal_scale: tf.Tensor, *, num_samples: int, chunk_size: int,
                                      seed: SeedLike) -> tf.Tensor:
    """Estimate log p(x) per example by importance sampling from N(loc, diag(scale^2)).

    Args:
      log_joint_fn: (x [B, ...], z [C, B, D]) -> log p(x, z) [C, B].
      x: the observations, [B, ...].
      proposal_loc, proposal_scale: [B, D].
      num_samples: S; chunk_size: samples scored at once (the last chunk may be partial).
    Returns: [B] estimates.
    """
    if num_samples < 1 or chunk_size < 1:
        raise ValueError(f"num_samples={num_samples} and chunk_size={chunk_size} must be positive")
    chunk_size = min(chunk_size, num_samples)
    num_chunks = -(-num_samples // chunk_size)
    proposal = posterior_distribution(proposal_loc, proposal_scale)
    chunk_seeds = tf.random.experimental.stateless_split(as_seed(seed), num=num_chunks)
    dtype = proposal_loc.dtype
    batch = tf.shape(proposal_loc)[0]

    def body(c, running_max, running_sum):
        z = proposal.sample(chunk_size, seed=chunk_seeds[c])                     # [C, B, D]
        log_weights = log_joint_fn(x, z) - proposal.log_prob(z)                   # [C, B]
        # The last chunk may run past S: its surplus samples get weight zero.
        valid = c * chunk_size + tf.range(chunk_size) < num_samples
        log_weights = tf.where(valid[:, None], log_weights, tf.constant(-np.inf, dtype))
        new_max = tf.maximum(running_max, tf.reduce_max(log_weights, axis=0))
        running_sum = (running_sum * tf.exp(running_max - new_max)
                       + tf.reduce_sum(tf.exp(log_weights - new_max), axis=0))
        return c + 1, new_max, running_sum

    _, running_max, running_sum = tf.while_loop(
        lambda c, *_: c < num_chunks, body,
        (tf.constant(0), tf.fill([batch], tf.constant(-np.inf, dtype)), tf.zeros([batch], dtype)))
    return running_max + tf.math.log(running_sum) - math.log(num_samples)


def hmc_posterior_moments(model: VAE, x: tf.Tensor, *, burn_in: int, kept: int, step_size: float,
                          num_leapfrog_steps: int, seed: SeedLike, target_accept_rate: float = HMCConfig.target_accept_rate,
                          adaptation_rate: float = HMCConfig.adaptation_rate) -> tuple[tf.Tensor, tf.Tensor]:
    """Mean and standard deviation [B, D] of ``kept`` HMC states of p(z | x), after ``burn_in``
    adapting iterations, with every chain started at the encoder mean."""
    loc, _ = model.encoder(x)
    burn_seed, keep_seed = tf.unstack(split_seed(seed, 2))

    def target(z):
        return model.log_joint(x, z)

    state = loc
    if burn_in > 0:
        burn = hmc_chain(target, loc, step_size, num_iterations=burn_in, num_leapfrog_steps=num_leapfrog_steps,
                         seed=burn_seed, adapt_step_size=True, target_accept_rate=target_accept_rate,
                         adaptation_rate=adaptation_rate)
        state, step_size = burn.final_state, burn.step_size
    sampled = hmc_chain(target, state, step_size, num_iterations=kept, num_leapfrog_steps=num_leapfrog_steps,
                        seed=keep_seed, adapt_step_size=False, return_trace=True)
    states = sampled.trace.states
    return tf.reduce_mean(states, axis=0), tf.math.reduce_std(states, axis=0)


def proposal_for(model: VAE, x: tf.Tensor, evaluation: EvaluationConfig, hmc: HMCConfig, *,
                 seed: SeedLike) -> tuple[tf.Tensor, tf.Tensor]:
    """(loc, scale) [B, D] of the configured proposal for the examples x."""
    loc, scale = model.encoder(x)
    if evaluation.proposal == "encoder":
        return loc, evaluation.widen * scale
    mean, std = hmc_posterior_moments(model, x, burn_in=evaluation.burn_in, kept=evaluation.kept,
                                      step_size=hmc.initial_step_size, seed=seed, **hmc.kernel_arguments())
    if evaluation.proposal == "hmc_mean":
        return mean, evaluation.widen * scale
    # A chain that never moved has zero spread; the model's scale floor keeps the proposal proper.
    return mean, evaluation.widen * tf.maximum(std, model.config.min_scale)


def sigmoid_schedule(num_temperatures: int, steepness: float = 4.0) -> np.ndarray:
    """Inverse temperatures 0 = beta_0 < beta_1 < ... < beta_T = 1 ([T + 1] float64), spaced
    by a sigmoid (Grosse, Maddison & Salakhutdinov 2013): dense at both ends, where the
    intermediate distributions change fastest."""
    check_positive_int("num_temperatures", num_temperatures)
    raw = 1.0 / (1.0 + np.exp(-steepness * np.linspace(-1.0, 1.0, num_temperatures + 1)))
    return (raw - raw[0]) / (raw[-1] - raw[0])


class AISResult(NamedTuple):
    """log_normalizer [B]: the estimate of log Z; log_weights [K, B]: each chain's log weight;
    accept_rate: mean acceptance over temperatures; step_size: the adapted step size at the end."""

    log_normalizer: tf.Tensor
    log_weights: tf.Tensor
    accept_rate: tf.Tensor
    step_size: tf.Tensor


def annealed_importance_sampling(target_log_prob_fn: Callable[[tf.Tensor], tf.Tensor], initial_loc: tf.Tensor,
                                 initial_scale: tf.Tensor, *, num_temperatures: int, num_chains: int,
                                 num_leapfrog_steps: int, step_size: float, seed: SeedLike,
                                 target_accept_rate: float = HMCConfig.target_accept_rate,
                                 adaptation_rate: float = HMCConfig.adaptation_rate) -> AISResult:
    """Annealed importance sampling (Neal 2001) of log Z = log integral of exp(target(z)) dz, per example.

    Starts ``num_chains`` chains per example from q = N(loc, diag(scale^2)) and moves them
    through f_t(z) = log q(z) + beta_t (target(z) - log q(z)), t = 1..T (``sigmoid_schedule``),
    with one HMC iteration of the package's kernel (``hmc_chain``) per temperature, which leaves
    f_t invariant. Each chain's log weight adds (beta_t - beta_{t-1}) (target(z) - log q(z)) before
    each move; log Z ~ logsumexp over chains - log K. The estimate is unbiased for Z, so its log
    is a stochastic lower bound on log Z, like importance sampling's, but it needs no proposal
    close to the target.

    Args:
      target_log_prob_fn: z [K, B, D] -> unnormalised log density [K, B] (for a VAE: log p(x, z)).
      initial_loc, initial_scale: [B, D].
      num_temperatures: T; num_chains: K; num_leapfrog_steps, step_size: the HMC moves (the step
        size adapts towards ``target_accept_rate`` after every temperature).
    """
    check_positive_int("num_chains", num_chains)
    betas = tf.constant(sigmoid_schedule(num_temperatures), initial_loc.dtype)
    init_seed, move_seed = tf.unstack(split_seed(seed, 2))
    move_seeds = tf.random.experimental.stateless_split(move_seed, num=num_temperatures)
    start = posterior_distribution(initial_loc, initial_scale)
    # The latent size stays static where it is known: the model's layers need it.
    batch, dims = tf.shape(initial_loc)[0], initial_loc.shape[-1] or tf.shape(initial_loc)[1]

    def log_ratio(z):  # target - log q, for states z [K, B, D]
        return target_log_prob_fn(z) - start.log_prob(z)

    def body(t, z, log_weights, step_size, accept_sum):
        log_weights = log_weights + (betas[t] - betas[t - 1]) * log_ratio(z)
        beta = betas[t]

        def annealed(flat):  # f_t on [K B, D], as hmc_chain's chains
            z = tf.reshape(flat, [num_chains, batch, dims])
            return tf.reshape(start.log_prob(z) + beta * log_ratio(z), [-1])

        move = hmc_chain(annealed, tf.reshape(z, [-1, dims]), step_size, num_iterations=1,
                         num_leapfrog_steps=num_leapfrog_steps, seed=move_seeds[t - 1],
                         target_accept_rate=target_accept_rate, adaptation_rate=adaptation_rate)
        z = tf.ensure_shape(tf.reshape(move.final_state, [num_chains, batch, dims]), z.shape)
        return t + 1, z, log_weights, move.step_size, accept_sum + move.accept_rate

    z0 = start.sample(num_chains, seed=init_seed)
    _, _, log_weights, step_size, accept_sum = tf.while_loop(
        lambda t, *_: t <= num_temperatures, body,
        (tf.constant(1), z0, tf.zeros([num_chains, batch], initial_loc.dtype),
         tf.constant(step_size, initial_loc.dtype), tf.constant(0.0, initial_loc.dtype)))
    log_normalizer = tf.reduce_logsumexp(log_weights, axis=0) - math.log(num_chains)
    return AISResult(log_normalizer, log_weights, accept_sum / num_temperatures, step_size)


def ais_log_likelihood(model: VAE, images: np.ndarray, hmc: HMCConfig, *, num_temperatures: int,
                       num_chains: int, seed: SeedLike = 0, batch_size: int = 100) -> np.ndarray:
    """AIS estimate of log p(x) for each image ([N, 784] -> [N] numpy), from the encoder's
    q0(z | x) to the posterior p(z | x) (target log p(x, z)), with the HMC kernel and step-size
    rule of ``hmc``: an independent check of the importance-sampled estimate."""

    @tf.function
    def estimate(x, batch_seed):
        loc, scale = model.encoder(x)
        return annealed_importance_sampling(
            lambda z: model.log_joint(x, z), loc, scale, num_temperatures=num_temperatures,
            num_chains=num_chains, step_size=hmc.initial_step_size, seed=batch_seed,
            **hmc.kernel_arguments()).log_normalizer

    return np.concatenate([estimate(tf.constant(images[start: start + batch_size], tf.float32),
                                    fold_in(seed, k)).numpy()
                           for k, start in enumerate(range(0, len(images), batch_size))])


class EvaluationResult(NamedTuple):
    """mean_log_likelihood: average over the examples; per_example: [N] numpy array."""

    mean_log_likelihood: float
    per_example: np.ndarray
    proposal: str
    num_samples: int


def make_evaluator(model: VAE, evaluation: EvaluationConfig,
                   hmc: HMCConfig) -> Callable[[np.ndarray, SeedLike], EvaluationResult]:
    """A function ``(images [N, 784], seed) -> EvaluationResult`` computing the importance-sampled
    log-likelihood of the first ``evaluation.num_examples`` images (all when unset), in batches of
    ``evaluation.batch_size``. Its graph is traced once, so a run that evaluates itself
    periodically (the learning curve) does not trace and optimise it again each time.

    Batch ``k`` draws from ``fold_in(seed, k)`` alone, so batches can be computed in separate
    processes: ``evaluate(images, seed, done={k: estimates}, on_batch=save)`` takes the batches in
    ``done`` as they are (when their length fits) and hands each one it computes to ``on_batch``,
    which is how a run killed during its final evaluation resumes it (``runs``)."""

    @tf.function
    def estimate(x, batch_seed):
        proposal_seed, sample_seed = tf.unstack(split_seed(batch_seed, 2))
        loc, scale = proposal_for(model, x, evaluation, hmc, seed=proposal_seed)
        return importance_sampled_log_likelihood(model.log_joint, x, loc, scale,
                                                 num_samples=evaluation.num_samples,
                                                 chunk_size=evaluation.chunk_size, seed=sample_seed)

    def evaluate(images: np.ndarray, seed: SeedLike = 0, *, done: Mapping[int, np.ndarray] | None = None,
                 on_batch: Callable[[int, np.ndarray], None] | None = None) -> EvaluationResult:
        if evaluation.num_examples is not None:
            images = images[: evaluation.num_examples]
        done = done or {}
        estimates = []
        for k, start in enumerate(range(0, len(images), evaluation.batch_size)):
            x = images[start: start + evaluation.batch_size]
            if k in done and done[k].shape == (len(x),):
                estimates.append(done[k])
                continue
            estimates.append(estimate(tf.constant(x, tf.float32), fold_in(seed, k)).numpy())
            if on_batch is not None:
                on_batch(k, estimates[-1])
        per_example = np.concatenate(estimates)
        return EvaluationResult(float(per_example.mean()), per_example, evaluation.proposal, evaluation.num_samples)

    return evaluate


def evaluate_log_likelihood(model: VAE, images: np.ndarray, evaluation: EvaluationConfig, hmc: HMCConfig, *,
                            seed: SeedLike = 0) -> EvaluationResult:
    """Importance-sampled log-likelihood of ``images`` ([N, 784]; the first
    ``evaluation.num_examples`` when set), in batches of ``evaluation.batch_size`` examples."""
    return make_evaluator(model, evaluation, hmc)(images, seed)

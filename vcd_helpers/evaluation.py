"""Importance-sampled log-likelihood, the test metric of the paper.

    log p(x) ~= logsumexp_s [log p(x, z_s) - log r(z_s)] - log S,   z_s ~ r(z | x)

with S = 20,000 samples per example in the paper. The S samples are drawn and scored in chunks
and combined with a streaming logsumexp (a running maximum and a rescaled running sum), so
memory grows with the chunk size, not with S.

Proposals r, all diagonal Gaussians with their scale widened by c = 1.2:
- ``encoder``:     N(mu_q, (1.2 sigma_q)^2);
- ``hmc_mean``:    N(HMC mean, (1.2 sigma_q)^2);
- ``hmc_moments``: N(HMC mean, (1.2 HMC std)^2), the one the authors report.
With ``num_starts`` = M > 1 chains per image the HMC proposals are the equal-weight mixture of
the M chains' widened Gaussians (``proposal_distribution``): a chain that stops in a worse mode
of a multimodal posterior no longer decides the estimate alone.
Widening is a margin, not a guarantee: the weights' variance is finite only where the proposal's
tails are heavier than the posterior's in every direction, and a widened Gaussian still has
Gaussian tails. The weights' effective sample size S_eff (``return_effective_sample_size``)
shows how far a proposal is from that. The HMC statistics come from a chain started at the
encoder mean (``hmc_posterior_chain``): ``burn_in`` iterations that adapt the step size, then
``kept`` iterations at a fixed step size whose states give the mean and standard deviation (the
reference adapts during burn-in only).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.config import EvaluationConfig, HMCConfig, check_non_negative_int, check_positive_int, check_positive_number
from vcd_helpers.hmc import (HamiltonianMonteCarlo, StepSizeAdaptation, accept_rate, mean_over_iterations,
                             sample_chain)
from vcd_helpers.model import VAE
from vcd_helpers.objectives import posterior_distribution
from vcd_helpers.seeds import SeedLike, fold_in, split_seed

tfd = tfp.distributions

LogJointFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def importance_sampled_log_likelihood(log_joint_fn: LogJointFn, x: tf.Tensor, proposal_loc: tf.Tensor,
                                      proposal_scale: tf.Tensor, *, num_samples: int, chunk_size: int,
                                      seed: SeedLike, return_effective_sample_size: bool = False
                                      ) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
    """Estimate log p(x) per example by importance sampling from N(loc, diag(scale^2)).

    With ``return_effective_sample_size``, the same pass also returns the weights' effective
    sample size per example, S_eff = (sum_s w_s)^2 / sum_s w_s^2, between 1 (one weight
    dominates) and S (all equal). It streams with the estimate: a running sum of the squared
    weights, rescaled by the same running maximum, so no weight is ever exponentiated unscaled
    (no overflow) and the estimate is the same number with or without it.

    Args:
      log_joint_fn: (x [B, ...], z [C, B, D]) -> log p(x, z) [C, B].
      x: the observations, [B, ...].
      proposal_loc, proposal_scale: [B, D], or [M, B, D] for a mixture (``proposal_distribution``).
      num_samples: S; chunk_size: samples scored at once (the last chunk may be partial).
      return_effective_sample_size: also return S_eff [B].
    Returns: [B] estimates, or ([B] estimates, [B] S_eff).
    Raises: ValueError if num_samples or chunk_size is not positive.
    """
    check_positive_int("num_samples", num_samples)
    check_positive_int("chunk_size", chunk_size)
    chunk_size = min(chunk_size, num_samples)
    num_chunks = -(-num_samples // chunk_size)
    proposal = proposal_distribution(proposal_loc, proposal_scale)
    chunk_seeds = split_seed(seed, num_chunks)
    dtype = proposal_loc.dtype
    batch = tf.shape(proposal_loc)[-2]

    def body(c, running_max, running_sum, *running_squares):
        z = proposal.sample(chunk_size, seed=chunk_seeds[c])                     # [C, B, D]
        log_weights = log_joint_fn(x, z) - proposal.log_prob(z)                   # [C, B]
        # The last chunk may run past S: its surplus samples get weight zero.
        valid = c * chunk_size + tf.range(chunk_size) < num_samples
        log_weights = tf.where(valid[:, None], log_weights, tf.constant(-np.inf, dtype))
        new_max = tf.maximum(running_max, tf.reduce_max(log_weights, axis=0))
        rescale, scaled = tf.exp(running_max - new_max), tf.exp(log_weights - new_max)  # [B], [C, B]: at most 1
        running_sum = running_sum * rescale + tf.reduce_sum(scaled, axis=0)
        if return_effective_sample_size:  # sum of w^2 / max^2, rescaled like the sum
            running_squares = (running_squares[0] * tf.square(rescale) + tf.reduce_sum(tf.square(scaled), axis=0),)
        return (c + 1, new_max, running_sum, *running_squares)

    zeros = tf.zeros([batch], dtype)
    _, running_max, running_sum, *running_squares = tf.while_loop(
        lambda c, *_: c < num_chunks, body,
        (tf.constant(0), tf.fill([batch], tf.constant(-np.inf, dtype)), zeros,
         *((zeros,) if return_effective_sample_size else ())))
    log_likelihood = running_max + tf.math.log(running_sum) - math.log(num_samples)
    if not return_effective_sample_size:
        return log_likelihood
    # (sum w)^2 / sum w^2: the common factor max^2 cancels.
    return log_likelihood, tf.square(running_sum) / running_squares[0]


def proposal_distribution(loc: tf.Tensor, scale: tf.Tensor) -> tfd.Distribution:
    """N(loc, diag(scale^2)) per example for loc, scale [B, D]; for [M, B, D], the equal-weight
    mixture of the M Gaussians of each example, r(z) = (1/M) sum_m N(z; loc_m, scale_m^2). Either
    way batch shape [B], event [D]: samples [C, B, D], log_prob [C, B]."""
    if loc.shape.rank == 2:
        return posterior_distribution(loc, scale)
    components = posterior_distribution(tf.transpose(loc, [1, 0, 2]), tf.transpose(scale, [1, 0, 2]))  # [B, M]
    weights = tfd.Categorical(logits=tf.zeros([tf.shape(loc)[1], tf.shape(loc)[0]], loc.dtype))  # [B], M each
    return tfd.MixtureSameFamily(weights, components)


class PosteriorChain(NamedTuple):
    """The evaluation's chain on p(z | x). kept_states [kept, B, D]: the states after the burn-in,
    whose mean and standard deviation make the HMC proposals; burn_in_states [burn_in, B, D] when
    traced, else None; step_size: the step size of the kept iterations (the burn-in's last
    adapted value, then frozen); burn_in_accept_rate (NaN without burn-in), kept_accept_rate:
    the mean acceptance over chains and iterations of each phase."""

    kept_states: tf.Tensor
    burn_in_states: tf.Tensor | None
    step_size: tf.Tensor
    burn_in_accept_rate: tf.Tensor
    kept_accept_rate: tf.Tensor


def hmc_posterior_chain(model: VAE, x: tf.Tensor, *, burn_in: int, kept: int, step_size: float,
                        num_leapfrog_steps: int, seed: SeedLike, target_accept_rate: float = HMCConfig.target_accept_rate,
                        adaptation_rate: float = HMCConfig.adaptation_rate, initial_state: tf.Tensor | None = None,
                        trace_burn_in: bool = False) -> PosteriorChain:
    """The evaluation's HMC chain on p(z | x), one per image x [B, 784]: ``burn_in`` iterations
    that adapt the (shared, scalar) step size from ``step_size``, then ``kept`` iterations at the
    step size the burn-in ended with, frozen, so that the kept states form a chain that leaves
    p(z | x) invariant. Every chain starts at the encoder mean, or at ``initial_state`` [B, D]
    (to diagnose convergence from other starts).

    Returns a ``PosteriorChain``: kept_states [kept, B, D]; burn_in_states [burn_in, B, D] when
    ``trace_burn_in`` (else None); the kept phase's step size and each phase's acceptance.
    Raises: ValueError if burn_in is not an integer >= 0, kept is not an integer >= 1, step_size is
    not a finite positive number (a tensor is taken as it is), or initial_state is not [B, D].
    """
    check_non_negative_int("burn_in", burn_in)
    check_positive_int("kept", kept)
    if not isinstance(step_size, tf.Tensor):
        check_positive_number("step_size", step_size)
    loc, _ = model.encoder(x)
    if initial_state is not None:
        initial_state = tf.convert_to_tensor(initial_state, loc.dtype)
        if not initial_state.shape.is_compatible_with(loc.shape):
            raise ValueError(f"initial_state has shape {initial_state.shape}: expected {loc.shape} "
                             f"(one start [B, D] per image)")
    burn_seed, keep_seed = tf.unstack(split_seed(seed, 2))
    kernel = HamiltonianMonteCarlo(lambda z: model.log_joint(x, z), step_size, num_leapfrog_steps)
    state = loc if initial_state is None else initial_state
    burn_in_states, burn_in_accept_rate = None, tf.constant(np.nan, loc.dtype)
    if burn_in > 0:
        def burn_in_trace(z, results):  # states only when asked for: the paper's burn-in is 300 iterations
            return (z if trace_burn_in else ()), accept_rate(results)

        burn = sample_chain(burn_in, state, StepSizeAdaptation(kernel, target_accept_rate, adaptation_rate),
                            seed=burn_seed, trace_fn=burn_in_trace)
        states, accept_rates = burn.trace
        state, burn_in_accept_rate = burn.final_state, mean_over_iterations(accept_rates)
        burn_in_states = states if trace_burn_in else None
        kernel = kernel.copy(step_size=burn.final_kernel_results.new_step_size)  # frozen from here on
    sampled = sample_chain(kept, state, kernel, seed=keep_seed,
                           trace_fn=lambda z, results: (z, accept_rate(results)))
    kept_states, accept_rates = sampled.trace
    return PosteriorChain(kept_states, burn_in_states, sampled.final_kernel_results.step_size, burn_in_accept_rate,
                          mean_over_iterations(accept_rates))


def hmc_posterior_moments(model: VAE, x: tf.Tensor, *, burn_in: int, kept: int, step_size: float,
                          num_leapfrog_steps: int, seed: SeedLike, target_accept_rate: float = HMCConfig.target_accept_rate,
                          adaptation_rate: float = HMCConfig.adaptation_rate, num_starts: int = 1,
                          step_size_per_chain: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
    """Mean and standard deviation [B, D] of ``kept`` HMC states of p(z | x), after ``burn_in``
    adapting iterations, with every chain started at the encoder mean (``hmc_posterior_chain``).

    With ``num_starts`` = M > 1, M chains per image, the first from the encoder mean and the
    others from draws of the encoder's q0(z | x): mean and standard deviation [M, B, D], one per
    chain. ``step_size_per_chain``: each chain adapts a step size of its own during the burn-in
    (from its own acceptances) instead of one shared by the batch.
    Raises: ValueError if num_starts is not a positive integer (and as ``hmc_posterior_chain``).
    """
    check_positive_int("num_starts", num_starts)
    initial_state = None
    if num_starts > 1:  # the extra draw only then: one start keeps the paper protocol's seeds
        start_seed, seed = tf.unstack(split_seed(seed, 2))
        loc, scale = model.encoder(x)
        draws = posterior_distribution(loc, scale).sample(num_starts - 1, seed=start_seed)  # [M - 1, B, D]
        initial_state = tf.reshape(tf.concat([loc[None], draws], axis=0), [-1, loc.shape[-1]])
        x = tf.tile(x, [num_starts, 1])  # chain m of image b is row m B + b
    if step_size_per_chain:
        check_positive_number("step_size", step_size)
        step_size = tf.fill([tf.shape(x)[0], 1], tf.constant(step_size, x.dtype))
    states = hmc_posterior_chain(model, x, burn_in=burn_in, kept=kept, step_size=step_size,
                                 num_leapfrog_steps=num_leapfrog_steps, seed=seed, initial_state=initial_state,
                                 target_accept_rate=target_accept_rate, adaptation_rate=adaptation_rate).kept_states
    mean, std = tf.reduce_mean(states, axis=0), tf.math.reduce_std(states, axis=0)
    if num_starts == 1:
        return mean, std
    return tf.reshape(mean, [num_starts, -1, mean.shape[-1]]), tf.reshape(std, [num_starts, -1, std.shape[-1]])


def proposal_for(model: VAE, x: tf.Tensor, evaluation: EvaluationConfig, hmc: HMCConfig, *,
                 seed: SeedLike) -> tuple[tf.Tensor, tf.Tensor]:
    """(loc, scale) [B, D] of the configured proposal for the examples x; [M, B, D], the
    components of a mixture (``proposal_distribution``), with ``evaluation.num_starts`` = M > 1."""
    loc, scale = model.encoder(x)
    if evaluation.proposal == "encoder":
        return loc, evaluation.widen * scale
    mean, std = hmc_posterior_moments(model, x, burn_in=evaluation.burn_in, kept=evaluation.kept,
                                      step_size=hmc.initial_step_size, seed=seed, num_starts=evaluation.num_starts,
                                      step_size_per_chain=evaluation.step_size_per_chain, **hmc.kernel_arguments())
    if evaluation.proposal == "hmc_mean":
        return mean, evaluation.widen * tf.broadcast_to(scale, tf.shape(mean))
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
                                 adaptation_rate: float = HMCConfig.adaptation_rate,
                                 adapt_step_size: bool = True) -> AISResult:
    """Annealed importance sampling (Neal 2001) of log Z = log integral of exp(target(z)) dz, per example.

    Starts ``num_chains`` chains per example from q = N(loc, diag(scale^2)) and moves them
    through f_t(z) = log q(z) + beta_t (target(z) - log q(z)), t = 1..T (``sigmoid_schedule``),
    with one iteration of the package's HMC kernel (``hmc.HamiltonianMonteCarlo``, its step size
    adapted by ``hmc.StepSizeAdaptation``) per temperature, which leaves f_t invariant. Each
    chain's log weight adds (beta_t - beta_{t-1}) (target(z) - log q(z)) before each move;
    log Z ~ logsumexp over chains - log K. The estimate is unbiased for Z, so its log
    is a stochastic lower bound on log Z, like importance sampling's, but it needs no proposal
    close to the target.

    Unbiasedness needs each move to leave its f_t exactly invariant: with ``adapt_step_size=False``
    every move uses ``step_size`` unchanged and the estimate of Z is exactly unbiased. The default
    (True) adapts the shared step size from the chains' acceptances at every temperature, as the
    training chain does; then each move's step size depends on the chains' earlier states, and
    the estimate is unbiased only approximately.

    Args:
      target_log_prob_fn: z [K, B, D] -> unnormalised log density [K, B] (for a VAE: log p(x, z)).
      initial_loc, initial_scale: [B, D].
      num_temperatures: T; num_chains: K; num_leapfrog_steps, step_size: the HMC moves (the step
        size adapts towards ``target_accept_rate`` after every temperature, unless
        ``adapt_step_size`` is False: then it stays ``step_size`` throughout).
    """
    check_positive_int("num_chains", num_chains)
    betas = tf.constant(sigmoid_schedule(num_temperatures), initial_loc.dtype)
    init_seed, move_seed = tf.unstack(split_seed(seed, 2))
    move_seeds = split_seed(move_seed, num_temperatures)
    start = posterior_distribution(initial_loc, initial_scale)
    # The latent size stays static where it is known: the model's layers need it.
    batch, dims = tf.shape(initial_loc)[0], initial_loc.shape[-1] or tf.shape(initial_loc)[1]

    def log_ratio(z):  # target - log q, for states z [K, B, D]
        return target_log_prob_fn(z) - start.log_prob(z)

    def body(t, z, log_weights, step_size, accept_sum):
        log_weights = log_weights + (betas[t] - betas[t - 1]) * log_ratio(z)
        beta = betas[t]

        def annealed(flat):  # f_t on [K B, D], the kernel's chains
            z = tf.reshape(flat, [num_chains, batch, dims])
            return tf.reshape(start.log_prob(z) + beta * log_ratio(z), [-1])

        kernel = HamiltonianMonteCarlo(annealed, step_size, num_leapfrog_steps)
        if adapt_step_size:
            kernel = StepSizeAdaptation(kernel, target_accept_rate, adaptation_rate)
        move = sample_chain(1, tf.reshape(z, [-1, dims]), kernel, seed=move_seeds[t - 1])
        z = tf.ensure_shape(tf.reshape(move.final_state, [num_chains, batch, dims]), z.shape)
        results = move.final_kernel_results
        # Without adaptation, the step size every move used, unchanged.
        next_step_size = results.new_step_size if adapt_step_size else step_size
        return t + 1, z, log_weights, next_step_size, accept_sum + accept_rate(results)

    z0 = start.sample(num_chains, seed=init_seed)
    _, _, log_weights, step_size, accept_sum = tf.while_loop(
        lambda t, *_: t <= num_temperatures, body,
        (tf.constant(1), z0, tf.zeros([num_chains, batch], initial_loc.dtype),
         tf.constant(step_size, initial_loc.dtype), tf.constant(0.0, initial_loc.dtype)))
    log_normalizer = tf.reduce_logsumexp(log_weights, axis=0) - math.log(num_chains)
    return AISResult(log_normalizer, log_weights, accept_sum / num_temperatures, step_size)


def ais_log_likelihood(model: VAE, images: np.ndarray, hmc: HMCConfig, *, num_temperatures: int,
                       num_chains: int, seed: SeedLike = 0, batch_size: int = 100,
                       adapt_step_size: bool = True) -> np.ndarray:
    """AIS estimate of log p(x) for each image ([N, 784] -> [N] numpy), from the encoder's
    q0(z | x) to the posterior p(z | x) (target log p(x, z)), with the HMC kernel and step-size
    rule of ``hmc``: an independent check of the importance-sampled estimate.
    ``adapt_step_size=False`` keeps ``hmc.initial_step_size`` at every temperature, which makes
    the estimate of p(x) exactly unbiased (``annealed_importance_sampling``)."""

    @tf.function
    def estimate(x, batch_seed):
        loc, scale = model.encoder(x)
        return annealed_importance_sampling(
            lambda z: model.log_joint(x, z), loc, scale, num_temperatures=num_temperatures,
            num_chains=num_chains, step_size=hmc.initial_step_size, seed=batch_seed,
            adapt_step_size=adapt_step_size, **hmc.kernel_arguments()).log_normalizer

    return np.concatenate([estimate(tf.constant(images[start: start + batch_size], tf.float32),
                                    fold_in(seed, k)).numpy()
                           for k, start in enumerate(range(0, len(images), batch_size))])


class EvaluationResult(NamedTuple):
    """mean_log_likelihood: average over the examples; per_example: [N] numpy array;
    effective_sample_size: [N] numpy array, each estimate's S_eff, when asked for, else None."""

    mean_log_likelihood: float
    per_example: np.ndarray
    proposal: str
    num_samples: int
    effective_sample_size: np.ndarray | None = None


#: Importance samples scored at once inside a chunk by the evaluator: [2 x batch, 784] logits stay in
#: the CPU's cache, where a whole chunk's (100 x 500 x 784 floats, 157 MB) go through memory. The
#: same numbers (each row's multiply is the same), in 0.91x the time on one core (measured at batch 500).
SCORE_BLOCK = 2


def log_joint_in_blocks(log_joint_fn: LogJointFn, block: int = SCORE_BLOCK) -> LogJointFn:
    """``log_joint_fn`` for z [C, B, D], computed over blocks of ``block`` samples and concatenated:
    (x [B, ...], z [C, B, D]) -> [C, B], the same values. C must be static (a chunk's size)."""
    check_positive_int("block", block)

    def in_blocks(x: tf.Tensor, z: tf.Tensor) -> tf.Tensor:
        sizes = [block] * (z.shape[0] // block) + ([z.shape[0] % block] if z.shape[0] % block else [])
        return tf.concat([log_joint_fn(x, part) for part in tf.split(z, sizes)], axis=0)

    return in_blocks


def make_evaluator(model: VAE, evaluation: EvaluationConfig, hmc: HMCConfig, *,
                   effective_sample_size: bool = False) -> Callable[[np.ndarray, SeedLike], EvaluationResult]:
    """A function ``(images [N, 784], seed) -> EvaluationResult`` computing the importance-sampled
    log-likelihood of the first ``evaluation.num_examples`` images (all when unset), in batches of
    ``evaluation.batch_size``. Its graph is traced once, so a run that evaluates itself
    periodically (the learning curve) does not trace and optimise it again each time.

    Batch ``k`` draws from ``fold_in(seed, k)`` alone, so batches can be computed in separate
    processes: ``evaluate(images, seed, done={k: estimates}, on_batch=save)`` takes the batches in
    ``done`` as they are (when their length fits) and hands each one it computes to ``on_batch``,
    which is how a run killed during its final evaluation resumes it (``runs``).

    ``effective_sample_size=True`` also returns each estimate's importance weights' S_eff, from
    the same samples (the estimates are the same numbers); ``done`` and ``on_batch`` then do not
    apply (ValueError)."""

    @tf.function
    def estimate(x, batch_seed):
        proposal_seed, sample_seed = tf.unstack(split_seed(batch_seed, 2))
        loc, scale = proposal_for(model, x, evaluation, hmc, seed=proposal_seed)
        return importance_sampled_log_likelihood(log_joint_in_blocks(model.log_joint), x, loc, scale,
                                                 num_samples=evaluation.num_samples,
                                                 chunk_size=evaluation.chunk_size, seed=sample_seed,
                                                 return_effective_sample_size=effective_sample_size)

    def evaluate(images: np.ndarray, seed: SeedLike = 0, *, done: Mapping[int, np.ndarray] | None = None,
                 on_batch: Callable[[int, np.ndarray], None] | None = None) -> EvaluationResult:
        if effective_sample_size and (done or on_batch is not None):
            raise ValueError("done and on_batch resume an evaluation of estimates alone: "
                             "they cannot be used with effective_sample_size=True")
        if evaluation.num_examples is not None:
            images = images[: evaluation.num_examples]
        done = done or {}
        estimates, sizes = [], []
        for k, start in enumerate(range(0, len(images), evaluation.batch_size)):
            x = images[start: start + evaluation.batch_size]
            if k in done and done[k].shape == (len(x),):
                estimates.append(done[k])
                continue
            result = estimate(tf.constant(x, tf.float32), fold_in(seed, k))
            if effective_sample_size:
                result, size = result
                sizes.append(size.numpy())
            estimates.append(result.numpy())
            if on_batch is not None:
                on_batch(k, estimates[-1])
        per_example = np.concatenate(estimates)
        return EvaluationResult(float(per_example.mean()), per_example, evaluation.proposal, evaluation.num_samples,
                                np.concatenate(sizes) if effective_sample_size else None)

    return evaluate


def evaluate_log_likelihood(model: VAE, images: np.ndarray, evaluation: EvaluationConfig, hmc: HMCConfig, *,
                            seed: SeedLike = 0) -> EvaluationResult:
    """Importance-sampled log-likelihood of ``images`` ([N, 784]; the first
    ``evaluation.num_examples`` when set), in batches of ``evaluation.batch_size`` examples."""
    return make_evaluator(model, evaluation, hmc)(images, seed)

"""Hamiltonian Monte Carlo for a batch of independent chains, as in the VCD reference code.

Each iteration draws a fresh momentum p ~ N(0, I) (identity mass matrix), integrates
Hamilton's equations with ``num_leapfrog_steps`` leapfrog steps of size ``step_size``, and
accepts or rejects the end point per chain with the Metropolis rule. One scalar step size is
shared by all chains and dimensions and, when adapting, moves after every iteration towards a
target acceptance rate (the reference's rule):

    step_size <- step_size + adaptation_rate * ((mean_accept - target) / target) * step_size

where mean_accept is the fraction of chains that accepted in that iteration.

The gradient of the log density at the current state is carried from one iteration to the
next: a trajectory of L leapfrog steps then costs L gradient evaluations instead of the
reference's L + 1 (5 instead of 6 per iteration, 41 instead of 48 per 8-iteration chain).

Gradients never flow through the chain: the initial state and step size are wrapped in
``stop_gradient`` and each gradient of the target is taken with respect to the state only.
Call it outside any outer ``GradientTape`` (or inside ``tape.stop_recording()``) so that the
tape does not keep the loop's intermediates alive.

``run_on_posterior`` runs the chain on a VAE's posterior p(z | x) from the encoder's samples and
returns what the chapters plot (the HMC chapter's figure and explorer, the VCD chapter's check).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

import tensorflow as tf

from vcd_helpers.config import HMCConfig, check_positive_int
from vcd_helpers.model import VAE
from vcd_helpers.seeds import SeedLike, as_seed, split_seed

TargetLogProbFn = Callable[[tf.Tensor], tf.Tensor]
#: log density of states z [B, D] given data rows [B, ...] -> [B], row b depending on row b only.
ConditionalLogProbFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


class HMCTrace(NamedTuple):
    """Per-iteration history. states [T, B, D]; log_probs [T, B]; accept_rates [T]; step_sizes [T]
    (the step size used in that iteration)."""

    states: tf.Tensor
    log_probs: tf.Tensor
    accept_rates: tf.Tensor
    step_sizes: tf.Tensor


class HMCResult(NamedTuple):
    """final_state [B, D]; final_log_prob [B]; step_size: the adapted scalar after the last
    iteration; accept_rate: mean acceptance over chains and iterations; trace: HMCTrace or None;
    initial_log_prob [B] and initial_gradient [B, D]: the target and its gradient at the initial
    state, which the chain evaluates anyway (VCD reuses them instead of evaluating them again)."""

    final_state: tf.Tensor
    final_log_prob: tf.Tensor
    step_size: tf.Tensor
    accept_rate: tf.Tensor
    trace: HMCTrace | None
    initial_log_prob: tf.Tensor
    initial_gradient: tf.Tensor


def value_and_gradient(target_log_prob_fn: TargetLogProbFn, state: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """log density [B] and its gradient [B, D] with respect to ``state`` only.

    Chains are independent, so the gradient of the sum over chains is each chain's gradient.
    ``watch_accessed_variables=False`` keeps model weights out of this tape.
    """
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(state)
        log_prob = target_log_prob_fn(state)
    return log_prob, tape.gradient(log_prob, state)


def block_sizes(size: int, num_blocks: int) -> list[int]:
    """``size`` rows cut into ``min(num_blocks, size)`` contiguous blocks differing by at most one row,
    the larger first: block_sizes(100, 3) == [34, 33, 33]."""
    check_positive_int("size", size)
    check_positive_int("num_blocks", num_blocks)
    count = min(num_blocks, size)
    return [size // count + (k < size % count) for k in range(count)]


def sharded_target(log_prob_fn: ConditionalLogProbFn, data: tf.Tensor, num_shards: int) -> TargetLogProbFn:
    """The target ``z -> log_prob_fn(data, z)``, evaluated on ``num_shards`` blocks of rows.

    Chains are independent: row b of the result, and of its gradient, depends on row b of z
    and of ``data`` only. Cut into blocks, one evaluation becomes ``num_shards`` independent
    ones (each block's matmuls, softplus and gradient), which XLA's CPU runtime runs
    concurrently on its threads: the way one chain batch keeps several cores busy with the same
    maths (values equal to the unsharded ones up to float round-off). The randomness and the
    step size stay the whole batch's, so the chain is the same chain.

    data [B, ...] with B known when tracing; z [B, D] -> [B]. One shard (or an unknown B)
    gives the plain target.
    """
    check_positive_int("num_shards", num_shards)
    size = data.shape[0]
    if num_shards == 1 or size is None:
        return lambda z: log_prob_fn(data, z)
    sizes = block_sizes(size, num_shards)
    blocks = tf.split(data, sizes)
    return lambda z: tf.concat([log_prob_fn(d, b) for d, b in zip(blocks, tf.split(z, sizes))], axis=0)


def leapfrog(target_log_prob_fn: TargetLogProbFn, state: tf.Tensor, momentum: tf.Tensor, gradient: tf.Tensor,
             step_size: tf.Tensor, num_steps: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """``num_steps`` leapfrog steps from (state, momentum), given the gradient at ``state``.

    Returns (state, momentum, log_prob, gradient) at the end of the trajectory; exactly
    ``num_steps`` gradient evaluations. Shapes: state, momentum, gradient [B, D]; log_prob [B].

    Only the end point's log density enters the Metropolis test, so the steps inside the
    trajectory use the gradient alone, and the compiled graph drops their log-density values
    (for the VAE, a softplus over all 784 pixels at every inner step).
    """
    momentum = momentum + 0.5 * step_size * gradient

    def inner_step(k, z, p):  # a position step and a full momentum step
        z = z + step_size * p
        return k + 1, z, p + step_size * value_and_gradient(target_log_prob_fn, z)[1]

    _, state, momentum = tf.while_loop(lambda k, *_: k < num_steps - 1, inner_step,
                                       (tf.constant(0), state, momentum))
    state = state + step_size * momentum
    log_prob, gradient = value_and_gradient(target_log_prob_fn, state)
    return state, momentum + 0.5 * step_size * gradient, log_prob, gradient


def hmc_chain(target_log_prob_fn: TargetLogProbFn, initial_state: tf.Tensor, step_size: float | tf.Tensor, *,
              num_iterations: int, num_leapfrog_steps: int, seed: SeedLike, adapt_step_size: bool = True,
              target_accept_rate: float = HMCConfig.target_accept_rate,
              adaptation_rate: float = HMCConfig.adaptation_rate,
              return_trace: bool = False) -> HMCResult:
    """Run ``num_iterations`` HMC iterations of a batch of independent chains.

    Args:
      target_log_prob_fn: maps states [B, D] to log densities [B] (up to a constant).
      initial_state: [B, D], one row per chain.
      step_size: the initial scalar leapfrog step size.
      num_iterations, num_leapfrog_steps: Python ints.
      seed: a stateless seed; the same seed gives the same chain.
      adapt_step_size: adapt the step size after every iteration (see the module docstring).
      return_trace: also return the per-iteration history.

    Works eagerly, inside ``tf.function`` and under XLA (``jit_compile=True``).
    """
    for name, value in (("num_iterations", num_iterations), ("num_leapfrog_steps", num_leapfrog_steps)):
        check_positive_int(name, value)
    if not 0.0 < target_accept_rate < 1.0:
        raise ValueError(f"target_accept_rate={target_accept_rate!r} is invalid: must lie in (0, 1)")

    state = tf.stop_gradient(tf.convert_to_tensor(initial_state))
    if state.shape.rank != 2:
        raise ValueError(f"initial_state has shape {state.shape}: expected [chains, dims]")
    dtype = state.dtype
    step_size = tf.stop_gradient(tf.cast(step_size, dtype))
    iteration_seeds = tf.random.experimental.stateless_split(as_seed(seed), num=num_iterations)
    initial_log_prob, initial_gradient = value_and_gradient(target_log_prob_fn, state)

    def kinetic(p):
        return 0.5 * tf.reduce_sum(tf.square(p), axis=-1)

    def body(i, state, log_prob, gradient, step_size, accept_sum, traces):
        momentum_seed, accept_seed = tf.unstack(tf.random.experimental.stateless_split(iteration_seeds[i], 2))
        momentum = tf.random.stateless_normal(tf.shape(state), seed=momentum_seed, dtype=dtype)
        new_state, new_momentum, new_log_prob, new_gradient = leapfrog(
            target_log_prob_fn, state, momentum, gradient, step_size, num_leapfrog_steps)
        # log of the Metropolis ratio exp(H_current - H_proposed); a diverged trajectory is rejected.
        log_ratio = (new_log_prob - kinetic(new_momentum)) - (log_prob - kinetic(momentum))
        log_ratio = tf.where(tf.math.is_finite(log_ratio), log_ratio, tf.constant(-float("inf"), dtype))
        uniform = tf.random.stateless_uniform(tf.shape(log_prob), seed=accept_seed, dtype=dtype)
        accept = tf.math.log(uniform) < log_ratio
        state = tf.where(accept[:, None], new_state, state)
        log_prob = tf.where(accept, new_log_prob, log_prob)
        gradient = tf.where(accept[:, None], new_gradient, gradient)
        accept_rate = tf.reduce_mean(tf.cast(accept, dtype))
        if return_trace:
            traces = (traces[0].write(i, state), traces[1].write(i, log_prob),
                      traces[2].write(i, accept_rate), traces[3].write(i, step_size))
        if adapt_step_size:
            step_size = step_size + adaptation_rate * ((accept_rate - target_accept_rate) / target_accept_rate) * step_size
        return i + 1, state, log_prob, gradient, step_size, accept_sum + accept_rate, traces

    traces = tuple(tf.TensorArray(dtype, size=num_iterations) for _ in range(4)) if return_trace else ()
    _, state, log_prob, _, step_size, accept_sum, traces = tf.while_loop(
        lambda i, *_: i < num_iterations, body,
        (tf.constant(0), state, initial_log_prob, initial_gradient, step_size, tf.constant(0.0, dtype), traces))
    trace = HMCTrace(*(t.stack() for t in traces)) if return_trace else None
    return HMCResult(final_state=state, final_log_prob=log_prob, step_size=step_size,
                     accept_rate=accept_sum / num_iterations, trace=trace, initial_log_prob=initial_log_prob,
                     initial_gradient=initial_gradient)


class PosteriorRun(NamedTuple):
    """One chain per image on a VAE's p(z | x), as numpy arrays: z0 [B, D], where it started;
    log_probs [T + 1, B], log p(x, z) at z0 and after each iteration; accept_rates, step_sizes
    [T]; before, after [B, 784], the decoder's pixel means at z0 and at zT; final_step_size, the
    adapted one; accept_rate, the mean over chains and iterations."""

    z0: np.ndarray
    log_probs: np.ndarray
    accept_rates: np.ndarray
    step_sizes: np.ndarray
    before: np.ndarray
    after: np.ndarray
    final_step_size: float
    accept_rate: float


def run_on_posterior(model: VAE, x: tf.Tensor, *, num_iterations: int, num_leapfrog_steps: int,
                     step_size: float, seed: SeedLike = 0, z0: tf.Tensor | None = None) -> PosteriorRun:
    """HMC, adapting its step size, on p(z | x) for the images x [B, 784], from z0 [B, D] (by
    default one draw from the encoder's q(z | x)). The chain is compiled once per (model,
    iterations, leapfrog steps), so rerunning it (an explorer's slider moved back) is fast."""
    start_seed, chain_seed = tf.unstack(split_seed(seed, 2))
    if z0 is None:
        loc, scale = model.encoder(x)
        z0 = loc + scale * tf.random.stateless_normal(tf.shape(loc), seed=start_seed)
    result = _compiled_posterior_chain(model, num_iterations, num_leapfrog_steps)(
        x, z0, tf.constant(step_size, tf.float32), chain_seed)
    return PosteriorRun(
        z0=np.asarray(z0),
        log_probs=np.concatenate([model.log_joint(x, z0).numpy()[None], result.trace.log_probs.numpy()]),
        accept_rates=result.trace.accept_rates.numpy(),
        step_sizes=result.trace.step_sizes.numpy(),
        before=tf.sigmoid(model.decoder(z0)).numpy(),
        after=tf.sigmoid(model.decoder(result.final_state)).numpy(),
        final_step_size=float(result.step_size),
        accept_rate=float(result.accept_rate))


_posterior_chains: dict[tuple[int, int, int], Callable] = {}


def _compiled_posterior_chain(model: VAE, num_iterations: int, num_leapfrog_steps: int) -> Callable:
    key = (id(model), num_iterations, num_leapfrog_steps)
    if key not in _posterior_chains:
        @tf.function
        def chain(x, z0, step_size, seed):
            return hmc_chain(lambda z: model.log_joint(x, z), z0, step_size, num_iterations=num_iterations,
                             num_leapfrog_steps=num_leapfrog_steps, seed=seed, return_trace=True)
        _posterior_chains[key] = chain
    return _posterior_chains[key]

"""Hamiltonian Monte Carlo for a batch of independent chains, as in the VCD reference code, in
the shape of TensorFlow Probability's ``tfp.mcmc`` kernels.

Each iteration draws a fresh momentum p ~ N(0, I) (identity mass matrix), integrates
Hamilton's equations with ``num_leapfrog_steps`` leapfrog steps of size ``step_size``, and
accepts or rejects the end point per chain with the Metropolis rule (``HamiltonianMonteCarlo``).
One scalar step size is shared by all chains and dimensions and, when adapting
(``StepSizeAdaptation``, a kernel around it), moves after every iteration towards a target
acceptance rate (the reference's rule):

    step_size <- step_size + adaptation_rate * ((mean_accept - target) / target) * step_size

where mean_accept is the fraction of chains that accepted in that iteration. A step size of shape
[B, 1] instead gives each chain its own, adapted from that chain's own decisions (as TFP's
adaptations adapt a step size per chain): chains on targets of different widths (images whose
posteriors differ) then each get a step that suits them.

The gradient of the log density at the current state is carried from one iteration to the
next in the kernel results: a trajectory of L leapfrog steps then costs L gradient evaluations
instead of the reference's L + 1 (5 instead of 6 per iteration, 41 instead of 48 per
8-iteration chain).

``sample_chain`` runs a kernel for N iterations and records what its ``trace_fn`` picks;
``hmc_chain`` composes the three. Both kernels subclass ``tfp.mcmc.TransitionKernel`` and follow
its protocol (``bootstrap_results``, ``one_step``), so TFP's own kernels run in ``sample_chain``,
and the HMC kernel's results carry what TFP's drivers read (``step_size``, ``log_accept_ratio``):
``tfp.mcmc.SimpleStepSizeAdaptation`` and ``tfp.mcmc.sample_chain`` run it too. ``hmc_results``
reads the HMC kernel's results out of any adaptation's around them.

Gradients never flow through the chain: the initial state and step size are wrapped in
``stop_gradient`` and each gradient of the target is taken with respect to the state only.
Call it outside any outer ``GradientTape`` (or inside ``tape.stop_recording()``) so that the
tape does not keep the loop's intermediates alive.

``trace_posterior`` runs the chain on a VAE's posterior p(z | x) from the encoder's samples and
returns what the chapters plot (the HMC chapter's figure and explorer, the VCD chapter's check).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from vcd_helpers.config import HMCConfig, check_fraction, check_positive_int
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


class HMCKernelResults(NamedTuple):
    """What one HMC iteration hands the next. target_log_prob [B] and grads_target_log_prob
    [B, D]: the target and its gradient at the current state; step_size: the scalar (or [B, 1],
    one per chain) the last iteration integrated with (and the next one will, unless an
    adaptation replaces it);
    is_accepted [B]: each chain's last Metropolis decision (all True before the first);
    log_accept_ratio [B]: the log Metropolis ratio it was drawn against (-inf for a diverged
    trajectory; 0 before the first), which TFP's step-size adaptations read."""

    target_log_prob: tf.Tensor
    grads_target_log_prob: tf.Tensor
    step_size: tf.Tensor
    is_accepted: tf.Tensor
    log_accept_ratio: tf.Tensor


class HamiltonianMonteCarlo(tfp.mcmc.TransitionKernel):
    """HMC with an identity mass matrix on states [B, D], one chain per row, one scalar step size.

    ``bootstrap_results(state)`` evaluates the target and its gradient at the start (the only
    evaluation outside a trajectory); ``one_step(state, results, seed)`` takes the step size from
    ``results``, as ``tfp.mcmc.HamiltonianMonteCarlo`` does, so that an adaptation kernel can set it.
    Raises: ValueError if num_leapfrog_steps is not a positive integer.
    """

    def __init__(self, target_log_prob_fn: TargetLogProbFn, step_size: float | tf.Tensor, num_leapfrog_steps: int):
        check_positive_int("num_leapfrog_steps", num_leapfrog_steps)
        self._parameters = dict(target_log_prob_fn=target_log_prob_fn, step_size=step_size,
                                num_leapfrog_steps=num_leapfrog_steps)

    @property
    def parameters(self) -> dict[str, Any]:
        return self._parameters

    @property
    def target_log_prob_fn(self) -> TargetLogProbFn:
        return self._parameters["target_log_prob_fn"]

    @property
    def step_size(self) -> float | tf.Tensor:
        return self._parameters["step_size"]

    @property
    def num_leapfrog_steps(self) -> int:
        return self._parameters["num_leapfrog_steps"]

    @property
    def is_calibrated(self) -> bool:
        return True

    def bootstrap_results(self, init_state: tf.Tensor) -> HMCKernelResults:
        """Results at init_state [B, D]. Raises: ValueError if init_state is not of rank 2."""
        if init_state.shape.rank != 2:
            raise ValueError(f"initial_state has shape {init_state.shape}: expected [chains, dims]")
        log_prob, gradient = value_and_gradient(self.target_log_prob_fn, init_state)
        step_size = tf.stop_gradient(tf.cast(self.step_size, init_state.dtype))
        return HMCKernelResults(log_prob, gradient, step_size, tf.ones_like(log_prob, tf.bool), tf.zeros_like(log_prob))

    def one_step(self, current_state: tf.Tensor, previous_kernel_results: HMCKernelResults,
                 seed: tf.Tensor) -> tuple[tf.Tensor, HMCKernelResults]:
        """One iteration from current_state [B, D]: momentum draw, trajectory, Metropolis test per
        chain. ``seed`` [2] is this iteration's own."""
        state, results, dtype = current_state, previous_kernel_results, current_state.dtype
        momentum_seed, accept_seed = tf.unstack(split_seed(seed, 2))
        momentum = tf.random.stateless_normal(tf.shape(state), seed=momentum_seed, dtype=dtype)
        new_state, new_momentum, new_log_prob, new_gradient = leapfrog(
            self.target_log_prob_fn, state, momentum, results.grads_target_log_prob, results.step_size,
            self.num_leapfrog_steps)
        # log of the Metropolis ratio exp(H_current - H_proposed); a diverged trajectory is rejected.
        log_ratio = (new_log_prob - kinetic_energy(new_momentum)) - (results.target_log_prob - kinetic_energy(momentum))
        log_ratio = tf.where(tf.math.is_finite(log_ratio), log_ratio, tf.constant(-float("inf"), dtype))
        uniform = tf.random.stateless_uniform(tf.shape(results.target_log_prob), seed=accept_seed, dtype=dtype)
        accept = tf.math.log(uniform) < log_ratio
        return tf.where(accept[:, None], new_state, state), HMCKernelResults(
            target_log_prob=tf.where(accept, new_log_prob, results.target_log_prob),
            grads_target_log_prob=tf.where(accept[:, None], new_gradient, results.grads_target_log_prob),
            step_size=results.step_size, is_accepted=accept, log_accept_ratio=log_ratio)


def kinetic_energy(momentum: tf.Tensor) -> tf.Tensor:
    """|p|^2 / 2 per chain: momentum [B, D] -> [B]."""
    return 0.5 * tf.reduce_sum(tf.square(momentum), axis=-1)


def hmc_results(results: Any) -> HMCKernelResults:
    """The HMC kernel's own results within a kernel's results: themselves, or the ``inner_results``
    of the adaptations around them (this module's or TFP's). Raises AttributeError for results
    that hold none."""
    while not isinstance(results, HMCKernelResults):
        results = results.inner_results
    return results


def accept_rate(results: Any) -> tf.Tensor:
    """The fraction of chains that accepted in the last iteration (of the HMC kernel within
    ``results``, ``hmc_results``): a scalar."""
    results = hmc_results(results)
    return tf.reduce_mean(tf.cast(results.is_accepted, results.step_size.dtype))


def accepted_per_step_size(results: Any) -> tf.Tensor:
    """The acceptance each step size of the HMC kernel within ``results`` adapts from: a scalar step
    size, the fraction of all chains that accepted (``accept_rate``); a step size [B, 1] per chain,
    each chain's own decision, 0 or 1, as [B, 1]."""
    results = hmc_results(results)
    if results.step_size.shape.rank == 0:
        return accept_rate(results)
    return tf.cast(results.is_accepted, results.step_size.dtype)[:, None]


class StepSizeAdaptationResults(NamedTuple):
    """inner_results: the HMC kernel's results (their step size: the one the last iteration used);
    new_step_size: the adapted step size (scalar, or [B, 1] per chain) the next iteration will use."""

    inner_results: HMCKernelResults
    new_step_size: tf.Tensor


class StepSizeAdaptation(tfp.mcmc.TransitionKernel):
    """The reference's step-size rule around an HMC kernel, as ``tfp.mcmc.SimpleStepSizeAdaptation``
    wraps one: after every iteration, with a the fraction of chains that accepted and t the target,

        step_size <- step_size + adaptation_rate * ((a - t) / t) * step_size

    (a per-chain step size [B, 1] adapts from its own chain's decision: ``accepted_per_step_size``)

    (TFP's rule multiplies by 1 + rate or divides by it instead: other numbers). It adapts at every
    iteration: a chain that must leave its target invariant runs the inner kernel alone, at the
    step size this one ended with.
    Raises: ValueError if target_accept_rate is not in (0, 1).
    """

    def __init__(self, inner_kernel: HamiltonianMonteCarlo, target_accept_rate: float = HMCConfig.target_accept_rate,
                 adaptation_rate: float = HMCConfig.adaptation_rate):
        check_fraction("target_accept_rate", target_accept_rate)
        self._parameters = dict(inner_kernel=inner_kernel, target_accept_rate=target_accept_rate,
                                adaptation_rate=adaptation_rate)

    @property
    def parameters(self) -> dict[str, Any]:
        return self._parameters

    @property
    def inner_kernel(self) -> HamiltonianMonteCarlo:
        return self._parameters["inner_kernel"]

    @property
    def target_accept_rate(self) -> float:
        return self._parameters["target_accept_rate"]

    @property
    def adaptation_rate(self) -> float:
        return self._parameters["adaptation_rate"]

    @property
    def is_calibrated(self) -> bool:
        return False  # a step size that moves with the chain's history breaks detailed balance

    def bootstrap_results(self, init_state: tf.Tensor) -> StepSizeAdaptationResults:
        inner_results = self.inner_kernel.bootstrap_results(init_state)
        return StepSizeAdaptationResults(inner_results, inner_results.step_size)

    def one_step(self, current_state: tf.Tensor, previous_kernel_results: StepSizeAdaptationResults,
                 seed: tf.Tensor) -> tuple[tf.Tensor, StepSizeAdaptationResults]:
        """The inner kernel's step at the adapted step size, then the rule above."""
        inner_results = previous_kernel_results.inner_results._replace(
            step_size=previous_kernel_results.new_step_size)
        state, inner_results = self.inner_kernel.one_step(current_state, inner_results, seed)
        step_size, target = inner_results.step_size, self.target_accept_rate
        accepted = accepted_per_step_size(inner_results)
        new_step_size = step_size + self.adaptation_rate * ((accepted - target) / target) * step_size
        return state, StepSizeAdaptationResults(inner_results, new_step_size)


class ChainOutput(NamedTuple):
    """final_state [B, D]; final_kernel_results: the kernel's results after the last iteration;
    trace: ``trace_fn``'s values stacked over iterations (each [T, ...]), or None without one."""

    final_state: tf.Tensor
    final_kernel_results: Any
    trace: Any


def sample_chain(num_iterations: int, current_state: tf.Tensor, kernel: tfp.mcmc.TransitionKernel, *,
                 seed: SeedLike, previous_kernel_results: Any = None,
                 trace_fn: Callable[[tf.Tensor, Any], Any] | None = None) -> ChainOutput:
    """Run ``num_iterations`` iterations of ``kernel`` from current_state, as ``tfp.mcmc.sample_chain``
    does without burn-in or thinning.

    Iteration i draws from the i-th of ``num_iterations`` seeds split from ``seed``; the kernel starts
    from ``previous_kernel_results`` (by default ``kernel.bootstrap_results(current_state)``).
    ``trace_fn(state, kernel_results)`` -> a nest of tensors, recorded after every iteration.
    Raises: ValueError if num_iterations is not a positive integer.
    """
    check_positive_int("num_iterations", num_iterations)
    if previous_kernel_results is None:
        previous_kernel_results = kernel.bootstrap_results(current_state)
    # int32 seeds for the kernel, as TFP's drivers make them (``samplers.sanitize_seed``).
    seeds = split_seed(as_seed(seed), num_iterations)
    # trace_fn's values at the start give the dtypes of the arrays that record it.
    traces = () if trace_fn is None else tf.nest.map_structure(
        lambda value: tf.TensorArray(value.dtype, size=num_iterations),
        trace_fn(current_state, previous_kernel_results))

    def body(i, state, results, traces):
        state, results = kernel.one_step(state, results, seeds[i])
        if trace_fn is not None:
            traces = tf.nest.map_structure(lambda array, value: array.write(i, value), traces, trace_fn(state, results))
        return i + 1, state, results, traces

    _, state, results, traces = tf.while_loop(lambda i, *_: i < num_iterations, body,
                                              (tf.constant(0), current_state, previous_kernel_results, traces))
    trace = None if trace_fn is None else tf.nest.map_structure(lambda array: array.stack(), traces)
    return ChainOutput(state, results, trace)


def mean_over_iterations(values: tf.Tensor) -> tf.Tensor:
    """values [T, ...] (T known when tracing) -> their mean over T, summed one iteration after another.

    A running sum, as a chain accumulates it: ``reduce_mean`` adds in another order, which moves
    the last bit of the reported acceptance rates.
    """
    return tf.foldl(tf.add, values, initializer=tf.zeros_like(values[0])) / values.shape[0]


def hmc_chain(target_log_prob_fn: TargetLogProbFn, initial_state: tf.Tensor, step_size: float | tf.Tensor, *,
              num_iterations: int, num_leapfrog_steps: int, seed: SeedLike, adapt_step_size: bool = True,
              target_accept_rate: float = HMCConfig.target_accept_rate,
              adaptation_rate: float = HMCConfig.adaptation_rate,
              return_trace: bool = False) -> HMCResult:
    """Run ``num_iterations`` HMC iterations of a batch of independent chains: ``sample_chain`` of
    ``HamiltonianMonteCarlo``, wrapped in ``StepSizeAdaptation`` when ``adapt_step_size``.

    Args:
      target_log_prob_fn: maps states [B, D] to log densities [B] (up to a constant).
      initial_state: [B, D], one row per chain.
      step_size: the initial scalar leapfrog step size.
      num_iterations, num_leapfrog_steps: Python ints.
      seed: a stateless seed; the same seed gives the same chain.
      adapt_step_size: adapt the step size after every iteration (see the module docstring).
      return_trace: also return the per-iteration history.
    Raises: ValueError if num_iterations or num_leapfrog_steps is not a positive integer, if
      target_accept_rate (when adapting) is not in (0, 1), or if initial_state is not [B, D].

    Works eagerly, inside ``tf.function`` and under XLA (``jit_compile=True``).
    """
    check_positive_int("num_iterations", num_iterations)
    kernel = HamiltonianMonteCarlo(target_log_prob_fn, step_size, num_leapfrog_steps)
    if adapt_step_size:
        kernel = StepSizeAdaptation(kernel, target_accept_rate, adaptation_rate)

    def trace_fn(state, results):  # the acceptance rates always: their mean is reported
        results = hmc_results(results)
        rate = accept_rate(results)
        return rate, (HMCTrace(state, results.target_log_prob, rate, results.step_size) if return_trace else ())

    state = tf.stop_gradient(tf.convert_to_tensor(initial_state))
    initial_results = kernel.bootstrap_results(state)
    run = sample_chain(num_iterations, state, kernel, seed=seed, previous_kernel_results=initial_results,
                       trace_fn=trace_fn)
    accept_rates, trace = run.trace
    final, initial = hmc_results(run.final_kernel_results), hmc_results(initial_results)
    return HMCResult(
        final_state=run.final_state, final_log_prob=final.target_log_prob,
        step_size=run.final_kernel_results.new_step_size if adapt_step_size else final.step_size,
        accept_rate=mean_over_iterations(accept_rates), trace=trace if return_trace else None,
        initial_log_prob=initial.target_log_prob, initial_gradient=initial.grads_target_log_prob)


class PosteriorTrace(NamedTuple):
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


def trace_posterior(model: VAE, x: tf.Tensor, *, num_iterations: int, num_leapfrog_steps: int,
                     step_size: float, seed: SeedLike = 0, z0: tf.Tensor | None = None) -> PosteriorTrace:
    """HMC, adapting its step size, on p(z | x) for the images x [B, 784], from z0 [B, D] (by
    default one draw from the encoder's q(z | x)), as one compiled graph."""
    start_seed, chain_seed = tf.unstack(split_seed(seed, 2))
    if z0 is None:
        loc, scale = model.encoder(x)
        z0 = loc + scale * tf.random.stateless_normal(tf.shape(loc), seed=start_seed)

    @tf.function
    def chain(x, z0, step_size, seed):
        return hmc_chain(lambda z: model.log_joint(x, z), z0, step_size, num_iterations=num_iterations,
                         num_leapfrog_steps=num_leapfrog_steps, seed=seed, return_trace=True)

    result = chain(x, z0, tf.constant(step_size, tf.float32), chain_seed)
    return PosteriorTrace(
        z0=np.asarray(z0),
        log_probs=np.concatenate([model.log_joint(x, z0).numpy()[None], result.trace.log_probs.numpy()]),
        accept_rates=result.trace.accept_rates.numpy(),
        step_sizes=result.trace.step_sizes.numpy(),
        before=tf.sigmoid(model.decoder(z0)).numpy(),
        after=tf.sigmoid(model.decoder(result.final_state)).numpy(),
        final_step_size=float(result.step_size),
        accept_rate=float(result.accept_rate))

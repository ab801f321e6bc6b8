"""Interactive explorers for the chapters (need a live kernel). Used by notebooks only.

Each explorer reruns real package code when a slider moves and redraws the same figure the
chapter shows statically, so the published book and a live session show the same thing.
"""

from __future__ import annotations

from typing import Callable

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf

from vcd_helpers.bench import benchmark_row
from vcd_helpers.config import Config
from vcd_helpers.hmc import hmc_chain
from vcd_helpers.model import VAE
from vcd_helpers.plots import plot_hmc_run


def run_hmc_on_posterior(model: VAE, x: tf.Tensor, z0: tf.Tensor, *, num_iterations: int, num_leapfrog_steps: int,
                         step_size: float, seed: int = 0) -> dict[str, np.ndarray]:
    """HMC on p(z | x) from z0 ([B, 10]) with adaptation, as numpy arrays for plotting:
    log_probs [T + 1, B], accept_rates [T], step_sizes [T], before/after decoder means [B, 784]."""
    result = _compiled_chain(model, num_iterations, num_leapfrog_steps)(x, z0, tf.constant(step_size), seed)
    start_log_prob = model.log_joint(x, z0)
    return {
        "log_probs": np.concatenate([start_log_prob.numpy()[None], result.trace.log_probs.numpy()]),
        "accept_rates": result.trace.accept_rates.numpy(),
        "step_sizes": result.trace.step_sizes.numpy(),
        "before": tf.sigmoid(model.decoder(z0)).numpy(),
        "after": tf.sigmoid(model.decoder(result.final_state)).numpy(),
        "final_step_size": float(result.step_size),
        "accept_rate": float(result.accept_rate),
    }


_chains: dict[tuple, Callable] = {}


def _compiled_chain(model: VAE, num_iterations: int, num_leapfrog_steps: int) -> Callable:
    """One compiled chain per (model, T, L): moving a slider back is instant after the first time."""
    key = (id(model), num_iterations, num_leapfrog_steps)
    if key not in _chains:
        @tf.function
        def chain(x, z0, step_size, seed):
            return hmc_chain(lambda z: model.log_joint(x, z), z0, step_size, num_iterations=num_iterations,
                             num_leapfrog_steps=num_leapfrog_steps, seed=seed, return_trace=True)
        _chains[key] = chain
    return _chains[key]


def hmc_explorer(model: VAE, x: tf.Tensor, z0: tf.Tensor, *, num_iterations: int = 8,
                 num_leapfrog_steps: int = 5, step_size: float = 0.05) -> widgets.Widget:
    """Sliders for HMC iterations, leapfrog steps and initial step size; each change reruns the
    chain on p(z | x) and redraws ``plot_hmc_run``."""
    iterations = widgets.IntSlider(value=num_iterations, min=1, max=100, description="iterations",
                                   continuous_update=False)
    leapfrog_steps = widgets.IntSlider(value=num_leapfrog_steps, min=1, max=30, description="leapfrog steps",
                                       continuous_update=False)
    step = widgets.FloatLogSlider(value=step_size, base=10, min=-3, max=0, step=0.1, description="step size",
                                  readout_format=".3f", continuous_update=False)
    output = widgets.Output()

    def redraw(_=None):
        with output:
            output.clear_output(wait=True)
            run = run_hmc_on_posterior(model, x, z0, num_iterations=iterations.value,
                                       num_leapfrog_steps=leapfrog_steps.value, step_size=step.value)
            plot_hmc_run(run["log_probs"], run["accept_rates"], run["step_sizes"], run["before"], run["after"],
                         title=f"mean acceptance {run['accept_rate']:.2f}, final step size {run['final_step_size']:.4f}")
            plt.show()

    for slider in (iterations, leapfrog_steps, step):
        slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([iterations, leapfrog_steps, step]), output])


def training_speed_explorer(config: Config, *, batch_sizes: tuple[int, ...] = (16, 32, 64, 100, 128, 256, 512, 1024),
                            steps_per_call: tuple[int, ...] = (1, 10, 100), calls: int = 3) -> widgets.Widget:
    """Sliders for the batch size and the steps per call; each change times the XLA training
    step in the in-graph loop (``bench.benchmark_row``) and prints ms/step and examples/s.
    The first time a batch size is seen it is compiled, which takes seconds."""
    batch = widgets.SelectionSlider(options=list(batch_sizes), value=config.batch_size if config.batch_size in
                                    batch_sizes else batch_sizes[0], description="batch size", continuous_update=False)
    per_call = widgets.SelectionSlider(options=list(steps_per_call), value=steps_per_call[0],
                                       description="steps/call", continuous_update=False)
    output = widgets.Output()

    def rerun(_=None):
        with output:
            output.clear_output(wait=True)
            row = benchmark_row(config.replace(batch_size=batch.value), steps_per_call=per_call.value, calls=calls)
            print(f"batch {row.batch_size}, {per_call.value} steps per call: {row.ms_per_step:.1f} ms per step, "
                  f"{row.examples_per_second:,.0f} examples/s, {row.gflops_per_second:.1f} GFLOP/s")

    for slider in (batch, per_call):
        slider.observe(rerun, names="value")
    rerun()
    return widgets.VBox([widgets.HBox([batch, per_call]), output])

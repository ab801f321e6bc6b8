"""Interactive explorers for the chapters (need a live kernel). Used by notebooks only.

Each explorer reruns real package code when a slider moves and redraws the same figure the
chapter shows statically, so the published book and a live session show the same thing.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import tensorflow as tf

from vcd_helpers.bench import decoder_layer_gflops, row_from_timing, step_call
from vcd_helpers.config import Config
from vcd_helpers.hmc import run_on_posterior
from vcd_helpers.model import VAE
from vcd_helpers.plots import plot_hmc_run
from vcd_helpers.timing import time_calls

# Labels at their natural width: the default box cut "leapfrog steps" to "leapfrog s...".
LABEL_STYLE = {"description_width": "initial"}


def hmc_explorer(model: VAE, x: tf.Tensor, z0: tf.Tensor, *, num_iterations: int = 8,
                 num_leapfrog_steps: int = 5, step_size: float = 0.05) -> widgets.Widget:
    """Sliders for HMC iterations, leapfrog steps and initial step size; each change reruns the
    chain on p(z | x) and redraws ``plot_hmc_run``."""
    iterations = widgets.IntSlider(value=num_iterations, min=1, max=100, description="iterations",
                                   continuous_update=False, style=LABEL_STYLE)
    leapfrog_steps = widgets.IntSlider(value=num_leapfrog_steps, min=1, max=30, description="leapfrog steps",
                                       continuous_update=False, style=LABEL_STYLE)
    step = widgets.FloatLogSlider(value=step_size, base=10, min=-3, max=0, step=0.1, description="step size",
                                  readout_format=".3f", continuous_update=False, style=LABEL_STYLE)
    output = widgets.Output()

    def redraw(_=None):
        with output:
            output.clear_output(wait=True)
            run = run_on_posterior(model, x, z0=z0, num_iterations=iterations.value,
                                   num_leapfrog_steps=leapfrog_steps.value, step_size=step.value)
            plot_hmc_run(run.log_probs, run.accept_rates, run.step_sizes, run.before, run.after,
                         title=f"mean acceptance {run.accept_rate:.2f}, final step size {run.final_step_size:.4f}")
            plt.show()

    for slider in (iterations, leapfrog_steps, step):
        slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([iterations, leapfrog_steps, step]), output])


def training_speed_explorer(config: Config, *, batch_sizes: tuple[int, ...] = (16, 32, 64, 100, 128, 256, 512, 1024),
                            steps_per_call: tuple[int, ...] = (1, 10, 100), calls: int = 5) -> widgets.Widget:
    """Sliders for the batch size and the steps per call; each change times the XLA training
    step in the in-graph loop (``bench.step_call``, the median of ``calls`` timed calls) and prints
    ms/step, examples/s and GFLOP/s. Each batch size is compiled the first time it is chosen, which
    takes seconds (a line says so meanwhile), and kept by ``step_call`` for every steps per call:
    going back is quick."""
    batch = widgets.SelectionSlider(options=list(batch_sizes), value=config.batch_size if config.batch_size in
                                    batch_sizes else batch_sizes[0], description="batch size", continuous_update=False, style=LABEL_STYLE)
    per_call = widgets.SelectionSlider(options=list(steps_per_call), value=steps_per_call[0],
                                       description="steps/call", continuous_update=False, style=LABEL_STYLE)
    output = widgets.Output()
    compiled: dict[tuple[int, int], tuple] = {}
    shape_rates: dict[int, float] = {}

    def rerun(_=None):
        key = (batch.value, per_call.value)
        sized = config.replace(batch_size=batch.value)
        with output:
            output.clear_output(wait=True)
            if key not in compiled:
                if batch.value not in shape_rates:
                    print(f"compiling the step for batch {batch.value} ...", flush=True)
                compiled[key] = step_call(sized, "xla_loop", steps_per_call=per_call.value)
                shape_rates[batch.value] = shape_rates.get(batch.value) or decoder_layer_gflops(sized)
            call, k = compiled[key]
            timed = time_calls(call, repeats=calls, units=k)
            row = row_from_timing(sized, timed, shape_rates[batch.value])
            output.clear_output(wait=True)
            print(f"batch {row.batch_size}, {k} steps per call: {timed} per step, "
                  f"{row.examples_per_second:,.0f} examples/s, {row.gflops_per_second:.1f} GFLOP/s, "
                  f"{row.cores_used:.2f} cores busy")

    for slider in (batch, per_call):
        slider.observe(rerun, names="value")
    rerun()
    return widgets.VBox([widgets.HBox([batch, per_call]), output])

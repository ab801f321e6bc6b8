"""Interactive explorers for the chapters. Used by notebooks only.

The live explorers (``hmc_explorer``, ``training_speed_explorer``) rerun real package code when
a slider moves; they need a kernel. ``static_explorer`` is their form for the published book:
the chapter computes the same package code for a grid of slider settings while it executes, and
the page switches between the precomputed results in the browser, with no kernel and no network.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import itertools
import json
from typing import Any, Mapping, Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
import tensorflow as tf
from IPython.display import HTML

from vcd_helpers.bench import TimedStep, decoder_layer_gflops, row_from_timing
from vcd_helpers.config import Config
from vcd_helpers.hmc import trace_posterior
from vcd_helpers.model import VAE
from vcd_helpers.plots import plot_hmc_trace
from vcd_helpers.timing import time_calls

# Labels at their natural width: the default box cut "leapfrog steps" to "leapfrog s...".
LABEL_STYLE = {"description_width": "initial"}


def hmc_explorer(model: VAE, x: tf.Tensor, z0: tf.Tensor, *, num_iterations: int = 8,
                 num_leapfrog_steps: int = 5, step_size: float = 0.05) -> widgets.Widget:
    """Sliders for HMC iterations, leapfrog steps and initial step size; each change reruns the
    chain on p(z | x) and redraws ``plot_hmc_trace``."""
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
            posterior_trace_figure(model, x, z0, num_iterations=iterations.value,
                                 num_leapfrog_steps=leapfrog_steps.value, step_size=step.value)
            plt.show()

    for slider in (iterations, leapfrog_steps, step):
        slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([iterations, leapfrog_steps, step]), output])


def posterior_trace_figure(model: VAE, x: tf.Tensor, z0: tf.Tensor, *, num_iterations: int,
                         num_leapfrog_steps: int, step_size: float) -> plt.Figure:
    """One setting of the HMC explorer: the chain on p(z | x) from z0 (``trace_posterior``), drawn
    by ``plot_hmc_trace``; the live explorer shows it, the static one precomputes it per setting."""
    trace = trace_posterior(model, x, z0=z0, num_iterations=num_iterations, num_leapfrog_steps=num_leapfrog_steps,
                            step_size=step_size)
    return plot_hmc_trace(trace.log_probs, trace.accept_rates, trace.step_sizes, trace.before, trace.after,
                          title=f"mean acceptance {trace.accept_rate:.2f}, final step size {trace.final_step_size:.4f}")


def training_speed_explorer(config: Config, *, batch_sizes: tuple[int, ...] = (16, 32, 64, 100, 128, 256, 512, 1024),
                            steps_per_call: tuple[int, ...] = (1, 10, 100), calls: int = 5) -> widgets.Widget:
    """Sliders for the batch size and the steps per call; each change times the XLA training
    step in the in-graph loop (a ``bench.TimedStep``, the median of ``calls`` timed calls) and
    prints ms/step, examples/s and GFLOP/s. Each batch size is compiled the first time it is chosen,
    which takes seconds (a line says so meanwhile), and kept by the widget for every steps per call:
    going back is quick."""
    batch = widgets.SelectionSlider(options=list(batch_sizes), value=config.batch_size if config.batch_size in
                                    batch_sizes else batch_sizes[0], description="batch size", continuous_update=False, style=LABEL_STYLE)
    per_call = widgets.SelectionSlider(options=list(steps_per_call), value=steps_per_call[0],
                                       description="steps/call", continuous_update=False, style=LABEL_STYLE)
    output = widgets.Output()
    steps: dict[int, TimedStep] = {}
    compiled: dict[tuple[int, int], tuple] = {}
    shape_rates: dict[int, float] = {}

    def rerun(_=None):
        key = (batch.value, per_call.value)
        sized = config.replace(batch_size=batch.value)
        with output:
            output.clear_output(wait=True)
            if key not in compiled:
                if batch.value not in steps:
                    print(f"compiling the step for batch {batch.value} ...", flush=True)
                    steps[batch.value] = TimedStep(sized, "xla_loop")
                compiled[key] = steps[batch.value].call(per_call.value)
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


# Shows the frame whose key is the sliders' positions; hides every other. Inline, so that the
# page needs nothing from a network or a kernel.
_SWITCH = """<script>(function () {
  const root = document.getElementById("%s");
  const inputs = Array.from(root.querySelectorAll("input[type=range]"));
  function show() {
    const key = inputs.map(input => input.value).join("|");
    inputs.forEach(input => { input.nextElementSibling.textContent = JSON.parse(input.dataset.labels)[input.value]; });
    root.querySelectorAll(".vcd-frame").forEach(frame => { frame.hidden = frame.dataset.key !== key; });
    root.dataset.shown = key;
  }
  inputs.forEach(input => input.addEventListener("input", show));
  show();
})();</script>"""


def static_explorer(frames: Mapping[tuple, str], sliders: Sequence[tuple[str, Sequence[Any]]], *,
                    note: str, initial: tuple | None = None) -> HTML:
    """Sliders that switch between precomputed results in the page itself (no kernel, no network).

    ``sliders``: (label, values) per slider; ``frames``: an HTML fragment (``figure_html``, a
    ``<pre>``) for every combination of values, keyed by the tuple of values in the sliders'
    order; ``note``: one line saying what was precomputed, on what machine; ``initial``: the
    combination shown first (default: each slider's first value). Raises ValueError naming a
    combination without a frame, or an ``initial`` that is not a combination.
    """
    combinations = list(itertools.product(*(values for _, values in sliders)))
    missing = [c for c in combinations if c not in frames]
    if missing:
        raise ValueError(f"frames has no entry for {missing[0]!r} ({len(missing)} of {len(combinations)} "
                         "combinations missing): give one per combination of the sliders' values")
    initial = combinations[0] if initial is None else tuple(initial)
    if initial not in frames:
        raise ValueError(f"initial={initial!r} is invalid: must be one of the sliders' combinations")
    # A stable id: the same explorer renders to the same page on every execution.
    root = "vcd-explorer-" + hashlib.sha1(json.dumps([note, [[l, list(map(str, v))] for l, v in sliders]])
                                         .encode()).hexdigest()[:10]
    controls = []
    for (label, values), start in zip(sliders, initial):
        labels = html.escape(json.dumps([str(v) for v in values]))
        controls.append(f'<label style="margin-right:1.5em">{html.escape(label)} <input type="range" min="0" '
                        f'max="{len(values) - 1}" step="1" value="{list(values).index(start)}" data-labels="{labels}"> '
                        f'<output>{html.escape(str(start))}</output></label>')
    index = [{v: i for i, v in enumerate(values)} for _, values in sliders]
    shown = [f'<div class="vcd-frame" data-key="{"|".join(str(index[d][v]) for d, v in enumerate(c))}"'
             f'{"" if c == initial else " hidden"}>{frames[c]}</div>' for c in combinations]
    return HTML(f'<div class="vcd-explorer" id="{root}"><p class="vcd-explorer-note"><em>{html.escape(note)}</em></p>'
                f'<div>{"".join(controls)}</div>{"".join(shown)}{_SWITCH % root}</div>')


def figure_html(fig: plt.Figure, *, dpi: int = 60, colors: int = 64) -> str:
    """``fig`` as an inline PNG ``<img>`` (closed afterwards): a frame for ``static_explorer``.
    The image is reduced to a palette of ``colors`` colours, which keeps a plot legible at about a
    quarter of the bytes: an explorer holds dozens of frames, and the page carries them all."""
    from PIL import Image  # matplotlib's own image library

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB").quantize(colors=colors)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    encoded = base64.b64encode(buffer.getvalue()).decode()
    return f'<img src="data:image/png;base64,{encoded}" style="max-width:100%" alt="precomputed figure">'

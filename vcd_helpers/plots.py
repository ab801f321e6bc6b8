"""Figures the chapters share. Used by notebooks only; nothing in the package imports this."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from vcd_helpers.config import STAGE_NAMES, HMCConfig


def image_grid(images: np.ndarray, rows: int, cols: int, *, ax: plt.Axes | None = None,
               title: str | None = None, gap: int = 2) -> plt.Axes:
    """Draw ``rows * cols`` images ([N, 784] or [N, 28, 28], values in [0, 1]) as one tiled picture."""
    count = rows * cols
    if len(images) < count:
        raise ValueError(f"image_grid needs {count} images for a {rows}x{cols} grid, got {len(images)}")
    tiles = np.asarray(images[:count], dtype=np.float32).reshape(count, 28, 28)
    canvas = np.ones((rows * (28 + gap) - gap, cols * (28 + gap) - gap), dtype=np.float32)
    for k, tile in enumerate(tiles):
        r, c = divmod(k, cols)
        canvas[r * (28 + gap): r * (28 + gap) + 28, c * (28 + gap): c * (28 + gap) + 28] = 1.0 - tile
    if ax is None:
        _, ax = plt.subplots(figsize=(cols * 0.6, rows * 0.6))
    ax.imshow(canvas, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_axis_off()
    if title:
        ax.set_title(title)
    return ax


def plot_training_curve(history: dict[str, np.ndarray], *, key: str = "loss", ax: plt.Axes | None = None,
                        label: str | None = None, window: int = 50) -> plt.Axes:
    """A metric against the step, raw (faint) and as a running mean over ``window`` steps."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    steps, values = history["step"], history[key]
    line, = ax.plot(steps, values, alpha=0.25)
    if len(values) >= window:
        smooth = np.convolve(values, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, color=line.get_color(), label=label)
    ax.set(xlabel="training step", ylabel=key)
    return ax


def plot_hmc_trace(trace_log_probs: np.ndarray, accept_rates: np.ndarray, step_sizes: np.ndarray,
                   before: np.ndarray, after: np.ndarray, *, title: str = "") -> plt.Figure:
    """Five panels (readable at a book's width) for an HMC run on p(z | x) of several digits: each
    chain's climb in log p(x, z) from its start (the climb, a few nats, would vanish beside the
    tens of nats that separate digits), acceptance, step size (its own panel, on an axis from 0:
    a drift of a few per cent is not drawn as a plunge), and decoded digits at start and end.

    trace_log_probs [T + 1, B] (row 0 at the start), accept_rates [T], step_sizes [T];
    before, after [n, 784]: decoder means at the first and last state of n chains.
    The step-size panel is the figure's last axes (``fig.axes[-1]``).
    """
    fig = plt.figure(figsize=(9, 6.2))
    grid = fig.add_gridspec(2, 6)
    iterations = np.arange(len(trace_log_probs))
    climb = trace_log_probs - trace_log_probs[0]
    low, high = np.percentile(climb, [10, 90], axis=1)
    ax_climb = fig.add_subplot(grid[0, 0:2])
    ax_climb.fill_between(iterations, low, high, alpha=0.3)
    ax_climb.plot(iterations, climb.mean(axis=1))
    ax_climb.axhline(0, color="gray", lw=0.8)
    # No legend (the band fills the panel): the title names the line and the band.
    ax_climb.set(xlabel="HMC iteration", ylabel="log p(x, z_t) - log p(x, z_0)", title="climb: mean, 10-90% band")
    ax_rate = fig.add_subplot(grid[0, 2:4])
    ax_rate.plot(np.arange(1, len(accept_rates) + 1), accept_rates, "o-", ms=3, color="tab:green",
                 label="fraction of chains")
    ax_rate.axhline(HMCConfig.target_accept_rate, ls="--", color="gray", lw=1, label="target")
    ax_rate.set(xlabel="HMC iteration", ylabel="acceptance", ylim=(0, 1.05), title="acceptance")
    ax_rate.legend(loc="lower right", fontsize=9)
    n = min(len(before), 16)
    image_grid(before, 4, n // 4, ax=fig.add_subplot(grid[1, 0:3]), title="decoded z at the start")
    image_grid(after, 4, n // 4, ax=fig.add_subplot(grid[1, 3:6]), title="decoded z at the end")
    ax_step = fig.add_subplot(grid[0, 4:6])
    ax_step.plot(np.arange(1, len(step_sizes) + 1), step_sizes, color="tab:red")
    ax_step.set(xlabel="HMC iteration", ylabel="step size h", ylim=(0, 1.25 * float(np.max(step_sizes))),
                title="step size (axis from 0)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_timeline(timeline, *, ax: plt.Axes | None = None, title: str | None = None,
                  stage_names: tuple[str, ...] = STAGE_NAMES) -> plt.Axes:
    """A measured pipeline step (``pipeline.Timeline``) as a Gantt chart: one row per stage's
    device, a bar per task (forwards solid, backwards hatched), labelled with its micro-batch."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for task, start, end in zip(timeline.tasks, timeline.start * 1e3, timeline.end * 1e3):
        row = len(stage_names) - 1 - task.stage
        ax.barh(row, end - start, left=start, height=0.7, color=colors[task.micro_batch % len(colors)],
                alpha=0.9 if task.kind == "F" else 0.5, hatch=None if task.kind == "F" else "//",
                edgecolor="black", linewidth=0.4)
        if end - start > 0.03 * timeline.span * 1e3:
            ax.text((start + end) / 2, row, task.label, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(stage_names)), [f"device {s}: {n}" for s, n in reversed(list(enumerate(stage_names)))])
    ax.set_xlabel("ms from the start of the step")
    if title:
        ax.set_title(title, fontsize=10)
    return ax

"""Figures the chapters share. Used by notebooks only; nothing in the package imports this."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np


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

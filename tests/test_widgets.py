"""The precomputed explorers of the published book (widgets.static_explorer): one frame per
combination of slider values, the initial one shown, every other hidden; the browser check
(tests/test_book.py) moves their sliders in Chromium."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from vcd_helpers import widgets  # noqa: E402

SLIDERS = [("iterations", (10, 40)), ("step size", (0.01, 0.05, 0.2))]
FRAMES = {(n, h): f"<pre>n={n} h={h}</pre>" for n in (10, 40) for h in (0.01, 0.05, 0.2)}


def test_a_static_explorer_holds_one_frame_per_combination_and_shows_the_initial_one():
    page = widgets.static_explorer(FRAMES, SLIDERS, note="precomputed", initial=(40, 0.05)).data
    frames = re.findall(r'<div class="vcd-frame" data-key="([^"]+)"( hidden)?><pre>n=(\d+) h=([\d.]+)</pre>', page)
    assert len(frames) == 6
    # The key is the sliders' positions (indices), the frame's content that combination's.
    assert {key: (int(n), float(h)) for key, _, n, h in frames} == {
        f"{i}|{j}": (n, h) for i, n in enumerate((10, 40)) for j, h in enumerate((0.01, 0.05, 0.2))}
    assert [key for key, hidden, _, _ in frames if not hidden] == ["1|1"]
    assert page.count('type="range"') == 2 and 'value="1"' in page and "<output>0.05</output>" in page
    assert "<script>" in page and "http" not in page  # nothing fetched: the page works offline
    # The same explorer renders to the same page (a stable id), another explorer to another id.
    assert widgets.static_explorer(FRAMES, SLIDERS, note="precomputed", initial=(40, 0.05)).data == page
    assert re.search(r'id="(vcd-explorer-\w+)"', page).group(1) != re.search(
        r'id="(vcd-explorer-\w+)"', widgets.static_explorer(FRAMES, SLIDERS, note="other").data).group(1)


def test_a_static_explorer_refuses_a_missing_frame_or_initial_setting():
    with pytest.raises(ValueError, match=r"frames has no entry for \(40, 0.2\)"):
        widgets.static_explorer({k: v for k, v in FRAMES.items() if k != (40, 0.2)}, SLIDERS, note="x")
    with pytest.raises(ValueError, match=r"initial=\(40, 0.1\) is invalid"):
        widgets.static_explorer(FRAMES, SLIDERS, note="x", initial=(40, 0.1))


def test_figure_html_inlines_the_figure_as_png():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    tag = widgets.figure_html(fig, dpi=20, colors=16)
    assert tag.startswith('<img src="data:image/png;base64,iVBOR') and not plt.get_fignums()
    import base64
    import io

    from PIL import Image
    image = Image.open(io.BytesIO(base64.b64decode(tag.split("base64,")[1].split('"')[0])))
    assert image.mode == "P" and len(image.getcolors()) <= 16  # a palette image: a frame of a few KB

"""A Sphinx extension: every page of the book renders with no network.

- MathJax is served by the book itself. Version 3.2.2 comes from npm (``book/package.json``,
  installed into ``book/node_modules`` by ``make``, never committed); this copies its CommonHTML
  build and what that loads on demand (TeX extensions, fonts, menu, accessibility) into
  ``_static/mathjax`` and points Sphinx's ``mathjax_path`` at it.
- No widget manager is loaded. A widget needs a live kernel to do anything, so the book shows the
  static figure beside each widget instead; the widget state that executing a chapter records
  is left out of the page, and myst-nb is told to load no require.js or html-manager from a CDN.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sphinx.errors import ConfigError

MATHJAX = Path(__file__).resolve().parents[1] / "node_modules" / "mathjax" / "es5"
MATHJAX_PARTS = ("tex-chtml.js", "input", "output/chtml.js", "output/chtml", "ui", "a11y", "sre")
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _configure(app, config) -> None:
    if not (MATHJAX / "tex-chtml.js").exists():
        raise ConfigError(f"MathJax is missing from {MATHJAX}: install the book's assets with "
                          "`npm ci --prefix book` (make book and make test do it)")
    config.mathjax_path = "mathjax/tex-chtml.js"
    config.nb_ipywidgets_js = {}


def _copy_mathjax(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static" / "mathjax"
    for part in MATHJAX_PARTS:
        source = MATHJAX / part
        if source.is_dir():
            shutil.copytree(source, target / part, dirs_exist_ok=True)
        else:
            (target / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / part)


def _drop_widget_state(app, pagename, templatename, context, doctree) -> None:
    context["script_files"] = [script for script in context.get("script_files", [])
                               if getattr(script, "attributes", {}).get("type") != WIDGET_STATE]


def setup(app):
    app.connect("config-inited", _configure)
    app.connect("html-page-context", _drop_widget_state)
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

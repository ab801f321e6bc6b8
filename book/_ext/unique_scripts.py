"""A Sphinx extension: each script tag once per page.

sphinx-thebe (loaded by Jupyter Book) adds its inline configuration script each time Sphinx
re-reads the environment, so a page can carry two copies and the browser reports
"Identifier 'THEBE_JS_URL' has already been declared". This drops the repeats, keeping order.
"""

from __future__ import annotations


def _unique_scripts(app, pagename, templatename, context, doctree) -> None:
    seen, kept = set(), []
    for script in context.get("script_files", []):
        # An inline script is added once with filename None and once with "": the same script.
        key = (getattr(script, "filename", script) or "", repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", _unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

"""A Sphinx extension: a notebook whose execution failed is executed again by the next build.

With ``execute_notebooks: cache``, myst-nb executes a notebook when the jupyter-cache holds no
successful execution of its current code, and a failure is a warning (an error under ``-W``).
But Sphinx re-reads only the sources that changed since its last build: a second build after a
failure reads nothing, executes nothing, warns about nothing and reports success, although the
failed chapter's page carries outputs that were never executed. This marks as outdated every
notebook that the cache holds no successful execution of, so that each build executes it again
and fails again until it succeeds. A notebook that succeeded is matched in the cache and costs
nothing.
"""

from __future__ import annotations

from pathlib import Path

from jupyter_cache import get_cache


def not_executed(app, env, added, changed, removed) -> list[str]:
    """The notebooks of the book with no successful execution of their current code in the cache."""
    if app.config.nb_execution_mode != "cache":
        return []
    cache = get_cache(app.config.nb_execution_cache_path or ".jupyter_cache")
    outdated = []
    for docname in sorted(env.found_docs - set(removed)):
        path = Path(env.doc2path(docname))
        if path.suffix != ".ipynb":
            continue
        try:
            cache.match_cache_file(str(path))
        except KeyError:
            outdated.append(docname)
    return outdated


def setup(app):
    app.connect("env-get-outdated", not_executed)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

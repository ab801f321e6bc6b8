"""Helpers for the chapters: show the package's real code, flag timings taken on a busy machine,
and sign off with a watermark.

The notebooks teach by showing the package's own functions (never a copy in a cell) and then
calling them. Used by notebooks only; nothing in the package imports this module.
"""

from __future__ import annotations

import ast
import datetime as _dt
import inspect
import os
import platform
import sys
import textwrap

from IPython.display import HTML, Code

from vcd_helpers.config import active_profile
from vcd_helpers.devices import code_version, cpu_model, package_versions
from vcd_helpers.timing import MachineLoad

WATERMARK_PACKAGES = ("tensorflow", "tensorflow-probability", "keras", "numpy", "matplotlib",
                      "ipywidgets", "jupyter-book", "vcd_helpers")


def source_lines(obj: object, *, docstring: bool = True, between: tuple[str, str] | None = None) -> str:
    """The source of the function ``obj`` as text, optionally cut down to its essential lines.

    ``docstring=False`` drops its docstring. ``between=(first, last)`` keeps the signature, then
    only the lines from the first one containing ``first`` to the first one after it containing
    ``last`` (both kept), with ``...`` lines standing for what is left out. Raises ValueError when
    a marker is not found, so that a listing cannot silently go stale."""
    lines = inspect.getsource(obj).splitlines()
    node = ast.parse(textwrap.dedent("\n".join(lines))).body[0]
    first_body = node.body[0]
    head, rest = lines[:first_body.lineno - 1], lines[first_body.lineno - 1:]
    has_docstring = (isinstance(first_body, ast.Expr) and isinstance(first_body.value, ast.Constant)
                     and isinstance(first_body.value.value, str))
    if not docstring and has_docstring:
        rest = rest[first_body.end_lineno - first_body.lineno + 1:]
    if between is not None:
        first, last = between
        try:
            start = next(k for k, line in enumerate(rest) if first in line)
            stop = next(k for k in range(start, len(rest)) if last in rest[k])
        except StopIteration:
            raise ValueError(f"{getattr(obj, '__qualname__', obj)}: no lines from {first!r} to {last!r}") from None
        indent = " " * (len(rest[start]) - len(rest[start].lstrip()))
        rest = ([indent + "..."] if start > 0 else []) + rest[start: stop + 1] + (
            [indent + "..."] if stop + 1 < len(rest) else [])
    return "\n".join(head + rest) + "\n"


def show_source(obj: object, *, docstring: bool = True, between: tuple[str, str] | None = None) -> Code:
    """The source of a function, class or module from the package, syntax-highlighted; for a
    function, ``docstring`` and ``between`` cut it to its essential lines (``source_lines``)."""
    if docstring and between is None:
        return Code(inspect.getsource(obj), language="python")
    return Code(source_lines(obj, docstring=docstring, between=between), language="python")


def _machines(timed: object) -> list[MachineLoad]:
    if isinstance(timed, dict):
        return [m for value in timed.values() for m in _machines(value)]
    if isinstance(timed, (list, tuple)):
        return [m for value in timed for m in _machines(value)]
    machine = getattr(timed, "machine", None)
    return [machine] if isinstance(machine, MachineLoad) else []


def load_note(*timed: object) -> HTML:
    """A visible note on the page when the machine was busy (``MachineLoad.busy``: other processes
    kept half a core busy) while any of ``timed`` was measured: ``Timing``s, ``RatioInterval``s, or dicts and lists of
    them. Renders nothing when every one was taken on a quiet machine.

    Raises ValueError when ``timed`` holds no timing at all (a note that could never show)."""
    machines = [m for item in timed for m in _machines(item)]
    if not machines:
        raise ValueError("load_note was given no Timing or RatioInterval: nothing to judge the machine's load by")
    busiest = max(machines, key=lambda m: (m.busy, (m.busy_cores or 0.0) - m.own_cores, m.load_average or 0.0))
    if not busiest.busy:
        return HTML("")
    return HTML(
        '<div class="admonition warning"><p class="admonition-title">Timed on a busy machine</p>'
        f"<p>Other work competed for the cores while this chapter timed its variants (at the busiest, "
        f"{busiest}). Its timings are slower and noisier than on a quiet machine, so a difference may "
        "be left unresolved, or even reversed; every verdict on this page, and the sentences that "
        "state it, were computed from these timings.</p></div>")


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:  # not on every platform
        return "unknown"


def watermark() -> str:
    """Date, the code's git commit, machine and CPU, Python and package versions, and the active
    run profile."""
    code = code_version()
    commit = (code["commit"] or "unknown") + (" with uncommitted changes" if code["dirty"] else "")
    lines = [
        f"Last run: {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"Code: git commit {commit}",
        f"Machine: {platform.machine()} {platform.system()} ({cpu_model()}), Python {sys.version.split()[0]}",
        # The load says whether a chapter's timings were taken on a quiet machine.
        f"Load average: {_load_average()} (1 min) on {os.cpu_count()} cores",
        f"Run profile: {active_profile().name}",
    ]
    for package, version in package_versions(WATERMARK_PACKAGES).items():
        lines.append(f"{package}=={version}" if version != "not installed" else f"{package}: not installed")
    return "\n".join(lines)

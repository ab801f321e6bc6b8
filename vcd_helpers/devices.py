"""What hardware is here, and how to carve one physical device into several logical ones.

The multi-device chapters run on logical devices so that they work on any machine: one CPU split
into N logical CPUs behaves, for placement and communication, like N devices. TensorFlow only
accepts such a split before it initialises its devices (the first op, or the first
``list_logical_devices``), so ``split_physical_device`` must be called first in a process.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Iterable

import tensorflow as tf

from vcd_helpers.config import check_one_of, check_positive_int


def device_summary() -> dict[str, object]:
    """Physical and logical devices, CPU count and TensorFlow build facts, as plain values."""
    physical = tf.config.list_physical_devices()
    logical = tf.config.list_logical_devices()
    build = tf.sysconfig.get_build_info()
    return {
        "tensorflow": tf.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "physical_devices": [f"{d.device_type}:{d.name.rsplit(':', 1)[-1]}" for d in physical],
        "logical_devices": [d.name for d in logical],
        "gpus": [d.name for d in physical if d.device_type == "GPU"],
        "cuda_build": bool(build.get("is_cuda_build", False)),
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") != "0",
        "cpu_model": cpu_model(),
    }


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` shows it (timings are only comparable on one model)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: A file holding the commit of a source snapshot that has no .git (the run service's
#: runner runs the long runs from such a snapshot, so that edits to the work tree never reach them).
COMMIT_FILE = "COMMIT"


# What the package's results depend on: its source, its metadata and the pinned stack.
CODE_PATHS = ("vcd_helpers", "pyproject.toml", "requirements.txt", "requirements-data.txt")


def code_version(root: Path | None = None) -> dict[str, object]:
    """The git commit of the package's source and whether that source (``CODE_PATHS``) had
    uncommitted changes: ``{"commit": sha or None, "dirty": bool or None}`` (None: not known
    here). Edits elsewhere (a notebook's outputs, the book's text) do not change what the code
    computes, so they do not count: executing the chapters one after another, each rewriting its
    own file, leaves the later ones' watermarks clean. ``root``: the checkout (default: this one)."""
    root = root or Path(__file__).resolve().parent.parent
    if (root / COMMIT_FILE).is_file():
        return {"commit": (root / COMMIT_FILE).read_text().strip(), "dirty": False}
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                 *CODE_PATHS], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    if head.returncode or status.returncode:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def compute_threads() -> int:
    """The threads TensorFlow's ops (and XLA's CPU runtime) may use at once in this process: the
    intra-op setting (``TF_NUM_INTRAOP_THREADS`` or ``tf.config.threading``), else every core.
    The experiment runner gives each of its runs one thread."""
    configured = os.environ.get("TF_NUM_INTRAOP_THREADS") or tf.config.threading.get_intra_op_parallelism_threads()
    return max(1, int(configured or os.cpu_count() or 1))


def package_versions(packages: Iterable[str]) -> dict[str, str]:
    """{package: installed version, or 'not installed'}."""
    found = {}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def format_device_summary(summary: dict[str, object] | None = None) -> str:
    """``device_summary()`` as a few readable lines."""
    s = summary or device_summary()
    gpus = ", ".join(s["gpus"]) or "none"
    return (
        f"TensorFlow {s['tensorflow']} on {s['machine']} with {s['cpu_count']} CPU cores\n"
        f"GPUs: {gpus}\n"
        f"logical devices: {', '.join(s['logical_devices'])}"
    )


def split_physical_device(num_logical: int, device_type: str = "CPU",
                          memory_limit_mb: int | None = None) -> list[str]:
    """Split the first physical ``device_type`` device into ``num_logical`` logical devices.

    Returns the logical device names of that type. Calling it again with the same split is a
    no-op (so a notebook cell can be re-run). ``memory_limit_mb`` is required for GPUs (each
    logical GPU gets that much) and ignored for CPUs.

    Raises:
      ValueError: ``num_logical`` is not a positive integer, or no such device exists.
      RuntimeError: TensorFlow already initialised its devices with a different split.
    """
    check_positive_int("num_logical", num_logical)
    check_one_of("device_type", device_type, ("CPU", "GPU"))
    if device_type == "GPU" and memory_limit_mb is None:
        raise ValueError("memory_limit_mb is required when splitting a GPU (MiB per logical GPU)")
    physical = tf.config.list_physical_devices(device_type)
    if not physical:
        raise ValueError(f"no physical {device_type} device found; devices here: "
                         f"{[d.name for d in tf.config.list_physical_devices()]}")
    limit = memory_limit_mb if device_type == "GPU" else None
    wanted = [tf.config.LogicalDeviceConfiguration(memory_limit=limit) for _ in range(num_logical)]
    try:
        tf.config.set_logical_device_configuration(physical[0], wanted)
    except RuntimeError as error:
        current = [d.name for d in tf.config.list_logical_devices(device_type)]
        if len(current) == num_logical:
            return current
        raise RuntimeError(
            f"split_physical_device({num_logical}) was called after TensorFlow initialised its "
            f"devices (it now has {len(current)} logical {device_type} device(s)). Call it first, "
            "before any TensorFlow op runs: restart the kernel or process and call it right after "
            f"the imports. TensorFlow said: {error}"
        ) from None
    return [d.name for d in tf.config.list_logical_devices(device_type)]

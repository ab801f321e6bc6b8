"""Pytest set-up shared by the unit tests and the notebooks run under nbval.

The test run uses the tiny ``test`` run profile unless the caller chose one; nbval's kernels
inherit this environment, so every notebook sizes itself down too.

The test process's CPU is split into four logical devices before TensorFlow initialises, so the
pipeline and replication tests place stages and replicas on devices of their own; everything
else runs on the first, as it would without the split.
"""

import os

import pytest

os.environ.setdefault("VCD_PROFILE", "test")

from vcd_helpers.devices import split_physical_device  # noqa: E402  (after the environment is set)

split_physical_device(4)

SANITIZE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nbval-sanitize.cfg")


def pytest_configure(config):
    """nbval compares outputs after the substitutions in nbval-sanitize.cfg (dates, commits,
    machine, load, run profile, durations), wherever pytest is started from; an explicit
    --nbval-sanitize-with wins."""
    if getattr(config.option, "nbval_sanitize_with", "absent") is None:
        config.option.nbval_sanitize_with = SANITIZE


def pytest_collection_modifyitems(items):
    """Every notebook run under nbval is slow (`make test-fast` leaves them out with the tests
    marked slow)."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)

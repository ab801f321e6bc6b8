"""Pytest set-up shared by the unit tests and the notebooks run under nbval.

The test run uses the tiny ``test`` run profile unless the caller chose one; nbval's kernels
inherit this environment, so every notebook sizes itself down too.
"""

import os

os.environ.setdefault("VCD_PROFILE", "test")

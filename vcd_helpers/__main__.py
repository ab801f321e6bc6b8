"""``python -m vcd_helpers``: see ``vcd_helpers.runs.cli``."""

import sys

from vcd_helpers.runs.cli import main

sys.exit(main())

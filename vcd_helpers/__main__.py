"""``python -m vcd_helpers``: see ``vcd_helpers.cli``."""

import sys

from vcd_helpers.cli import main

sys.exit(main())

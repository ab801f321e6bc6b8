"""``python -m vcd_helpers``: see ``vcd_helpers.runs.cli``."""

import signal
import sys

try:
    from vcd_helpers.runs.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command's modules load: as the command answers it
    print("interrupted", file=sys.stderr)
    sys.exit(130)

code = main()
# The command has finished and said so: a signal now would only interrupt the interpreter's exit,
# printing a stack from whatever object it was freeing (the command's handlers raise KeyboardInterrupt).
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN)
sys.exit(code)

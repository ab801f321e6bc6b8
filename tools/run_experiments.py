"""Start, resume or inspect chapter 8's long runs: see ``vcd_helpers.runs.runner`` (and the README).

    .venv/bin/python tools/run_experiments.py             # start, or resume, every unfinished run
    .venv/bin/python tools/run_experiments.py --status    # each run's progress, speed, expected finish
    .venv/bin/python tools/run_experiments.py --collect   # copy finished runs' small files into results/
"""

import sys

VCD_COMMAND_LINE = True  # vcd_helpers answers a bad environment or a Ctrl-C while importing in one line

from vcd_helpers.runs.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

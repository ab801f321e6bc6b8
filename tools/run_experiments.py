"""Start, resume or inspect chapter 7's long runs: see ``vcd_helpers.runs.runner`` (and the README).

    .venv/bin/python tools/run_experiments.py             # start, or resume, every unfinished run
    .venv/bin/python tools/run_experiments.py --status    # each run's progress, speed, expected finish
    .venv/bin/python tools/run_experiments.py --collect   # copy finished runs' small files into results/
"""

import sys

from vcd_helpers.runs.runner import main

if __name__ == "__main__":
    sys.exit(main())

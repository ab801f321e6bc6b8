"""The run service: the machinery of long training runs, on top of the library.

``python -m vcd_helpers train | evaluate | bench`` (``cli``) trains into a results directory
that survives every interruption: a lock keeps it to one process (``directory``), checkpoints
resume it exactly and skip damaged ones (``checkpoints``), metrics and the learning curve are
logged as it goes and compared when a resumed run writes them again (``logs``), and its final
evaluation resumes batch by batch (``evaluate``); ``train`` ties them together; ``runner`` runs the
library's plan of chapter 8's long runs (``vcd_helpers.plan``) two at a time (``tools/run_experiments.py``).

The library (``vcd_helpers``'s other modules) never imports this package; the layout of a
results directory and its readers are the library's (``vcd_helpers.results``).
"""

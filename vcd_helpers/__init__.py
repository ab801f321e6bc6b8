"""vcd_helpers: the library behind the book *Variational inference meets MCMC*.

A VAE on binarised MNIST trained with Variational Contrastive Divergence (Ruiz & Titsias, 2019),
written with TensorFlow 2 and TensorFlow Probability. Modules, bottom to top:

- ``config``: one frozen, validated configuration (presets in ``presets/``) and run profiles;
- ``devices``, ``seeds``: what hardware is here, logical-device splitting, stateless seeds;
- ``data``: statically binarised MNIST, offline-capable, and indexed ``tf.data`` pipelines;
- ``model``, ``hmc``, ``optim``: the VAE, the HMC chain, the reference RMSProp variant;
- ``objectives``, ``evaluation``, ``training``: ELBO and VCD losses, importance sampling, steps;
- ``loops``, ``variance``: many steps per host call and the loop around them; the estimator's variance;
- ``pipeline``, ``distributed``: the VCD step pipelined over devices, or replicated;
- ``trainers``: ``build_trainer``, the one way to build a trainer for any of those executions;
- ``results``, ``analysis``, ``plan``: a results directory's files and their readers; finished runs compared;
  the long runs the book reports, and the paper's number they are held to;
- ``bench``, ``timing``, ``plots``, ``widgets``, ``notebook``: timings, figures, explorers, the chapters' helpers.

On top of the library, and never imported by it: ``runs``, the run service (``python -m
vcd_helpers train | evaluate | bench``, results directories that survive interruptions, the
runner of the long runs' plan).

Importing the package first imports TensorFlow quietly (see ``_quiet``): TensorFlow 2.21 prints
its start-up log lines to file descriptor 2 before any log-level setting applies, and Jupyter
copies them into every notebook's stderr output.
"""

import sys

from vcd_helpers._quiet import import_tensorflow_quietly

try:
    import_tensorflow_quietly()
except (ValueError, KeyboardInterrupt) as error:
    # A command line imports the package before it can catch anything: ``python -m vcd_helpers``
    # (Python sets argv[0] to "-m" meanwhile) and the tools, which set VCD_COMMAND_LINE first. It
    # answers a bad thread variable or a Ctrl-C as its own errors: in one line, not a traceback.
    if sys.argv[:1] != ["-m"] and not getattr(sys.modules.get("__main__"), "VCD_COMMAND_LINE", False):
        raise
    print("interrupted" if isinstance(error, KeyboardInterrupt) else f"error: {error}", file=sys.stderr)
    raise SystemExit(130 if isinstance(error, KeyboardInterrupt) else 2) from None

__version__ = "0.1.0"

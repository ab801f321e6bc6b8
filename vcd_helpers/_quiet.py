"""Import TensorFlow without its start-up noise on stderr, in an environment it can run in.

TensorFlow 2.21 writes INFO lines (oneDNN, CUDA stubs) to file descriptor 2 *before* absl's
logging is initialised, so neither ``TF_CPP_MIN_LOG_LEVEL`` nor absl flags silence them; a
Jupyter kernel captures fd 2 and stores the lines in the notebook, where they differ from machine
to machine and break strict output checks. We hold fd 2 on a temporary file during the import and
show what was captured only if the import fails.

TensorFlow reads its thread counts from the environment at its first op and aborts the process
(SIGABRT, a native stack) on a negative one; the package reads them too. They are checked before
the import, so that a bad one is a ValueError naming the variable.
"""

from __future__ import annotations

import os
import sys
import tempfile

# Level 3 also hides the "failed call to cuInit" error that CPU-only machines print when the
# runtime first looks for a GPU. Python exceptions are unaffected. A user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


#: The thread counts TensorFlow (and ``devices.compute_threads``) read from the environment.
THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def check_thread_variables() -> None:
    """Raise ValueError naming the variable unless each of ``THREAD_VARIABLES`` is unset, empty
    or a whole number of threads (0: TensorFlow chooses)."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "")
        if value and not (value.isascii() and value.isdigit()):
            raise ValueError(f"${name}={value!r} is invalid: must be a whole number of threads, 0 or more "
                             "(0 lets TensorFlow choose), or unset")


def import_tensorflow_quietly() -> None:
    """Import ``tensorflow`` and ``tensorflow_probability`` with fd 2 captured.

    A no-op when TensorFlow is already imported. Raises ValueError naming a thread variable that
    TensorFlow cannot run with (``check_thread_variables``); ImportError with the captured stderr
    appended when the import fails.
    """
    check_thread_variables()
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf
            import tensorflow_probability  # noqa: F401  (its import also logs)

            tf.get_logger().setLevel("ERROR")
        except ImportError as error:
            os.dup2(saved_fd, 2)
            capture.seek(0)
            captured = capture.read().decode(errors="replace").strip()
            raise ImportError(f"{error}\nTensorFlow's stderr during the import:\n{captured}") from error
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)

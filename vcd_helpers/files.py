"""Writing files so that a reader never finds half of one.

Every file the package writes for later (a run's config, results and evaluations, a rewritten
metrics file, the data cache and its manifest) goes through ``write_atomic``: the bytes go to a
temporary file beside the target, are flushed to the disk, and replace the target in one rename.
A kill, a crash or a full disk leaves either the old file or the new one, never a truncated one.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all (temporary file, fsync, rename).

    Raises OSError naming ``path`` (or the temporary file beside it) when the write fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        if error.filename is not None:
            raise
        # A write's error (a full disk: ENOSPC) names no file: name the one being written.
        raise OSError(error.errno, error.strerror, str(path)) from error
    finally:
        tmp.unlink(missing_ok=True)


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` in NumPy's .npy format, for ``write_atomic``."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()

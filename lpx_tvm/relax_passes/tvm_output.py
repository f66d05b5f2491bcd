"""TVM's own output, kept off the user's terminal where it only repeats an error.

TVM's C++ log lines (``Warning: BlockBuilder destroyed with remaining blocks!`` when the
objects of a failed import or pass are freed) go straight to file descriptor 2, past
Python's ``sys.stderr``; :func:`captured_fd2` takes them for the time of a block, in
which the caller drops its last reference to what the failure left.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

__all__ = ["captured_fd2"]


@contextlib.contextmanager
def captured_fd2():
    """Inside the block, what is written to file descriptor 2 goes to a temporary file;
    the list yielded holds that text once the block has ended."""
    captured = []
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield captured
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                tmp.seek(0)
                captured.append(tmp.read().decode("utf-8", errors="replace"))
    finally:
        os.close(saved)


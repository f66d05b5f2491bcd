"""TVM's own output, kept off the user's terminal.

TVM's C++ log lines (``Warning: BlockBuilder destroyed with remaining blocks!`` when the
objects of a failed import or pass are freed; ``IndexPut: index tensor 0 has ndim=2 for
broadcasting`` for every cache update of a decoder step) go straight to file descriptor
2, past Python's ``sys.stderr``. :func:`captured_fd2` takes them for the time of a
block, in which the caller drops its last reference to what the failure left;
:func:`quiet_tvm` drops TVM's log lines written during a block and passes on the rest.
``LPX_TVM_LOG=1`` in the environment lets TVM's lines through (docs/errors.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading

__all__ = ["captured_fd2", "quiet_tvm", "LOG_ENV"]

LOG_ENV = "LPX_TVM_LOG"  # set to 1: TVM's C++ log lines reach stderr
# A line of TVM's C++ logging: "[12:14:37] /project/src/relax/op/...cc:2459: ..."
_TVM_LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+\.(cc|h|cpp):\d+: ")
_quiet_lock = threading.Lock()
_quiet_depth = [0]  # process-wide: fd 2 is one for all threads


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



@contextlib.contextmanager
def quiet_tvm():
    """Inside the block, TVM's C++ log lines are dropped and everything else written to
    file descriptor 2 is written again once the block ends. A block entered while
    another is open (in any thread: fd 2 is the process's) is part of that one."""
    with _quiet_lock:
        outer = _quiet_depth[0] == 0 and os.environ.get(LOG_ENV, "") in ("", "0")
        _quiet_depth[0] += 1
    if not outer:
        try:
            yield
        finally:
            with _quiet_lock:
                _quiet_depth[0] -= 1
        return
    captured = []
    try:
        with captured_fd2() as captured:
            yield
    finally:
        with _quiet_lock:
            _quiet_depth[0] -= 1
        if captured:
            rest = "".join(line for line in captured[0].splitlines(keepends=True)
                           if not _TVM_LOG_LINE.match(line))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()

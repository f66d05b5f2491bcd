"""Run numpy's BLAS on one thread while the simulator computes.

The simulator's matmuls are tiles (at most a few thousand by a few hundred), one after
another, with Python work in between. A multi-threaded BLAS splits each of them across
threads that spin between calls and meet at barriers: on a machine whose cores are
also busy with other work, one descheduled thread stalls the rest, and the same
matmuls take several times longer than on one thread (measured on a shared 2-core
machine: the ResNet-50 tiles took 1.5 - 2.6 s on two threads, 0.15 - 0.2 s on one).
So the simulator asks numpy's OpenBLAS for one thread for the duration of a run and
restores the previous count afterwards, except around single matmuls big enough for
the threads' synchronization to be a small part of their time (:func:`threads_for`).
OpenBLAS's thread count is process-wide: a matmul that another Python thread runs
meanwhile also gets one thread.

Where numpy's BLAS is not an OpenBLAS this module can find, it changes nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os

import numpy as np

_API = None  # (get, set) once looked up; () when there is none
_SAVED = []  # thread counts that one_thread() replaced, innermost last

# Multiply-adds from which a matmul runs on the threads one_thread() took away: about
# 10 ms of one core's work (e.g. 2048 x 2048 x 320), where a thread's start and the
# barrier at the end cost little.
THREADED_MACS = 1 << 27


def _candidates():
    here = os.path.dirname(np.__file__)
    # Wheels bundle the library next to the package (numpy.libs, or numpy/.dylibs on macOS).
    yield from sorted(glob.glob(os.path.join(here + ".libs", "*openblas*")))
    yield from sorted(glob.glob(os.path.join(here, ".dylibs", "*openblas*")))
    try:  # otherwise: an OpenBLAS this process has loaded (a system numpy)
        with open("/proc/self/maps") as f:
            yield from sorted({line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1]})
    except OSError:
        pass


def _api():
    global _API
    if _API is None:
        _API = ()
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for get, set_ in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                              ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                              ("openblas_get_num_threads", "openblas_set_num_threads")):
                if hasattr(lib, get) and hasattr(lib, set_):
                    g, s = getattr(lib, get), getattr(lib, set_)
                    g.restype, g.argtypes = ctypes.c_int, []
                    s.restype, s.argtypes = None, [ctypes.c_int]
                    _API = (g, s)
                    return _API
    return _API


@contextlib.contextmanager
def one_thread():
    """numpy's OpenBLAS on one thread inside the block (process-wide), as before after it."""
    api = _api()
    if not api:
        yield
        return
    get, set_ = api
    old = get()
    if old == 1:
        yield
        return
    set_(1)
    _SAVED.append(old)
    try:
        yield
    finally:
        _SAVED.pop()
        set_(old)


@contextlib.contextmanager
def threads_for(macs: int):
    """Inside :func:`one_thread`: a matmul of ``macs`` multiply-adds gets the threads that
    one_thread() took away when it is at least :data:`THREADED_MACS`."""
    if macs < THREADED_MACS or not _SAVED:
        yield
        return
    get, set_ = _api()
    set_(_SAVED[-1])
    try:
        yield
    finally:
        set_(1)

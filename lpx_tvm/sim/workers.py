"""Where independent jobs run: in this process, in worker processes, or on a Ray
cluster past one machine. Tuning measures its candidates through these pools, and a
system of chips checks its chips' timing through them (sim/multichip.py)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing

from ..errors import LPXError


class _Inline:
    """Runs every job in this process (workers=0): the simplest, for tests and tiny spaces."""

    remote = False

    def submit(self, fn, *args):
        f = cf.Future()
        try:
            f.set_result(fn(*args))
        except Exception as e:  # the candidate's error becomes its result
            f.set_exception(e)
        return f

    def shutdown(self):
        pass


class _Ray:
    """Sends jobs to a Ray cluster (``ray.init(address)``); Ray is an optional extra.
    Tasks and programs travel as bytes: the cluster's workers share no files with us."""

    remote = True

    def __init__(self, address: str):
        try:
            import ray
        except ImportError:
            raise LPXError("--ray needs Ray: pip install 'lpx_tvm[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        self._remote = {}

    def submit(self, fn, *args):
        if fn not in self._remote:
            self._remote[fn] = self.ray.remote(fn)
        return _RayFuture(self.ray, self._remote[fn].remote(*args))

    def shutdown(self):
        pass


class _RayFuture:
    def __init__(self, ray, ref):
        self.ray, self.ref = ray, ref

    def done(self) -> bool:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        return bool(ready)

    def result(self):
        return self.ray.get(self.ref)


def make_pool(workers: int = 0, ray_address: "str | None" = None):
    """Where jobs run: this process (0), K worker processes, or Ray (``ray_address``).
    Each pool has ``submit(fn, *args)`` returning a future, and ``shutdown()``."""
    if ray_address:
        return _Ray(ray_address)
    if workers <= 0:
        return _Inline()
    return cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))

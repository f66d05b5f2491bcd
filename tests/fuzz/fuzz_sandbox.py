"""Run fuzz cases in a worker process, so that a crash or a hang is an outcome too.

One worker process (multiprocessing, spawn) takes cases one after the other over a pipe:
importing TVM and lpx_tvm costs seconds, so a worker per case would cost more than most
compiles. A case that runs past the timeout is a ``timeout`` (the worker is killed); a
worker that dies is a ``crash`` (with its exit status or signal). Either way the next
case gets a fresh worker, and so does every ``recycle``-th case or a worker grown past a
memory limit, to keep memory bounded.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
import traceback

from fuzz_runner import Outcome

_HERE = os.path.dirname(os.path.abspath(__file__))


class HarnessError(RuntimeError):
    """The generator or the runner failed (a bug of the fuzzer, not of lpx_tvm)."""


def _serve(conn, log: "str | None", run) -> None:
    """The worker: receive a case's tuple, send back the JSON of ``run(*case)``'s outcome
    (or the traceback of a failure of the fuzzer itself)."""
    if log:  # what TVM and the compiler print goes to the log, not between the bench's lines
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        try:
            conn.send({"outcome": run(*case).to_json(), "rss_mib": _rss_mib()})
        except Exception:
            conn.send({"harness_error": traceback.format_exc()})


def run_onnx_case(family: str, index: int, seed: int, preset: str) -> Outcome:
    """The ONNX fuzzer's case (family, index, seed) run on ``preset``."""
    sys.path.insert(0, _HERE)
    import fuzz_runner
    import onnx_graphs

    return fuzz_runner.run_case(onnx_graphs.case(family, index, seed), preset)


def _rss_mib() -> float:
    """This process's resident memory (Linux), MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Sandbox:
    """Runs cases in a worker process with a per-case ``timeout`` (seconds). The worker is
    replaced after ``recycle`` cases or once it holds more than ``max_rss_mib`` MiB
    (compiled models that have run are not all freed: on tsp each keeps tens of MiB)."""

    def __init__(self, timeout: float = 300.0, recycle: int = 50, max_rss_mib: float = 1500.0,
                 log: "str | None" = None):
        self.timeout = timeout
        self.log = log
        self.recycle = recycle
        self.max_rss_mib = max_rss_mib
        self._ctx = mp.get_context("spawn")
        self._proc = self._conn = None
        self._served = 0

    # What a worker runs for a case (a module-level function, so that a spawned process
    # finds it) and the outcome type it replies with: a sandbox of other cases sets these two.
    run_case = run_onnx_case
    outcome = Outcome

    def run(self, *case) -> Outcome:
        """The outcome of ``case`` (here: family, index, seed, preset)."""
        if self._proc is None or not self._proc.is_alive() or self._served >= self.recycle:
            self._restart()
        start = time.perf_counter()
        self._conn.send(case)
        self._served += 1
        if not self._conn.poll(self.timeout):
            self.close()
            return self.outcome("timeout", f"no result after {self.timeout:g} s",
                                seconds=time.perf_counter() - start)
        try:
            reply = self._conn.recv()
        except (EOFError, ConnectionError):
            self._proc.join(10)
            status = self._proc.exitcode
            self._proc = None
            why = (f"killed by {signal.Signals(-status).name}" if status is not None and status < 0
                   else f"worker exited with status {status}")
            return self.outcome("crash", why, seconds=time.perf_counter() - start)
        if "harness_error" in reply:
            raise HarnessError(f"{case}:\n{reply['harness_error']}")
        if reply["rss_mib"] > self.max_rss_mib:
            self.close()
        return self.outcome.from_json(reply["outcome"])

    def _restart(self) -> None:
        self.close()
        self._conn, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.log, type(self).run_case), daemon=True)
        self._proc.start()
        child.close()
        self._served = 0

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join()
            self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

"""Chrome / Perfetto trace JSON of a simulated run: one track group per instruction queue.

Open the file in https://ui.perfetto.dev or chrome://tracing. Each queue (``mem12``,
``mxm0``, ``vxm3``, ...) is a process; its ports (``mxm0.install``, ``mxm0.compute``,
...) are threads, so concurrent installs and multiplies of one plane show side by side.
Times are microseconds at the machine's clock; every event also carries its cycles.
"""

from __future__ import annotations

import json
import os
import tempfile

from ..files import user_mode


class TraceRecorder:
    def __init__(self, clock_hz: float, name: str = ""):
        self._us_per_cycle = 1e6 / clock_hz
        self._name = name
        self._events = []
        self._pids = {}
        self._tids = {}

    def _ids(self, queue: str, port: str):
        if queue not in self._pids:
            self._pids[queue] = len(self._pids) + 1
        pid = self._pids[queue]
        if port not in self._tids:
            self._tids[port] = (pid, len(self._tids) + 1)
        return pid, self._tids[port][1]

    def add(self, queue: str, port: str, op: str, start: int, cycles: int, index: int, tag: str):
        pid, tid = self._ids(queue, port)
        self._events.append({
            "name": op, "cat": queue.rstrip("0123456789"), "ph": "X", "pid": pid, "tid": tid,
            "ts": start * self._us_per_cycle, "dur": max(cycles, 1) * self._us_per_cycle,
            "args": {"cycle": start, "cycles": cycles, "instr": index, "tag": tag},
        })

    def to_json(self) -> dict:
        meta = []
        for queue, pid in self._pids.items():
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": queue}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        for port, (pid, tid) in self._tids.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": port}})
        return {"traceEvents": meta + self._events, "displayTimeUnit": "ns",
                "otherData": {"program": self._name, "us_per_cycle": self._us_per_cycle}}

    def save(self, path: "str | os.PathLike"):
        path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        os.fchmod(fd, user_mode())  # mkstemp makes it private (0600); a trace is the user's file
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_json(), f)
        os.replace(tmp, path)

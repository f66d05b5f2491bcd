"""A profiled model run as one Chrome / Perfetto trace (trace-event JSON; docs/profile.md).

Open it in https://ui.perfetto.dev or chrome://tracing. One process per unit kind, one
thread per unit port: ``MXM`` (each plane's install streams, compute and drain), ``VXM`` (one
per ALU), ``SXM``, ``MEM west`` and ``MEM east`` (each slice's read and write port, by
the slice's side of the VXM on the floorplan), ``DMA``, ``C2C``. ``LPX`` holds the region
calls, the layer owning each cycle (the profile's exclusive attribution) and the counter
tracks (SRAM occupancy, streams in use); ``host`` holds the CPU kernels the VM ran
between regions, each as long as its measured wall time.

Every slice on a unit is named by its instruction's layer (the report's layer name).
The clock is real time: region calls take their simulated cycles at the machine's clock,
CPU kernels their measured wall time, one after another in the order the VM made them.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from ..files import user_mode
from ..machine.isa import NOPS
from .profile import Profile, RegionTimeline, owned_spans

PROCESSES = ("host", "LPX", "MXM", "VXM", "SXM", "MEM west", "MEM east", "DMA", "C2C")
COUNTER_SAMPLES = 2000  # counter values per region call, at most (the peak of each bin)
_PORT_ORDER = {"mxm.install": 0, "mxm.compute": 1, "mxm.drain": 2, "mem.rd": 0, "mem.wr": 1, "c2c.tx": 0, "c2c.rx": 1}
_PORT_WORD = {"mxm.install": "install", "mxm.compute": "compute", "mxm.drain": "drain", "mem.rd": "read",
              "mem.wr": "write", "c2c.tx": "send", "c2c.rx": "receive"}


class _Tracks:
    """Processes and threads by name, numbered in a stable order when the trace is made."""

    def __init__(self):
        self.threads = {}  # (process, sort key, thread name) -> events

    def add(self, process: str, key: tuple, thread: str, event: dict):
        self.threads.setdefault((process, key, thread), []).append(event)

    def events(self) -> list:
        meta, body = [], []
        pids = {p: n + 1 for n, p in enumerate(PROCESSES)}
        used = sorted({p for p, _, _ in self.threads}, key=PROCESSES.index)
        for p in used:
            meta.append({"name": "process_name", "ph": "M", "pid": pids[p], "tid": 0, "args": {"name": p}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": pids[p], "tid": 0,
                         "args": {"sort_index": pids[p]}})
        tid = {}
        for (p, key, thread) in sorted(self.threads, key=lambda t: (PROCESSES.index(t[0]), t[1])):
            tid[p, key, thread] = n = len([k for k in tid if k[0] == p]) + 1
            meta.append({"name": "thread_name", "ph": "M", "pid": pids[p], "tid": n, "args": {"name": thread}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": pids[p], "tid": n, "args": {"sort_index": n}})
        for k, events in self.threads.items():
            for e in events:
                e["pid"], e["tid"] = pids[k[0]], tid[k]
                body.append(e)
        return meta + body


def model_trace(profile: Profile) -> dict:
    """The trace-event JSON object of ``profile``'s run."""
    cfg = profile.cfg
    us = 1e6 / cfg.clock_hz  # microseconds per cycle
    tracks = _Tracks()
    west = {i for i in range(cfg.mem_slices) if cfg.position("MEM", i) < cfg.position("VXM", 0)}
    counters = {}
    clock = 0.0
    for call_index, call in enumerate(profile.calls):
        if call.cpu:
            tracks.add("host", (0,), "CPU kernels (measured wall time)",
                       {"name": call.cpu, "ph": "X", "ts": clock, "dur": call.wall_s * 1e6,
                        "args": {"wall_us": call.wall_s * 1e6}})
            clock += call.wall_s * 1e6
            continue
        tl = profile.timelines[call.region]
        tracks.add("LPX", (0,), "region calls",
                   {"name": call.region, "ph": "X", "ts": clock, "dur": tl.cycles * us,
                    "args": {"cycles": tl.cycles, "call": call_index}})
        _unit_events(tracks, tl, clock, us, west)
        _owner_events(tracks, tl, clock, us)
        if call.region not in counters:
            counters[call.region] = _counter_series(tl)
        for name, series in counters[call.region]:
            for cycle, values in series:
                tracks.add("LPX", (9,), name, {"name": name, "ph": "C", "ts": clock + cycle * us, "args": values})
        clock += tl.cycles * us
    return {"traceEvents": tracks.events(), "displayTimeUnit": "ns",
            "otherData": {"preset": cfg.name, "precision": profile.precision, "cycles": profile.cycles,
                          "us_per_cycle": us, "clock": "LPX regions: simulated cycles at the machine clock; "
                                                       "CPU kernels: measured wall time"}}


def _unit_events(tracks: _Tracks, tl: RegionTimeline, offset: float, us: float, west: set):
    for k, (ins, t) in enumerate(zip(tl.instrs, tl.timings)):
        if ins.op in NOPS or t.occupancy <= 0:
            continue  # a nop holds its queue but does no work
        event = {"name": tl.layer[k], "ph": "X", "ts": offset + ins.cycle * us, "dur": t.occupancy * us,
                 "args": {"op": ins.op, "tag": ins.tag, "cycle": ins.cycle, "cycles": t.occupancy,
                          "region": tl.region.name, "instr": k}}
        for port in t.ports:
            process, key, thread = _track_of(port, west)
            tracks.add(process, key, thread, dict(event) if len(t.ports) > 1 else event)


def _track_of(port: tuple, west: set) -> tuple:
    """(process, sort key, thread name) of a unit port such as ``("mxm.compute", 2)`` or
    ``("mxm.install", 1, 7)`` (plane 1's install stream 7: a w-byte install holds w)."""
    kind, index, *stream = port
    unit = kind.split(".")[0]
    order = _PORT_ORDER.get(kind, 0)
    if unit == "mem":
        return ("MEM west" if index in west else "MEM east"), (index, order), f"slice {index} {_PORT_WORD[kind]}"
    if stream:
        return "MXM", (index, order, *stream), f"plane {index} {_PORT_WORD[kind]} stream {stream[0]}"
    if unit == "mxm":
        return "MXM", (index, order), f"plane {index} {_PORT_WORD[kind]}"
    if unit == "c2c":
        return "C2C", (index, order), f"link {index} {_PORT_WORD[kind]}"
    name = {"vxm": "ALU", "sxm": "SXM", "dma": "engine"}[unit]
    return unit.upper(), (index,), f"{name} {index}"


def _owner_events(tracks: _Tracks, tl: RegionTimeline, offset: float, us: float):
    """The layer owning each cycle, runs of one owner merged into one slice."""
    runs = []
    for start, end, k in owned_spans(tl.issue, tl.done):
        layer = tl.layer[k]
        if runs and runs[-1][2] == layer and runs[-1][1] == start:
            runs[-1][1] = end
        else:
            runs.append([start, end, layer])
    for start, end, layer in runs:
        tracks.add("LPX", (1,), "layer owning each cycle",
                   {"name": layer, "ph": "X", "ts": offset + start * us, "dur": (end - start) * us,
                    "args": {"cycle": start, "cycles": end - start, "region": tl.region.name}})


# ---- counters ----------------------------------------------------------------------

def _counter_series(tl: RegionTimeline) -> list:
    """[(counter name, [(cycle, {series: value})])] of one region call."""
    east, west = stream_planes(tl)
    return [("SRAM occupancy (bytes)", [(c, {"bytes": v}) for c, v in _samples(sram_occupancy(tl))]),
            ("streams in use (byte-planes)",
             [(c, {"east": int(e), "west": int(w)}) for c, (e, w) in _samples2(east, west)])]


def _expand(counts: np.ndarray) -> tuple:
    """(group, k) of ``sum(counts)`` items: item ``k`` of group ``group``."""
    group = np.repeat(np.arange(len(counts)), counts)
    k = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return group, k


def sram_occupancy(tl: RegionTimeline) -> np.ndarray:
    """SRAM bytes holding a value still to be read, at each cycle ``0..cycles``.

    A line is live from the cycle it is written (cycle 0 for the program's initial image
    and its inputs) through the last cycle it is read before it is written again; the
    initial image (weights, constants: resident across runs) and the outputs stay live to
    the end. Gathers read data-dependent lines: only their tables' initial images count.
    """
    cfg, prog, n = tl.cfg, tl.region.program, tl.cycles
    lanes, lines_per_slice = cfg.lanes, cfg.lines_per_slice
    mem = [(ins.unit, ins.addr, ins.stride, ins.inner, ins.outer, ins.count,
            ins.dtype.itemsize, ins.cycle, ins.op == "mem.write")
           for ins in tl.instrs if ins.op in ("mem.read", "mem.write")]
    parts = [_access_lines(np.array(mem, np.int64).reshape(-1, 9))]
    fixed = []  # (slice, first line, lines, written at, read at)
    for img in prog.sram_init:
        fixed.append((img.slice, img.addr, len(img.data) // lanes, 0, n))
    for b in prog.bindings:
        if b.offchip is not None:
            continue
        lay = b.layout
        w = lay.dtype.itemsize
        for j in range(-(-lay.cols // lanes)):
            for q in range(lay.nchunks):
                (sl, addr), _, rows = lay.chunk(j, q)
                for r in range(rows):
                    fixed.append((sl, addr + r * lay.row_stride, w, 0, n if b.role == "output" else -1))
    for sl, first, count, written, read in fixed:
        lines = np.arange(first, first + count, dtype=np.int64)
        parts.append((np.full(count, sl), lines, np.full(count, written), np.ones(count, bool)))
        if read >= 0:
            parts.append((np.full(count, sl), lines, np.full(count, read), np.zeros(count, bool)))
    sl, line, cycle, write = (np.concatenate(x) for x in zip(*parts))
    key = sl * lines_per_slice + line
    order = np.lexsort((write, cycle, key))  # per line in time; at one cycle a read before a write
    key, cycle, write = key[order], cycle[order], write[order]
    delta = np.zeros(n + 2, np.int64)
    if len(key):
        first = np.concatenate(([True], key[1:] != key[:-1]))
        starts = np.flatnonzero(first | write)  # a segment: one value of one line
        ends = np.concatenate((starts[1:], [len(key)])) - 1
        begin = np.where(write[starts], cycle[starts], 0)
        last = np.where(ends > starts, cycle[ends], np.where(write[starts], cycle[starts], 0))
        np.add.at(delta, np.clip(begin, 0, n + 1), lanes)
        np.add.at(delta, np.clip(last + 1, 0, n + 1), -lanes)
    return np.cumsum(delta)[: n + 1]


def _access_lines(mem: np.ndarray) -> tuple:
    """(slice, line, cycle, is write) of every line the mem.read / mem.write rows of ``mem``
    touch: vector ``k`` at ``addr + k*stride`` (2-D: ``addr + (k//inner)*outer +
    (k%inner)*stride``), ``itemsize`` lines from there, at cycle ``issue + k``."""
    sl, addr, stride, inner, outer, count, width, issue, write = mem.T
    g, k = _expand(count)
    inner_g = np.maximum(inner[g], 1)
    start = np.where(inner[g] > 0, addr[g] + (k // inner_g) * outer[g] + (k % inner_g) * stride[g],
                     addr[g] + k * stride[g])
    w = width[g]
    g2, j = _expand(w)
    return sl[g][g2], start[g2] + j, (issue[g] + k)[g2], write[g][g2].astype(bool)


def stream_planes(tl: RegionTimeline) -> tuple:
    """(east, west): byte-planes being emitted onto the streams at each cycle ``0..cycles``
    (a value of ``itemsize`` bytes a lane takes ``itemsize`` of them)."""
    n = tl.cycles
    out = {"E": np.zeros(n + 2, np.int64), "W": np.zeros(n + 2, np.int64)}
    for ins, t in zip(tl.instrs, tl.timings):
        if t.emit is None or not t.emit_count or ins.dst is None:
            continue
        size = (ins.out_dtype if ins.op in ("vxm.cvt", "vxm.requant") else ins.dtype).itemsize
        d = out[ins.dst.dir]
        d[min(t.emit, n + 1)] += size
        d[min(t.emit + t.emit_count, n + 1)] -= size
    return np.cumsum(out["E"])[: n + 1], np.cumsum(out["W"])[: n + 1]


def _bins(n: int) -> np.ndarray:
    return np.arange(0, n, max(1, -(-n // COUNTER_SAMPLES)))


def _samples(values: np.ndarray) -> list:
    """[(cycle, value)] at most :data:`COUNTER_SAMPLES` long: each bin's peak, only where it changes."""
    starts = _bins(len(values))
    peaks = np.maximum.reduceat(values, starts)
    out = []
    for c, v in zip(starts.tolist(), peaks.tolist()):
        if not out or out[-1][1] != v:
            out.append((c, int(v)))
    return out


def _samples2(a: np.ndarray, b: np.ndarray) -> list:
    starts = _bins(len(a))
    pa, pb = np.maximum.reduceat(a, starts), np.maximum.reduceat(b, starts)
    out = []
    for c, x, y in zip(starts.tolist(), pa.tolist(), pb.tolist()):
        if not out or out[-1][1] != (x, y):
            out.append((c, (x, y)))
    return out


def save_trace(trace: dict, path: "str | os.PathLike") -> None:
    """Write ``trace`` to ``path`` (replaced only once complete; the user's file mode)."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    os.fchmod(fd, user_mode())
    with os.fdopen(fd, "w") as f:
        json.dump(trace, f)
    os.replace(tmp, path)

"""The one report of a run: a compiled model's, an artifact's or a program binary's.

:class:`Report` is what ``CompiledModel.report`` returns, what ``lpx-tvm run --report``
writes (:meth:`Report.to_json`) and what reads it back (:meth:`Report.from_json`); its
fields and their meaning are in docs/report.md. ``report["cycles"]`` reads a field of the
JSON form, as the written file has it.

Per-layer cycles are attributed from the program alone (the schedule is static, so the
issue cycle and completion of every instruction follow from
:func:`lpx_tvm.machine.timing.timing`): each cycle is charged to the *oldest* instruction
in flight at that cycle (the earliest issued, ties by program order), the way an
in-order completion queue charges a cycle to its head; a cycle with nothing in flight
is ``(idle)``. Every cycle has at most one owner, so a region's layer cycles add up
exactly to its cycles (:func:`layer_cycles`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from ..errors import LPXError
from ..machine.config import LPXConfig
from ..machine.isa import DType
from ..machine.timing import timing

SCHEMA_VERSION = 1
IDLE = "(idle)"  # the layer of the cycles in which no instruction is in flight
UNTAGGED = "(untagged)"  # the layer of instructions without a tag


class ReportError(LPXError):
    """A report file that is not a report of this schema."""


@dataclass
class Offload:
    """What partitioning sent to LPX and what it left on the CPU, as the runtime keeps it
    (the JSON form of the partitioner's ``OffloadReport``, so a loaded artifact needs no
    compiler to read it).

    ``lpx``, ``cpu``: op counts per side; ``reasons``: per op type left on the CPU, the
    distinct reasons; ``cpu_ops``: every CPU op in program order; ``composites``: how
    often each ``lpx.`` composite was formed; ``regions``: number of LPX regions;
    ``config``, ``precision``: what the checks judged against.
    """

    lpx: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    cpu_ops: list = field(default_factory=list)
    composites: dict = field(default_factory=dict)
    regions: int = 0
    config: str = ""
    precision: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: "dict | None") -> "Offload":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


@dataclass
class Layer:
    """One layer's share of a run: ``cycles`` attributed to it (see the module docstring),
    ``macs`` its MXM multiply-accumulates (the simulator's count), ``instructions`` run."""

    name: str
    cycles: int = 0
    macs: int = 0
    instructions: int = 0
    weights: "dict | None" = None  # where its MXM weights are read from (see weight_placement)


@dataclass
class Report(Mapping):
    """A run's cycles, latency, utilization, traffic and per-layer numbers (docs/report.md).

    It reads as a read-only mapping of its JSON form, as the written file has it:
    ``report["cycles"]``, ``report.get(...)``, ``keys()``, ``items()``, ``dict(report)``.

    For a program binary the compiler's fields are empty: ``precision`` None, ``offload``
    empty, ``weight_bytes`` and ``streamed_weight_bytes`` 0, ``tuning`` None.
    ``nonfinite_outputs`` counts the inf and NaN values of each output (empty before a
    model's first run and for a timing-only run).
    """

    preset: str
    precision: "str | None"
    cycles: int
    latency_s: float
    macs: int
    mxm_utilization: float
    mxm_dtypes: list = field(default_factory=list)
    offload: Offload = field(default_factory=Offload)
    layers: list = field(default_factory=list)  # [Layer]; their cycles add up to ``cycles``
    sim_wall_s: float = 0.0
    cpu_wall_s: float = 0.0
    sram_bytes: int = 0
    offchip_bytes: int = 0
    weight_bytes: int = 0
    streamed_weight_bytes: int = 0
    chips_to_hold_weights: int = 1
    tuning: "dict | None" = None
    # {output name: its inf / NaN values} of the run (fp16 overflows show up here)
    nonfinite_outputs: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        """The report as plain JSON types."""
        out = asdict(self)
        out["offload"] = self.offload.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Report":
        """Read :meth:`to_json`'s dict back; another schema version is an error."""
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ReportError(f"report schema version {version}: this lpx_tvm reads version {SCHEMA_VERSION}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ReportError(f"report has unknown field(s) {unknown}")
        data = dict(data)
        data["offload"] = Offload.from_json(data.get("offload"))
        data["layers"] = [Layer(**row) for row in data.get("layers", [])]
        return cls(**data)

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "Report":
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_json(json.load(f))
        except json.JSONDecodeError as e:
            raise ReportError(f"{path}: not a JSON report ({e})") from None

    def __getitem__(self, key: str):
        if key not in _REPORT_FIELDS:
            raise KeyError(key)
        return self.to_json()[key]  # a copy: the report stays as it is

    def __iter__(self):
        return iter(_REPORT_FIELDS)

    def __len__(self) -> int:
        return len(_REPORT_FIELDS)


_REPORT_FIELDS = tuple(f.name for f in fields(Report))


# ---- per-layer attribution ---------------------------------------------------------

def layer_of(tag: str) -> str:
    """An instruction tag's layer: the tag up to its first ``.`` (``lv3.install`` -> ``lv3``)."""
    return tag.split(".")[0] if tag else UNTAGGED


def instruction_spans(cfg: LPXConfig, program) -> tuple:
    """``(issue, done)`` cycle arrays, one entry per instruction of ``program`` (in program
    order): the instruction is in flight over ``[issue, done)``."""
    instrs = program.instrs
    issue = np.fromiter((ins.cycle for ins in instrs), dtype=np.int64, count=len(instrs))
    done = np.fromiter((t.done for t in instruction_timings(cfg, instrs)), dtype=np.int64, count=len(instrs))
    return issue, np.maximum(done, issue)


def instruction_timings(cfg: LPXConfig, instrs: list) -> list:
    """The :func:`~lpx_tvm.machine.timing.timing` of each instruction of ``instrs`` (in
    their order). A multiply's depends on the dtype of the weights installed in its
    buffer, so the instructions are walked in issue order (as the simulator does)."""
    out = [None] * len(instrs)
    installed = {}  # (plane, buffer) -> weight dtype
    for i in sorted(range(len(instrs)), key=lambda i: (instrs[i].cycle, instrs[i].op != "icu.sync")):
        ins = instrs[i]
        weights = None
        if ins.op == "mxm.install":
            installed[ins.unit, ins.buf] = ins.dtype
        elif ins.op in ("mxm.mul", "mxm.mac"):
            weights = installed.get((ins.unit, ins.buf))
            weights = None if weights is DType.NONE else weights
        out[i] = timing(cfg, ins, mxm_weights=weights)
    return out


def owned_cycles(issue: np.ndarray, done: np.ndarray) -> tuple:
    """Cycles each interval ``[issue[i], done[i])`` owns when every cycle goes to the
    earliest-starting interval covering it (ties: the lower index); and the cycles in
    ``[0, max(done))`` no interval covers.

    Sorted by start, the cycles the earlier intervals cover from ``issue[i]`` on are
    exactly ``[issue[i], max(done[:i]))`` (each of them started no later), so interval
    ``i`` owns ``[max(issue[i], max(done[:i])), done[i])``.
    """
    if len(issue) == 0:
        return np.zeros(0, dtype=np.int64), 0
    order = np.lexsort((np.arange(len(issue)), issue))
    s, e = issue[order], done[order]
    reach = np.concatenate(([0], np.maximum.accumulate(e)[:-1]))  # furthest end before each
    owned_sorted = np.maximum(0, e - np.maximum(s, reach))
    owned = np.empty_like(owned_sorted)
    owned[order] = owned_sorted
    idle = int(e.max()) - int(owned.sum())
    return owned, idle


def layer_cycles(cfg: LPXConfig, program) -> dict:
    """{layer tag: cycles} of one run of ``program``, adding up to its cycles (the last
    instruction's completion); ``(idle)`` holds the cycles with nothing in flight."""
    issue, done = instruction_spans(cfg, program)
    owned, idle = owned_cycles(issue, done)
    out = {}
    for ins, n in zip(program.instrs, owned.tolist()):
        layer = layer_of(ins.tag)
        out[layer] = out.get(layer, 0) + n
    if idle:
        out[IDLE] = idle
    return out


def layer_instructions(program) -> dict:
    """{layer tag: instruction count} of ``program``."""
    out = {}
    for ins in program.instrs:
        layer = layer_of(ins.tag)
        out[layer] = out.get(layer, 0) + 1
    return out


def weight_placement(cfg: LPXConfig, program) -> dict:
    """{layer tag: how its weights feed the MXM}: per layer, the ``installs`` (parts) and
    ``rows`` it installs, the install ``lanes`` and SRAM ``slices`` they use, the ``hops``
    from those slices to the planes (min, max), and ``rows_per_cycle``: rows over the
    cycles each plane had one of them in flight, summed over planes, the install rate
    reached while installing (``mxm.install_streams`` at most, in int8)."""
    # An install reads what a read put on its stream: the same stream and D (docs/machine.md).
    reads = {}
    for ins in program.instrs:
        if ins.op == "mem.read":
            t = timing(cfg, ins)
            reads[(ins.dst, t.emit - ins.dst.sign * t.position)] = (ins.unit, t.position)
    out = {}
    for ins in program.instrs:
        if ins.op != "mxm.install":
            continue
        row = out.setdefault(layer_of(ins.tag), {"installs": 0, "rows": 0, "lanes": set(), "slices": set(),
                                                 "hops": [], "busy": {}})
        row["installs"] += 1
        row["rows"] += ins.count
        row["lanes"].add(ins.lane)
        plane_pos = timing(cfg, ins).position
        src = reads.get((ins.src0, ins.cycle - ins.src0.sign * plane_pos))
        if src is not None:
            row["slices"].add(src[0])
            row["hops"].append(abs(plane_pos - src[1]))
        row["busy"].setdefault(ins.unit, []).append((ins.cycle, ins.cycle + ins.count))
    for row in out.values():
        hops = row.pop("hops")
        installing = sum(_covered(spans) for spans in row.pop("busy").values())
        row["lanes"], row["slices"] = len(row["lanes"]), len(row["slices"])
        row["hops"] = [min(hops), max(hops)] if hops else None
        row["rows_per_cycle"] = round(row["rows"] / installing, 2)
    return out


def _covered(spans) -> int:
    """Cycles in the union of half-open intervals."""
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def mxm_dtypes(programs) -> list:
    """The activation dtypes the MXM multiplies in ``programs`` (``int8``, ``fp16``, ...)."""
    return sorted({ins.dtype.short for p in programs for ins in p.instrs if ins.op in ("mxm.mul", "mxm.mac")})


def _peak_dtype(cfg: LPXConfig, dtypes: list) -> str:
    """The dtype whose MXM peak a program's utilization divides by: the fastest rate among
    those it multiplies (int8 when it multiplies nothing)."""
    rates = sorted(set(dtypes) & set(cfg.mxm_cycles_per_vector))
    return min(rates, key=lambda d: cfg.mxm_cycles_per_vector[d]) if rates else "int8"


def nonfinite_counts(outputs: dict) -> dict:
    """{name: number of inf and NaN values} of each output array (0 for integer outputs)."""
    out = {}
    for name, a in outputs.items():
        a = np.asarray(a)
        out[name] = int(a.size - np.count_nonzero(np.isfinite(a))) if a.dtype.kind in "fc" else 0
    return out


# ---- the two reports ---------------------------------------------------------------

def model_report(exe, nonfinite_outputs: "dict | None" = None) -> Report:
    """The report of an executable's last run (``exe``: an
    :class:`~lpx_tvm.runtime.executable.LPXExecutable`; ``nonfinite_outputs``: that run's
    :func:`nonfinite_counts`, by model output name)."""
    cfg, s = exe.config, exe.stats
    peak = cfg.peak_macs_per_cycle_for(exe.precision)  # int8: the int8 rate (4x fp16 on tsp)
    weight_bytes = sum(r.weight_bytes for r in exe.regions.values())
    return Report(
        preset=cfg.name,
        precision=str(exe.precision),
        cycles=s.cycles,
        latency_s=cfg.seconds(s.cycles),
        macs=s.useful_macs,
        mxm_utilization=s.useful_macs / (peak * s.cycles) if s.cycles else 0.0,
        mxm_dtypes=exe.mxm_dtypes,
        offload=exe.offload if exe.offload is not None else Offload(),
        layers=exe.layers(),
        sim_wall_s=s.sim_wall_s,
        cpu_wall_s=max(0.0, s.total_wall_s - s.sim_wall_s),
        sram_bytes=s.sram_bytes,
        offchip_bytes=s.offchip_bytes,
        weight_bytes=weight_bytes,
        streamed_weight_bytes=sum(r.streamed_bytes for r in exe.regions.values()),
        # Chips whose SRAM would hold every weight resident (the multi-chip mapping's job).
        chips_to_hold_weights=max(1, math.ceil(weight_bytes / cfg.sram_bytes)),
        tuning=exe.tuning,
        nonfinite_outputs=dict(nonfinite_outputs or {}),
    )


def program_report(result, program, sim_wall_s: float = 0.0) -> Report:
    """The report of one run of a program binary (``result``: its ``SimResult``)."""
    cfg, c = result.config, result.counters
    dtypes = mxm_dtypes([program])
    peak = cfg.peak_macs_per_cycle_for(_peak_dtype(cfg, dtypes))
    cycles, counts = layer_cycles(cfg, program), layer_instructions(program)
    macs = {}
    for tag, t in c.by_tag.items():
        macs[layer_of(tag)] = macs.get(layer_of(tag), 0) + t.macs
    placement = weight_placement(cfg, program)
    layers = [Layer(name, n, macs.get(name, 0), counts.get(name, 0), placement.get(name))
              for name, n in cycles.items()]
    return Report(
        preset=cfg.name, precision=None, cycles=c.cycles, latency_s=cfg.seconds(c.cycles), macs=c.macs,
        mxm_utilization=c.macs / (peak * c.cycles) if c.cycles else 0.0, mxm_dtypes=dtypes,
        layers=_in_order(layers), sim_wall_s=sim_wall_s,
        sram_bytes=c.sram_bytes_read + c.sram_bytes_written,
        offchip_bytes=c.offchip_bytes_read + c.offchip_bytes_written,
        nonfinite_outputs=nonfinite_counts(result.outputs or {}),
    )


def _in_order(layers: list) -> list:
    """``(idle)`` last, the others as given."""
    return [x for x in layers if x.name != IDLE] + [x for x in layers if x.name == IDLE]

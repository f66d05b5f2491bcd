"""Where a compiled model's cycles go: one recorded run, each layer's exclusive cycles,
its floors and its bottleneck (docs/profile.md).

:func:`profile_model` runs a model once on the simulator with the VM instrumented, so the
order of its region calls and CPU kernels, and each CPU kernel's wall time, are known.
Everything about the LPX side follows from the programs alone (the schedule is static):
each instruction's ports and busy cycles come from :func:`lpx_tvm.machine.timing.timing`,
as the simulator's own checks and traces take them.

Exclusive attribution (:func:`exclusive_cycles`): within a region, a cycle belongs to the
earliest-issued instruction still in flight at that cycle (ties: program order); a cycle
in which nothing is in flight belongs to the next instruction to issue, as the latency
that instruction waited on. Every cycle of a region then has exactly one owner, so the
layers' cycles add up to the region's, and over all region calls to the model's.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .floors import Floors, add, floors_of
from .compiled_region import REGION_PREFIX
from .report import instruction_timings, layer_of

# A layer whose cycles exceed this many times its largest floor is bound by dependency
# latency: no resource is even a third busy, so waiting on results decides its time.
DEPENDENCY_FACTOR = 3.0

BOTTLENECK_OF_FLOOR = {"multiply": "multiply", "install": "install", "sram_read": "SRAM port",
                       "sram_write": "SRAM port", "stream": "stream budget", "vxm": "VXM", "sxm": "SXM",
                       "dma": "DMA"}
DEPENDENCY = "dependency latency"
OVERLAPPED = "overlapped"  # a layer that owns no cycle: all its work ran under other layers'


# ---- one recorded run --------------------------------------------------------------

@dataclass
class Call:
    """One call the VM made: an LPX region (``region`` set) or a CPU kernel (``cpu`` set,
    with its measured wall time)."""

    region: "str | None" = None
    cpu: "str | None" = None
    wall_s: float = 0.0


@contextmanager
def recorded_calls(executable):
    """While active, every run of ``executable`` appends its VM calls to the yielded list:
    region calls and CPU kernels (the VM's own builtins, allocations and shape checks, are
    left out)."""
    calls, started = [], {}

    def instrument(func, symbol, before, ret, *args):
        now = time.perf_counter()
        name = str(symbol)
        if name.startswith(REGION_PREFIX):
            if before:
                calls.append(Call(region=name[len(REGION_PREFIX):]))
        elif not name.startswith("vm.builtin."):
            if before:
                started[name] = now
            else:
                calls.append(Call(cpu=name, wall_s=now - started.pop(name, now)))
        return 0

    old = executable.instrument
    executable.instrument = instrument
    try:
        yield calls
    finally:
        executable.instrument = old


# ---- one region's static timeline --------------------------------------------------

def exclusive_cycles(issue: np.ndarray, done: np.ndarray) -> tuple:
    """``(owned, waited)`` per interval ``[issue[i], done[i])`` under the exclusive rule of
    the module docstring; ``owned`` adds up to ``max(done)``, ``waited`` is the part of
    ``owned`` in which nothing was in flight (so ``owned >= waited``).

    Sorted by start, the cycles earlier intervals cover from ``issue[i]`` on end at
    ``reach[i] = max(done[:i])``; interval ``i`` owns ``[reach[i], done[i])`` (the gap
    ``[reach[i], issue[i])`` included, when there is one). The owned spans tile
    ``[0, max(done))``.
    """
    if len(issue) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((np.arange(len(issue)), issue))
    s, e = issue[order], done[order]
    reach = np.concatenate(([0], np.maximum.accumulate(e)[:-1]))
    owned, waited = np.empty_like(s), np.empty_like(s)
    owned[order] = np.maximum(0, e - reach)
    waited[order] = np.clip(s - reach, 0, None)
    return owned, waited


def owned_spans(issue: np.ndarray, done: np.ndarray) -> list:
    """``[(start, end, instruction index)]``: the spans the instructions own, in time order."""
    order = np.lexsort((np.arange(len(issue)), issue))
    e = done[order]
    reach = np.concatenate(([0], np.maximum.accumulate(e)[:-1]))
    keep = e > reach
    return list(zip(reach[keep].tolist(), e[keep].tolist(), order[keep].tolist()))


class RegionTimeline:
    """One region's program as the machine runs it: every instruction's :class:`Timing`,
    its layer (the report's stable layer name), the exclusive cycles, and per layer its
    instructions, cycles and floors."""

    def __init__(self, cfg, region):
        self.cfg, self.region = cfg, region
        instrs = self.instrs = region.program.instrs
        self.timings = instruction_timings(cfg, instrs)
        self.issue = np.fromiter((i.cycle for i in instrs), np.int64, len(instrs))
        self.done = np.maximum(np.fromiter((t.done for t in self.timings), np.int64, len(instrs)), self.issue)
        self.cycles = int(self.done.max()) if len(instrs) else 0
        self.tags = [layer_of(i.tag) for i in instrs]
        self.layer = [self.layer_name(t) for t in self.tags]
        self.owned, self.waited = exclusive_cycles(self.issue, self.done)

    def layer_name(self, tag: str) -> str:
        """The report's name of a layer tag: its source name, else ``<region>/<tag>``
        (tags repeat across regions), ``(untagged)`` as is (as ``LPXExecutable.layers``)."""
        named = self.region.layer_names.get(tag)
        return named or (tag if tag.startswith("(") else f"{self.region.name}/{tag}")

    @cached_property
    def layers(self) -> dict:
        """{layer name: :class:`LayerPart`} in order of first issue."""
        by_layer = {}
        for k in np.argsort(self.issue, kind="stable").tolist():
            by_layer.setdefault(self.layer[k], []).append(k)
        out = {}
        for name, idx in by_layer.items():
            out[name] = LayerPart(int(self.owned[idx].sum()), int(self.waited[idx].sum()),
                                  int(self.done[idx].max() - self.issue[idx].min()), len(idx),
                                  floors_of(self.cfg, [self.instrs[k] for k in idx]), {self.tags[k] for k in idx})
        return out


@dataclass
class LayerPart:
    """A layer's part of one region call: the cycles it owns (``waited`` of them with
    nothing in flight), its ``span`` (first issue to last completion), its instructions,
    their floors, and the instruction tags that name it."""

    cycles: int
    waited: int
    span: int
    instructions: int
    floors: Floors
    tags: set


# ---- the per-layer table -----------------------------------------------------------

@dataclass
class LayerProfile:
    """One layer's line of the table (docs/profile.md): ``cycles`` it owns (``waited`` of
    them with nothing in flight), its ``floors`` over its own instructions, the binding
    one's ``floor_kind`` and ``floor_cycles``, ``floor_fraction`` = floor / cycles, and the
    ``bottleneck`` that follows. ``span``: summed over region calls, the cycles from the
    layer's first issue to its last completion (overlapping other layers': the roofline's
    time base)."""

    name: str
    cycles: int = 0
    waited: int = 0
    span: int = 0
    instructions: int = 0
    macs: int = 0
    mxm_dtype: str = ""
    floors: Floors = field(default_factory=Floors)

    @property
    def floor_kind(self) -> str:
        return self.floors.largest()[0]

    @property
    def floor_cycles(self) -> float:
        return self.floors.largest()[1]

    @property
    def floor_fraction(self) -> "float | None":
        return self.floor_cycles / self.cycles if self.cycles else None

    @property
    def bottleneck(self) -> str:
        if not self.cycles:
            return OVERLAPPED
        if self.cycles > DEPENDENCY_FACTOR * self.floor_cycles:
            return DEPENDENCY
        return BOTTLENECK_OF_FLOOR[self.floor_kind]

    def to_json(self) -> dict:
        return {"name": self.name, "cycles": self.cycles, "waited": self.waited, "span": self.span,
                "instructions": self.instructions, "macs": self.macs, "mxm_dtype": self.mxm_dtype,
                "floors": self.floors.to_json(), "floor_kind": self.floor_kind, "floor_cycles": self.floor_cycles,
                "floor_fraction": self.floor_fraction, "bottleneck": self.bottleneck}


@dataclass
class Profile:
    """A model's profile: the recorded ``calls``, each called region's
    :class:`RegionTimeline`, the per-layer table and the model's floors."""

    preset: str
    precision: str
    cfg: object
    calls: list
    timelines: dict  # region name -> RegionTimeline
    layers: list  # [LayerProfile], in order of first issue; cycles add up to ``cycles``
    cycles: int
    floors: Floors
    kinds: list = field(default_factory=list)  # [LayerProfile] per kind of layer, when the model names kinds
    # The called regions' dependency floors summed: each schedule's groups at the earliest
    # cycles their dependencies allow, every port and stream free (target.placer.Placer).
    dependency_cycles: int = 0

    @property
    def cpu_wall_s(self) -> float:
        return sum(c.wall_s for c in self.calls if c.cpu)

    def to_json(self) -> dict:
        kind, floor = self.floors.largest()
        regions = {}
        for c in self.calls:
            if c.region:
                regions.setdefault(c.region, 0)
                regions[c.region] += 1
        return {
            "preset": self.preset, "precision": self.precision, "cycles": self.cycles,
            "latency_s": self.cfg.seconds(self.cycles), "floors": self.floors.to_json(),
            "floor_kind": kind, "floor_cycles": floor, "floor_multiple": self.cycles / floor if floor else None,
            "dependency_cycles": self.dependency_cycles,
            "regions": [{"name": n, "calls": k, "cycles": self.timelines[n].cycles} for n, k in regions.items()],
            "cpu_kernels": sum(1 for c in self.calls if c.cpu), "cpu_wall_s": self.cpu_wall_s,
            "dependency_factor": DEPENDENCY_FACTOR,
            "layers": [x.to_json() for x in self.layers],
            **({"kinds": [x.to_json() for x in self.kinds]} if self.kinds else {}),
        }


def by_kind(layers: list, kind_of) -> list:
    """The layers summed by ``kind_of(layer name)``: one :class:`LayerProfile` per kind
    (its cycles, MACs and floors the sums of its layers'), in order of first issue."""
    kinds = {}
    for x in layers:
        kind = kind_of(x.name)
        k = kinds.setdefault(kind, LayerProfile(kind))
        k.cycles += x.cycles
        k.waited += x.waited
        k.span += x.span
        k.instructions += x.instructions
        k.macs += x.macs
        k.floors = add(k.floors, x.floors)
    return list(kinds.values())


def build_profile(executable, calls: list, kind_of=None) -> Profile:
    """The :class:`Profile` of one recorded run of ``executable`` (``calls`` from
    :func:`recorded_calls`; ``executable.stats`` of that same run). ``kind_of(layer
    name)``: the kind each layer is summed under (a decoder step's parts), if any."""
    cfg = executable.config
    timelines, rows, totals = {}, {}, []
    for c in calls:
        if not c.region:
            continue
        tl = timelines.get(c.region)
        if tl is None:
            tl = timelines[c.region] = RegionTimeline(cfg, executable.regions[c.region])
        for name, part in tl.layers.items():
            row = rows.setdefault(name, LayerProfile(name))
            row.cycles += part.cycles
            row.waited += part.waited
            row.span += part.span
            row.instructions += part.instructions
            row.floors = add(row.floors, part.floors)
            totals.append(part.floors)
    macs = executable.stats.layer_macs
    for name, tl in timelines.items():
        dtypes = _layer_dtypes(tl)
        for layer, part in tl.layers.items():
            rows[layer].macs += sum(macs.get((name, t), 0) for t in part.tags)
            rows[layer].mxm_dtype = rows[layer].mxm_dtype or dtypes.get(layer, "")
    cycles = sum(timelines[c.region].cycles for c in calls if c.region)
    layers = list(rows.values())
    dependency = sum(executable.regions[c.region].dependency_cycles for c in calls if c.region)
    return Profile(cfg.name, str(executable.precision), cfg, calls, timelines, layers, cycles, add(*totals),
                   by_kind(layers, kind_of) if kind_of else [], dependency)


def _layer_dtypes(tl: RegionTimeline) -> dict:
    """{layer: the activation dtype of its first multiply}."""
    out = {}
    for ins, layer in zip(tl.instrs, tl.layer):
        if ins.op in ("mxm.mul", "mxm.mac"):
            out.setdefault(layer, ins.dtype.short)
    return out


def profile_model(model, inputs: dict) -> tuple:
    """Run ``model`` (a :class:`~lpx_tvm.runtime.compiled_model.CompiledModel`) once on
    ``inputs``; returns ``(Profile, outputs)``."""
    with recorded_calls(model.executable) as calls:
        outputs = model.run(inputs)
    return build_profile(model.executable, list(calls)), outputs

"""When each instruction reads, computes, writes and occupies its unit.

This is the single timing definition of the ISA, read by the simulator (which checks a
schedule against it) and by the static scheduler (which builds schedules from it).
All times are absolute cycles for an instruction issued at ``ins.cycle``.

Conventions (see docs/isa.md):
- A consumer reads vector ``k`` of a stream operand at ``issue + k``.
- A producer emits vector ``k`` at its own floorplan position at ``emit + k``; the
  vector then moves one position per cycle in the stream's direction.
- A unit (port) is busy over ``[issue, issue + occupancy)``; two instructions may not
  overlap on one port.
"""

from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass

from .config import LPXConfig
from .isa import NOPS, VXM_REDUCE, VXM_TRANSCENDENTAL, DType, Instr, Unit


@dataclass(frozen=True)
class Timing:
    ports: tuple  # resources held over [issue, issue + occupancy)
    occupancy: int
    position: "int | None"  # floorplan position where stream operands are read / emitted
    emit: "int | None"  # cycle of the first emitted vector (None: emits nothing)
    emit_count: int
    done: int  # cycle by which every effect of the instruction has landed


def install_lanes(cfg: LPXConfig, dtype: DType) -> int:
    """Install lanes of a plane for weights of ``dtype``: each takes one row per cycle from
    one stream, and a row ``w`` bytes wide needs ``w`` of the plane's install streams."""
    return max(1, cfg.mxm_install_streams // dtype.itemsize)


def install_cycles(cfg: LPXConfig, dtype: DType, rows: int) -> int:
    """Cycles a plane takes to install ``rows`` weight rows of ``dtype`` over all its lanes."""
    return -(-rows // install_lanes(cfg, dtype))


def planes_beside(cfg: LPXConfig, plane: int) -> list:
    """The MXM planes on the same side of the VXM as ``plane`` (itself included)."""
    vxm = cfg.position("VXM")
    west = cfg.position("MXM", plane) < vxm
    return [p for p in range(cfg.mxm_planes) if (cfg.position("MXM", p) < vxm) == west]


def slices_beside(cfg: LPXConfig, plane: int) -> list:
    """The SRAM slices on the same side of the VXM as MXM ``plane``, in index order."""
    vxm = cfg.position("VXM")
    west = cfg.position("MXM", plane) < vxm
    return [s for s in range(cfg.mem_slices) if (cfg.position("MEM", s) < vxm) == west]


def nearest_vxm(cfg: LPXConfig, slices) -> list:
    """``slices`` nearest the VXM first (hops from it; ties, one a side: the lower index)."""
    vxm = cfg.position("VXM")
    return sorted(slices, key=lambda s: (abs(cfg.position("MEM", s) - vxm), s))


def install_ports(dtype: DType, lane: int, plane: int) -> tuple:
    """The install streams (ports) of ``plane`` that install lane ``lane`` holds."""
    w = dtype.itemsize
    return tuple(("mxm.install", plane, lane * w + k) for k in range(w))


def ports_of_queue(cfg: LPXConfig, unit: Unit, index: int) -> tuple:
    """Every port of one unit instance (a nop holds them all)."""
    return {
        Unit.MEM: (("mem.rd", index), ("mem.wr", index)),
        Unit.DMA: (("dma", index),),
        Unit.MXM: tuple(("mxm.install", index, k) for k in range(cfg.mxm_install_streams))
        + (("mxm.compute", index), ("mxm.drain", index)),
        Unit.VXM: (("vxm", index),),
        Unit.SXM: (("sxm", index),),
        Unit.C2C: (("c2c.tx", index), ("c2c.rx", index)),
        Unit.ICU: (),
    }[unit]


def unit_count(cfg: LPXConfig, unit: Unit) -> int:
    return _unit_counts(cfg)[unit]


@lru_cache(maxsize=16)
def _unit_counts(cfg: LPXConfig) -> dict:
    return {
        Unit.MEM: cfg.mem_slices,
        Unit.DMA: cfg.dma_engines,
        Unit.MXM: cfg.mxm_planes,
        Unit.VXM: cfg.vxm_alus,
        Unit.SXM: sum(1 for k in cfg.floorplan if k == "SXM"),
        Unit.C2C: cfg.c2c_links,
        Unit.ICU: 1,
    }


def unit_position(cfg: LPXConfig, unit: Unit, index: int) -> "int | None":
    if unit is Unit.MEM:
        return cfg.position("MEM", index)
    if unit is Unit.MXM:
        return cfg.position("MXM", index)
    if unit is Unit.SXM:
        return cfg.position("SXM", index)
    if unit in (Unit.VXM, Unit.C2C):
        # The VXM's ALUs sit in the middle of the chip; the C2C links attach there too.
        return cfg.position("VXM", 0)
    return None


def mxm_rate(cfg: LPXConfig, act: DType, weights: DType) -> int:
    """Cycles per activation vector for an MXM multiply (the slower operand decides)."""
    return max(cfg.mxm_cycles_per_vector[act.short], cfg.mxm_cycles_per_vector[weights.short])


def dma_cycles(cfg: LPXConfig, count: int, dtype: DType) -> int:
    nbytes = count * cfg.lanes * dtype.itemsize
    return cfg.offchip_latency + math.ceil(nbytes / cfg.offchip_bytes_per_cycle)


def c2c_cycles_per_vector(cfg: LPXConfig, dtype: DType) -> int:
    return math.ceil(cfg.lanes * dtype.itemsize / cfg.c2c_bytes_per_cycle)


def vxm_latency(cfg: LPXConfig, op: str) -> int:
    lat = cfg.latency
    if op in VXM_TRANSCENDENTAL:
        return lat["vxm_transcendental"]
    if op in VXM_REDUCE:
        return lat["vxm_reduce"]
    if op in ("vxm.cvt", "vxm.requant"):
        return lat["vxm_convert"]
    return lat["vxm_alu"]


def timing(cfg: LPXConfig, ins: Instr, *, mxm_weights: DType = None) -> Timing:
    """Timing of one instruction. ``mxm_weights`` is the installed weights' dtype for mul/mac."""
    t, n, op = ins.cycle, ins.count, ins.op
    lat = cfg.latency
    unit, idx = ins.queue
    pos = unit_position(cfg, unit, idx)
    if op in NOPS:
        return Timing(ports_of_queue(cfg, unit, idx), n, None, None, 0, t + n)
    if op == "mem.read":
        return Timing((("mem.rd", idx),), n, pos, t + lat["mem_read"], n, t + lat["mem_read"] + n)
    if op == "mem.gather":
        return Timing((("mem.rd", idx),), n, pos, t + lat["mem_gather"], n, t + lat["mem_gather"] + n)
    if op in ("mem.write", "mem.scatter"):
        return Timing((("mem.wr", idx),), n, pos, None, 0, t + n - 1 + lat["mem_write"])
    if op in ("dma.load", "dma.store"):
        d = dma_cycles(cfg, n, ins.dtype)
        return Timing((("dma", idx),), d, None, None, 0, t + d)
    if op == "mxm.install":
        ports = install_ports(ins.dtype, ins.lane, idx)
        return Timing(ports, n, pos, None, 0, t + n + lat["mxm_install"])
    if op in ("mxm.mul", "mxm.mac"):
        r = mxm_rate(cfg, ins.dtype, mxm_weights or ins.dtype)
        # done: the last accumulator row has landed (mxm_row_landing of row n - 1)
        return Timing((("mxm.compute", idx),), r * n, pos, None, 0, t + r * n + lat["mxm_mul"] - 1)
    if op == "mxm.drain":
        e = t + lat["mxm_drain"]
        return Timing((("mxm.drain", idx),), n, pos, e, n, e + n)
    if unit is Unit.VXM:
        e = t + vxm_latency(cfg, op)
        return Timing((("vxm", idx),), n, pos, e, n, e + n)
    if op == "sxm.transpose":
        out = ins.out
        e = t + n + lat["sxm_transpose"]
        return Timing((("sxm", idx),), n + out, pos, e, out, e + out)
    if unit is Unit.SXM:
        e = t + lat["sxm"]
        return Timing((("sxm", idx),), n, pos, e, n, e + n)
    if op == "c2c.send":
        busy = n * c2c_cycles_per_vector(cfg, ins.dtype)
        return Timing((("c2c.tx", idx),), busy, pos, None, 0, t + busy + cfg.c2c_latency)
    if op == "c2c.recv":
        return Timing((("c2c.rx", idx),), n, pos, t + 1, n, t + 1 + n)
    if op == "icu.sync":
        return Timing((), 0, None, None, 0, t)
    raise AssertionError(f"no timing for {op}")


def mxm_row_landing(cfg: LPXConfig, ins: Instr, rate: int, k):
    """Cycle at which accumulator row ``addr + k`` of a mul/mac lands (k may be an array)."""
    return ins.cycle + rate * (k + 1) + cfg.latency["mxm_mul"] - 1


def mem_write_landing(cfg: LPXConfig, ins: Instr) -> int:
    """Cycle at which the first line of a MEM write (or scatter) lands; line ``k`` of the
    write lands ``k`` cycles later."""
    return ins.cycle + cfg.latency["mem_write"]

"""What an instruction does to the machine's state, and when: its effects.

An :class:`Effect` is one access (a read or a write) of a range of one piece of state
(SRAM lines of a slice, an MXM weight buffer's rows, an accumulator's rows, a link,
off-chip bytes) over a window of cycles. :func:`instr_effects` gives an instruction's
effects from the instruction alone, with the landing cycles of :mod:`.timing`: the
static scheduler (:mod:`lpx_tvm.target.placer`) orders instructions by them, and the
simulator's race checks see the same windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from .config import LPXConfig
from .isa import DType, Instr
from .timing import mem_write_landing, mxm_rate, mxm_row_landing, timing


@dataclass(frozen=True, eq=False)
class Walk:
    """When each index of an access is touched: index ``lo + offsets[j]`` at cycle
    ``start + cycles[j]`` (an index may appear more than once)."""

    offsets: np.ndarray
    cycles: np.ndarray
    unique: bool  # no index appears twice


def vector_starts(stride: int, count: int, inner: int = 0, outer: int = 0) -> np.ndarray:
    """Where each of ``count`` vectors starts, from the first address: vector ``k`` at
    ``k * stride`` or, a two-level walk when ``inner`` is set, at
    ``(k // inner) * outer + (k % inner) * stride``."""
    k = np.arange(count, dtype=np.int64)
    return (k // inner) * outer + (k % inner) * stride if inner else k * stride


@lru_cache(maxsize=4096)
def vector_walk(stride: int, count: int, width: int, inner: int = 0, outer: int = 0, pace: int = 1) -> Walk:
    """The walk of ``count`` vectors of ``width`` indices placed as :func:`vector_starts`
    says, vector ``k`` at ``k * pace``, relative to the lowest index touched."""
    starts = vector_starts(stride, count, inner, outer)
    starts = starts - starts.min()
    offsets = (starts[:, None] + np.arange(width, dtype=np.int64)).ravel()
    cycles = np.repeat(np.arange(count, dtype=np.int64) * pace, width)
    for a in (offsets, cycles):
        a.setflags(write=False)
    return Walk(offsets, cycles, len(np.unique(offsets)) == len(offsets))


@dataclass(frozen=True)
class Effect:
    """Access ``kind`` ("r" or "w") of indices ``lo..hi`` of state ``key`` from cycle
    ``start`` to ``end``, by an instruction that issues at ``issue`` (all three relative
    to one origin: the instruction's issue, or its group's start once placed). ``walk``,
    when known, is the cycle each index is touched (a vector a cycle from ``start``, or
    an accumulator row at the MXM's rate): dependencies then meet index by index, so a
    consumer streams behind its producer instead of waiting for the last vector."""

    key: tuple  # ("sram", slice), ("wbuf", plane, buf), ("acc", plane), ("link", link), ("host",), ...
    lo: int
    hi: int
    kind: str
    start: int
    end: int
    issue: int = 0
    walk: "Walk | None" = field(default=None, compare=False, repr=False)

    def after(self, cycles: int) -> "Effect":
        """The same access, its origin ``cycles`` earlier."""
        return replace(self, start=self.start + cycles, end=self.end + cycles, issue=self.issue + cycles)

    def conflicts(self, other: "Effect") -> bool:
        """Whether the two touch common indices of the same state and one of them writes."""
        return (self.key == other.key and self.lo <= other.hi and other.lo <= self.hi
                and "w" in (self.kind, other.kind))


def line_span(addr: int, stride: int, count: int, itemsize: int, inner: int = 0, outer: int = 0) -> tuple:
    """(first, last) line ``count`` vectors of ``itemsize`` lines touch, placed from
    ``addr`` as :func:`vector_starts` says."""
    starts = addr + vector_starts(stride, count, inner, outer)
    return int(starts.min()), int(starts.max()) + itemsize - 1


def sram_lines(ins: Instr) -> tuple:
    """(first, last) SRAM line a MEM read or write, or a DMA, of ``ins`` touches."""
    inner, outer = (ins.inner, ins.outer) if ins.op in ("mem.read", "mem.write") else (0, 0)
    return line_span(ins.addr, ins.stride, ins.count, ins.dtype.itemsize, inner, outer)


def instr_effects(cfg: LPXConfig, ins: Instr, *, weights: "DType | None" = None, lines: "tuple | None" = None,
                  loopback: bool = True) -> list:
    """The effects of ``ins``, relative to its issue cycle. ``weights``: the dtype of the
    weights a mul or mac multiplies by; ``lines``: the lines a gather or scatter may
    touch (its addresses are data, so the whole table counts); ``loopback``: whether the
    chip's links loop back to itself (a chip alone) or go to other chips."""
    op, n = ins.op, ins.count
    if op in ("mem.read", "mem.write", "mem.gather", "mem.scatter"):
        lo, hi = lines or sram_lines(ins)
        # A gather's or scatter's addresses are data: the whole table, all of it at once.
        walk = vector_walk(ins.stride, n, ins.dtype.itemsize, ins.inner, ins.outer) \
            if op in ("mem.read", "mem.write") else None
        if op in ("mem.read", "mem.gather"):
            return [Effect(("sram", ins.unit), lo, hi, "r", 0, n - 1, walk=walk)]
        land = mem_write_landing(cfg, ins) - ins.cycle
        return [Effect(("sram", ins.unit), lo, hi, "w", land, n - 1 + land, walk=walk)]
    if op in ("dma.load", "dma.store"):
        lo, hi = sram_lines(ins)
        done = timing(cfg, ins).done - ins.cycle
        host, nbytes = ins.host, n * cfg.lanes * ins.dtype.itemsize
        if op == "dma.load":
            return [Effect(("sram", ins.slice), lo, hi, "w", done, done),
                    Effect(("host",), host, host + nbytes - 1, "r", 0, done)]
        return [Effect(("sram", ins.slice), lo, hi, "r", 0, 0),
                Effect(("host",), host, host + nbytes - 1, "w", done, done)]
    if op == "mxm.install":
        done = n + cfg.latency["mxm_install"]
        return [Effect(("wbuf", ins.unit, ins.buf), ins.addr, ins.addr + n - 1, "w", 0, done)]
    if op in ("mxm.mul", "mxm.mac"):
        r = mxm_rate(cfg, ins.dtype, weights)
        first, last = (int(mxm_row_landing(cfg, ins, r, k)) - ins.cycle for k in (0, n - 1))
        acc = ins.addr
        # It reads every row of the buffer: no install of the next fill, whatever its rows,
        # may issue before it (that install would join this fill).
        rows = vector_walk(1, n, 1, pace=r)
        out = [Effect(("wbuf", ins.unit, ins.buf), 0, cfg.mxm_rows - 1, "r", 0, r * n - 1),
               Effect(("acc", ins.unit), acc, acc + n - 1, "w", first, last, walk=rows)]
        if op == "mxm.mac":  # each row is read the cycle before its sum lands
            out.append(Effect(("acc", ins.unit), acc, acc + n - 1, "r", first - 1, last - 1, walk=rows))
        return out
    if op == "mxm.drain":
        return [Effect(("acc", ins.unit), ins.addr, ins.addr + n - 1, "r", 0, n - 1, walk=vector_walk(1, n, 1))]
    if op == "c2c.send":
        if loopback:
            done = timing(cfg, ins).done - ins.cycle
            return [Effect(("link", ins.unit), 0, 0, "w", done, done)]
        # A link to another chip: its messages keep program order (the receiver takes
        # them in its own program order).
        return [Effect(("link-out", ins.unit), 0, 0, "w", 0, 0)]
    if op == "c2c.recv":
        out = [Effect(("link", ins.unit), 0, 0, "r", 0, 0)]
        if not loopback:  # in program order, the order the messages arrive in
            out.append(Effect(("link-in", ins.unit), 0, 0, "w", 0, 0))
        return out
    return []


def arrival_effect(link: int, cycle: int) -> Effect:
    """Data from another chip landing on ``link`` at ``cycle``: what a receive waits for."""
    return Effect(("link", link), 0, 0, "w", 0, cycle)

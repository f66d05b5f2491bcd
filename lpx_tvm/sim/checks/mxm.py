"""MXM: weight buffers, accumulator rows and the float blocks the executor computes lazily.

A plane's weight buffers are checked for readiness and reuse, its accumulator rows
(through per-row race stamps) for reads before writes, write races and the type they
hold. Which K splits form a float block, and when it is computed, follows from the
instructions too (see ``sim/mxm.py``): decided here, recorded as split / settle steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...machine import timing as tm
from ...machine.config import MXM_DTYPES
from ...machine.isa import NOPS, DType
from .. import numerics as nx
from ..memory import Race
from ..replay_plan import Block
from ..replay_steps import MxmDrain, MxmInstall, MxmNow, MxmSeal, MxmSettle, MxmSplit


def operand_problems(cfg, program, ins) -> list:
    op = ins.op
    if op in NOPS:
        return []
    problems = []
    if ins.buf >= cfg.mxm_weight_buffers and op != "mxm.drain":
        problems.append(f"weight buffer {ins.buf} out of range 0..{cfg.mxm_weight_buffers - 1}")
    if op == "mxm.install":
        if ins.addr < 0 or ins.addr + ins.count > cfg.mxm_rows:
            problems.append(f"installs rows {ins.addr}..{ins.addr + ins.count - 1} but a plane has {cfg.mxm_rows}")
        if not 1 <= ins.width <= cfg.mxm_cols:
            problems.append(f"width {ins.width} out of range 1..{cfg.mxm_cols}")
        if ins.dtype.short in cfg.mxm_cycles_per_vector and not 0 <= ins.lane < tm.install_lanes(cfg, ins.dtype):
            problems.append(f"install lane {ins.lane} out of range 0..{tm.install_lanes(cfg, ins.dtype) - 1} "
                            f"({cfg.mxm_install_streams} install streams, {ins.dtype.itemsize} per "
                            f"{ins.dtype.short} row)")
    if op != "mxm.drain" and ins.dtype.short not in cfg.mxm_cycles_per_vector:
        problems.append(f"the MXM does not multiply {ins.dtype.short}" + (
            f" on {cfg.name} (mxm.cycles_per_vector has no {ins.dtype.short})" if ins.dtype.short in MXM_DTYPES else ""))
    if op == "mxm.drain" and ins.dtype not in (DType.INT32, DType.FP32):
        problems.append(f"accumulators drain as int32 or fp32, not {ins.dtype.short}")
    return problems


@dataclass
class _Part:
    """Rows ``row .. row + count - 1`` of a fill, installed by instruction ``installer``."""

    row: int
    count: int
    done: int
    installer: int
    producer: int
    key: "tuple | None"


@dataclass
class _WeightBuffer:
    """One weight buffer. Installs fill it part by part (one per install lane); the first
    multiply after them seals the fill: its rows must be 0..K-1, and K is what it contracts."""

    dtype: DType = DType.NONE
    rows: int = 0
    width: int = 0
    ready: "int | None" = None  # cycle from which a multiply may use the weights
    busy_until: int = -1  # last cycle (exclusive) a multiply reads it
    installer: int = -1
    producer: int = -1  # an instruction whose values were installed
    key: "tuple | None" = None  # the SRAM lines they came from (see install)
    parts: list = None  # the open fill's parts; None once sealed by a multiply

    def seal(self, run, plane: int, buf: int):
        parts = sorted(self.parts, key=lambda p: p.row)
        row = 0
        for p in parts:
            if p.row != row:
                raise Race("weights-incomplete", f"weight buffer {buf} of plane {plane} has no rows {row}.."
                                                 f"{p.row - 1} installed (its installs leave a gap)")
            row += p.count
        last = max(parts, key=lambda p: p.done)
        self.rows, self.ready, self.installer = row, last.done, last.installer
        self.producer = parts[0].producer
        keys = [p.key for p in parts]
        self.key = None if None in keys else (keys[0] if len(keys) == 1 else tuple(keys))
        self.parts = None
        run.record(MxmSeal(plane, buf, self.width), tuple(p.producer for p in parts))


class MxmState:
    """The planes' weight buffers, the type each accumulator row holds, open float blocks."""

    def __init__(self, cfg):
        self.acc_kind = np.zeros((cfg.mxm_planes, cfg.mxm_acc_rows), np.int8)
        self.wbuf = [[_WeightBuffer() for _ in range(cfg.mxm_weight_buffers)] for _ in range(cfg.mxm_planes)]
        self.pending = [dict() for _ in range(cfg.mxm_planes)]  # (addr, count) -> block id

    def weights_dtype(self, ins) -> "DType | None":
        """The dtype of the weights a mul/mac multiplies by (None: never installed)."""
        dt = self.wbuf[ins.unit][ins.buf].dtype
        return None if dt is DType.NONE else dt


def mxm_install(run, i, ins, t, _):
    buf = run.mxm.wbuf[ins.unit][ins.buf]
    if ins.cycle < buf.busy_until:
        raise Race("weights-in-use", f"weight buffer {ins.buf} of plane {ins.unit} is in use until cycle "
                                     f"{buf.busy_until}")
    fresh = buf.parts is None
    if fresh:
        buf.parts = []
        buf.dtype, buf.width, buf.ready = ins.dtype, ins.width, None
    elif (ins.dtype, ins.width) != (buf.dtype, buf.width):
        raise Race("weights-mismatch", f"install of {ins.width} {ins.dtype.short} columns into weight buffer "
                                       f"{ins.buf} of plane {ins.unit}, whose other installs since its last "
                                       f"multiply are {buf.width} {buf.dtype.short} columns")
    lo, hi = ins.addr, ins.addr + ins.count
    for p in buf.parts:
        if p.row < hi and lo < p.row + p.count:
            raise Race("weights-overlap", f"rows {max(lo, p.row)}..{min(hi, p.row + p.count) - 1} of weight "
                                          f"buffer {ins.buf} of plane {ins.unit} are installed by instruction "
                                          f"#{p.installer} too, with no multiply between")
    em, off = run.streams.read(ins.src0, t.position, ins.cycle, ins.count, ins.dtype)
    # The same SRAM rows, unchanged since, give the same weights: the key says which.
    key = None if em.source is None else em.source + (off, ins.count)
    buf.parts.append(_Part(lo, ins.count, t.done, i, em.producer, key))
    run.record(MxmInstall(ins.unit, ins.buf, run.operand(em, off), ins.count, ins.addr, fresh), (em.producer,))


def mxm_multiply(run, i, ins, t, _):
    plane, cfg, mxm = ins.unit, run.cfg, run.mxm
    buf = mxm.wbuf[plane][ins.buf]
    if buf.parts:
        buf.seal(run, plane, ins.buf)
    if buf.ready is None:
        raise Race("weights-missing", f"weight buffer {ins.buf} of plane {plane} was never installed")
    if ins.cycle < buf.ready:
        raise Race("weights-not-ready", f"weight buffer {ins.buf} of plane {plane} is installed by "
                                        f"instruction #{buf.installer} only at cycle {buf.ready}")
    kind = nx.acc_kind(ins.dtype)
    if kind != nx.acc_kind(buf.dtype) or (kind == nx.ACC_FLOAT and ins.dtype != buf.dtype):
        raise Race("dtype-mismatch", f"{ins.dtype.short} activations cannot multiply {buf.dtype.short} "
                                     f"weights in buffer {ins.buf}")
    em, off = run.streams.read(ins.src0, t.position, ins.cycle, ins.count, ins.dtype)
    rate = tm.mxm_rate(cfg, ins.dtype, buf.dtype)
    n, rows = ins.count, slice(ins.addr, ins.addr + ins.count)
    run.acc_stamps.check_range(plane, ins.addr, 1, n, 1, "accumulator row")
    land = tm.mxm_row_landing(cfg, ins, rate, 0)
    if ins.op == "mxm.mac":
        kinds = mxm.acc_kind[plane, rows]
        if (kinds != kind).any():
            bad = int(np.flatnonzero(kinds != kind)[0])
            what = "never written" if kinds[bad] == 0 else "of the other accumulator type"
            raise Race("dtype-mismatch" if kinds[bad] else "acc-read-before-write",
                       f"mac onto accumulator row {ins.addr + bad} of plane {plane}, which is {what}")
        _acc_access(run, plane, ins, rate, land - 1, i, read=True)
    _acc_access(run, plane, ins, rate, land, i, read=False)
    mxm.acc_kind[plane, rows] = kind
    buf.busy_until = max(buf.busy_until, ins.cycle + t.occupancy)
    macs = n * buf.rows * buf.width
    run.counters.macs += macs
    run.counters.by_tag[ins.tag].macs += macs
    xkey = None if em.source is None else em.source + (off, n)
    _arith(run, plane, ins.buf, buf, ins.addr, n, run.operand(em, off), xkey, kind, ins.op == "mxm.mac")


def _arith(run, plane, b, buf, addr, n, x, xkey, kind, accumulate):
    """The multiply's arithmetic. Float accumulators keep a row block's splits pending
    until its rows are read or partly overwritten (see sim/mxm.py), the rest is computed at once."""
    key = (addr, n)
    pending, blocks = run.mxm.pending[plane], run.notes.blocks
    if kind == nx.ACC_FLOAT:
        bid = None if not accumulate else pending.get(key)
        if bid is not None and blocks[bid].width != buf.width:
            bid = None
        if bid is None and not accumulate:
            settle(run, plane, addr, n)
            bid = pending[key] = len(blocks)
            blocks[bid] = Block(buf.width)
        if bid is not None:
            blocks[bid].splits.append((x.producer, buf.producer, xkey, buf.rows, buf.key))
            blocks[bid].last_split = run.record(MxmSplit(plane, b, bid, x, n), (x.producer,))
            return
    settle(run, plane, addr, n)
    run.record(MxmNow(plane, b, addr, x, n, buf.key, kind, accumulate), (x.producer, buf.producer))


def settle(run, plane, addr, n):
    """Compute the pending blocks overlapping rows ``addr .. addr + n - 1``."""
    pending = run.mxm.pending[plane]
    for key in [k for k in pending if k[0] < addr + n and addr < k[0] + k[1]]:
        bid = pending.pop(key)
        run.notes.settles.append((len(run.steps), bid))
        run.record(MxmSettle(plane, bid, key[0], key[1]))


def _acc_access(run, plane, ins, rate, first, i, read):
    # Accumulator rows land one every `rate` cycles: stamp each row with its own cycle.
    run.acc_stamps.access_rows(plane, slice(ins.addr, ins.addr + ins.count), first, rate, i, read=read)


def mxm_drain(run, i, ins, t, _):
    plane = ins.unit
    run.acc_stamps.check_range(plane, ins.addr, 1, ins.count, 1, "accumulator row")
    rows = slice(ins.addr, ins.addr + ins.count)
    want = nx.ACC_INT if ins.dtype is DType.INT32 else nx.ACC_FLOAT
    kinds = run.mxm.acc_kind[plane, rows]
    if (kinds != want).any():
        bad = int(np.flatnonzero(kinds != want)[0])
        raise Race("dtype-mismatch" if kinds[bad] else "acc-read-before-write",
                   f"drain as {ins.dtype.short} of accumulator row {ins.addr + bad} of plane {plane}, which "
                   + ("was never written" if kinds[bad] == 0 else "holds the other accumulator type"))
    _acc_access(run, plane, ins, 1, ins.cycle, i, read=True)
    settle(run, plane, ins.addr, ins.count)
    run.record(MxmDrain(i, plane, ins.addr, ins.count, want), makes=i)
    run.notes.fresh[i] = ins.count
    run.emit(i, ins, t, ins.dtype)


HANDLERS = {"mxm.install": mxm_install, "mxm.mul": mxm_multiply, "mxm.mac": mxm_multiply, "mxm.drain": mxm_drain}

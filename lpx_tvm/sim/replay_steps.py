"""The steps of a run: one named record per kind of work the executor does.

The schedule checker resolves each instruction to a step (see docs/design.md, "Verify
once, replay"): which SRAM bytes an access touches (``view``: the ``(shape, offset,
strides)`` of an ndarray over the SRAM bytes, see ``Banked.vectors_spec``; or ``lines``,
the line numbers, where no such view exists), which earlier instruction's value a
stream operand reads and from which vector (an :class:`StreamOperand`), which MXM blocks to
compute when. A step's :meth:`run` does that work on an :class:`~lpx_tvm.sim.executor.Executor`,
calling it by keyword, so a changed executor signature fails at once instead of
passing arguments to the wrong parameters. ``producer`` is the index of the
instruction whose value a step makes; ``drop`` the values no later step reads, freed
after it (set when the plan is finalized).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class StreamOperand(NamedTuple):
    """Vectors ``offset ..`` of the value instruction ``producer`` emitted."""

    producer: int
    offset: int


@dataclass(slots=True)
class ReplayStep:
    """One step; subclasses name their operands."""

    drop: tuple = field(default=(), kw_only=True)

    def run(self, ex):
        raise NotImplementedError


# ---- MEM / DMA -------------------------------------------------------------------

@dataclass(slots=True)
class MemRead(ReplayStep):
    """``count`` vectors of ``dtype`` from an SRAM view: a copy, or (``copy`` False, when
    no write changes the lines while the value is read) the view itself."""

    producer: int
    view: tuple
    count: int
    dtype: np.dtype
    copy: bool = True

    def run(self, ex):
        ex.mem_read(i=self.producer, spec=self.view, count=self.count, dtype=self.dtype, copy=self.copy)


@dataclass(slots=True)
class MemReadLines(ReplayStep):
    """A read (or gather) of vectors on the SRAM ``lines`` of slice ``bank``."""

    producer: int
    bank: int
    lines: object
    count: int
    dtype: np.dtype

    def run(self, ex):
        ex.mem_read_lines(i=self.producer, bank=self.bank, index=self.lines, count=self.count, dtype=self.dtype)


@dataclass(slots=True)
class MemWrite(ReplayStep):
    view: tuple
    src: StreamOperand
    count: int

    def run(self, ex):
        ex.mem_write(spec=self.view, producer=self.src.producer, off=self.src.offset, count=self.count)


@dataclass(slots=True)
class MemWriteLines(ReplayStep):
    bank: int
    lines: object
    src: StreamOperand
    count: int

    def run(self, ex):
        ex.mem_write_lines(bank=self.bank, index=self.lines, producer=self.src.producer, off=self.src.offset,
                           count=self.count)


@dataclass(slots=True)
class DmaLoad(ReplayStep):
    """Off-chip bytes ``host_lo .. host_hi - 1`` into an SRAM view."""

    view: tuple
    host_lo: int
    host_hi: int

    def run(self, ex):
        ex.dma_load(spec=self.view, lo=self.host_lo, hi=self.host_hi)


@dataclass(slots=True)
class DmaLoadLines(ReplayStep):
    bank: int
    lines: object
    host_lo: int
    host_hi: int

    def run(self, ex):
        ex.dma_load_lines(bank=self.bank, index=self.lines, lo=self.host_lo, hi=self.host_hi)


@dataclass(slots=True)
class DmaStore(ReplayStep):
    view: tuple
    host_lo: int
    host_hi: int

    def run(self, ex):
        ex.dma_store(spec=self.view, lo=self.host_lo, hi=self.host_hi)


# ---- MXM -------------------------------------------------------------------------

@dataclass(slots=True)
class MxmInstall(ReplayStep):
    """Rows ``row ..`` of a weight buffer's fill (``fresh``: the fill's first install)."""

    plane: int
    buf: int
    src: StreamOperand
    rows: int
    row: int
    fresh: bool

    def run(self, ex):
        ex.mxm_install(plane=self.plane, buf=self.buf, producer=self.src.producer, off=self.src.offset,
                       rows=self.rows, row=self.row, fresh=self.fresh)


@dataclass(slots=True)
class MxmSeal(ReplayStep):
    """A fill's parts become the buffer's weight matrix (at its first multiply)."""

    plane: int
    buf: int
    width: int

    def run(self, ex):
        ex.mxm_seal(plane=self.plane, buf=self.buf, width=self.width)


@dataclass(slots=True)
class MxmSplit(ReplayStep):
    """One K split of a float block, kept until the block settles (see mxm.py)."""

    plane: int
    buf: int
    block: int
    src: StreamOperand
    count: int

    def run(self, ex):
        ex.mxm_split(plane=self.plane, buf=self.buf, block=self.block, producer=self.src.producer,
                     off=self.src.offset, count=self.count)


@dataclass(slots=True)
class MxmSettle(ReplayStep):
    """Compute a float block into rows ``addr .. addr + count - 1``. ``xkeep`` / ``wkeep``:
    what to do with its concatenated activations / weights (``(id, Accumulators.PUT|GET|POP)``
    or None); ``batch``: later blocks computed in the same matmul."""

    plane: int
    block: int
    addr: int
    count: int
    xkeep: "tuple | None" = None
    wkeep: "tuple | None" = None
    batch: tuple = ()

    def run(self, ex):
        ex.mxm_settle(plane=self.plane, block=self.block, addr=self.addr, count=self.count, xkeep=self.xkeep,
                      wkeep=self.wkeep, batch=self.batch)


@dataclass(slots=True)
class MxmSettleEarly(ReplayStep):
    """The settle of a block computed with an earlier one; drops the kept operands
    ``xdrop`` / ``wdrop`` (ids) whose last use this is."""

    plane: int
    block: int
    addr: int
    count: int
    xdrop: "int | None" = None
    wdrop: "int | None" = None

    def run(self, ex):
        ex.mxm_settle_early(plane=self.plane, block=self.block, addr=self.addr, count=self.count,
                            xdrop=self.xdrop, wdrop=self.wdrop)


@dataclass(slots=True)
class MxmNow(ReplayStep):
    """A multiply computed at once (integer rows, or a mac that continues no block)."""

    plane: int
    buf: int
    addr: int
    src: StreamOperand
    count: int
    weights_key: "tuple | None"
    kind: int
    accumulate: bool

    def run(self, ex):
        ex.mxm_now(plane=self.plane, buf=self.buf, addr=self.addr, producer=self.src.producer, off=self.src.offset,
                   count=self.count, wkey=self.weights_key, kind=self.kind, accumulate=self.accumulate)


@dataclass(slots=True)
class MxmDrain(ReplayStep):
    producer: int
    plane: int
    addr: int
    count: int
    kind: int

    def run(self, ex):
        ex.mxm_drain(i=self.producer, plane=self.plane, addr=self.addr, count=self.count, kind=self.kind)


# ---- VXM / SXM / C2C ---------------------------------------------------------------

@dataclass(slots=True)
class Vxm(ReplayStep):
    """One VXM op; ``b`` None: the second operand is ``imm``."""

    producer: int
    op: str
    dtype: object
    out_dtype: object
    count: int
    a: StreamOperand
    b: "StreamOperand | None"
    imm: object
    aux0: int

    def run(self, ex):
        ex.vxm(i=self.producer, op=self.op, dt=self.dtype, out_dt=self.out_dtype, count=self.count, a=self.a,
               b=self.b, imm=self.imm, aux0=self.aux0)


@dataclass(slots=True)
class VxmInPlace(ReplayStep):
    """An fp32 binary op written over its first operand, the whole value of ``a``."""

    producer: int
    op: str
    a: int
    b: "StreamOperand | None"
    imm: object

    def run(self, ex):
        ex.vxm_inplace(i=self.producer, op=self.op, a=self.a, b=self.b, imm=self.imm)


@dataclass(slots=True)
class Sxm(ReplayStep):
    producer: int
    op: str
    count: int
    a: StreamOperand
    aux0: int
    aux1: int

    def run(self, ex):
        ex.sxm(i=self.producer, op=self.op, count=self.count, a=self.a, aux0=self.aux0, aux1=self.aux1)


@dataclass(slots=True)
class C2cSend(ReplayStep):
    producer: int
    src: StreamOperand
    count: int

    def run(self, ex):
        ex.c2c_send(i=self.producer, producer=self.src.producer, off=self.src.offset, count=self.count)


@dataclass(slots=True)
class C2cRecv(ReplayStep):
    """Vectors ``(sender, first, count)`` of each message part, concatenated."""

    producer: int
    parts: tuple

    def run(self, ex):
        ex.c2c_recv(i=self.producer, parts=self.parts)


@dataclass(slots=True)
class C2cRecvRemote(ReplayStep):
    """Vectors ``(executor, sender, first, count)`` sent by other chips of a system (their
    executors), concatenated: a step of a functional system run, never replayed."""

    producer: int
    parts: tuple

    def run(self, ex):
        ex.c2c_recv_remote(i=self.producer, parts=self.parts)

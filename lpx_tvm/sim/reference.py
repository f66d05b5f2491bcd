"""The reference interpreter: the LPX instruction set's semantics, one instruction at a time.

This is the plain definition of what every opcode does, written to be read next to
docs/isa.md. :func:`run` executes a Program's instructions in issue order (ties in
program order, an ``icu.sync`` first), each as one short function below that says what
it reads, what it computes and what it writes:

- ``sram``: the SRAM, ``(slices, lines, lanes)`` bytes. A vector of a ``w``-byte dtype
  is stored on ``w`` consecutive lines, its bytes in order (docs/machine.md).
- streams: values in flight. A producer's value is a ``(count, lanes)`` array that
  moves one floorplan position per cycle; a consumer takes the vectors passing its
  position from its issue cycle on (:class:`_Streams`).
- ``wbuf[plane][buf]``: installed MXM weights, a ``(K, N)`` matrix and its dtype.
- ``acc_int`` / ``acc_float``: MXM accumulator rows, int32 and fp32.
- ``host``: off-chip memory bytes; ``links``: the C2C links, each looped back to this
  chip, as queues of vectors sent and not yet received.

It assumes a valid program: it does none of the simulator's schedule checks. For a
valid schedule, running each instruction whole at its issue cycle, in issue order,
gives the hardware's results (docs/design.md, "Execution in issue order"), so this
interpreter and :class:`~lpx_tvm.sim.Simulator` must agree bit for bit, and on the
cycle count: the largest ``done`` of any instruction, from the ISA's one timing
definition (:mod:`lpx_tvm.machine.timing`). ``tests/sim/test_reference.py`` checks that
on every kernel, compiled model and random program.

Independent of the simulator's fast path (no executor steps, no SRAM views, no lazy
MXM machinery), it shares only the rounding rules of :mod:`~lpx_tvm.sim.numerics`
(round once to nearest even, saturate, the transcendental formulas), which
tests/sim/test_opcodes.py checks against hand-written references.

fp32 accumulation order. The model does not fix the order of the fp32 additions of a
float MXM row block; the ISA's definition, which the simulator implements, is: the
rows a ``mxm.mul`` writes and the ``mxm.mac``\\ s that follow it onto the same rows
(same first row, count and width) form a *block*, whose value is one fp32 matmul of
the splits' activations and weights concatenated over K, computed when its rows are
next read or overwritten. A ``mxm.mac`` that continues no block adds its product at
once. Integer accumulation is exact (int32, wrapping), so its order does not matter.
A block's matmul runs on as many BLAS threads as the simulator's would (how BLAS
orders a row's sum depends on how it splits the matmul). The simulator may compute
several blocks that share weights in one matmul of all their rows, and BLAS may then
order the sums differently: only there may the two differ, by fp32 rounding
(tests/sim/lpx_hand.py, ``BATCHED_FP32_RTOL``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..machine import timing as tm
from ..machine.config import LPXConfig, load_config
from ..machine.isa import VXM_BINARY, VXM_REDUCE, VXM_TRANSCENDENTAL, DType, Instr, dtype_of_numpy
from ..machine.layout import coerce, offchip_bytes, offchip_nbytes, read_offchip, read_tensor, tensor_tiles
from ..machine.program import Program
from . import blas
from . import numerics as nx


@dataclass
class ReferenceResult:
    outputs: dict
    cycles: int


def run(config, program: Program, inputs: dict) -> ReferenceResult:
    """Execute ``program`` on machine ``config`` (a preset name, a path or an LPXConfig)
    with ``inputs`` ({name: array}); returns its outputs and its cycle count."""
    m = Machine(load_config(config), program)
    m.load_inputs(inputs)
    order = sorted(range(len(program.instrs)),
                   key=lambda i: (program.instrs[i].cycle, program.instrs[i].op != "icu.sync"))
    cycles = 0
    with blas.one_thread():  # as the simulator runs BLAS (see _FloatBlock.value)
        for i in order:
            cycles = max(cycles, m.execute(program.instrs[i]))
    return ReferenceResult(m.read_outputs(), cycles)


# ---- the machine's state ------------------------------------------------------

@dataclass
class _Emission:
    """One byte-plane in flight: vector ``k`` passes position ``x`` at cycle ``d0 + k + sign * x``."""

    d0: int
    position: int
    plane: np.ndarray  # (count, lanes) uint8: byte ``b`` of every element, on register ``first + b``
    dtype: DType  # of the whole value
    leaves: int  # the cycle its last vector passes the chip's edge


class _Streams:
    """Every stream register's byte-planes in flight (docs/machine.md, "Streams").

    Along a value's path ``D = cycle - sign * position`` is constant, so "the vector
    passing position ``x`` at cycle ``c``" is vector ``c - sign * x - d0`` of the value
    whose ``D`` interval holds ``c - sign * x`` and whose producer is upstream of ``x``.
    A register carries one byte per lane: a ``w``-byte value travels as its ``w``
    byte-planes on registers ``s .. s + w - 1``, and a reader reassembles them.
    """

    def __init__(self, positions: int):
        self.edge = {1: positions - 1, -1: 0}
        self.values = {}  # (dir, register) -> [_Emission]

    def emit(self, stream, position: int, first_cycle: int, values: np.ndarray, now: int):
        """Put ``values`` on ``stream``'s registers at ``position`` from ``first_cycle``; planes
        that left the chip before cycle ``now`` (no later instruction can read them) are forgotten."""
        d0 = first_cycle - stream.sign * position
        leaves = d0 + len(values) - 1 + stream.sign * self.edge[stream.sign]
        dtype = dtype_of_numpy(values.dtype)
        w = dtype.itemsize
        planes = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), -1, w)
        for b in range(w):
            reg = (stream.dir, stream.id + b)
            flying = [e for e in self.values.get(reg, ()) if e.leaves >= now]
            self.values[reg] = flying + [_Emission(d0, position, planes[:, :, b], dtype, leaves)]

    def take(self, stream, position: int, cycle: int, count: int) -> np.ndarray:
        d = cycle - stream.sign * position
        first = self._plane((stream.dir, stream.id), position, d, stream.sign)
        w = first.dtype.itemsize
        planes = [first] + [self._plane((stream.dir, stream.id + b), position, d, stream.sign) for b in range(1, w)]
        k = d - first.d0
        data = np.stack([p.plane[k:k + count] for p in planes], axis=-1)
        return np.ascontiguousarray(data).view(first.dtype.np).reshape(count, -1)

    def _plane(self, reg, position: int, d: int, sign: int) -> _Emission:
        for e in reversed(self.values.get(reg, ())):
            if e.d0 <= d < e.d0 + len(e.plane) and (position - e.position) * sign >= 0:
                return e
        raise AssertionError(f"stream {reg[0]}{reg[1]}: nothing passes position {position} at D {d}")


@dataclass
class _Weights:
    matrix: np.ndarray  # (K, N): the installed rows, their first N lanes
    dtype: DType
    parts: "dict | None" = None  # first row -> rows, of a fill not yet multiplied by

    def sealed(self) -> "_Weights":
        """The fill's rows 0..K-1 as the matrix a multiply contracts (its first multiply)."""
        if self.parts is not None:
            self.matrix = np.concatenate([self.parts[r] for r in sorted(self.parts)])
            self.parts = None
        return self


@dataclass
class _FloatBlock:
    """fp32 accumulator rows whose splits are summed as one matmul (see the module doc)."""

    width: int
    xs: list = field(default_factory=list)  # activations per split, (n, K_i)
    ws: list = field(default_factory=list)  # weights per split, (K_i, width)

    def value(self) -> np.ndarray:
        # Row-major operands: BLAS orders a row's sum by their layout.
        x = np.ascontiguousarray(np.concatenate([a.astype(np.float32) for a in self.xs], axis=1))
        w = np.ascontiguousarray(np.concatenate([b.astype(np.float32) for b in self.ws], axis=0))
        # How BLAS orders a row's fp32 sum depends on how it splits the matmul across
        # threads: the simulator's thread count for a matmul of this size.
        with blas.threads_for(x.shape[0] * w.shape[0] * self.width):
            return x @ w


class Machine:
    """The state of one LPX chip running one program, changed one instruction at a time."""

    def __init__(self, cfg: LPXConfig, program: Program):
        self.cfg, self.program, self.lanes = cfg, program, cfg.lanes
        self.sram = np.zeros((cfg.mem_slices, cfg.lines_per_slice, cfg.lanes), np.uint8)
        for img in program.sram_init:
            lines = np.frombuffer(img.data, np.uint8).reshape(-1, cfg.lanes)
            self.sram[img.slice, img.addr:img.addr + len(lines)] = lines
        self.host = np.zeros(max(program.host_bytes, len(program.host_init)), np.uint8)
        self.host[:len(program.host_init)] = np.frombuffer(program.host_init, np.uint8)
        self.streams = _Streams(len(cfg.floorplan))
        self.wbuf = [[None] * cfg.mxm_weight_buffers for _ in range(cfg.mxm_planes)]
        self.acc_int = np.zeros((cfg.mxm_planes, cfg.mxm_acc_rows, cfg.lanes), np.int32)
        self.acc_float = np.zeros((cfg.mxm_planes, cfg.mxm_acc_rows, cfg.lanes), np.float32)
        self.blocks = [{} for _ in range(cfg.mxm_planes)]  # plane -> {(first row, count): _FloatBlock}
        self.links = [deque() for _ in range(cfg.c2c_links)]  # each: vectors (lanes,) sent, oldest first

    # ---- inputs and outputs --------------------------------------------------
    def load_inputs(self, inputs: dict):
        for b in self.program.inputs:
            arr = coerce(b.name, inputs[b.name], b.layout)
            if b.offchip is not None:
                raw = offchip_bytes(b.layout, arr, self.lanes)
                self.host[b.offchip:b.offchip + len(raw)] = raw
            else:
                for sl, lines, raw in tensor_tiles(b.layout, arr, self.lanes):
                    self.sram[sl, lines] = raw

    def read_outputs(self) -> dict:
        out = {}
        for b in self.program.outputs:
            if b.offchip is not None:
                raw = self.host[b.offchip:b.offchip + offchip_nbytes(b.layout, self.lanes)]
                out[b.name] = read_offchip(b.layout, raw, self.lanes)
            else:
                out[b.name] = read_tensor(b.layout, lambda sl, lines: self.sram[sl, lines], self.lanes)
        return out

    # ---- one instruction -------------------------------------------------------
    def execute(self, ins: Instr) -> int:
        """Apply ``ins``'s effects; returns its ``done`` cycle."""
        weights = None
        if ins.op in ("mxm.mul", "mxm.mac"):
            weights = self.wbuf[ins.unit][ins.buf].dtype
        t = tm.timing(self.cfg, ins, mxm_weights=weights)
        op = SEMANTICS.get(ins.op) or SEMANTICS[ins.op.split(".")[0] + ".*"]
        op(self, ins, t)
        return t.done

    def take(self, ins: Instr, t: tm.Timing, stream, count: int = None) -> np.ndarray:
        """The ``count`` (default: the instruction's count) vectors a stream operand reads."""
        return self.streams.take(stream, t.position, ins.cycle, count or ins.count)

    def emit(self, ins: Instr, t: tm.Timing, values: np.ndarray):
        self.streams.emit(ins.dst, t.position, t.emit, values, ins.cycle)

    # SRAM vectors: vector k of an access at lines start_k .. start_k + w - 1.
    def lines(self, ins: Instr, starts: np.ndarray) -> np.ndarray:
        return starts[:, None] + np.arange(ins.dtype.itemsize)[None, :]

    def load_vectors(self, sl: int, lines: np.ndarray, dtype: DType) -> np.ndarray:
        n = len(lines)
        return self.sram[sl, lines].reshape(n, -1).view(dtype.np).reshape(n, self.lanes)

    def store_vectors(self, sl: int, lines: np.ndarray, vectors: np.ndarray):
        n, w = lines.shape
        self.sram[sl, lines] = np.ascontiguousarray(vectors).view(np.uint8).reshape(n, w, self.lanes)

    # MXM float blocks
    def settle(self, plane: int, first: int, count: int):
        """Compute the float blocks on rows ``first .. first + count - 1``: they are read or
        overwritten next."""
        blocks = self.blocks[plane]
        for key in [k for k in blocks if k[0] < first + count and first < k[0] + k[1]]:
            b = blocks.pop(key)
            rows = self.acc_float[plane, key[0]:key[0] + key[1]]
            rows[:, :b.width] = b.value()
            rows[:, b.width:] = 0


def _starts(ins: Instr) -> np.ndarray:
    """First line of each vector of a MEM/DMA access: ``addr + k * stride``, or with a 2-D
    pattern (``inner`` > 0) ``addr + (k // inner) * outer + (k % inner) * stride``."""
    k = np.arange(ins.count, dtype=np.int64)
    if ins.op in ("mem.read", "mem.write") and ins.inner > 0:
        return ins.addr + (k // ins.inner) * ins.outer + (k % ins.inner) * ins.stride
    return ins.addr + k * ins.stride


# ---- MEM ------------------------------------------------------------------------

def mem_read(m: Machine, ins: Instr, t):
    """Vectors at the access's lines of slice ``unit`` -> stream ``dst``."""
    m.emit(ins, t, m.load_vectors(ins.unit, m.lines(ins, _starts(ins)), ins.dtype))


def mem_write(m: Machine, ins: Instr, t):
    """Stream ``src`` -> the access's lines of slice ``unit`` (a later vector's lines win)."""
    m.store_vectors(ins.unit, m.lines(ins, _starts(ins)), m.take(ins, t, ins.src0))


def mem_gather(m: Machine, ins: Instr, t):
    """For each int32 index ``i`` in lane 0 of stream ``idx``: the vector at ``base + i * stride``."""
    idx = m.take(ins, t, ins.src0)[:, 0].astype(np.int64)
    m.emit(ins, t, m.load_vectors(ins.unit, m.lines(ins, ins.addr + idx * ins.stride), ins.dtype))


def mem_scatter(m: Machine, ins: Instr, t):
    """For each int32 index ``i`` in lane 0 of the k-th vector of stream ``idx``: the k-th
    vector of stream ``values`` -> the lines at ``base + i * stride`` (a later vector wins)."""
    idx = m.take(ins, t, ins.src1)[:, 0].astype(np.int64)
    lines = m.lines(ins, ins.addr + idx * ins.stride)
    if lines.min() < 0 or lines.max() >= m.cfg.lines_per_slice:
        raise IndexError(f"mem.scatter to lines {lines.min()}..{lines.max()} of slice {ins.unit}")
    vectors = m.take(ins, t, ins.src0)
    for k in range(ins.count):  # in order: a later vector wins a line two indices share
        m.store_vectors(ins.unit, lines[k:k + 1], vectors[k:k + 1])


# ---- DMA ------------------------------------------------------------------------

def _host_vectors(m: Machine, ins: Instr) -> slice:
    return slice(ins.host, ins.host + ins.count * m.lanes * ins.dtype.itemsize)


def dma_load(m: Machine, ins: Instr, t):
    """Off-chip bytes from ``host``, ``count`` vectors -> the lines of slice ``slice``."""
    vectors = m.host[_host_vectors(m, ins)].view(ins.dtype.np).reshape(ins.count, m.lanes)
    m.store_vectors(ins.slice, m.lines(ins, _starts(ins)), vectors)


def dma_store(m: Machine, ins: Instr, t):
    """The lines of slice ``slice`` -> off-chip bytes from ``host``."""
    vectors = m.load_vectors(ins.slice, m.lines(ins, _starts(ins)), ins.dtype)
    m.host[_host_vectors(m, ins)] = vectors.view(np.uint8).reshape(-1)


# ---- MXM ------------------------------------------------------------------------

def mxm_install(m: Machine, ins: Instr, t):
    """``count`` rows from stream ``src``, their first N = ``width`` lanes -> rows ``row ..``
    of weight buffer ``buf``; the installs since its last multiply together make its matrix."""
    rows = m.take(ins, t, ins.src0)
    w = m.wbuf[ins.unit][ins.buf]
    if w is None or w.parts is None:
        w = m.wbuf[ins.unit][ins.buf] = _Weights(None, ins.dtype, {})
    w.parts[ins.addr] = rows[:, :ins.width].copy()


def mxm_multiply(m: Machine, ins: Instr, t):
    """acc[addr + k][:N] = (mul) or += (mac) src[k][:K] @ W; mul zeroes lanes N.."""
    plane, first, n = ins.unit, ins.addr, ins.count
    w = m.wbuf[plane][ins.buf].sealed()
    k, width = w.matrix.shape
    x = m.take(ins, t, ins.src0)[:, :k]
    accumulate = ins.op == "mxm.mac"
    if nx.acc_kind(ins.dtype) == nx.ACC_INT:
        m.settle(plane, first, n)
        # Exact: every partial sum of int8/uint8 products is far below 2^53.
        y = (x.astype(np.float64) @ w.matrix.astype(np.float64)).astype(np.int64)
        rows = m.acc_int[plane, first:first + n]
        if accumulate:
            rows[:, :width] = _wrap_int32(rows[:, :width].astype(np.int64) + y)
        else:
            rows[:, :width] = _wrap_int32(y)
            rows[:, width:] = 0
        return
    blocks = m.blocks[plane]
    block = blocks.get((first, n)) if accumulate else None
    if block is not None and block.width == width:  # a split of an open block
        block.xs.append(x)
        block.ws.append(w.matrix)
        return
    m.settle(plane, first, n)
    if not accumulate:  # a mul opens a block
        blocks[first, n] = _FloatBlock(width, [x], [w.matrix])
        return
    rows = m.acc_float[plane, first:first + n]
    rows[:, :width] += x.astype(np.float32, order="C") @ w.matrix.astype(np.float32, order="C")


def mxm_drain(m: Machine, ins: Instr, t):
    """Accumulator rows ``acc ..`` (int32 or fp32) -> stream ``dst``; the rows are kept."""
    plane, first, n = ins.unit, ins.addr, ins.count
    m.settle(plane, first, n)
    acc = m.acc_int if ins.dtype is DType.INT32 else m.acc_float
    m.emit(ins, t, acc[plane, first:first + n].copy())


def _wrap_int32(v: np.ndarray) -> np.ndarray:
    return ((v + 2**31) % 2**32 - 2**31).astype(np.int32)


# ---- VXM ------------------------------------------------------------------------

_BINARY = {"vxm.add": np.add, "vxm.sub": np.subtract, "vxm.mul": np.multiply,
           "vxm.max": np.maximum, "vxm.min": np.minimum}


def vxm_binary(m: Machine, ins: Instr, t):
    """a OP b (or a OP imm): floats in fp32 rounded once to dtype; int8/uint8 saturate, int32 wraps."""
    dt = ins.dtype
    a = m.take(ins, t, ins.src0)
    b = m.take(ins, t, ins.src1) if ins.src1 is not None else nx.imm_value(ins.imm, dt)
    fn = _BINARY[ins.op]
    with np.errstate(all="ignore"):
        if dt.is_float:
            out = nx.to_dtype(fn(a.astype(np.float32), np.asarray(b).astype(np.float32)), dt)
        else:
            exact = fn(a.astype(np.int64), np.asarray(b).astype(np.int64))
            out = _wrap_int32(exact) if dt is DType.INT32 else nx.to_dtype(exact, dt)
    m.emit(ins, t, out)


def vxm_transcendental(m: Machine, ins: Instr, t):
    """F(a) in fp64, rounded once to dtype (a float dtype)."""
    with np.errstate(all="ignore"):
        m.emit(ins, t, nx.unary(ins.op, m.take(ins, t, ins.src0), ins.dtype))


def vxm_cvt(m: Machine, ins: Instr, t):
    """a converted to ``to``: rounded once to nearest even; to an integer, saturating (NaN -> 0)."""
    a = m.take(ins, t, ins.src0)
    exact = a.astype(np.float32) if ins.dtype.is_float else a  # every float dtype is exact in fp32
    with np.errstate(all="ignore"):
        m.emit(ins, t, nx.to_dtype(exact, ins.out_dtype))


def vxm_requant(m: Machine, ins: Instr, t):
    """int32 -> int8/uint8: clip(round_half_even(a * scale) + zp), in fp64; scale an fp32
    stream or the fp32 imm."""
    a = m.take(ins, t, ins.src0).astype(np.float64)
    scale = m.take(ins, t, ins.src1).astype(np.float64) if ins.src1 is not None else float(np.float32(ins.imm))
    with np.errstate(all="ignore"):
        m.emit(ins, t, nx.to_dtype(np.rint(a * scale) + ins.zp, ins.out_dtype))


def vxm_reduce(m: Machine, ins: Instr, t):
    """sum or max of the first ``width`` lanes of each vector, in every lane of the result
    (float sums in fp32, numpy's order over a C-ordered row; int32 sums wrap)."""
    part = m.take(ins, t, ins.src0)[:, :ins.width]
    dt = ins.dtype
    with np.errstate(all="ignore"):
        if ins.op == "vxm.reduce_max":
            r = part.max(axis=1)
        elif dt.is_float:
            r = np.ascontiguousarray(part, dtype=np.float32).sum(axis=1, dtype=np.float32).astype(dt.np)
        else:
            r = _wrap_int32(part.astype(np.int64).sum(axis=1))
    m.emit(ins, t, np.repeat(r[:, None], m.lanes, axis=1))


def vxm(m: Machine, ins: Instr, t):
    if ins.op in VXM_BINARY:
        vxm_binary(m, ins, t)
    elif ins.op in VXM_TRANSCENDENTAL:
        vxm_transcendental(m, ins, t)
    elif ins.op in VXM_REDUCE:
        vxm_reduce(m, ins, t)
    elif ins.op == "vxm.cvt":
        vxm_cvt(m, ins, t)
    elif ins.op == "vxm.requant":
        vxm_requant(m, ins, t)


# ---- SXM: lanes move, values do not change; a lane that receives nothing is 0 ------

def _lane_map(m: Machine, ins: Instr) -> np.ndarray:
    """Output lane i <- input lane map[i] (-1: zero) for shift, rotate, permute, broadcast, pad."""
    i = np.arange(m.lanes)
    if ins.op == "sxm.shift":
        src = i - ins.by
        return np.where((src >= 0) & (src < m.lanes), src, -1)
    if ins.op == "sxm.rotate":
        return (i - ins.by) % m.lanes
    if ins.op == "sxm.permute":
        return np.asarray(m.program.tables[ins.map], np.int64)
    if ins.op == "sxm.broadcast":
        return np.full(m.lanes, ins.lane)
    kept = max(0, min(ins.width, m.lanes - ins.before))  # sxm.pad
    return np.where((i >= ins.before) & (i < ins.before + kept), i - ins.before, -1)


def sxm(m: Machine, ins: Instr, t):
    x = m.take(ins, t, ins.src0)
    if ins.op == "sxm.transpose":
        # out vectors: y_j[i] = x_i[j] for the n <= lanes vectors read, 0 past them
        out = np.zeros((ins.out, m.lanes), x.dtype)
        out[:, :len(x)] = x[:, :ins.out].T
    else:
        lane = _lane_map(m, ins)
        out = np.where(lane >= 0, x[:, np.maximum(lane, 0)], np.zeros((), x.dtype))
    m.emit(ins, t, out)


# ---- C2C: each link loops back to this chip ----------------------------------------

def c2c_send(m: Machine, ins: Instr, t):
    """Stream ``src`` -> the end of link ``unit``'s queue."""
    m.links[ins.unit].extend(m.take(ins, t, ins.src0))


def c2c_recv(m: Machine, ins: Instr, t):
    """The ``count`` oldest vectors of link ``unit``'s queue -> stream ``dst``."""
    link = m.links[ins.unit]
    m.emit(ins, t, np.stack([link.popleft() for _ in range(ins.count)]))


def nothing(m: Machine, ins: Instr, t):
    """NOPs hold their queue's ports; icu.sync checks a schedule. Neither changes state."""


SEMANTICS = {
    "mem.read": mem_read,
    "mem.write": mem_write,
    "mem.gather": mem_gather,
    "mem.scatter": mem_scatter,
    "dma.load": dma_load,
    "dma.store": dma_store,
    "mxm.install": mxm_install,
    "mxm.mul": mxm_multiply,
    "mxm.mac": mxm_multiply,
    "mxm.drain": mxm_drain,
    "vxm.*": vxm,
    "sxm.*": sxm,
    "c2c.send": c2c_send,
    "c2c.recv": c2c_recv,
    "icu.*": nothing,
    "mem.nop": nothing, "dma.nop": nothing, "mxm.nop": nothing, "vxm.nop": nothing,
    "sxm.nop": nothing, "c2c.nop": nothing,
}

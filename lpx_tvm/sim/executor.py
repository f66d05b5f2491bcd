"""The functional half of a run: the machine's data, changed by one step per instruction.

The schedule checker (``simulator._Run``) turns each instruction into a *step*
(:mod:`lpx_tvm.sim.replay_steps`): a call of one of this :class:`Executor`'s methods with the
arguments that the checks resolved — which SRAM lines an access touches, which earlier
instruction produced the values a stream operand reads and from which offset, which
MXM blocks to compute when.
A step does only arithmetic and data movement, on whole tiles, with no timing. A
functional run replays the steps of the verified program (see docs/design.md, "Verify
once, replay"); only programs with data-dependent addresses (``mem.gather``) run each
step right after its instruction's checks.
"""

from __future__ import annotations

import numpy as np

from ..machine.isa import VXM_BINARY, VXM_TRANSCENDENTAL
from ..machine.layout import read_tensor, tensor_tiles
from . import numerics as nx
from .memory import Banked
from .mxm import Accumulators


def _chunks(layout, lanes):
    """(slice, addr, first row, rows, first column, end column) of each stored chunk of a tensor."""
    for j in range(-(-layout.cols // lanes)):
        c0, c1 = j * lanes, min(layout.cols, (j + 1) * lanes)
        for q in range(layout.nchunks):
            (sl, addr), r0, n = layout.chunk(j, q)
            yield sl, addr, r0, n, c0, c1


def _tiles(arr, layout, lanes) -> np.ndarray:
    """A tensor as (column tiles, rows, lanes) vectors, zero past the last column."""
    ntiles = -(-layout.cols // lanes)
    out = np.zeros((layout.rows, ntiles * lanes), layout.dtype.np)
    out[:, :layout.cols] = np.asarray(arr).reshape(layout.rows, layout.cols)
    return out.reshape(layout.rows, ntiles, lanes).transpose(1, 0, 2)


def _vectors(sram: Banked, sl, addr, n, layout) -> np.ndarray:
    """The (n, lanes) vectors of a tensor chunk, as a view of the SRAM."""
    L, w = sram.lanes, layout.dtype.itemsize
    return np.ndarray((n, L), layout.dtype.np, sram.flat, (sl * sram.lines + addr) * L, (layout.row_stride * L, w))


def read_binding(sram: Banked, layout, lanes) -> np.ndarray:
    """A new array of the tensor stored in SRAM with ``layout``."""
    if layout.row_stride < layout.dtype.itemsize:  # overlapping vectors: the generic path
        return read_tensor(layout, sram.peek, lanes)
    mat = np.empty((layout.rows, layout.cols), layout.dtype.np)
    for sl, addr, r0, n, c0, c1 in _chunks(layout, lanes):
        mat[r0:r0 + n, c0:c1] = _vectors(sram, sl, addr, n, layout)[:, :c1 - c0]
    return mat.reshape(layout.shape)


class Executor:
    """Data of one functional run: SRAM bytes, accumulators, off-chip memory, and the
    values each instruction put on a stream (by instruction index), kept until the
    checker has seen them leave the chip."""

    def __init__(self, cfg, program, sram: Banked, accs: Accumulators):
        self.cfg = cfg
        self.lanes = cfg.lanes
        self.program = program
        self.sram = sram
        self.flat = sram.flat
        self.accs = accs
        self.host = np.zeros(max(program.host_bytes, len(program.host_init)), np.uint8)
        if program.host_init:
            self.host[:len(program.host_init)] = np.frombuffer(program.host_init, np.uint8)
        self.vals = {}  # producer instruction -> (count, lanes) values it emitted
        self.wbuf = {}  # (plane, buffer) -> (installed rows, width)
        self.fills = {}  # (plane, buffer) -> [(first row, rows)] installed since its last multiply

    # ---- before and after the instructions ---------------------------------
    def load_image(self, key=None, keep=None):
        """The program's initial SRAM image (checked to fit by the simulator); ``key`` names
        it, to restore only what changed when it is still loaded, and ``keep`` lines to leave
        as they are (see Banked.load_image)."""
        lanes = self.lanes
        self.sram.load_image(key, [(img.slice, img.addr,
                                    np.frombuffer(img.data, np.uint8).reshape(len(img.data) // lanes, lanes))
                                   for img in self.program.sram_init], keep)

    def load_inputs(self, arrays: dict):
        """Store the inputs (already checked and converted to their layouts' dtypes); an input
        not in ``arrays`` is kept from the previous run (not fed)."""
        for b in self.program.inputs:
            arr = arrays.get(b.name)
            if arr is None:
                continue
            if getattr(b, "offchip", None) is not None:
                self._offchip(b)[...] = _tiles(arr, b.layout, self.lanes)
                continue
            for sl, addr, r0, n, c0, c1 in _chunks(b.layout, self.lanes):
                lay = b.layout
                if lay.row_stride < lay.dtype.itemsize:  # overlapping vectors: the generic path
                    for sl_, lines, raw in tensor_tiles(lay, arr, self.lanes):
                        self.sram.poke(sl_, lines, raw)
                    break
                dst = _vectors(self.sram, sl, addr, n, lay)
                dst[:, :c1 - c0] = arr.reshape(lay.rows, lay.cols)[r0:r0 + n, c0:c1]
                dst[:, c1 - c0:] = 0
                self.sram.mark({sl: (addr, addr + (n - 1) * lay.row_stride + lay.dtype.itemsize - 1)})

    def read_outputs(self, names=None) -> dict:
        """The outputs (only those ``names`` names, when given) as tensors."""
        out = {}
        for b in self.program.outputs:
            if names is not None and b.name not in names:
                continue
            if getattr(b, "offchip", None) is not None:
                lay = b.layout
                mat = np.concatenate(list(self._offchip(b)), axis=1)[:, :lay.cols]
                out[b.name] = mat.reshape(lay.shape)
            else:
                out[b.name] = read_binding(self.sram, b.layout, self.lanes)
        return out

    def _offchip(self, b) -> np.ndarray:
        """An off-chip binding's (column tiles, rows, lanes) vectors, a view of the off-chip memory."""
        lay, L = b.layout, self.lanes
        ntiles = -(-lay.cols // L)
        nbytes = ntiles * lay.rows * L * lay.dtype.itemsize
        return self.host[b.offchip:b.offchip + nbytes].view(lay.dtype.np).reshape(ntiles, lay.rows, L)

    def replay(self, steps):
        """Run a plan's steps (see sim/replay_plan.py), dropping each value after its last read."""
        vals = self.vals
        for step in steps:
            step.run(self)
            for p in step.drop:
                del vals[p]

    def operand(self, producer: int, off: int, count: int) -> np.ndarray:
        """Vectors ``off .. off + count - 1`` of what ``producer`` emitted, (count, lanes)."""
        v = self.vals[producer]
        if v.ndim == 3:  # rows in groups (a 2-D read pattern): one array from now on
            v = self.vals[producer] = v.reshape(-1, v.shape[-1])
        return v[off:off + count]

    def free(self, producers: tuple):
        vals = self.vals
        for p in producers:
            vals.pop(p, None)

    # ---- MEM / DMA -----------------------------------------------------------
    # An access is a strided ndarray over the SRAM bytes (see Banked.vectors_spec), or,
    # for the few patterns without one, a gather/scatter of line numbers.
    def mem_read(self, i, spec, count, dtype, copy):
        shape, offset, strides = spec
        v = np.ndarray(shape, dtype, self.flat, offset, strides)
        if copy:
            if len(shape) == 3:
                r = v.reshape(count, self.lanes)  # a copy, unless the groups line up (e.g. one group)
                v = r.copy() if np.may_share_memory(r, v) else r
            else:
                v = v.copy()
        self.vals[i] = v  # else a view: (count, lanes), or (groups, inner, lanes) for a 2-D pattern

    def mem_read_lines(self, i, bank, index, count, dtype):
        self.vals[i] = self.sram.load(bank, index, count, dtype)

    def mem_write(self, spec, producer, off, count):
        v = self.operand(producer, off, count)
        shape, offset, strides = spec
        np.ndarray(shape, v.dtype, self.flat, offset, strides)[...] = v.reshape(shape)

    def mem_write_lines(self, bank, index, producer, off, count):
        self.sram.store(bank, index, self.operand(producer, off, count))

    def dma_load(self, spec, lo, hi):
        shape, offset, strides = spec
        np.ndarray(shape, np.uint8, self.flat, offset, strides)[...] = self.host[lo:hi].reshape(shape)

    def dma_load_lines(self, bank, index, lo, hi):
        raw = self.host[lo:hi]
        if isinstance(index, slice):
            self.sram.data[bank, index] = raw.reshape(-1, self.lanes)
        else:
            self.sram.data[bank, index] = raw.reshape(index.shape + (self.lanes,))

    def dma_store(self, spec, lo, hi):
        shape, offset, strides = spec
        self.host[lo:hi] = np.ndarray(shape, np.uint8, self.flat, offset, strides).reshape(-1)

    # ---- MXM -------------------------------------------------------------------
    def mxm_install(self, plane, buf, producer, off, rows, row, fresh):
        if fresh:
            self.fills[plane, buf] = []
        self.fills[plane, buf].append((row, self.operand(producer, off, rows)))

    def mxm_seal(self, plane, buf, width):
        parts = sorted(self.fills.pop((plane, buf)), key=lambda p: p[0])
        # One part is a view of its stream value, as it came; several are joined once.
        rows = parts[0][1] if len(parts) == 1 else np.concatenate([x for _, x in parts])
        self.wbuf[plane, buf] = (rows, width)

    def mxm_split(self, plane, buf, block, producer, off, count):
        rows, width = self.wbuf[plane, buf]
        v = self.vals[producer]
        if v.ndim == 3 and off % v.shape[1] == 0 and count % v.shape[1] == 0:
            # rows in groups: the MXM concatenates them without a copy first
            x = v[off // v.shape[1]:(off + count) // v.shape[1]]
        else:
            x = self.operand(producer, off, count)
        self.accs.split(block, x, rows, width)

    def mxm_settle(self, plane, block, addr, count, xkeep, wkeep, batch):
        self.accs.settle(plane, block, addr, count, xkeep, wkeep, batch)

    def mxm_settle_early(self, plane, block, addr, count, xdrop, wdrop):
        self.accs.settle_early(plane, block, addr, count, xdrop, wdrop)

    def mxm_now(self, plane, buf, addr, producer, off, count, wkey, kind, accumulate):
        rows, width = self.wbuf[plane, buf]
        self.accs.now(plane, addr, self.operand(producer, off, count), rows, width, wkey, kind, accumulate)

    def mxm_drain(self, i, plane, addr, count, kind):
        self.vals[i] = self.accs.read(plane, addr, count, kind)

    # ---- VXM / SXM -----------------------------------------------------------
    def vxm(self, i, op, dt, out_dt, count, a, b, imm, aux0):
        x = self.operand(a[0], a[1], count)
        y = imm if b is None else self.operand(b[0], b[1], count)
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are the hardware's, not errors
            if op in VXM_BINARY:
                out = nx.binary(op, x, y, dt)
            elif op in VXM_TRANSCENDENTAL:
                out = nx.unary(op, x, dt)
            elif op == "vxm.cvt":
                out = nx.convert(x, out_dt)
            elif op == "vxm.requant":
                out = nx.requant(x, y, aux0, out_dt)
            else:
                out = nx.reduce(op, x, aux0, dt)
        self.vals[i] = out

    def vxm_inplace(self, i, op, a, b, imm):
        """An fp32 binary op whose first operand, a whole value, is read by nothing after:
        the result overwrites it (no new array, one pass less over memory)."""
        x = self.vals[a]
        y = imm if b is None else self.operand(b[0], b[1], len(x))
        with np.errstate(all="ignore"):
            nx.binary_into(op, x, y)
        self.vals[i] = x

    def sxm(self, i, op, count, a, aux0, aux1):
        x = self.operand(a[0], a[1], count)
        if op == "sxm.shift":
            out = nx.shift(x, aux0)
        elif op == "sxm.rotate":
            out = nx.rotate(x, aux0)
        elif op == "sxm.permute":
            out = nx.permute(x, np.asarray(self.program.tables[aux0]))
        elif op == "sxm.transpose":
            out = nx.transpose(x, aux0)
        elif op == "sxm.broadcast":
            out = nx.broadcast(x, aux0)
        else:
            out = nx.pad(x, aux0, aux1)
        self.vals[i] = out

    # ---- C2C -------------------------------------------------------------------
    def c2c_send(self, i, producer, off, count):
        self.vals[i] = self.operand(producer, off, count)

    def c2c_recv(self, i, parts):
        self.vals[i] = np.concatenate([self.operand(s, a, k) for s, a, k in parts])

    def c2c_recv_remote(self, i, parts):
        """Values other chips' executors sent: ``parts`` of (executor, sender, first, count)."""
        self.vals[i] = np.concatenate([src.operand(s, a, k) for src, s, a, k in parts])


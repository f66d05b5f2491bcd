"""Compile one LPX region (a partitioned Relax function) into one Program.

Storage convention inside a region: a 4-D NCHW tensor is stored as an NHWC matrix
(rows = N*H*W pixels, cols = C channels, cut into tiles of ``lanes`` channels); any
other tensor as rows = product of all but the last dim, cols = last dim. The lanes
past a tensor's last channel hold unspecified values and every consumer ignores them
(MXM installs only the valid weight rows, reductions take a width). The runtime
converts NCHW to NHWC and back at the region's boundary.

MXM ops (conv2d, dense) are lowered through their TensorIR schedule: the scheduled
PrimFunc's tile instances (:func:`lpx_tvm.tir_schedules.tile_steps`) become install /
multiply-accumulate groups, and the last reduction tile of each output block a drain
group that also applies the fused epilogue (bias, ReLU, clip) and the conversion to the
storage dtype. Vector ops (elementwise, pools) become VXM/SXM groups per column tile.
All groups of the region go to one ProgramBuilder, whose list scheduler times them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...tir_schedules import (Conv2dWorkload, DenseTiling, DenseWorkload, DepthwiseWorkload, default_tiling, round_up,
                              schedule, tile_steps)
from ...tir_schedules.schedules import Conv2dTiling
from ...errors import SchedulingError
from ..builder import ProgramBuilder, SramTensor
from ..config import LPXConfig
from ..isa import DType
from ..program import Program
from .graph import Operand, Region, RegionOp, UnsupportedOnLPX, read_region
from .support import block_diagonal, grouped_conv_problem, reshape_keeps_storage

PRECISION_DTYPE = {"fp32": DType.FP32, "fp16": DType.FP16, "bf16": DType.BF16}
TVM_DTYPE = {DType.FP32: "float32", DType.FP16: "float16", DType.BF16: "bfloat16"}


@dataclass
class Stored:
    """A region value in SRAM: its logical shape and the matrix that holds it."""

    tensor: SramTensor
    shape: tuple  # logical (Relax) shape

    @property
    def nhwc(self) -> bool:
        return len(self.shape) == 4


def stored_shape(shape: tuple) -> tuple:
    """The tensor shape a Relax value is stored as (NCHW -> NHWC)."""
    if len(shape) == 4:
        n, c, h, w = shape
        return (n, h, w, c)
    return tuple(shape) if shape else (1,)


def _slices(values) -> list:
    return [sl for v in values for sl, _ in v.tensor.layout.tiles]


@dataclass
class CompiledRegion:
    name: str
    program: Program
    inputs: list  # [(param name, logical shape)]
    outputs: list  # [(binding name, logical shape)]
    macs: int = 0
    ops: dict = field(default_factory=dict)  # relax op -> count, for reports
    weight_bytes: int = 0  # all MXM weights, resident or streamed
    streamed_bytes: int = 0  # the part kept off chip and loaded over the DMA path
    input_transforms: dict = field(default_factory=dict)  # param -> host-side layout (im2col)


class _Planes:
    """Round-robin plane choice, alternating weight buffers and accumulator halves."""

    def __init__(self, cfg: LPXConfig):
        self.cfg = cfg
        self.next = 0
        self.installs = [0] * cfg.mxm_planes
        self.blocks = [0] * cfg.mxm_planes

    def new_block(self, rows: int) -> tuple:
        p = self.next
        self.next = (self.next + 1) % self.cfg.mxm_planes
        half = self.cfg.mxm_acc_rows // 2
        base = (self.blocks[p] % 2) * half if rows <= half else 0
        if rows > self.cfg.mxm_acc_rows:
            raise UnsupportedOnLPX(f"an output block of {rows} rows exceeds the {self.cfg.mxm_acc_rows} accumulators")
        self.blocks[p] += 1
        return p, base

    def buffer(self, plane: int) -> int:
        b = self.installs[plane] % self.cfg.mxm_weight_buffers
        self.installs[plane] += 1
        return b


def _runs(n: int, key) -> list:
    """Maximal runs [i0, i1) of 0..n-1 over which ``key(i)`` stays the same."""
    out, i = [], 0
    while i < n:
        k, j = key(i), i + 1
        while j < n and key(j) == k:
            j += 1
        out.append((i, j))
        i = j
    return out


def _chunk_of(t: SramTensor, row: int) -> int:
    return row // t.layout.rows_per_chunk


@dataclass
class StreamedWeights:
    """A weight matrix kept in off-chip memory: column tile ``j`` is ``rows`` vectors of
    ``lanes`` lanes from byte ``offsets[j]``, loaded over the DMA path tile by tile."""

    offsets: list
    rows: int
    vector_bytes: int
    nbytes: int

    @classmethod
    def place(cls, builder: ProgramBuilder, matrix: np.ndarray, dtype: DType, lanes: int) -> "StreamedWeights":
        rows, cols = matrix.shape
        offsets = []
        for j in range(-(-cols // lanes)):
            tile = np.zeros((rows, lanes), dtype.np)
            part = matrix[:, j * lanes:(j + 1) * lanes]
            tile[:, :part.shape[1]] = part
            offsets.append(builder.host_buffer(tile))
        vb = lanes * dtype.itemsize
        return cls(offsets, rows, vb, len(offsets) * rows * vb)

    def offset(self, j: int, row: int) -> int:
        return self.offsets[j] + row * self.vector_bytes


class RegionCompiler:
    # Share of the SRAM that resident weights may take; the rest is working space.
    weight_budget = 0.6

    def __init__(self, config: LPXConfig, precision: str = "fp16"):
        if precision not in PRECISION_DTYPE:
            raise UnsupportedOnLPX(f"precision {precision!r} (expected fp32, fp16 or bf16)")
        self.cfg = config
        self.dtype = PRECISION_DTYPE[precision]
        self.acc = DType.FP32

    def compile(self, name: str, func) -> CompiledRegion:
        region = read_region(name, func)
        self.b = ProgramBuilder(self.cfg, name)
        self.planes = _Planes(self.cfg)
        self.values = {}
        self.macs = 0
        self.op_counts = {}
        self._fills = {}
        self._maps = {}
        self.input_transforms = self._im2col_inputs(region)
        for p in region.params:
            tr = self.input_transforms.get(p.name)
            shape = tuple(tr["matrix"]) if tr else stored_shape(p.shape)
            self.values[p.name] = Stored(self.b.input(p.name, shape, self.dtype,
                                                      row_align=1 if tr else _row_align(p.shape)), p.shape)
        # Liveness: a value's SRAM is reused once its last reader has been emitted.
        last_use = {}
        names = {p.name for p in region.params} | {op.out for op in region.ops}
        for i, op in enumerate(region.ops):
            for arg in [a for s in [op.main] + op.epilogue for a in s.args if not a.is_const]:
                if arg.name in names:
                    last_use[arg.name] = i
        keep = set(region.outputs)
        # Constants go first: the initial image must sit in lines that working space never
        # touches, which the allocator can only promise for space it has not handed out yet.
        self._weights = {op.out: self._weight_tensor(op) for op in region.ops}
        for i, op in enumerate(region.ops):
            self._count(op)
            self._scratch = []
            self._lower(op, op.out in region.outputs)
            for t in self._scratch:
                self.b.free(t)
            dead = [v for v, last in last_use.items() if last == i and v not in keep]
            for v in dead:
                self._release(v)
        outputs = []
        out_names = {bnd.name for bnd in self.b._bindings if bnd.role == "output"}
        taken = set()
        for name_ in region.outputs:
            st = self.values[name_]
            # A reshape alias shares its source's tensor: an output tensor stored in another
            # shape (or already returned for another output) is returned through a copy.
            if st.tensor.name not in out_names or st.tensor.name in taken or \
                    tuple(st.tensor.layout.shape) != stored_shape(st.shape):
                st = self._copy(st, f"{name_}_out", is_output=True)
            taken.add(st.tensor.name)
            outputs.append((st.tensor.name, st.shape))
        prog = self.b.build()
        weights = [w for w in self._weights.values() if w is not None]
        streamed = sum(w.nbytes for w in weights if isinstance(w, StreamedWeights))
        resident = sum(w.ntiles * w.layout.rows * self.cfg.lanes * w.layout.dtype.itemsize
                       for w in weights if not isinstance(w, StreamedWeights))
        return CompiledRegion(name, prog, [(p.name, p.shape) for p in region.params], outputs, self.macs,
                              self.op_counts, resident + streamed, streamed, self.input_transforms)

    def _im2col_inputs(self, region: Region) -> dict:
        """Region inputs whose only reader is a convolution with few input channels (an
        image stem): the host lays them out as im2col rows (one row per output pixel, the
        taps of all input channels along the lanes), so the convolution is one dense
        matmul with a single reduction tile instead of one narrow tile per tap."""
        readers = {}
        for op in region.ops:
            for a in [x for st in [op.main] + op.epilogue for x in st.args if not x.is_const]:
                readers.setdefault(a.name, []).append(op)
        out = {}
        for p in region.params:
            ops = readers.get(p.name, [])
            if len(ops) != 1 or ops[0].main.op != "nn.conv2d" or ops[0].main.args[0].name != p.name:
                continue
            op = ops[0]
            a = op.main.attrs
            co, cg, kh, kw = op.main.args[1].shape
            if a.get("groups", 1) != 1 or cg * kh * kw > self.cfg.mxm_rows or kh * kw == 1:
                continue
            n, _, oh, ow = op.shape
            out[p.name] = {"kind": "im2col", "kernel": [kh, kw], "strides": list(a["strides"]),
                           "padding": list(a["padding"]), "dilation": list(a["dilation"]),
                           "matrix": [n * oh * ow, kh * kw * cg]}
        return out

    # ---- storage helpers -----------------------------------------------------
    def _release(self, name: str):
        """Free a dead value's tensor unless another live value (a reshape alias) shares it."""
        tensor = self.values.pop(name).tensor
        if all(v.tensor is not tensor for v in self.values.values()):
            self.b.free(tensor)

    def _temp(self, tensor):
        """Register a tensor that lives only while the current op is emitted."""
        self._scratch.append(tensor.tensor if isinstance(tensor, Stored) else tensor)
        return tensor

    def _count(self, op: RegionOp):
        for s in [op.main] + op.epilogue:
            self.op_counts[s.op] = self.op_counts.get(s.op, 0) + 1

    def _new(self, name: str, shape: tuple, is_output: bool = False, avoid=(), dtype=None) -> Stored:
        role = "output" if is_output else None
        t = self.b.tensor(name, stored_shape(shape), dtype or self.dtype, role=role, avoid=_slices(avoid),
                          row_align=_row_align(shape))
        return Stored(t, shape)

    def _copy(self, x: Stored, name: str, is_output: bool = False, avoid=()) -> Stored:
        y = self._new(name, x.shape, is_output, avoid=list(avoid) + [x], dtype=x.tensor.layout.dtype)
        self._rowwise(f"{name}.copy", [x], y, lambda g, vs: vs[0])
        return y

    def _apart(self, x: Stored, other: Stored, tag: str) -> Stored:
        """``x``, or a copy of it on other slices when it shares a slice with ``other``
        (both are read in one group, and a slice has one read port)."""
        if not set(_slices([x])) & set(_slices([other])):
            return x
        return self._temp(self._copy(x, f"{tag}.apart", avoid=[other]))

    def _rowwise(self, tag: str, inputs: list, y: Stored, body, tiles=None):
        """For each column tile and run of rows that sits in one chunk of every tensor:
        read the inputs' rows, ``body(group, values) -> value``, write it to ``y``."""
        rows = y.tensor.layout.rows
        # An input given as (value, tile) always supplies that column tile (e.g. a per-row scale).
        inputs = [x if isinstance(x, tuple) else (x, None) for x in inputs]
        tensors = [x.tensor for x, _ in inputs] + [y.tensor]
        for j in range(y.tensor.ntiles) if tiles is None else tiles:
            for r0, r1 in _runs(rows, lambda r: tuple(_chunk_of(t, r) for t in tensors)):
                g = self.b.group(tag)
                vs = [g.read(_one(x.tensor.segments(j if t is None else t, r0, r1))) for x, t in inputs]
                v = body(g, vs)
                self._finish(g, v, y.tensor.segments(j, r0, r1)[0][1])

    def _value(self, operand: Operand) -> Stored:
        if operand.is_const:
            raise UnsupportedOnLPX("a constant where a tensor input was expected")
        return self.values[operand.name]

    def _lower(self, op: RegionOp, is_output: bool):
        kind = op.main.op
        lower = {"nn.conv2d": self._conv2d, "matmul": self._dense, "add": self._binary, "subtract": self._binary,
                 "multiply": self._binary, "nn.relu": self._unary, "sigmoid": self._unary, "tanh": self._unary,
                 "clip": self._unary, "nn.max_pool2d": self._pool, "nn.avg_pool2d": self._pool,
                 "concat": self._concat, "mean": self._global_avg_pool}.get(kind)
        if kind == "reshape":
            return self._reshape(op)
        if lower is None:
            raise UnsupportedOnLPX(f"no LPX lowering for {kind}")
        lower(op, is_output)

    # ---- constants -------------------------------------------------------------
    def _weight_tensor(self, op: RegionOp):
        """The MXM weight matrix of an op, as its lowering reads it (None for vector ops):
        resident in SRAM while the constants' budget lasts, else streamed from off-chip memory."""
        lanes = self.cfg.lanes
        kind, args, a = op.main.op, op.main.args, op.main.attrs
        matrix, align = None, lanes
        if kind == "nn.conv2d" and len(args) > 1 and args[1].is_const:
            w = np.asarray(args[1].const, np.float32)
            co, cg, kh, kw = w.shape
            c, groups = args[0].shape[1], a.get("groups", 1)
            depthwise = groups != 1 and groups == c == co and cg == 1
            if groups != 1 and not depthwise:
                w = block_diagonal(w, groups)  # other groupings are lowered as a dense conv
                co, cg, kh, kw = w.shape
            if depthwise:
                cpad = round_up(c, lanes)
                # Row (tap * cpad + ch) holds w[ch, tap] at lane ch % lanes: a diagonal tile per tap.
                diag = np.zeros((kh * kw, cpad, lanes), np.float32)
                diag[:, np.arange(c), np.arange(c) % lanes] = w.reshape(c, kh * kw).T
                matrix = diag.reshape(-1, lanes)
            else:
                # Row (tap * c + ci): whole taps per chunk (or lane tiles) so no K tile straddles slices.
                matrix = w.transpose(2, 3, 1, 0).reshape(-1, co)
                align = lanes if cg % lanes == 0 or kh * kw == 1 else cg
        elif kind == "matmul" and len(args) > 1 and args[1].is_const and len(args[1].shape) == 2:
            matrix = np.asarray(args[1].const, np.float32)
        if matrix is None:
            return None
        rows, cols = matrix.shape
        lines = -(-cols // lanes) * rows * self.dtype.itemsize
        budget = self.weight_budget * self.cfg.mem_slices * self.cfg.lines_per_slice
        if self.b.constant_lines + lines <= budget:
            try:
                return self.b.tensor(f"{op.out}.weight", matrix.shape, self.dtype, data=matrix, row_align=align)
            except SchedulingError:
                pass
        return StreamedWeights.place(self.b, matrix, self.dtype, lanes)

    # ---- epilogues -------------------------------------------------------------
    def _epilogue_consts(self, op: RegionOp, channels: int) -> list:
        """The epilogue as ("bias", SramTensor) / ("clip", lo, hi) steps."""
        out = []
        for s in op.epilogue:
            if s.op == "add" and s.args[1].is_const:
                bias = np.asarray(s.args[1].const, np.float32).reshape(-1)
                if bias.size == 1:
                    bias = np.full(channels, bias[0], np.float32)
                if bias.size != channels:
                    raise UnsupportedOnLPX(f"bias of {bias.size} values for {channels} channels")
                out.append(("bias", self._temp(self.b.constant(f"{op.out}.bias", bias.reshape(1, channels),
                                                               self.acc))))
            elif s.op == "nn.relu":
                out.append(("clip", 0.0, None))
            elif s.op == "clip":
                lo, hi = (float(np.asarray(a.const)) for a in s.args[1:3])
                out.append(("clip", lo, hi))
            else:
                raise UnsupportedOnLPX(f"epilogue op {s.op}")
        return out

    @staticmethod
    def _apply_epilogue(g, y, epilogue, tile: int, rows: int):
        for e in epilogue:
            if e[0] == "bias":
                y = g.vxm("vxm.add", y, g.read(e[1].tile(tile).repeat(rows)))
            else:
                _, lo, hi = e
                if lo is not None and np.isfinite(lo):
                    y = g.vxm("vxm.max", y, imm=lo)
                if hi is not None and np.isfinite(hi):
                    y = g.vxm("vxm.min", y, imm=hi)
        return y

    @staticmethod
    def _finish(g, y, out_region):
        if y.dtype != out_region.dtype:
            y = g.vxm("vxm.cvt", y, to=out_region.dtype)
        g.write(y, out_region)

    def _write_rows(self, g, v, y: Stored, j: int, r0: int, r1: int):
        """Write value ``v`` (rows r0..r1 of tile j) across the chunks it covers."""
        if v.dtype != y.tensor.layout.dtype:
            v = g.vxm("vxm.cvt", v, to=y.tensor.layout.dtype)
        segments = y.tensor.segments(j, r0, r1)
        mid = self.cfg.position("VXM")
        west = {self.cfg.position("MEM", region.slice) < mid for _, region in segments}
        # A VXM result flows one way: chunks on both sides of the VXM get a recomputed twin.
        twin = g.again(v) if len(west) == 2 and v.node.op.startswith("vxm.") else v
        for first, region in segments:
            src = twin if self.cfg.position("MEM", region.slice) < mid else v
            g.write(src.part(first - r0, region.count) if (first, region.count) != (r0, r1 - r0) else src, region)

    # ---- MXM ops -----------------------------------------------------------------
    def _conv2d(self, op: RegionOp, is_output: bool):
        a = op.main.attrs
        if a.get("data_layout", "NCHW") != "NCHW" or a.get("kernel_layout", "OIHW") != "OIHW":
            raise UnsupportedOnLPX("conv2d layouts other than NCHW/OIHW")
        x = self._value(op.main.args[0])
        w = np.asarray(op.main.args[1].const, np.float32)
        if op.main.args[0].name in self.input_transforms:
            return self._conv_from_im2col(op, x, w, is_output)
        groups = a.get("groups", 1)
        if groups != 1:
            if groups == x.shape[1] == w.shape[0] and w.shape[1] == 1:
                return self._depthwise(op, x, w, is_output)
            # Any other grouping runs as a dense conv with a block-diagonal weight
            # (built by _weight_tensor): the MXM also multiplies the zeros between groups.
            problem = grouped_conv_problem(groups, x.shape[1], w.shape[0])
            if problem:
                raise UnsupportedOnLPX(problem)
        n, c, h, wd = x.shape
        co, cg, kh, kw = w.shape
        (sh, sw), (dh, dw) = a["strides"], a["dilation"]
        lanes = self.cfg.lanes
        xp = self._padded(x, tuple(a["padding"]), op.out)
        hp, wp = xp.shape[2], xp.shape[3]
        cpad, copad = round_up(c, lanes), round_up(co, lanes)
        # Row (tap * c + ci) holds the weights of input channel ci at one tap: taps are whole
        # chunks' worth of rows (row_align=c) so a K tile never straddles two slices.
        work = Conv2dWorkload(n, hp, wp, cpad, kh, kw, copad, (sh, sw), (dh, dw), TVM_DTYPE[self.dtype])
        oh, ow = work.OH, work.OW
        t = default_tiling(self.cfg, work)
        steps = tile_steps(schedule(work, Conv2dTiling(oh=t.oh, ci=lanes, co=lanes, order=t.order)).mod["main"])

        def window(step):
            n0, (oh0, ohe) = step.writes["mxm"][0][0], step.writes["mxm"][1]
            kh0, kw0, ci0 = (step.reads["W"][d][0] for d in range(3))
            first = (n0 * hp + oh0 * sh + kh0 * dh) * wp + kw0 * dw
            return xp.tensor.window_segments(ci0 // lanes, first, ohe, ow, sh * wp, sw)

        def weights(step):
            kh0, kw0, ci0, co0 = (step.reads["W"][d][0] for d in range(4))
            base = (kh0 * kw + kw0) * c + ci0
            return co0 // lanes, base, base + min(c - ci0, lanes)

        def block(step):
            n0, (oh0, ohe), co0 = step.writes["mxm"][0][0], step.writes["mxm"][1], step.writes["mxm"][3][0]
            return co0, (n0 * oh + oh0) * ow, ohe * ow

        self.macs += n * oh * ow * co * cg * kh * kw  # useful MACs: cg = c / groups
        self._emit_mxm(op, steps, window, weights, block, co, is_output)

    def _depthwise(self, op: RegionOp, x: Stored, w: np.ndarray, is_output: bool):
        """Depthwise conv on the MXM: each tap of a channel tile is a diagonal weight tile."""
        a = op.main.attrs
        n, c, h, wd = x.shape
        kh, kw = w.shape[2], w.shape[3]
        (sh, sw), (dh, dw) = a["strides"], a["dilation"]
        lanes = self.cfg.lanes
        xp = self._padded(x, tuple(a["padding"]), op.out)
        hp, wp = xp.shape[2], xp.shape[3]
        cpad = round_up(c, lanes)
        work = DepthwiseWorkload(n, hp, wp, cpad, kh, kw, (sh, sw), (dh, dw), TVM_DTYPE[self.dtype])
        oh, ow = work.OH, work.OW
        t = default_tiling(self.cfg, work)
        steps = tile_steps(schedule(work, Conv2dTiling(oh=t.oh, ci=lanes, co=lanes, order=t.order)).mod["main"])

        def window(step):
            n0, (oh0, ohe) = step.writes["mxm"][0][0], step.writes["mxm"][1]
            kh0, kw0, c0 = (step.reads["W"][d][0] for d in range(3))
            first = (n0 * hp + oh0 * sh + kh0 * dh) * wp + kw0 * dw
            return xp.tensor.window_segments(c0 // lanes, first, ohe, ow, sh * wp, sw)

        def weights(step):
            kh0, kw0, c0 = (step.reads["W"][d][0] for d in range(3))
            base = (kh0 * kw + kw0) * cpad + c0
            return 0, base, base + min(c - c0, lanes)

        def block(step):
            n0, (oh0, ohe), c0 = step.writes["mxm"][0][0], step.writes["mxm"][1], step.writes["mxm"][3][0]
            return c0, (n0 * oh + oh0) * ow, ohe * ow

        self.macs += n * oh * ow * c * kh * kw
        self._emit_mxm(op, steps, window, weights, block, c, is_output)

    def _conv_from_im2col(self, op: RegionOp, x: Stored, w: np.ndarray, is_output: bool):
        """A convolution whose input arrives as im2col rows: a dense matmul with the
        (taps x channels, out channels) weight matrix."""
        co, cg, kh, kw = w.shape
        self._matmul(op, x, x.tensor.layout.rows, kh * kw * cg, co, is_output)

    def _dense(self, op: RegionOp, is_output: bool):
        x = self._value(op.main.args[0])
        wconst = op.main.args[1]
        if not wconst.is_const or len(wconst.shape) != 2:
            raise UnsupportedOnLPX("matmul with a non-constant or non-2-D weight")
        k, nn = wconst.shape
        self._matmul(op, x, math.prod(x.shape[:-1]), k, nn, is_output)

    def _matmul(self, op: RegionOp, x: Stored, rows: int, k: int, nn: int, is_output: bool):
        """(rows, k) activations times the op's (k, nn) weight matrix, through DenseWorkload tiles."""
        lanes = self.cfg.lanes
        work = DenseWorkload(rows, round_up(k, lanes), round_up(nn, lanes), TVM_DTYPE[self.dtype])
        t = default_tiling(self.cfg, work)
        steps = tile_steps(schedule(work, DenseTiling(m=t.m, k=lanes, n=lanes, order=t.order)).mod["main"])

        def window(step):
            (m0, me), (k0, _) = step.reads["A"]
            return [(first - m0, r) for first, r in x.tensor.segments(k0 // lanes, m0, m0 + me)]

        def weights(step):
            (k0, _), (n0, _) = step.reads["B"]
            return n0 // lanes, k0, min(k, k0 + lanes)

        def block(step):
            (m0, me), (n0, _) = step.writes["mxm"]
            return n0, m0, me

        self.macs += rows * k * nn
        self._emit_mxm(op, steps, window, weights, block, nn, is_output)

    def _emit_mxm(self, op: RegionOp, steps, window, weights, block, channels: int, is_output: bool):
        """Install / multiply groups per tile, a drain group (with the epilogue) per output block.

        ``window(step)`` -> [(row offset in the block, Region)]; ``weights(step)`` -> (column
        tile, first row, end row) of the op's weight matrix; ``block(step)`` -> (first channel,
        first output row, rows). Streamed weights come over the off-chip path, one tile at a
        time, into two staging buffers that alternate so the next load overlaps this install.
        """
        lanes = self.cfg.lanes
        W = self._weights[op.out]
        staging = None
        if isinstance(W, StreamedWeights):
            staging = [self._temp(self.b.tensor(f"{op.out}.staging{i}", (lanes, lanes), self.dtype))
                       for i in range(2)]
        y = self._new(op.out, op.shape, is_output)
        epi = self._epilogue_consts(op, channels)
        tag = op.out
        last = {block(s): i for i, s in enumerate(steps)}
        live = {}  # output block -> (plane, first accumulator row)
        for i, s in enumerate(steps):
            key = block(s)
            col0, first_row, nrows = key
            first = key not in live
            if first:
                live[key] = self.planes.new_block(nrows)
            plane, acc = live[key]
            buf = self.planes.buffer(plane)
            j, row0, row1 = weights(s)
            if staging is None:
                src = _one(W.segments(j, row0, row1))
            else:
                src = staging[i % 2].tile(0).rows(0, row1 - row0)
                self.b.group(f"{tag}.stream").dma_load(W.offset(j, row0), src)
            g = self.b.group(f"{tag}.install")
            g.install(plane, buf, g.read(src), width=min(channels - col0, lanes))
            for offset, region in window(s):
                g = self.b.group(f"{tag}.mul")
                g.mul(plane, buf, g.read(region), acc=acc + offset, accumulate=not first)
            if last[key] == i:
                g = self.b.group(f"{tag}.drain")
                v = g.drain(plane, acc, nrows, self.acc)
                v = self._apply_epilogue(g, v, epi, col0 // lanes, nrows)
                self._write_rows(g, v, y, col0 // lanes, first_row, first_row + nrows)
                del live[key]
        self.values[op.out] = y

    def _padded(self, x: Stored, pads, tag: str, fill: float = 0.0) -> Stored:
        """A spatially padded copy of an NHWC value (the value itself when no padding).

        The border is written explicitly with ``fill`` (a reused buffer holds old data)."""
        pt, pl, pb, pr = pads
        if not any(pads):
            return x
        n, c, h, w = x.shape
        hp, wp = h + pt + pb, w + pl + pr
        xp = Stored(self._temp(self.b.tensor(f"{tag}.padded", (n * hp * wp, c), self.dtype, row_align=wp,
                                             avoid=_slices([x]))), (n, c, hp, wp))
        fill_row = self._fill_vector(fill)
        border = [(0, pt, 0, wp), (pt + h, pb, 0, wp), (pt, h, 0, pl), (pt, h, pl + w, pr)]  # rows, cols
        for i in range(n):
            for r_first, nrows, c_first, ncols in border:
                if not nrows or not ncols:
                    continue
                base = (i * hp + r_first) * wp + c_first
                for r0, r1 in _runs(nrows, lambda r: _chunk_of(xp.tensor, base + r * wp)):
                    for j in range(x.tensor.ntiles):
                        g = self.b.group(f"{tag}.border")
                        dst = _one(xp.tensor.window_segments(j, base + r0 * wp, r1 - r0, ncols, wp))
                        g.write(g.read(fill_row.tile(0).repeat(dst.count)), dst)
            for r0, r1 in _runs(h, lambda r: (_chunk_of(x.tensor, (i * h + r) * w),
                                              _chunk_of(xp.tensor, (i * hp + pt + r) * wp))):
                for j in range(x.tensor.ntiles):
                    g = self.b.group(f"{tag}.pad")
                    src = _one(x.tensor.segments(j, (i * h + r0) * w, (i * h + r1) * w))
                    dst = _one(xp.tensor.window_segments(j, (i * hp + pt + r0) * wp + pl, r1 - r0, w, wp))
                    g.write(g.read(src), dst)
        return xp

    def _fill_vector(self, value: float):
        """A constant vector of ``value`` in every lane (one per value and region)."""
        key = float(value)
        if key not in self._fills:
            self._fills[key] = self.b.constant(f"fill{len(self._fills)}", np.full((1, self.cfg.lanes), key,
                                                                                  np.float32), self.dtype)
        return self._fills[key]

    # ---- vector ops ------------------------------------------------------------------
    def _binary(self, op: RegionOp, is_output: bool):
        a, b = op.main.args
        if a.is_const and not b.is_const:
            if op.main.op == "subtract":
                raise UnsupportedOnLPX("constant minus tensor")
            a, b = b, a
        x = self._value(a)
        if tuple(x.shape) != tuple(op.shape):
            raise UnsupportedOnLPX("broadcast that enlarges the first operand")
        vop = {"add": "vxm.add", "subtract": "vxm.sub", "multiply": "vxm.mul"}[op.main.op]
        clips = [e for e in self._epilogue_consts(op, x.tensor.layout.cols) if e[0] == "clip"]
        y = self._new(op.out, op.shape, is_output, avoid=[x])
        if not b.is_const:
            other = self._value(b)
            if tuple(other.shape) != tuple(x.shape):
                raise UnsupportedOnLPX(f"broadcast of {other.shape} to {x.shape}")
            other = self._apart(other, x, op.out)
            self._rowwise(f"{op.out}.{op.main.op}", [x, other], y,
                          lambda g, vs: self._apply_epilogue(g, g.vxm(vop, vs[0], vs[1]), clips, 0, 0))
            self.values[op.out] = y
            return
        cv = np.asarray(b.const, np.float32)
        if cv.size == 1:
            imm = float(cv.reshape(-1)[0])
            body = lambda g, vs: self._apply_epilogue(g, g.vxm(vop, vs[0], imm=imm), clips, 0, 0)  # noqa: E731
            self._rowwise(f"{op.out}.{op.main.op}", [x], y, body)
        elif self._per_channel(cv, x.shape):
            row = self._temp(self.b.constant(f"{op.out}.operand", cv.reshape(1, -1), self.dtype,
                                             avoid=_slices([x, y])))
            rows = x.tensor.layout.rows
            tensors = [x.tensor, y.tensor]
            for j in range(x.tensor.ntiles):
                for r0, r1 in _runs(rows, lambda r: tuple(_chunk_of(t, r) for t in tensors)):
                    g = self.b.group(f"{op.out}.{op.main.op}")
                    v = g.vxm(vop, g.read(_one(x.tensor.segments(j, r0, r1))), g.read(row.tile(j).repeat(r1 - r0)))
                    self._finish(g, self._apply_epilogue(g, v, clips, j, r1 - r0), _one(y.tensor.segments(j, r0, r1)))
        elif cv.shape == tuple(x.shape):
            arr = cv.transpose(0, 2, 3, 1) if x.nhwc else cv
            full = Stored(self._temp(self.b.tensor(f"{op.out}.operand", stored_shape(cv.shape), self.dtype,
                                                   data=arr, avoid=_slices([x]), row_align=_row_align(cv.shape))),
                          cv.shape)
            self._rowwise(f"{op.out}.{op.main.op}", [x, full], y,
                          lambda g, vs: self._apply_epilogue(g, g.vxm(vop, vs[0], vs[1]), clips, 0, 0))
        else:
            raise UnsupportedOnLPX(f"broadcast of a constant of shape {cv.shape} to {x.shape}")
        self.values[op.out] = y

    @staticmethod
    def _per_channel(cv: np.ndarray, shape: tuple) -> bool:
        """True when ``cv`` broadcasts along the stored channel axis only."""
        if len(shape) == 4:
            return cv.size == shape[1] and (cv.ndim < 3 or cv.shape[-1] == cv.shape[-2] == 1)
        return cv.size == shape[-1] and cv.shape[-1] == shape[-1]

    def _unary(self, op: RegionOp, is_output: bool):
        x = self._value(op.main.args[0])
        y = self._new(op.out, op.shape, is_output, avoid=[x])

        def body(g, vs):
            v = vs[0]
            for s in [op.main] + op.epilogue:
                if s.op == "nn.relu":
                    v = g.vxm("vxm.max", v, imm=0.0)
                elif s.op == "clip":
                    lo, hi = (float(np.asarray(a.const)) for a in s.args[1:3])
                    if np.isfinite(lo):
                        v = g.vxm("vxm.max", v, imm=lo)
                    if np.isfinite(hi):
                        v = g.vxm("vxm.min", v, imm=hi)
                elif s.op in ("sigmoid", "tanh"):
                    v = g.vxm(f"vxm.{s.op}", v)
                else:
                    raise UnsupportedOnLPX(f"{s.op} after {op.main.op}")
            return v

        self._rowwise(f"{op.out}.{op.main.op}", [x], y, body)
        self.values[op.out] = y

    def _pool(self, op: RegionOp, is_output: bool):
        """Max or average pooling: fold the window taps into an fp32 accumulator one tap per
        group (the taps of one image share a slice, so they cannot stream together), then
        scale (average) and convert."""
        a = op.main.attrs
        if a.get("layout", "NCHW") != "NCHW" or a.get("ceil_mode", False):
            raise UnsupportedOnLPX("pooling with ceil_mode or a layout other than NCHW")
        is_max = op.main.op == "nn.max_pool2d"
        x = self._value(op.main.args[0])
        n, c, h, w = x.shape
        kh, kw = a["pool_size"]
        (sh, sw), (dh, dw) = a["strides"], a["dilation"]
        pads = tuple(a["padding"])
        xp = self._padded(x, pads, op.out, fill=-np.inf if is_max else 0.0)
        hp, wp = xp.shape[2], xp.shape[3]
        oh, ow = op.shape[2], op.shape[3]
        total = self._temp(self._new(f"{op.out}.acc", op.shape, avoid=[xp], dtype=self.acc))
        y = self._new(op.out, op.shape, is_output, avoid=[total])
        lanes = self.cfg.lanes
        scale_t = None
        if not is_max:
            if a.get("count_include_pad", False) or not any(pads):
                scale = np.full(oh * ow, 1.0 / (kh * kw), np.float32)
            else:  # taps that fall on padding do not count
                inside = np.zeros((hp, wp), np.float32)
                inside[pads[0]:pads[0] + h, pads[1]:pads[1] + w] = 1
                counts = [[inside[i * sh:i * sh + (kh - 1) * dh + 1:dh, j * sw:j * sw + (kw - 1) * dw + 1:dw].sum()
                           for j in range(ow)] for i in range(oh)]
                scale = 1.0 / np.array(counts, np.float32).reshape(-1)
            scale_map = np.repeat(np.tile(scale, n)[:, None], lanes, axis=1)
            scale_t = Stored(self._temp(self.b.tensor(f"{op.out}.scale", (n * oh * ow, lanes), self.acc,
                                                      data=scale_map, avoid=_slices([total]), row_align=ow)),
                             (n, lanes, oh, ow))
        combine = "vxm.max" if is_max else "vxm.add"
        for i in range(n):
            for t in range(kh * kw):
                r, s_ = divmod(t, kw)
                first = (i * hp + r * dh) * wp + s_ * dw
                runs = _runs(oh, lambda o: (_chunk_of(xp.tensor, first + o * sh * wp),
                                            _chunk_of(total.tensor, (i * oh + o) * ow)))
                for o0, o1 in runs:
                    for j in range(x.tensor.ntiles):
                        g = self.b.group(f"{op.out}.pool")
                        win = _one(xp.tensor.window_segments(j, first + o0 * sh * wp, o1 - o0, ow, sh * wp, sw))
                        out = _one(total.tensor.segments(j, (i * oh + o0) * ow, (i * oh + o1) * ow))
                        v = g.read(win)
                        if v.dtype != self.acc:
                            v = g.vxm("vxm.cvt", v, to=self.acc)
                        if t:
                            v = g.vxm(combine, v, g.read(out))
                        g.write(v, out)
        if is_max:
            self._rowwise(f"{op.out}.pool", [total], y, lambda g, vs: vs[0])
        else:
            self._rowwise(f"{op.out}.pool", [total, (self._apart(scale_t, total, op.out), 0)], y,
                          lambda g, vs: g.vxm("vxm.mul", vs[0], vs[1]))
        self.values[op.out] = y

    def _concat(self, op: RegionOp, is_output: bool):
        """Concatenate along channels: move each input's lanes into place with one SXM
        permute (the other lanes become zero) and add the disjoint pieces of each output tile."""
        axis = op.main.attrs.get("axis", 1)
        axis = axis[0] if isinstance(axis, list) else axis
        parts = [self._value(v) for v in op.main.args]
        rank = len(op.shape)
        axis = axis + rank if axis < 0 else axis
        if axis != (1 if rank == 4 else rank - 1):
            raise UnsupportedOnLPX(f"concat along axis {axis} of a rank-{rank} tensor")
        lanes = self.cfg.lanes
        y = self._new(op.out, op.shape, is_output, avoid=parts)
        rows = y.tensor.layout.rows
        written = set()
        offset = 0
        for x in parts:
            cx = x.shape[1] if rank == 4 else x.shape[-1]
            for ch0 in range(0, cx, lanes):
                done, width_in = 0, min(lanes, cx - ch0)
                while done < width_in:
                    tile, b = divmod(offset + ch0 + done, lanes)
                    length = min(width_in - done, lanes - b)
                    for r0, r1 in _runs(rows, lambda r: (_chunk_of(x.tensor, r), _chunk_of(y.tensor, r))):
                        g = self.b.group(f"{op.out}.concat")
                        v = g.read(_one(x.tensor.segments(ch0 // lanes, r0, r1)))
                        v = g.sxm("sxm.permute", v, map=self._lane_map(done, b, length))
                        out = _one(y.tensor.segments(tile, r0, r1))
                        if tile in written:
                            v = g.vxm("vxm.add", v, g.read(out))
                        g.write(v, out)
                    written.add(tile)
                    done += length
            offset += cx
        self.values[op.out] = y

    def _lane_map(self, src: int, dst: int, length: int) -> int:
        """A permutation table moving lanes src..src+length-1 to dst.., zero elsewhere."""
        key = (src, dst, length)
        if key not in self._maps:
            table = np.full(self.cfg.lanes, -1, np.int32)
            table[dst:dst + length] = np.arange(src, src + length)
            self._maps[key] = self.b.table(table)
        return self._maps[key]

    def _global_avg_pool(self, op: RegionOp, is_output: bool):
        """Mean over H and W: transpose pixel chunks so channels become vectors, sum them on
        the MXM against a column of 1/(H*W), transpose the sums back into one vector."""
        a = op.main.attrs
        x = self._value(op.main.args[0])
        if len(x.shape) != 4 or sorted(ax % 4 for ax in a.get("axis", [])) != [2, 3]:
            raise UnsupportedOnLPX("mean over axes other than the spatial ones of a 4-D tensor")
        n, c, h, w = x.shape
        lanes = self.cfg.lanes
        hw = h * w
        scale = self._temp(self.b.constant(f"{op.out}.scale", np.full((lanes, 1), 1.0 / hw, np.float32),
                                           self.dtype))
        y = self._new(op.out, op.shape, is_output)
        for i in range(n):
            for j in range(x.tensor.ntiles):
                cv = min(c - j * lanes, lanes)
                plane, acc = self.planes.new_block(cv)
                pieces = [seg for p0 in range(0, hw, lanes)
                          for seg in x.tensor.segments(j, i * hw + p0, i * hw + min(hw, p0 + lanes))]
                for q, (_, region) in enumerate(pieces):
                    buf = self.planes.buffer(plane)
                    g = self.b.group(f"{op.out}.install")
                    g.install(plane, buf, g.read(scale.tile(0).rows(0, region.count)), width=1)
                    g = self.b.group(f"{op.out}.sum")
                    t = g.sxm("sxm.transpose", g.read(region), out=cv)
                    g.mul(plane, buf, t, acc=acc, accumulate=q > 0)
                g = self.b.group(f"{op.out}.drain")
                v = g.sxm("sxm.transpose", g.drain(plane, acc, cv, self.acc), out=1)
                self._write_rows(g, v, y, j, i, i + 1)
        self.macs += n * c * hw
        self.values[op.out] = y

    def _reshape(self, op: RegionOp):
        x = self._value(op.main.args[0])
        if not reshape_keeps_storage(x.shape, op.shape):
            raise UnsupportedOnLPX(f"reshape {x.shape} -> {op.shape} moves data between lanes")
        self.values[op.out] = Stored(x.tensor, tuple(op.shape))


def _row_align(shape: tuple) -> int:
    """Chunks of a 4-D value hold whole image rows, so a window row never straddles two."""
    return int(shape[3]) if len(shape) == 4 else 1


def _one(segments: list):
    """The region of a run known to sit in one chunk."""
    if len(segments) != 1:
        raise UnsupportedOnLPX("an access expected in one SRAM chunk spans several")
    return segments[0][1] if isinstance(segments[0], tuple) else segments[0]

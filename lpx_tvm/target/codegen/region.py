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

from dataclasses import replace

import numpy as np

from ...errors import SramFull
from ...precision import Precision
from ..builder import OffchipTensor, ProgramBuilder
from ...machine.config import LPXConfig
from ...machine.isa import DType
from .graph import Operand, Region, RegionOp, UnsupportedOnLPX, read_region
from .int8 import Int8Lowering, relax_dtype
from .mxm import MxmLowering, _Planes
from ...runtime.region import CompiledRegion
from .offchip import OffchipLowering, Spilled
from .policy import TilingPolicy
from .storage import Stored, StreamedWeights, _chunk_of, _one, _row_align, _runs, _slices, stored_shape
from .vector import VectorLowering

PRECISION_DTYPE = {Precision.FP32: DType.FP32, Precision.FP16: DType.FP16, Precision.BF16: DType.BF16,
                   Precision.INT8: DType.INT8}


def compile_region(cfg: LPXConfig, precision: str, name: str, func, policy: "TilingPolicy | None" = None, *,
                   offchip: bool = True) -> CompiledRegion:
    """Compile one LPX region into one Program.

    ``func``: the partitioned Relax function (or a :class:`Region` already read from one);
    ``policy``: the tilings of its MXM layers (None: every layer at its default), which
    records the layers it was asked about; ``offchip``: whether a region whose activations
    do not fit the SRAM may keep them off chip (else :class:`SramFull` is raised).
    """
    compiler = RegionCompiler(cfg, precision, policy)
    region = func if isinstance(func, Region) else read_region(name, func)
    if not offchip:
        return compiler._compile(region, offchip=False)
    return compiler.compile(region)


class RegionCompiler(Int8Lowering, MxmLowering, VectorLowering, OffchipLowering):
    # Share of the SRAM that resident weights may take; the rest is working space.
    weight_budget = 0.6
    # Image values are cut into this many row chunks (on different slices), so that
    # row-wise passes (padding, pools, adds) and the planes' reads run side by side.
    spread = 8
    weight_spread = 8

    def __init__(self, config: LPXConfig, precision: str = "fp16", policy: "TilingPolicy | None" = None):
        if precision not in PRECISION_DTYPE:
            raise UnsupportedOnLPX(f"precision {precision!r} (expected fp32, fp16, bf16 or int8)")
        self.cfg = config
        self.policy = policy if policy is not None else TilingPolicy()
        self.dtype = PRECISION_DTYPE[precision]
        self.int8 = precision == "int8"  # values keep their own dtypes: int8, uint8, float32 at the edges
        self.acc = DType.INT32 if self.int8 else DType.FP32

    def compile(self, region: Region) -> CompiledRegion:
        try:
            return self._compile(region, offchip=False)
        except SramFull:
            if self.int8:
                raise  # the off-chip (band) lowerings are for float regions
        # The activations do not fit beside each other: keep them off chip, run by bands.
        for share in self.band_shares:
            self.band_share = share
            try:
                return self._compile(region, offchip=True)
            except SramFull:
                if share == self.band_shares[-1]:
                    raise

    def _compile(self, region: Region, offchip: bool) -> CompiledRegion:
        name = region.name
        self.offchip = offchip
        self.b = ProgramBuilder(self.cfg, name)
        self.planes = _Planes(self.cfg)
        self.values = {}
        self.macs = 0
        self.op_counts = {}
        self._fills = {}
        self._maps = {}
        self.layer_ops = {}
        self.input_transforms = {} if offchip else self._im2col_inputs(region)
        # Values stored as im2col rows: those inputs, and an int8 stem's quantized input.
        self.im2col_values = dict(self.input_transforms)
        if self.int8 and not offchip:
            self._int8_im2col(region)
        for p in region.params:
            if offchip:
                self.values[p.name] = self._spill_param(p.name, p.shape)
                continue
            tr = self.input_transforms.get(p.name)
            shape = tuple(tr["matrix"]) if tr else stored_shape(p.shape)
            dtype = relax_dtype(p.dtype) if self.int8 else self.dtype
            self.values[p.name] = Stored(self.b.input(p.name, shape, dtype,
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
            (self._lower_offchip if offchip else self._lower)(op, op.out in region.outputs)
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
            if isinstance(st, Spilled):
                # Another name for the same off-chip bytes (an input, a reshape, a repeat).
                if st.tensor.name not in out_names or st.tensor.name in taken or \
                        tuple(st.tensor.layout.shape) != stored_shape(st.shape):
                    self.b.bind(f"{name_}_out", st.tensor, stored_shape(st.shape))
                    st = Spilled(replace(st.tensor, name=f"{name_}_out"), st.shape)
                taken.add(st.tensor.name)
                outputs.append((st.tensor.name, st.shape))
                continue
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
        if isinstance(tensor, OffchipTensor):
            return  # off-chip working space is not reused
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
                          row_align=_row_align(shape), spread=self.spread if len(shape) == 4 else 1)
        return Stored(t, shape)

    def _copy(self, x: Stored, name: str, is_output: bool = False, avoid=(), slices=None) -> Stored:
        # Reading x and writing the copy use a slice's two ports: they may share slices.
        if slices is None:
            y = self._new(name, x.shape, is_output, avoid=avoid, dtype=x.tensor.layout.dtype)
        else:
            y = Stored(self.b.tensor(name, stored_shape(x.shape), x.tensor.layout.dtype, slices=slices,
                                     row_align=_row_align(x.shape), role="output" if is_output else None), x.shape)
        self._rowwise(f"{name}.copy", [x], y, lambda g, vs: vs[0])
        return y

    def _whole_groups(self, x: Stored, rows: int, tag: str) -> Stored:
        """``x``, or a copy of it whose SRAM chunks hold whole groups of ``rows`` rows (a
        batch of a matmul operand or of a transpose, read a block at a time)."""
        lay = x.tensor.layout
        if lay.nchunks == 1 or lay.rows_per_chunk % rows == 0:
            return x
        y = Stored(self._temp(self.b.tensor(tag, stored_shape(x.shape), lay.dtype, row_align=rows)), x.shape)
        self._rowwise(tag, [x], y, lambda g, vs: vs[0])
        return y

    @staticmethod
    def _tile_slices(v: Stored) -> list:
        """The slices each column tile of ``v`` sits on."""
        lay = v.tensor.layout
        return [{sl for sl, _ in lay.tiles[j * lay.nchunks:(j + 1) * lay.nchunks]} for j in range(v.tensor.ntiles)]

    def _clashes(self, x: Stored, other: Stored) -> bool:
        """Whether a column tile of ``x`` shares a slice with the same tile of ``other`` (both
        read in one group: a slice has one read port)."""
        lx, lo = x.tensor.layout, other.tensor.layout
        if (lx.rows, lx.rows_per_chunk, len(lx.tiles)) == (lo.rows, lo.rows_per_chunk, len(lo.tiles)):
            # Chunked alike: a group reads chunk q of both, so only equal chunks matter.
            if all(a[0] != b[0] for a, b in zip(lx.tiles, lo.tiles)):
                return False
        return any(a & b for a, b in zip(self._tile_slices(x), self._tile_slices(other)))

    def _apart(self, x: Stored, other: Stored, tag: str) -> Stored:
        """``x``, or a copy of it on other slices when it clashes with ``other`` (see
        :meth:`_clashes`)."""
        if not self._clashes(x, other):
            return x
        xs, os_ = self._tile_slices(x), self._tile_slices(other)
        if x.tensor.layout.nchunks == 1 and other.tensor.layout.nchunks == 1 and len(xs) == len(os_):
            # Tile by tile, the least used slice that tile of ``other`` does not use.
            used = self.b._sram.used
            slices = [min((s for s in range(self.cfg.mem_slices) if s not in b), key=lambda s: (used[s], s))
                      for b in os_]
            return self._temp(self._copy(x, f"{tag}.apart", slices=slices))
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
        if op.composite in self.INT8_COMPOSITES:
            return self._lower_int8(op, is_output)
        lower = {"nn.conv2d": self._conv2d, "matmul": self._dense, "add": self._binary, "subtract": self._binary,
                 "multiply": self._binary, "nn.relu": self._unary, "sigmoid": self._unary, "tanh": self._unary,
                 "erf": self._unary, "nn.gelu": self._unary, "nn.gelu_tanh": self._unary, "nn.silu": self._unary,
                 "nn.layer_norm": self._layer_norm, "nn.rms_norm": self._layer_norm, "where": self._where, "permute_dims": self._transpose,
                 "clip": self._unary, "nn.max_pool2d": self._pool, "nn.avg_pool2d": self._pool,
                 "concat": self._concat, "mean": self._global_avg_pool, "nn.softmax": self._softmax}.get(kind)
        by_composite = {"lpx.split_heads": self._split_heads, "lpx.merge_heads": self._merge_heads,
                        "lpx.slice": self._slice}.get(op.composite)
        if by_composite is not None:
            return by_composite(op, is_output)
        if kind == "reshape":
            return self._reshape(op)
        if lower is None:
            raise UnsupportedOnLPX(f"no LPX lowering for {kind}")
        lower(op, is_output)

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
            elif e[0] == "requant":  # int32 -> int8 / uint8 with a per-channel scale
                _, scale, zp, to = e
                y = g.vxm("vxm.requant", y, g.read(scale.tile(tile).repeat(rows)), to=to, zp=zp)
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

    # ---- vector ops ------------------------------------------------------------------

"""Int8 lowerings: the composites of a QDQ model (see lpx_tvm/relax_passes/int8_patterns.py).

- ``lpx.qconv2d`` / ``lpx.qdense``: the MXM multiplies the stored int8 / uint8 activations
  by int8 weights at int8 rate into int32 accumulators. The activation zero point ``z_x``
  is not subtracted element by element: a convolution's padding is filled with ``z_x``
  (so a padded tap contributes ``z_x * w``, exactly what every real tap's ``- z_x``
  correction removes) and ``z_x * sum(w)`` per output channel is folded into the int32
  bias. The drain adds that bias and ``vxm.requant`` scales by ``s_x * s_w[c] / s_y`` (a
  per-channel fp32 scale stream), rounds half to even, adds ``z_y`` and saturates.
- ``lpx.qmax_pool2d``: max pooling of the quantized values (padding is the dtype's least
  value).
- ``lpx.qadd``: both operands converted to fp32 and dequantized (``(q - z) * s``, as ONNX
  defines it), added, scaled by ``1 / s_y``, rounded to int32, ``+ z_y``, saturated.
- ``lpx.qglobal_avg_pool2d``: the pixel sums on the MXM (a column of int8 ones, int32
  accumulators), ``- z_x * H * W``, then ``vxm.requant`` by ``s_x / (H * W * s_y)``.
- ``lpx.quantize`` / ``lpx.dequantize``: a model's float input and output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...machine.isa import DType
from .graph import RegionOp, Step, UnsupportedOnLPX
from .storage import Stored


_RELAX_DTYPES = {"int8": DType.INT8, "uint8": DType.UINT8, "int32": DType.INT32, "float16": DType.FP16,
                 "bfloat16": DType.BF16, "float32": DType.FP32}


def relax_dtype(name: str) -> DType:
    """The LPX dtype of a Relax dtype name."""
    if name not in _RELAX_DTYPES:
        raise UnsupportedOnLPX(f"dtype {name} on LPX")
    return _RELAX_DTYPES[name]


@dataclass
class QEpilogue:
    """What an int8 MXM op does past the multiplies: padding value, drain epilogue, output dtype."""

    fill: float
    epilogue: list
    out_dtype: DType


_MXM = ("lpx.qconv2d", "lpx.qdense")


def _step(op: RegionOp, name: str) -> Step:
    for s in [op.main] + op.epilogue:
        if s.op == name:
            return s
    raise UnsupportedOnLPX(f"{op.composite}: no {name} in the composite")


def _scalar(operand) -> float:
    a = np.asarray(operand.const)
    if a.size != 1:
        raise UnsupportedOnLPX("a per-channel scale where LPX takes one scale")
    return float(a.reshape(-1)[0])


class Int8Lowering:
    """Methods of :class:`~lpx_tvm.target.codegen.region.RegionCompiler` for int8 ops."""

    INT8_COMPOSITES = frozenset(_MXM + ("lpx.qmax_pool2d", "lpx.qadd", "lpx.qglobal_avg_pool2d",
                                        "lpx.qglobal_avg_pool2d_reshape", "lpx.quantize", "lpx.dequantize"))

    def _mxm_view(self, op: RegionOp) -> RegionOp:
        """An int8 MXM composite seen as its integer conv2d / matmul of the stored values
        (what the weight placement and the MXM lowering read); other ops unchanged."""
        if op.composite not in _MXM:
            return op
        core = _step(op, "nn.conv2d" if op.composite == "lpx.qconv2d" else "matmul")
        main = Step(core.op, [op.main.args[0], core.args[1]], core.attrs, core.shape, core.dtype)
        return RegionOp(op.composite, main, [], op.out, op.shape, op.dtype)

    def _lower_int8(self, op: RegionOp, is_output: bool):
        out_dt = relax_dtype(op.dtype)
        if op.composite in _MXM:
            return self._qmxm(op, is_output, out_dt)
        if op.composite == "lpx.qmax_pool2d":
            return self._pool(op, is_output)
        if op.composite == "lpx.qadd":
            return self._qadd(op, is_output, out_dt)
        if op.composite.startswith("lpx.qglobal_avg_pool2d"):
            return self._qglobal_avg_pool(op, is_output, out_dt)
        if op.composite == "lpx.quantize":
            return self._quantize(op, is_output, out_dt)
        if op.composite == "lpx.dequantize":
            return self._dequantize(op, is_output)
        raise UnsupportedOnLPX(f"no LPX lowering for {op.composite}")

    def _int8_im2col(self, region):
        """An int8 image stem: a region input (float) read only by its quantize, read only by a
        convolution with few input channels. The host lays the float image out as im2col
        rows, padding with 0.0, which quantizes to the zero point: the quantize then makes
        exactly the im2col rows of the quantized image padded with ``z_x``, and the
        convolution is one dense matmul with a single reduction tile."""
        readers = {}
        for op in region.ops:
            for a in [x for st in [op.main] + op.epilogue for x in st.args if not x.is_const]:
                readers.setdefault(a.name, []).append(op)
        for p in region.params:
            qs = readers.get(p.name, [])
            if len(qs) != 1 or qs[0].composite != "lpx.quantize" or len(p.shape) != 4:
                continue
            convs = readers.get(qs[0].out, [])
            if len(convs) != 1 or convs[0].composite != "lpx.qconv2d" or qs[0].out in region.outputs:
                continue
            view = self._mxm_view(convs[0])
            a = view.main.attrs
            co, cg, kh, kw = view.main.args[1].shape
            if a.get("groups", 1) != 1 or cg * kh * kw > self.cfg.mxm_rows or kh * kw == 1:
                continue
            n, _, oh, ow = view.main.shape
            tr = {"kind": "im2col", "kernel": [kh, kw], "strides": list(a["strides"]),
                  "padding": list(a["padding"]), "dilation": list(a["dilation"]),
                  "matrix": [n * oh * ow, kh * kw * cg]}
            self.input_transforms[p.name] = tr
            self.im2col_values[p.name] = tr
            self.im2col_values[qs[0].out] = tr

    # ---- MXM -------------------------------------------------------------------------
    def _qmxm(self, op: RegionOp, is_output: bool, out_dt: DType):
        view = self._mxm_view(op)
        self.layer_ops[op.out] = op  # a tuning task measures the whole composite
        zx = int(round(_scalar(_step(op, "subtract").args[1])))
        w = np.asarray(view.main.args[1].const).astype(np.int64)
        conv = op.composite == "lpx.qconv2d"
        channels = w.shape[0] if conv else w.shape[1]
        bias = np.broadcast_to(np.asarray(_step(op, "add").args[1].const, np.int64).reshape(-1), (channels,))
        # sum over the taps of (x - z_x) * w = sum of x * w (padding holds z_x) - z_x * sum(w)
        wsum = w.reshape(channels, -1).sum(axis=1) if conv else w.sum(axis=0)
        bias = bias - zx * wsum
        if np.abs(bias).max(initial=0) >= 2**31:
            raise UnsupportedOnLPX("an int32 bias out of range")
        qs = _step(op, "quantize")
        scale = np.broadcast_to(np.asarray(qs.args[1].const, np.float64).reshape(-1), (channels,))
        zy = int(round(_scalar(qs.args[2])))
        bias_t = self._temp(self.b.constant(f"{op.out}.bias", bias.reshape(1, channels), DType.INT32))
        # The drain reads both beside the accumulators: on different slices (one read port each).
        mult = self._temp(self.b.constant(f"{op.out}.requant", (1.0 / scale).reshape(1, channels), DType.FP32,
                                          avoid=[sl for sl, _ in bias_t.layout.tiles]))
        q = QEpilogue(float(zx), [("bias", bias_t), ("requant", mult, zy, out_dt)], out_dt)
        if conv:
            return self._conv2d(view, is_output, q)
        x = self._value(view.main.args[0])
        k, nn = w.shape
        return self._matmul(view, x, math.prod(x.shape[:-1]), k, nn, is_output, q=q)

    # ---- vector ops ------------------------------------------------------------------
    @staticmethod
    def _dequantized(g, v, scale: float, zp: int):
        """(v - zp) * scale in fp32, as ONNX DequantizeLinear computes it."""
        v = g.vxm("vxm.cvt", v, to=DType.FP32)
        if zp:
            v = g.vxm("vxm.sub", v, imm=float(zp))
        return g.vxm("vxm.mul", v, imm=scale)

    @staticmethod
    def _quantized(g, v, scale: float, zp: int, out_dt: DType):
        """saturate(round_half_even(v / scale) + zp) of an fp32 value."""
        v = g.vxm("vxm.cvt", g.vxm("vxm.mul", v, imm=1.0 / scale), to=DType.INT32)
        if zp:
            v = g.vxm("vxm.add", v, imm=float(zp))
        return g.vxm("vxm.cvt", v, to=out_dt)

    def _qadd(self, op: RegionOp, is_output: bool, out_dt: DType):
        dq_a, dq_b, add, qs = op.main, op.epilogue[0], op.epilogue[1], op.epilogue[2]
        if add.op != "add" or dq_b.op != "dequantize" or qs.op != "quantize":
            raise UnsupportedOnLPX(f"{op.composite}: unexpected op chain")
        x, other = self._value(dq_a.args[0]), self._value(dq_b.args[0])
        sa, za = _scalar(dq_a.args[1]), int(round(_scalar(dq_a.args[2])))
        sb, zb = _scalar(dq_b.args[1]), int(round(_scalar(dq_b.args[2])))
        sy, zy = _scalar(qs.args[1]), int(round(_scalar(qs.args[2])))
        other = self._apart(other, x, op.out)
        y = self._new(op.out, op.shape, is_output, avoid=[x], dtype=out_dt)

        def body(g, vs):
            s = g.vxm("vxm.add", self._dequantized(g, vs[0], sa, za), self._dequantized(g, vs[1], sb, zb))
            return self._quantized(g, s, sy, zy, out_dt)

        self._rowwise(f"{op.out}.qadd", [x, other], y, body)
        self.values[op.out] = y

    def _quantize(self, op: RegionOp, is_output: bool, out_dt: DType):
        x = self._value(op.main.args[0])
        s, zp = _scalar(op.main.args[1]), int(round(_scalar(op.main.args[2])))
        if op.out in self.im2col_values:  # an int8 stem's image, as im2col rows
            y = Stored(self.b.tensor(op.out, tuple(self.im2col_values[op.out]["matrix"]), out_dt, row_align=1,
                                     spread=self.spread), op.shape)
        else:
            y = self._new(op.out, op.shape, is_output, avoid=[x], dtype=out_dt)
        self._rowwise(f"{op.out}.quantize", [x], y, lambda g, vs: self._quantized(g, vs[0], s, zp, out_dt))
        self.values[op.out] = y

    def _dequantize(self, op: RegionOp, is_output: bool):
        x = self._value(op.main.args[0])
        s, zp = _scalar(op.main.args[1]), int(round(_scalar(op.main.args[2])))
        y = self._new(op.out, op.shape, is_output, avoid=[x], dtype=DType.FP32)
        self._rowwise(f"{op.out}.dequantize", [x], y, lambda g, vs: self._dequantized(g, vs[0], s, zp))
        self.values[op.out] = y

    def _qglobal_avg_pool(self, op: RegionOp, is_output: bool, out_dt: DType):
        """Pixel sums on the MXM (transposed pixel chunks against a column of int8 ones, int32
        accumulators), then ``(sum - z_x * H * W) * s_x / (H * W * s_y) + z_y``."""
        dq, mean, qs = op.main, _step(op, "mean"), _step(op, "quantize")
        x = self._value(dq.args[0])
        if len(x.shape) != 4 or sorted(ax % 4 for ax in mean.attrs.get("axis", [])) != [2, 3]:
            raise UnsupportedOnLPX("mean over axes other than the spatial ones of a 4-D tensor")
        sx, zx = _scalar(dq.args[1]), int(round(_scalar(dq.args[2])))
        sy, zy = _scalar(qs.args[1]), int(round(_scalar(qs.args[2])))
        hw = x.shape[2] * x.shape[3]
        ones = self._temp(self.b.constant(f"{op.out}.ones", np.ones((self.cfg.lanes, 1), np.float32), DType.INT8))
        y = self._new(op.out, op.shape, is_output, dtype=out_dt)
        for g, v, i, j in self._pixel_sums(op.out, x, ones, DType.INT32):
            if zx:
                v = g.vxm("vxm.sub", v, imm=float(zx * hw))
            v = g.vxm("vxm.requant", v, imm=sx / (hw * sy), to=out_dt, zp=zy)
            self._write_rows(g, v, y, j, i, i + 1)
        self.values[op.out] = y


__all__ = ["Int8Lowering", "QEpilogue", "relax_dtype"]

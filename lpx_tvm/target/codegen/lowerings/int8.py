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
- ``lpx.quantize`` / ``lpx.dequantize``: a model's float input and output. A dequantize
  that alone reads an int8 conv2d / dense is fused into that op's drains (the rows are
  requantized, then dequantized on their way to SRAM: the same values as two passes,
  without writing the int8 rows and reading them back).
"""

from __future__ import annotations

import math

import numpy as np

from ....machine.isa import DType
from ..lowering_context import LoweringContext
from ..epilogue import Bias, Dequant, Requant
from ..graph import RegionOp, UnsupportedOnLPX
from ..mxm_tiles import matmul, pixel_sums
from ..row_passes import rowwise, write_rows
from ..quant import QEpilogue, dequantized, mxm_view, relax_dtype, scalar, step_of, zero_point
from ..registry import register_lowering
from ..rules import spatial_mean_problem
from ..storage import Stored
from ..values import apart, constant_beside, new_value
from .conv2d import lower_conv2d
from .pool import lower_pool

# Max pooling of quantized values is the float pooling on their own dtype.
register_lowering("lpx.qmax_pool2d")(lower_pool)


@register_lowering("lpx.qconv2d", "lpx.qdense")
def lower_qmxm(ctx: LoweringContext, op: RegionOp, is_output: bool):
    out_dt = relax_dtype(op.dtype)
    view = mxm_view(op)
    ctx.layer_ops[op.out] = op  # a tuning task measures the whole composite
    zx = zero_point(step_of(op, "subtract").args[1])
    w = np.asarray(view.main.args[1].const).astype(np.int64)
    conv = op.composite == "lpx.qconv2d"
    channels = w.shape[0] if conv else w.shape[1]
    bias = np.broadcast_to(np.asarray(step_of(op, "add").args[1].const, np.int64).reshape(-1), (channels,))
    # sum over the taps of (x - z_x) * w = sum of x * w (padding holds z_x) - z_x * sum(w)
    wsum = w.reshape(channels, -1).sum(axis=1) if conv else w.sum(axis=0)
    bias = bias - zx * wsum
    if np.abs(bias).max(initial=0) >= 2**31:
        raise UnsupportedOnLPX("an int32 bias out of range")
    qs = step_of(op, "quantize")
    scale = np.broadcast_to(np.asarray(qs.args[1].const, np.float64).reshape(-1), (channels,))
    zy = zero_point(qs.args[2])
    bias_t = ctx.temp(ctx.builder.constant(f"{op.out}.bias", bias.reshape(1, channels), DType.INT32))
    # The drain reads both beside the accumulators: on different slices (one read port each).
    mult = ctx.temp(constant_beside(ctx, f"{op.out}.requant", (1.0 / scale).reshape(1, channels), bias_t))
    q = QEpilogue(float(zx), [Bias(bias_t), Requant(mult, zy, out_dt)], out_dt)
    if op.out in ctx.dequantized:  # its only reader dequantizes it: the drains do, into that op's value
        dq, is_output = ctx.dequantized[op.out]
        q.epilogue.append(Dequant(scalar(dq.main.args[1]), zero_point(dq.main.args[2])))
        q.out_dtype = DType.FP32
    if conv:
        return lower_conv2d(ctx, view, is_output, q)
    x = ctx.value(view.main.args[0])
    k, nn = w.shape
    return matmul(ctx, view, x, math.prod(x.shape[:-1]), k, nn, is_output, q=q)


def _quantized(g, v, scale: float, zp: int, out_dt: DType):
    """saturate(round_half_even(v / scale) + zp) of an fp32 value."""
    v = g.vxm("vxm.cvt", g.vxm("vxm.mul", v, imm=1.0 / scale), to=DType.INT32)
    if zp:
        v = g.vxm("vxm.add", v, imm=float(zp))
    return g.vxm("vxm.cvt", v, to=out_dt)


@register_lowering("lpx.qadd")
def lower_qadd(ctx: LoweringContext, op: RegionOp, is_output: bool):
    out_dt = relax_dtype(op.dtype)
    dq_a, dq_b, add, qs = op.main, op.epilogue[0], op.epilogue[1], op.epilogue[2]
    if add.op != "add" or dq_b.op != "dequantize" or qs.op != "quantize":
        raise UnsupportedOnLPX(f"{op.composite}: unexpected op chain")
    x, other = ctx.value(dq_a.args[0]), ctx.value(dq_b.args[0])
    sa, za = scalar(dq_a.args[1]), zero_point(dq_a.args[2])
    sb, zb = scalar(dq_b.args[1]), zero_point(dq_b.args[2])
    sy, zy = scalar(qs.args[1]), zero_point(qs.args[2])
    other = apart(ctx, other, x, op.out)
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x], dtype=out_dt)

    def dequantized_sum(g, vs):
        return g.vxm("vxm.add", dequantized(g, vs[0], sa, za), dequantized(g, vs[1], sb, zb))

    # Every VXM op of one group holds an ALU for as long as the rows stream through it:
    # a chain longer than the machine has ALUs runs as two groups, through an fp32 sum.
    chain = (3 + bool(za)) + (2 + bool(zb)) + (3 + bool(zy))
    if chain <= ctx.cfg.vxm_alus:
        rowwise(ctx, f"{op.out}.qadd", [x, other], y,
                lambda g, vs: _quantized(g, dequantized_sum(g, vs), sy, zy, out_dt))
    else:
        total = ctx.temp(new_value(ctx, f"{op.out}.sum", op.shape, avoid=[x, other], dtype=DType.FP32))
        rowwise(ctx, f"{op.out}.qadd", [x, other], total, dequantized_sum)
        rowwise(ctx, f"{op.out}.qadd_requant", [total], y, lambda g, vs: _quantized(g, vs[0], sy, zy, out_dt))
    ctx.values[op.out] = y


@register_lowering("lpx.quantize")
def lower_quantize(ctx: LoweringContext, op: RegionOp, is_output: bool):
    out_dt = relax_dtype(op.dtype)
    x = ctx.value(op.main.args[0])
    s, zp = scalar(op.main.args[1]), zero_point(op.main.args[2])
    if op.out in ctx.im2col_values:  # an int8 stem's image, as im2col rows
        y = Stored(ctx.builder.tensor(op.out, tuple(ctx.im2col_values[op.out]["matrix"]), out_dt, row_align=1,
                                      spread=ctx.options.spread), op.shape)
    else:
        y = new_value(ctx, op.out, op.shape, is_output, avoid=[x], dtype=out_dt)
    rowwise(ctx, f"{op.out}.quantize", [x], y, lambda g, vs: _quantized(g, vs[0], s, zp, out_dt))
    ctx.values[op.out] = y


@register_lowering("lpx.dequantize")
def lower_dequantize(ctx: LoweringContext, op: RegionOp, is_output: bool):
    src = op.main.args[0].name
    if ctx.dequantized.get(src, (None,))[0] is op:
        ctx.values[op.out] = ctx.values[src]  # its producer's drains dequantized it already
        return
    x = ctx.value(op.main.args[0])
    s, zp = scalar(op.main.args[1]), zero_point(op.main.args[2])
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x], dtype=DType.FP32)
    rowwise(ctx, f"{op.out}.dequantize", [x], y, lambda g, vs: dequantized(g, vs[0], s, zp))
    ctx.values[op.out] = y


@register_lowering("lpx.qglobal_avg_pool2d", "lpx.qglobal_avg_pool2d_reshape")
def lower_qglobal_avg_pool(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Pixel sums on the MXM (transposed pixel chunks against a column of int8 ones, int32
    accumulators), then ``(sum - z_x * H * W) * s_x / (H * W * s_y) + z_y``."""
    out_dt = relax_dtype(op.dtype)
    dq, mean, qs = op.main, step_of(op, "mean"), step_of(op, "quantize")
    x = ctx.value(dq.args[0])
    problem = spatial_mean_problem(len(x.shape), mean.attrs.get("axis", []))
    if problem:
        raise UnsupportedOnLPX(problem)
    sx, zx = scalar(dq.args[1]), zero_point(dq.args[2])
    sy, zy = scalar(qs.args[1]), zero_point(qs.args[2])
    hw = x.shape[2] * x.shape[3]
    ones = ctx.temp(ctx.builder.constant(f"{op.out}.ones", np.ones((ctx.cfg.lanes, 1), np.float32), DType.INT8))
    y = new_value(ctx, op.out, op.shape, is_output, dtype=out_dt)
    for g, v, i, j in pixel_sums(ctx, op.out, x, ones, DType.INT32):
        if zx:
            v = g.vxm("vxm.sub", v, imm=float(zx * hw))
        v = g.vxm("vxm.requant", v, imm=sx / (hw * sy), to=out_dt, zp=zy)
        write_rows(ctx, g, v, y, j, i, i + 1)
    ctx.values[op.out] = y

"""8-bit dense layers inside a float build (W8A8: a decoder's projections at the MXM's
8-bit rate, the norms, RoPE, attention and softmax in float around them), in int8 or in
fp8 e4m3 (on a machine whose MXM multiplies fp8).

- ``lpx.act_quant``: ``clip(round(x * (1 / s_x)), -128, 127)`` of a float value, stored
  as int8 — on the VXM, ``vxm.cvt`` to fp32, ``vxm.mul`` by the static scale's inverse,
  and a saturating ``vxm.cvt`` to int8 that rounds half to even (``torch.round``).
  ``lpx.fp8_quant``: ``clip(x * (1 / s_x), -448, 448)`` stored as fp8 — the same pass,
  the last conversion to fp8 (rounding to nearest even, saturating at +-448).
- ``lpx.qlinear[_bias]``: an 8-bit value (widened in Relax, which the MXM does not
  need) times a constant 8-bit (K, N) weight on the MXM at its 8-bit rate: int8 summed
  exactly in int32 accumulators, fp8 products (exact in fp32) summed in fp32; the drain
  converts int32 sums to fp32, multiplies them by ``s_x * s_w[c]`` (a per-channel fp32
  scale stream read beside the accumulators), adds the fp32 bias, and writes the build's
  float dtype.
"""

from __future__ import annotations

import math

import numpy as np

from ....machine.isa import FP8_MAX, DType
from ..lowering_context import LoweringContext
from ..epilogue import Bias, Scale
from ..graph import RegionOp, UnsupportedOnLPX
from ..mxm_tiles import matmul
from ..row_passes import rowwise
from ..quant import QEpilogue, mxm_view, scalar, step_of
from ..registry import register_lowering
from ..values import constant_beside, new_value

# What each quantization stores, and the range its clip must have (the saturating
# conversion to the dtype then clips to the same range: no separate min/max).
QUANTIZED = {"lpx.act_quant": (DType.INT8, (-128.0, 127.0)), "lpx.fp8_quant": (DType.FP8, (-FP8_MAX, FP8_MAX))}


@register_lowering(*QUANTIZED)
def lower_act_quant(ctx: LoweringContext, op: RegionOp, is_output: bool):
    if op.main.op != "multiply" or not op.main.args[1].is_const:
        raise UnsupportedOnLPX(f"{op.composite}: expected x * (1 / scale) first")
    dtype, bounds = QUANTIZED[op.composite]
    lo, hi = (float(np.asarray(a.const)) for a in step_of(op, "clip").args[1:3])
    if (lo, hi) != bounds:
        raise UnsupportedOnLPX(f"{op.composite}: clipped to [{lo}, {hi}], not the {dtype.short} range")
    inv = scalar(op.main.args[1])
    x = ctx.value(op.main.args[0])
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x], dtype=dtype)

    def quantized(g, vs):
        v = vs[0] if vs[0].dtype == DType.FP32 else g.vxm("vxm.cvt", vs[0], to=DType.FP32)
        return g.vxm("vxm.cvt", g.vxm("vxm.mul", v, imm=inv), to=dtype)

    rowwise(ctx, f"{op.out}.quantize", [x], y, quantized)
    ctx.values[op.out] = y


@register_lowering("lpx.qlinear", "lpx.qlinear_bias")
def lower_qlinear(ctx: LoweringContext, op: RegionOp, is_output: bool):
    view = mxm_view(op)  # the matmul of the stored int8 values (the widening is Relax's alone)
    x = ctx.value(view.main.args[0])
    if x.tensor.layout.dtype != ctx.mxm_dtype(op):
        raise UnsupportedOnLPX(f"{op.composite} of a stored {x.tensor.layout.dtype.short} value (expected "
                               f"{ctx.mxm_dtype(op).short})")
    ctx.layer_ops[op.out] = op  # a tuning task measures the whole composite
    k, nn = view.main.args[1].shape
    scale = np.broadcast_to(np.asarray(step_of(op, "multiply").args[1].const, np.float32).reshape(-1), (nn,))
    b = ctx.builder
    scale_t = ctx.temp(b.constant(f"{op.out}.scale", scale.reshape(1, nn), DType.FP32))
    epilogue = [Scale(scale_t)]
    if op.composite == "lpx.qlinear_bias":
        bias = np.broadcast_to(np.asarray(step_of(op, "add").args[1].const, np.float32).reshape(-1), (nn,))
        # The drain reads both beside the accumulators: on different slices (one read port each).
        bias_t = ctx.temp(constant_beside(ctx, f"{op.out}.bias", bias.reshape(1, nn), scale_t))
        epilogue.append(Bias(bias_t))
    matmul(ctx, view, x, math.prod(x.shape[:-1]), k, nn, is_output, q=QEpilogue(0.0, epilogue, ctx.dtype))

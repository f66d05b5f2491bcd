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

import ml_dtypes
import numpy as np
from tvm.relax.dpl import is_const, is_op, wildcard

from ....machine.isa import FP8_MAX, DType
from ....precision import Precision
from ..lowering_context import LoweringContext
from ..epilogue import Bias, Scale
from ..graph import RegionOp, UnsupportedOnLPX
from ..mxm_tiles import matmul
from ..row_passes import rowwise
from ..quant import QEpilogue, mxm_view, scalar, step_of
from ..registry import OpPattern, register_lowering, register_pattern
from ..pattern_checks import bias_check, fp8_problem, tensors_problem
from ..relax_exprs import clip_bounds, expr_shape, scalar_value
from ..values import constant_beside, new_value
from .matmul import dense_bias_shapes


# What each quantization stores, and the range its clip must have (the saturating
# conversion to the dtype then clips to the same range: no separate min/max).
QUANTIZED = {"lpx.act_quant": (DType.INT8, (-128.0, 127.0)), "lpx.fp8_quant": (DType.FP8, (-FP8_MAX, FP8_MAX))}


@register_lowering(*QUANTIZED)
def lower_act_quant(ctx: LoweringContext, op: RegionOp, is_output: bool):
    assert op.main.op == "multiply" and op.main.args[1].is_const, f"{op.composite}: x * (1 / scale) first"
    dtype, bounds = QUANTIZED[op.composite]
    lo, hi = (float(np.asarray(a.const)) for a in step_of(op, "clip").args[1:3])
    assert (lo, hi) == bounds, f"{op.composite}: its pattern clips to the {dtype.short} range"
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


# ---- patterns ---------------------------------------------------------------------------


def _act_quant_pattern(rounded=True):
    """``astype(clip(round(x * inv)))`` (int8), or without the round (fp8: the conversion rounds)."""
    data, inv = wildcard(), is_const()
    scale = is_op("relax.multiply")(data, inv)
    annotations = {"input": data, "scale": scale, "inv": inv}
    clipped = scale
    if rounded:
        clipped = annotations["round"] = is_op("relax.round")(scale)
    clip = is_op("relax.clip")(clipped, wildcard(), wildcard())
    root = is_op("relax.astype")(clip)
    return root, {**annotations, "clip": clip, "root": root}


def _act_quant_check(a, settings):
    op, data = a["root"], a["input"]
    if settings.precision == Precision.INT8:
        return op, "an int8 build: its activations are quantized by the model's QuantizeLinear"
    found = tensors_problem(a["scale"], [data], settings)
    if found:
        return found
    if scalar_value(a["inv"]) is None:
        return a["scale"], "the quantization scale is not one constant: LPX quantizes by a static per-tensor scale"
    if "round" not in a and op.ty.dtype == "float8_e4m3fn":  # lpx.fp8_quant
        if clip_bounds(a["clip"]) != (-FP8_MAX, FP8_MAX):
            return a["clip"], f"clipped to {clip_bounds(a['clip'])}: LPX quantizes to fp8 e4m3 in [-448, 448]"
        return fp8_problem(op, settings)
    if "round" not in a:
        return op, f"quantized as {op.ty.dtype} without rounding: LPX's 8-bit dense layers take int8 or fp8 e4m3"
    if clip_bounds(a["clip"]) != (-128.0, 127.0):
        return a["clip"], f"clipped to {clip_bounds(a['clip'])}: LPX quantizes activations to int8 [-128, 127]"
    if op.ty.dtype != "int8":
        return op, f"quantized as {op.ty.dtype}: LPX's int8 dense layers take int8 values"
    return None


def _qlinear_pattern(bias=False):
    data, weight, per_channel = wildcard(), is_const(), is_const()
    widen = is_op("relax.astype")(data)
    root = is_op("relax.matmul")(widen, weight)
    sums = root | is_op("relax.astype")(root)
    out = scale = is_op("relax.multiply")(sums, per_channel)
    annotations = {"input": data, "widen": widen, "weight": weight, "root": root, "scale": scale,
                   "per_channel": per_channel}
    if bias:
        b = is_const()
        out = is_op("relax.add")(scale, b)
        annotations.update(bias=b, bias_add=out)
    return out, annotations


def _qlinear_check(a, settings):
    op, data, weight = a["root"], a["input"], a["weight"]
    if settings.precision == Precision.INT8:
        return op, "an int8 build: its dense layers are the model's QDQ ones"
    widened = a["widen"].ty.dtype
    fp8 = data.ty.dtype == "float8_e4m3fn"
    if (data.ty.dtype, widened, weight.ty.dtype) not in (("int8", "int32", "int32"),
                                                         ("float8_e4m3fn", "float32", "float32")):
        return op, (f"a matmul of {data.ty.dtype} (as {widened}) by {weight.ty.dtype}: LPX's 8-bit dense takes int8 "
                    "values widened to int32 by an int32 weight of int8 values, or fp8 e4m3 values widened to "
                    "float32 by a float32 weight of fp8 values")
    shape = expr_shape(weight)
    if len(shape) != 2 or len(expr_shape(data)) != 2:
        return op, f"an 8-bit matmul of {expr_shape(data)} by {shape}: LPX's 8-bit dense is 2-D by 2-D"
    w = weight.value.numpy()
    if fp8:
        found = fp8_problem(op, settings)
        if found:
            return found
        with np.errstate(invalid="ignore", over="ignore"):
            if not np.array_equal(w.astype(ml_dtypes.float8_e4m3fn).astype(np.float32), w):
                return op, "a float32 weight with values fp8 e4m3 does not hold: LPX stores it as fp8"
    elif w.min(initial=0) < -128 or w.max(initial=0) > 127:
        return op, "an integer weight outside the int8 range"
    scale = a["per_channel"].value.numpy()
    if scale.size not in (1, shape[1]) or scale.dtype != "float32":
        return a["scale"], f"a scale of {scale.size} {scale.dtype} values for {shape[1]} channels"
    found = tensors_problem(a["scale"], [], settings)
    if found:
        return found
    if "bias" in a:
        return bias_check(dense_bias_shapes)({"bias_add": a["bias_add"], "bias": a["bias"], "root": op}, settings)
    return None


# ``lpx.act_quant``: ``input`` (float), ``scale`` (the ``multiply`` by ``1 / s_x``), ``clip``
# (to [-128, 127]), ``root`` (the ``astype`` to int8); ``lpx.fp8_quant`` the same without
# ``round``, ``clip`` to [-448, 448], ``root`` the ``astype`` to float8_e4m3fn.
# ``lpx.qlinear[_bias]``: ``input`` (int8 or fp8), ``widen`` (its ``astype`` to int32 /
# float32), ``weight`` (constant (K, N)), ``root`` (the ``matmul``), ``scale`` (the
# ``multiply`` by ``s_x * s_w``), ``bias``, ``bias_add``; above the float dense layers.
register_pattern(
    OpPattern("act_quant", _act_quant_pattern, None, (_act_quant_check,), priority=77, zero_d=True),
    OpPattern("fp8_quant", lambda: _act_quant_pattern(rounded=False), None, (_act_quant_check,), priority=78,
              zero_d=True),
    OpPattern("qlinear", _qlinear_pattern, None, (_qlinear_check,), priority=120, zero_d=True),
    OpPattern("qlinear_bias", lambda: _qlinear_pattern(bias=True), None, (_qlinear_check,), priority=121,
              zero_d=True),
)

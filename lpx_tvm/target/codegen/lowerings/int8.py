"""Int8 ops: the composites of a QDQ model (see :mod:`lpx_tvm.relax_passes.qdq`), their
patterns and their lowerings.

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
from tvm.relax.dpl import is_op, wildcard

from ....machine.isa import DType
from ....precision import Precision
from ..lowering_context import LoweringContext
from ..epilogue import Bias, Dequant, Requant
from ..graph import RegionOp, UnsupportedOnLPX
from ..mxm_tiles import matmul, pixel_sums
from ..row_passes import rowwise, write_rows
from ..quant import QEpilogue, dequantized, mxm_view, relax_dtype, scalar, step_of, zero_point
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..relax_exprs import expr_shape, is_const, static_shape
from ..rules import activation_row_problem, grouped_conv_problem, int8_working_set_problem, spatial_mean_problem
from ..storage import Stored
from ..values import apart, constant_beside, new_value
from .conv2d import lower_conv2d
from .pool import global_avg_pool2d_check, lower_pool, pool2d_check


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


# ---- patterns ---------------------------------------------------------------------------

INT_DTYPES = ("int8", "uint8")


def _int_type_problem(expr, settings, dtypes=INT_DTYPES):
    ty = expr.ty
    if not hasattr(ty, "dtype") or ty.dtype not in dtypes:
        return f"dtype {getattr(ty, 'dtype', ty)} is not {' or '.join(dtypes)} in an int8 build"
    shape = static_shape(ty)
    if shape is None:
        return f"dynamic shape {ty.shape}: LPX schedules are static and need static shapes"
    return activation_row_problem(shape, 1 if ty.dtype in INT_DTYPES else 4, settings.config, settings.precision)


def _scalar_const(expr) -> bool:
    return is_const(expr) and expr.value.numpy().size == 1


def _int_rule(*keys):
    def rule(a, settings):
        for k in keys:
            problem = _int_type_problem(a[k], settings)
            if problem:
                return a["root"], problem
        return None
    return rule


def _qmxm_rule(a, settings):
    root, x, w, q = a["root"], a["input"], a["weight"], a["quantize"]
    for expr in (x, q):
        problem = _int_type_problem(expr, settings)
        if problem:
            return root, problem
    if not (is_const(w) and w.ty.dtype == "int8"):
        return root, "the weight is not an int8 constant"
    if not (_scalar_const(a["zp_in"]) and _scalar_const(a["zp_out"]) and is_const(a["bias"])
            and is_const(a["scale"])):
        return root, "zero points, bias and requantization scale must be constants"
    channels = expr_shape(root)[1 if root.op.name == "relax.nn.conv2d" else -1]
    if a["scale"].value.numpy().size not in (1, channels) or a["bias"].value.numpy().size not in (1, channels):
        return root, "the requantization scale and bias are not one value per output channel"
    if root.op.name == "relax.nn.conv2d":
        attrs = root.attrs
        if (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW"):
            return root, "LPX convolution takes NCHW activations and OIHW weights"
        groups, cin, cout = int(attrs.groups), expr_shape(x)[1], expr_shape(w)[0]
        problem = grouped_conv_problem(groups, cin, cout) if groups != 1 else None
        if problem:
            return root, problem
    else:
        if len(expr_shape(w)) != 2 or len(expr_shape(x)) < 2:
            return root, "LPX dense takes a 2-D (K, N) weight and an input of rank >= 2"
    return None


def _scales_rule(*keys):
    def rule(a, settings):
        for k in keys:
            call = a[k]
            if not (_scalar_const(call.args[1]) and _scalar_const(call.args[2])):
                return a["root"], "a per-channel scale here: LPX requantizes activations with one scale"
        return None
    return rule


def _qadd_rule(a, settings):
    if expr_shape(a["lhs"]) != expr_shape(a["rhs"]):
        return a["root"], "broadcasting quantized add"
    return None


def _quantize_rule(a, settings):
    problem = _int_type_problem(a["input"], settings, ("float32",)) or _int_type_problem(a["root"], settings)
    return (a["root"], problem) if problem else None


def _dequantize_rule(a, settings):
    problem = _int_type_problem(a["input"], settings) or _int_type_problem(a["root"], settings, ("float32",))
    return (a["root"], problem) if problem else None


def _fits_rule(*keys):
    """The activations at ``keys`` (the op's inputs and its result) fit the SRAM together
    (:func:`..rules.int8_working_set_problem`)."""
    def rule(a, settings):
        values = []
        for k in keys:
            expr = a[k]
            shape = None if is_const(expr) else static_shape(expr.ty)
            if shape is not None:
                values.append((shape, 1 if expr.ty.dtype in INT_DTYPES else 4))
        weight = a.get("weight")
        weight_bytes = weight.value.numpy().nbytes if weight is not None and is_const(weight) else 0
        problem = int8_working_set_problem(values, settings.config, weight_bytes)
        return (a["root"], problem) if problem else None
    return rule


def _qmxm_pattern(op):
    x, zp_in, w, bias, scale, zp_out = (wildcard() for _ in range(6))
    centered = is_op("relax.subtract")(is_op("relax.astype")(x), zp_in)
    root = is_op(op)(centered, w)
    acc = is_op("relax.add")(root, bias)
    q = is_op("relax.quantize")(is_op("relax.astype")(acc), scale, zp_out)
    return q, {"input": x, "zp_in": zp_in, "weight": w, "root": root, "bias": bias, "scale": scale,
               "zp_out": zp_out, "quantize": q}


def _dq(x):
    return is_op("relax.dequantize")(x, wildcard(), wildcard())


def _q(x):
    return is_op("relax.quantize")(x, wildcard(), wildcard())


def _qadd_pattern():
    a, b = wildcard(), wildcard()
    da, db = _dq(a), _dq(b)
    root = is_op("relax.add")(da, db)
    q = _q(root)
    return q, {"lhs": a, "rhs": b, "dq_lhs": da, "dq_rhs": db, "root": root, "quantize": q}


def _qgap_pattern(reshape):
    x = wildcard()
    dq = _dq(x)
    root = is_op("relax.mean")(dq)
    out = is_op("relax.reshape")(root, wildcard()) if reshape else root
    q = _q(out)
    return q, {"input": x, "dq": dq, "root": root, "quantize": q}


_unary = unary_pattern


def _int8(name, make, checks, priority):
    return OpPattern(name, make, None, checks, priority, zero_d=True, precisions=(Precision.INT8,))


# Tried in an int8 build only (in a float build they refuse without a reason, so the
# float patterns' reasons stand). Keys: ``lpx.qconv2d`` / ``lpx.qdense`` ``input``,
# ``zp_in``, ``weight``, ``root`` (the conv2d / matmul), ``bias``, ``scale``, ``zp_out``,
# ``quantize``; ``lpx.qadd`` ``lhs``, ``rhs``, ``dq_lhs``, ``dq_rhs``, ``root``, ``quantize``;
# ``lpx.qglobal_avg_pool2d[_reshape]`` ``input``, ``dq``, ``root`` (the mean), ``quantize``.
register_pattern(
    _int8("quantize", lambda: _unary("relax.quantize"),
          (_quantize_rule, _scales_rule("root"), _fits_rule("input", "root")), 200),
    _int8("dequantize", lambda: _unary("relax.dequantize"),
          (_dequantize_rule, _scales_rule("root"), _fits_rule("input", "root")), 201),
    _int8("qmax_pool2d", lambda: _unary("relax.nn.max_pool2d"),
          (_int_rule("input", "root"), pool2d_check, _fits_rule("input", "root")), 202),
    _int8("qadd", _qadd_pattern, (_int_rule("lhs", "rhs", "quantize"), _qadd_rule,
                                  _scales_rule("dq_lhs", "dq_rhs", "quantize"),
                                  _fits_rule("lhs", "rhs", "quantize")), 203),
    _int8("qglobal_avg_pool2d", lambda: _qgap_pattern(False),
          (_int_rule("input", "quantize"), global_avg_pool2d_check, _scales_rule("dq", "quantize"),
           _fits_rule("input", "quantize")), 204),
    _int8("qglobal_avg_pool2d_reshape", lambda: _qgap_pattern(True),
          (_int_rule("input", "quantize"), global_avg_pool2d_check, _scales_rule("dq", "quantize"),
           _fits_rule("input", "quantize")), 205),
    _int8("qconv2d", lambda: _qmxm_pattern("relax.nn.conv2d"), (_qmxm_rule, _fits_rule("input", "quantize")), 206),
    _int8("qdense", lambda: _qmxm_pattern("relax.matmul"), (_qmxm_rule, _fits_rule("input", "quantize")), 207),
)

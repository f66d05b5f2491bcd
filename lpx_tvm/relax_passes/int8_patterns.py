"""BYOC patterns for the int8 ops of a QDQ model (see :mod:`lpx_tvm.relax_passes.qdq`).

They accept only in an ``int8`` build (``check_settings(precision="int8")``); in a float
build they refuse without a reason, so the float patterns' reasons stand.

=====================================  =================================================
composites                              what runs on LPX
=====================================  =================================================
``lpx.qconv2d``                         ``quantize(astype(conv2d(astype(x_q) - z_x, W_q,
                                        int32) + b))``: the MXM at int8 rate with int32
                                        accumulators, then ``vxm.requant`` per channel.
                                        Keys: ``input``, ``zp_in``, ``weight``,
                                        ``root`` (the conv2d), ``bias``, ``scale``,
                                        ``zp_out``, ``quantize``
``lpx.qdense``                          the same with ``matmul`` (constant (K, N) weight)
``lpx.qmax_pool2d``                     ``nn.max_pool2d`` of int8 / uint8 values
``lpx.qadd``                            ``quantize(dequantize(a) + dequantize(b))``
                                        (a residual add): keys ``lhs``, ``rhs``,
                                        ``dq_lhs``, ``dq_rhs``, ``root``, ``quantize``
``lpx.qglobal_avg_pool2d``              ``quantize([reshape](mean(dequantize(x))))``
``lpx.quantize``, ``lpx.dequantize``    a model's first quantize (float input) and last
                                        dequantize (float output), with a scalar scale
=====================================  =================================================
"""

from __future__ import annotations

from tvm.relax.dpl.pattern import is_op, wildcard

from ..precision import Precision
from ..target.codegen.rules import (
    activation_row_problem,
    grouped_conv_problem,
    int8_working_set_problem,
    spatial_mean_problem,
)
from .check_context import current_settings
from .pattern_utils import expr_shape, is_const, make_check, static_shape

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


def _qgap_rule(a, settings):
    mean = a["root"]
    rank = len(expr_shape(a["input"]))
    problem = spatial_mean_problem(rank, mean.attrs.axis or range(rank))
    return (mean, problem) if problem else None


def _qpool_rule(a, settings):
    pool = a["root"]
    attrs = pool.attrs
    if (attrs.layout, attrs.out_layout or attrs.layout) != ("NCHW", "NCHW"):
        return pool, "LPX pooling takes NCHW"
    if attrs.ceil_mode:
        return pool, "ceil_mode=True: LPX pooling windows follow floor mode only"
    if any(int(d) != 1 for d in attrs.dilation):
        return pool, "dilated pooling is not supported"
    return None


def _quantize_rule(a, settings):
    problem = _int_type_problem(a["input"], settings, ("float32",)) or _int_type_problem(a["root"], settings)
    return (a["root"], problem) if problem else None


def _dequantize_rule(a, settings):
    problem = _int_type_problem(a["input"], settings) or _int_type_problem(a["root"], settings, ("float32",))
    return (a["root"], problem) if problem else None


def _fits_rule(*keys):
    """The activations at ``keys`` (the op's inputs and its result) fit the SRAM together
    (:func:`~lpx_tvm.target.codegen.rules.int8_working_set_problem`)."""
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


# ---- patterns ---------------------------------------------------------------------


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


def _unary(op):
    x = wildcard()
    root = is_op(op)(x, varg_default_wildcard=True)
    return root, {"input": x, "root": root}


def int8_pattern_table() -> list:
    """The int8 patterns as ``(name, pattern, annotations, check)``, lowest priority first."""

    def only_int8(name, rules):
        check = make_check(name, rules)

        def int8_check(context) -> bool:
            return current_settings().precision == Precision.INT8 and check(context)

        int8_check.__name__ = check.__name__
        return int8_check

    table = [
        ("lpx.quantize", *_unary("relax.quantize"), [_quantize_rule, _scales_rule("root"),
                                                     _fits_rule("input", "root")]),
        ("lpx.dequantize", *_unary("relax.dequantize"), [_dequantize_rule, _scales_rule("root"),
                                                         _fits_rule("input", "root")]),
        ("lpx.qmax_pool2d", *_unary("relax.nn.max_pool2d"), [_int_rule("input", "root"), _qpool_rule,
                                                             _fits_rule("input", "root")]),
        ("lpx.qadd", *_qadd_pattern(), [_int_rule("lhs", "rhs", "quantize"), _qadd_rule,
                                        _scales_rule("dq_lhs", "dq_rhs", "quantize"),
                                        _fits_rule("lhs", "rhs", "quantize")]),
        ("lpx.qglobal_avg_pool2d", *_qgap_pattern(False), [_int_rule("input", "quantize"), _qgap_rule,
                                                          _scales_rule("dq", "quantize"),
                                                          _fits_rule("input", "quantize")]),
        ("lpx.qglobal_avg_pool2d_reshape", *_qgap_pattern(True), [_int_rule("input", "quantize"), _qgap_rule,
                                                                  _scales_rule("dq", "quantize"),
                                                                  _fits_rule("input", "quantize")]),
        ("lpx.qconv2d", *_qmxm_pattern("relax.nn.conv2d"), [_qmxm_rule, _fits_rule("input", "quantize")]),
        ("lpx.qdense", *_qmxm_pattern("relax.matmul"), [_qmxm_rule, _fits_rule("input", "quantize")]),
    ]
    return [(name, pat, ann, only_int8(name, rules)) for name, pat, ann, rules in table]


__all__ = ["INT_DTYPES", "int8_pattern_table"]

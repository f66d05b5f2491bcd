"""BYOC patterns for LPX: which Relax ops (and fused groups) LPX runs, and why not when not.

Importing this module registers every pattern under the ``lpx.`` prefix with
:func:`tvm.relax.backend.pattern_registry.register_patterns`. Each pattern has a check
function that judges the match against the machine: dtypes, static shapes, the op's
attributes, and activations that could never fit the SRAM. A check that says no records
a one-line hardware reason in the :class:`RejectionLog` of the current
:func:`check_settings` context, keyed by the variable bound to the rejected op, so the
offload report can say why an op stayed on the CPU.

Annotation keys (what a codegen finds in ``PatternCheckContext.annotated_expr``):

=====================================  =================================================
composites                              keys
=====================================  =================================================
``lpx.conv2d[_bias][_relu|_clip]``      ``input``, ``weight`` (constant OIHW), ``root``
                                        (the ``nn.conv2d`` call: ``Conv2DAttrs``),
                                        ``bias`` (constant), ``bias_add`` (the add call),
                                        ``activation`` (the relu / clip call)
``lpx.dense[_bias][_relu|_clip]``       ``input``, ``weight`` (constant (K, N)), ``root``
                                        (the ``matmul`` call), ``bias``, ``bias_add``,
                                        ``activation``
``lpx.add``, ``.subtract``,             ``lhs``, ``rhs``, ``root``
``.multiply``
``lpx.relu``, ``.sigmoid``, ``.tanh``,  ``input``, ``root``; clip bounds are
``.clip``                               ``root.args[1]`` and ``root.args[2]``
``lpx.max_pool2d``, ``.avg_pool2d``     ``input``, ``root`` (``Pool2DAttrs``)
``lpx.global_avg_pool2d``               ``input``, ``root`` (the ``mean`` call:
                                        ``axis``, ``keepdims``)
``lpx.reshape``                         ``input``, ``shape``, ``root``
``lpx.concat``                          ``input`` (the tuple), ``root`` (``axis``)
``lpx.slice``                           ``input``, ``root`` (the ``strided_slice``)
``lpx.permute_lanes``                   ``input``, ``first`` and ``second`` (its
                                        ``strided_slice`` calls), ``root`` (their
                                        ``concat`` along the last axis)
``lpx.split_heads``                     ``input`` (s, h*d), ``reshape`` (to (s, h, d)),
                                        ``root`` (``permute_dims`` [1, 0, 2])
``lpx.merge_heads``                     ``input`` (h, s, d), ``permute`` ([1, 0, 2]),
                                        ``root`` (the reshape to (s, h*d))
``lpx.pixels_to_rows``                  ``input`` (N, C, H, W), ``permute`` ([0, 2, 3, 1]),
                                        ``root`` (the reshape to (N*H*W, C))
``lpx.rows_to_pixels``                  ``input`` (N*H*W, C), ``reshape`` (to (N, H, W, C)),
                                        ``root`` (``permute_dims`` [0, 3, 1, 2])
``lpx.resize2d``                        ``input``, ``root`` (``Resize2DAttrs``)
``lpx.flatten_pixels``                  ``input`` (n, c, h, w), ``reshape`` (to
                                        (n, c, h*w)), ``root`` (``permute_dims`` [0, 2, 1])
``lpx.concat_rows``                     ``input`` (the tuple), ``root`` (``axis``)
``lpx.slice_rows``                      ``input``, ``root`` (the ``strided_slice``)
``lpx.argmax``                          ``input``, ``root`` (the ``argmax``), ``cast``
                                        (the ``astype`` to int32)
``lpx.take``                            ``input`` (the constant table), ``indices``
                                        (int32), ``root``
``lpx.index_put``                       ``input`` (the 2-D value), ``rows`` (int32 (N, 1)),
                                        ``cols`` (constant ``arange(D)``), ``values``, ``root``
``lpx.astype``                          ``input`` (int32), ``root``
``lpx.act_quant``                       ``input`` (float), ``scale`` (the ``multiply`` by
                                        ``1 / s_x``), ``clip`` (to [-128, 127]),
                                        ``root`` (the ``astype`` to int8)
``lpx.all_reduce``                      ``input`` (2-D), ``root`` (``ccl.allreduce``, sum):
                                        the sum over the chips of a system's group
``lpx.fp8_quant``                       the same without ``round``: ``clip`` to [-448, 448],
                                        ``root`` the ``astype`` to float8_e4m3fn
``lpx.qlinear[_bias]``                  ``input`` (int8 or fp8), ``widen`` (its ``astype`` to
                                        int32 / float32), ``weight`` (constant (K, N): int32
                                        in the int8 range, or float32 of fp8 values),
                                        ``root`` (the ``matmul``), ``scale`` (the
                                        ``multiply`` by ``s_x * s_w``), ``bias``,
                                        ``bias_add``
=====================================  =================================================
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import tvm
from tvm import relax
from tvm.relax.backend.pattern_registry import register_patterns
from tvm.relax.dpl.pattern import is_const as const_pattern, is_op, is_tuple, wildcard

from ..machine.isa import FP8_MAX
from ..precision import Precision
from ..target.codegen import lowerings  # noqa: F401  (imports every family: the patterns they declare)
from ..target.codegen.registry import declared_patterns, unary_pattern
from ..target.codegen.rules import (
    activation_row_problem,
    binary_operands_problem,
    channel_axis,
    concat_axis_problem,
    divide_operands_problem,
    flattens_pixels,
    grouped_conv_problem,
    pad_problem,
    prelu_slope_problem,
    reshape_keeps_storage,
    resize_problem,
    row_axis_problem,
    spatial_mean_problem,
)
from .check_context import (
    CheckSettings,
    Rejection,
    RejectionLog,
    check_settings,
    current_settings,
)
from .decompose import MAX_INTEGER_POWER
from .int8_patterns import int8_pattern_table
from .pattern_utils import (
    PATTERN_PREFIX,
    clip_bounds,
    expr_shape,
    is_const,
    make_check,
    op_name,
    scalar_value,
    static_shape,
)

__all__ = [
    "PATTERN_PREFIX",
    "SUPPORTED_DTYPES",
    "CheckSettings",
    "Rejection",
    "RejectionLog",
    "check_settings",
    "clip_bounds",
    "current_settings",
    "pattern_table",
]

# Tensor dtypes a graph may carry into LPX; the MXM multiplies them at ``precision``.
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")

_ACTIVATIONS = {"relu": "relax.nn.relu", "clip": "relax.clip"}


# ---- rules: each returns None, or (the op to blame, a one-line reason) ---------------


def _type_problem(ty, settings, activation=True, integers=False) -> str | None:
    """Why a tensor of type ``ty`` cannot be an operand on LPX, or None. ``integers``: the
    op also takes int32 tensors (token ids and positions: their index arithmetic, their
    reshapes, their conversion to float) in a float build."""
    if not isinstance(ty, relax.TensorType):
        return f"operand of type {ty} is not a tensor"
    if integers and ty.dtype == "int32" and settings.precision != Precision.INT8:
        shape = static_shape(ty)
        return None if shape is not None else f"dynamic shape {ty.shape}: LPX schedules need static shapes"
    if ty.dtype not in SUPPORTED_DTYPES:
        return f"dtype {ty.dtype} is not supported on LPX (float32, float16 or bfloat16)"
    if settings.precision == Precision.INT8:
        return f"a {ty.dtype} op in an int8 build: LPX runs the quantized ops of a QDQ model"
    shape = static_shape(ty)
    if shape is None:
        return f"dynamic shape {ty.shape}: LPX schedules are static and need static shapes"
    if activation:
        return activation_row_problem(shape, settings.activation_bytes, settings.config, settings.precision)
    return None


def _tensors_problem(op, operands, settings, integers=False):
    """Dtype, static shape and SRAM fit of ``op``'s operands and result (int32 ones too
    when ``integers``).

    Constants are weights, which can stream in from off-chip memory: only
    activations must fit the SRAM.
    """
    for expr in [*operands, op]:
        if isinstance(expr, relax.Tuple):
            fields = [(f.ty, not is_const(f)) for f in expr.fields]
        elif isinstance(expr.ty, relax.TupleType):
            fields = [(ty, True) for ty in expr.ty.fields]
        else:
            fields = [(expr.ty, not is_const(expr))]
        for ty, activation in fields:
            problem = _type_problem(ty, settings, activation, integers)
            if problem:
                return op, problem
    return None


def _conv2d_rule(a, settings):
    conv, data, weight = a["root"], a["input"], a["weight"]
    found = _tensors_problem(conv, [data, weight], settings)
    found = found or _same_dtype_problem(conv, data, weight, ("input", "weight"))
    if found:
        return found
    attrs = conv.attrs
    layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout or attrs.data_layout)
    if layouts != ("NCHW", "OIHW", "NCHW"):
        return conv, (
            f"layouts data={layouts[0]} weight={layouts[1]} out={layouts[2]}: "
            "LPX convolution takes NCHW activations and OIHW weights"
        )
    if not is_const(weight):
        return conv, (
            "weight is not a constant: LPX keeps conv weights in SRAM, fixed at compile time"
        )
    groups, cin, cout = int(attrs.groups), expr_shape(data)[1], expr_shape(weight)[0]
    problem = grouped_conv_problem(groups, cin, cout) if groups != 1 else None
    return (conv, problem) if problem else None


def _dense_rule(a, settings):
    matmul, data, weight = a["root"], a["input"], a["weight"]
    found = _tensors_problem(matmul, [data, weight], settings)
    found = found or _same_dtype_problem(matmul, data, weight, ("input", "weight"))
    if found:
        return found
    if not is_const(weight):
        # Activation x activation: B is installed from SRAM like a weight matrix.
        lhs, rhs = expr_shape(data), expr_shape(weight)
        if len(lhs) != len(rhs) or len(lhs) not in (2, 3) or lhs[:-2] != rhs[:-2]:
            return matmul, (
                f"runtime matmul operands {lhs} x {rhs}: LPX multiplies 2-D matrices, or 3-D "
                "batches of equal size (4-D values are stored NHWC; broadcasts move data between lanes)"
            )
        return None
    if len(expr_shape(weight)) != 2:
        rank = len(expr_shape(weight))
        return matmul, f"weight of rank {rank}: LPX dense takes a 2-D (K, N) weight"
    if len(expr_shape(data)) < 2:
        return matmul, "input of rank 1: LPX dense takes an input of rank >= 2"
    return None


def _bias_rule(channel_shapes):
    """Bias rule for a family; ``channel_shapes(n)`` lists the accepted shapes for n channels."""

    def rule(a, settings):
        add, bias = a["bias_add"], a["bias"]
        channels = expr_shape(a["root"])[1 if a["root"].op.name == "relax.nn.conv2d" else -1]
        if not is_const(bias):
            return add, "bias is not a constant"
        found = _tensors_problem(add, [bias], settings)
        if found:
            return found
        accepted = channel_shapes(channels)
        if expr_shape(bias) not in accepted:
            return add, (
                f"bias of shape {expr_shape(bias)} is not one value per output channel "
                f"({' or '.join(str(s) for s in accepted)})"
            )
        return None

    return rule


def _activation_rule(a, settings):
    act = a.get("activation")
    if act is None:
        return None
    found = _tensors_problem(act, [], settings)
    if found:
        return found
    if act.op.name == "relax.clip":
        return _clip_problem(act)
    return None


def _clip_problem(call):
    bounds = clip_bounds(call)
    if bounds is None:
        return call, "clip bounds are not compile-time scalars"
    if bounds[0] > bounds[1]:
        return call, f"clip min {bounds[0]} is above max {bounds[1]}"
    return None


def _same_dtype_problem(op, lhs, rhs, what=("operand", "operand")):
    if lhs.ty.dtype != rhs.ty.dtype:
        return op, f"{what[0]} dtype {lhs.ty.dtype} and {what[1]} dtype {rhs.ty.dtype} differ"
    return None


def _binary_rule(a, settings):
    op, lhs, rhs = a["root"], a["lhs"], a["rhs"]
    found = _tensors_problem(op, [lhs, rhs], settings, integers=op_name(op) in ("add", "subtract"))
    if found:
        return found
    found = _same_dtype_problem(op, lhs, rhs)
    if found:
        return found
    problem = binary_operands_problem(op_name(op), expr_shape(lhs), expr_shape(rhs), is_const(lhs),
                                      is_const(rhs), expr_shape(op))
    return (op, problem) if problem else _scalar_problem(op)


def _scalar_problem(op):
    """An elementwise op of single numbers (a Range's bounds, a size computed at run
    time): nothing for the lanes to share, and a region's inputs and outputs are tensors
    of at least one dimension."""
    return None if expr_shape(op) else (op, f"{op_name(op)} of 0-d values (0-d values stay on the CPU)")


def _unary_rule(a, settings):
    op = a["root"]
    found = _tensors_problem(op, [a["input"]], settings)
    if found:
        return found
    if op.op.name == "relax.clip":
        return _clip_problem(op) or _scalar_problem(op)
    return _scalar_problem(op)


def _pool2d_rule(a, settings):
    pool = a["root"]
    found = _tensors_problem(pool, [a["input"]], settings)
    if found:
        return found
    attrs = pool.attrs
    if len(expr_shape(a["input"])) != 4:
        return pool, "pooling input is not 4-D"
    if (attrs.layout, attrs.out_layout or attrs.layout) != ("NCHW", "NCHW"):
        return pool, f"layout {attrs.layout}/{attrs.out_layout}: LPX pooling takes NCHW"
    if attrs.ceil_mode:
        return pool, "ceil_mode=True: LPX pooling windows follow floor mode only"
    if any(int(d) != 1 for d in attrs.dilation):
        return pool, f"dilation {tuple(attrs.dilation)}: dilated pooling is not supported"
    return None


def _softmax_rule(a, settings):
    op = a["root"]
    found = _tensors_problem(op, [a["input"]], settings)
    if found:
        return found
    shape = expr_shape(a["input"])
    rank = len(shape)
    if int(op.attrs.axis) % max(rank, 1) != rank - 1:
        return op, f"softmax over axis {int(op.attrs.axis)} of a {rank}-D tensor: LPX reduces the last axis"
    return _last_axis_rows_problem(op, shape, settings, "softmax")


def _take_rule(a, settings):
    op, table, idx = a["root"], a["input"], a["indices"]
    if not is_const(table) or len(expr_shape(table)) != 2:
        return op, "take from a runtime tensor: LPX gathers rows of a constant 2-D table"
    if op.attrs.axis is None or int(op.attrs.axis) != 0:
        return op, "take along an axis other than 0: LPX gathers whole rows"
    problem = _type_problem(op.ty, settings)
    if problem:
        return op, problem
    if not isinstance(idx.ty, relax.TensorType) or idx.ty.dtype != "int32" or static_shape(idx.ty) is None:
        return op, f"take by indices of type {idx.ty}: LPX gathers by static-shape int32 indices"
    shape = static_shape(idx.ty)
    if is_const(idx) or len(shape) > 2 or (len(shape) == 2 and shape[-1] != 1):
        return op, f"take by indices of shape {shape}: LPX gathers by a row of indices or one per row"
    rows = expr_shape(table)[0]
    lines = settings.config.lines_per_slice
    if rows * settings.activation_bytes > lines:  # a stored row takes one line per byte
        return op, f"take from a table of {rows} rows: a column tile of it must fit one slice ({lines} lines)"
    return None


def _index_put_rule(a, settings):
    """``index_put(data, (rows, cols), values)`` writing whole rows of a runtime 2-D value
    (a decoder's KV cache): ``rows`` int32 of shape (N, 1), ``cols`` the constant
    ``arange(D)`` of shape (1, D), ``values`` (N, D)."""
    op, data, rows, cols, values = a["root"], a["input"], a["rows"], a["cols"], a["values"]
    if is_const(data):
        return op, "index_put into a constant (folded at compile time)"
    found = _tensors_problem(op, [data, values], settings)
    if found:
        return found
    if op.attrs.accumulate:
        return op, "index_put with accumulate=True: LPX scatters rows, it does not add them"
    shape = expr_shape(data)
    if len(shape) != 2:
        return op, f"index_put into a {len(shape)}-D value: LPX scatters rows of a 2-D value"
    d = shape[1]
    if not isinstance(rows.ty, relax.TensorType) or rows.ty.dtype != "int32" or \
            static_shape(rows.ty) is None or len(static_shape(rows.ty)) != 2 or static_shape(rows.ty)[1] != 1:
        return op, f"index_put by row indices of type {rows.ty}: LPX scatters by int32 indices of shape (N, 1)"
    n = static_shape(rows.ty)[0]
    whole_rows = is_const(cols) and cols.value.numpy().reshape(-1).tolist() == list(range(d)) and \
        tuple(cols.value.numpy().shape) in ((1, d), (d,))
    if not whole_rows:
        return op, "index_put of part of a row: LPX scatters whole rows (columns arange(D))"
    if tuple(expr_shape(values)) != (n, d):
        return op, f"index_put of values of shape {expr_shape(values)} into rows of {shape} by {n} indices"
    lines = settings.config.lines_per_slice
    if shape[0] * settings.activation_bytes > lines:  # a stored row takes one line per byte
        return op, (f"index_put into a value of {shape[0]} rows: a column tile of it must fit one slice "
                    f"({lines} lines)")
    return None


def _astype_rule(a, settings):
    op, data = a["root"], a["input"]
    if "float8_e4m3fn" in (getattr(data.ty, "dtype", None), op.ty.dtype):
        return _fp8_problem(op, settings) or (op, (
            "an fp8 conversion outside an fp8 dense layer: LPX quantizes to fp8 by clip(x * (1 / s), -448, 448) "
            "(lpx.fp8_quant) for lpx.qlinear, which widens it"))
    if is_const(data) or not isinstance(data.ty, relax.TensorType) or data.ty.dtype != "int32" or \
            op.ty.dtype not in SUPPORTED_DTYPES:
        return op, (f"astype of {getattr(data.ty, 'dtype', data.ty)} to {op.ty.dtype}: LPX converts int32 "
                    "indices to float (floats stay at the precision)")
    return _tensors_problem(op, [data], settings, integers=True)


def _act_quant_rule(a, settings):
    op, data = a["root"], a["input"]
    if settings.precision == Precision.INT8:
        return op, "an int8 build: its activations are quantized by the model's QuantizeLinear"
    found = _tensors_problem(a["scale"], [data], settings)
    if found:
        return found
    if scalar_value(a["inv"]) is None:
        return a["scale"], "the quantization scale is not one constant: LPX quantizes by a static per-tensor scale"
    if "round" not in a and op.ty.dtype == "float8_e4m3fn":  # lpx.fp8_quant
        if clip_bounds(a["clip"]) != (-FP8_MAX, FP8_MAX):
            return a["clip"], f"clipped to {clip_bounds(a['clip'])}: LPX quantizes to fp8 e4m3 in [-448, 448]"
        return _fp8_problem(op, settings)
    if "round" not in a:
        return op, f"quantized as {op.ty.dtype} without rounding: LPX's 8-bit dense layers take int8 or fp8 e4m3"
    if clip_bounds(a["clip"]) != (-128.0, 127.0):
        return a["clip"], f"clipped to {clip_bounds(a['clip'])}: LPX quantizes activations to int8 [-128, 127]"
    if op.ty.dtype != "int8":
        return op, f"quantized as {op.ty.dtype}: LPX's int8 dense layers take int8 values"
    return None


def _all_reduce_rule(a, settings):
    op = a["root"]
    if str(op.attrs.op_type) != "sum":
        return op, f"an all-reduce by {op.attrs.op_type}: LPX all-reduces by sum"
    if len(expr_shape(op)) != 2:
        return op, f"an all-reduce of a {len(expr_shape(op))}-D value: LPX all-reduces rows of a 2-D value"
    return _tensors_problem(op, [a["input"]], settings)


def _fp8_problem(op, settings):
    """Why fp8 cannot run on the build's machine (its MXM has no fp8 rate), or None."""
    if "fp8" not in settings.config.mxm_cycles_per_vector:
        return op, f"fp8 e4m3: the MXM of {settings.config.name} does not multiply fp8 (lp30 does)"
    return None


def _qlinear_rule(a, settings):
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
        found = _fp8_problem(op, settings)
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
    found = _tensors_problem(a["scale"], [], settings)
    if found:
        return found
    if "bias" in a:
        found = _bias_rule(_dense_bias_shapes)({"bias_add": a["bias_add"], "bias": a["bias"], "root": op}, settings)
        if found:
            return found
    return None


def _argmax_rule(a, settings):
    op, cast = a["root"], a["cast"]
    problem = _type_problem(a["input"].ty, settings)
    if problem:
        return op, problem
    shape = expr_shape(a["input"])
    rank = len(shape)
    if op.attrs.axis is None or int(op.attrs.axis) % max(rank, 1) != rank - 1:
        return op, "argmax over all axes or not the last one: LPX reduces the last axis"
    if cast.ty.dtype != "int32":
        return cast, f"argmax as {cast.ty.dtype}: LPX gives int32 indices"
    rows = math.prod(shape[:-1])
    if rows > 1 and not bool(op.attrs.keepdims):
        return op, "argmax of several rows without keepdims (the indices would be stored across lanes)"
    return _last_axis_rows_problem(op, shape, settings, "argmax")


def _last_axis_rows_problem(op, shape, settings, what):
    """Why a per-row reduction over the last axis cannot run on LPX, or None."""
    rank = len(shape)
    if rank == 4:
        return op, f"{what} of a 4-D tensor: LPX stores its last axis (W) across vectors, not lanes"
    cfg = settings.config
    tiles = -(-int(shape[-1]) // cfg.lanes) if shape else 1
    if 2 * tiles + 2 > cfg.mem_slices:
        return op, (f"{what} rows of {shape[-1]} elements ({tiles} lane tiles) need more SRAM slices "
                    f"than {cfg.name} has ({cfg.mem_slices}) to read their pieces side by side")
    return None


def _permute_dims_rule(a, settings):
    op = a["root"]
    found = _tensors_problem(op, [a["input"]], settings)
    if found:
        return found
    rank = len(expr_shape(a["input"]))
    axes = [int(x) for x in op.attrs.axes] if op.attrs.axes is not None else list(range(rank))[::-1]
    if rank not in (2, 3):
        return op, (f"permute_dims {axes} of a {rank}-D tensor: LPX permutes the axes of a 2-D or 3-D "
                    "tensor (4-D values are stored NHWC)")
    nbytes = math.prod(expr_shape(a["input"])) * settings.activation_bytes
    if 4 * nbytes > settings.config.sram_bytes:
        return op, "a transpose larger than a quarter of the SRAM (it does not run by bands)"
    return None


def _norm_rule(a, settings):
    """layer_norm (data, gamma, beta) and rms_norm (data, weight) over the last axis."""
    op = a["root"]
    data, *params = op.args
    what = op_name(op).removeprefix("nn.")
    found = _tensors_problem(op, [data], settings)
    if found:
        return found
    if not all(is_const(p) for p in params):
        return op, f"{what} with a runtime " + ("gamma or beta" if len(params) == 2 else "weight")
    shape = expr_shape(data)
    rank = len(shape)
    if [int(ax) % max(rank, 1) for ax in op.attrs.axes] != [rank - 1]:
        return op, f"{what} over axes {[int(x) for x in op.attrs.axes]}: LPX normalizes the last axis"
    return _last_axis_rows_problem(op, shape, settings, what)


def _where_rule(a, settings):
    op = a["root"]
    cond, x, y = op.args
    if is_const(cond):
        return op, "where with a constant condition and finite fills (see lpx.MaskingAdd for infinite ones)"
    if not isinstance(cond.ty, relax.TensorType) or cond.ty.dtype != "bool":
        return op, f"where with a condition of type {cond.ty}: LPX selects by a bool tensor"
    found = _tensors_problem(op, [b for b in (x, y) if not (is_const(b) and scalar_value(b) is not None)], settings)
    if found:
        return found
    shape = expr_shape(op)
    if not shape:
        return op, "a where of scalars (0-d values stay on the CPU)"
    for b in (cond, x, y):
        if expr_shape(b) != shape and not (is_const(b) and scalar_value(b) is not None):
            return op, (f"where operand of shape {expr_shape(b)} broadcast against {shape}: "
                        "broadcasts move data between lanes")
    return None


def _global_avg_pool2d_rule(a, settings):
    mean = a["root"]
    found = _tensors_problem(mean, [a["input"]], settings)
    if found:
        return found
    rank = len(expr_shape(a["input"]))
    problem = spatial_mean_problem(rank, mean.attrs.axis or range(rank))
    return (mean, problem) if problem else None


def _reshape_rule(a, settings):
    found = _tensors_problem(a["root"], [a["input"]], settings, integers=True)
    if found:
        return found
    if is_const(a["input"]):
        return a["root"], "reshape of a constant (folded at compile time)"
    src, dst = expr_shape(a["input"]), expr_shape(a["root"])
    if not reshape_keeps_storage(src, dst):
        return a["root"], f"reshape {src} -> {dst} moves data between lanes (NHWC storage)"
    return None


def _concat_rule(a, settings, rows=False):
    """``lpx.concat`` (along the lanes), or with ``rows`` ``lpx.concat_rows`` (along another
    axis of a rank 2 or 3 value). The row pattern is tried first and each refuses the
    other's case; this one then gives the row case's reason."""
    concat = a["root"]
    found = _tensors_problem(concat, [a["input"]], settings)
    if found:
        return found
    if concat.attrs.axis is None:
        return concat, "concat without an axis (flattening) is not supported"
    fields = getattr(a["input"], "fields", ())
    if row_axis_problem("concat", int(concat.attrs.axis), len(expr_shape(concat))) is None:
        if all(is_const(f) for f in fields):
            return concat, "concat of constants (folded at compile time)"
        found = _one_band_problem(concat, settings, "concat")
        return found if rows or found else (concat, "a concat of rows (lpx.concat_rows)")
    if rows:
        return concat, "not a concat of rows"
    if any(is_const(f) for f in fields):
        return concat, "concat of a constant operand is not supported (the concat lowers values in SRAM)"
    problem = concat_axis_problem(int(concat.attrs.axis), len(expr_shape(concat)))
    return (concat, problem) if problem else None


def _heads_problem(op, rows_shape, s, h, d):
    """Why a head split / merge of ``s`` rows of ``h`` heads of ``d`` cannot run on LPX, or None."""
    rows = math.prod(rows_shape[:-1]) if len(rows_shape) > 1 else 1
    if rows != s or rows_shape[-1] != h * d:
        return op, f"values {rows_shape} are not {s} rows of {h} heads x {d}: only a batch of one splits into heads"
    return None


def _split_heads_rule(a, settings):
    reshape, permute, data = a["reshape"], a["root"], a["input"]
    found = _tensors_problem(permute, [data], settings)
    if found:
        return found
    if len(expr_shape(reshape)) != 3 or [int(x) for x in permute.attrs.axes] != [1, 0, 2]:
        return permute, "a head split is reshape (s, h, d) then permute_dims [1, 0, 2]"
    s, h, d = expr_shape(reshape)
    return _heads_problem(permute, expr_shape(data), s, h, d)


def _merge_heads_rule(a, settings):
    reshape, permute, data = a["root"], a["permute"], a["input"]
    found = _tensors_problem(reshape, [data], settings)
    if found:
        return found
    if len(expr_shape(data)) != 3 or [int(x) for x in permute.attrs.axes] != [1, 0, 2]:
        return reshape, "a head merge is permute_dims [1, 0, 2] of (h, s, d) then a reshape"
    h, s, d = expr_shape(data)
    return _heads_problem(reshape, expr_shape(reshape), s, h, d)


def _int_tuple(expr) -> list | None:
    """The ints of a tuple of compile-time integers (strided_slice's axes, begin, end, strides)."""
    fields = expr.fields if isinstance(expr, relax.Tuple) else expr.values if isinstance(expr, relax.ShapeExpr) \
        else None
    if fields is None:
        return None
    values = list(fields)
    if not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return [int(v.value) for v in values]


def _slice_rule(a, settings, rows=False):
    """``lpx.slice`` (of the last axis), or with ``rows`` ``lpx.slice_rows`` (of another
    axis of a rank 2 or 3 value), as :func:`_concat_rule`."""
    op = a["root"]
    found = _tensors_problem(op, [a["input"]], settings)
    if found:
        return found
    shape = expr_shape(a["input"])
    rank = len(shape)
    ints = [_int_tuple(t) for t in op.args[1:]]
    if any(t is None for t in ints):
        return op, "strided_slice with runtime bounds"
    axes = [x % rank for x in ints[0]]
    strides = ints[3] if len(ints) > 3 else [1] * len(axes)
    if len(axes) == 1 and strides == [1] and row_axis_problem("strided_slice", axes[0], rank) is None:
        found = _one_band_problem(op, settings, "slice")
        return found if rows or found else (op, "a slice of rows (lpx.slice_rows)")
    if rows:
        return op, "not a slice of rows"
    # A 4-D value keeps its channels (axis 1) in lanes: their slice is a lane slice too.
    if axes != [channel_axis(rank)] or strides != [1]:
        return op, (f"strided_slice over axes {axes} with strides {strides} of a {rank}-D value: LPX slices "
                    "the channels (the last axis; axis 1 of a 4-D value) with stride 1")
    return None


# ---- NCHW values and their pixel rows (lpx.ChannelsLast) ------------------------------


def _permute_lanes_pattern():
    """``concat((strided_slice(x), strided_slice(x)), axis=-1)``: lanes of one value
    picked by two slices (RoPE's halves of a head swapped)."""
    data = wildcard()
    first = is_op("relax.strided_slice")(data, varg_default_wildcard=True)
    second = is_op("relax.strided_slice")(data, varg_default_wildcard=True)
    root = is_op("relax.concat")(is_tuple([first, second]))
    return root, {"input": data, "first": first, "second": second, "root": root}


def _permute_lanes_rule(a, settings):
    concat = a["root"]
    found = _tensors_problem(concat, [a["input"]], settings)
    if found:
        return found
    rank = len(expr_shape(concat))
    if rank == 4 or concat.attrs.axis is None or int(concat.attrs.axis) % rank != rank - 1:
        return concat, "not a concat along the last axis of a value of rank <= 3"
    for key in ("first", "second"):
        found = _slice_rule({"root": a[key], "input": a["input"]}, settings)
        if found:
            return found
    return None


def _pixel_rows_problem(op, shape4, rows_shape):
    """Why ``rows_shape`` is not the (N*H*W, C) pixel-rows view of the NCHW ``shape4``, or None."""
    n, c, h, w = shape4
    if len(rows_shape) != 2 or tuple(rows_shape) != (n * h * w, c):
        return op, (f"{tuple(rows_shape)} is not the (N*H*W, C) = {(n * h * w, c)} pixel rows of {tuple(shape4)}: "
                    "only that view keeps the NHWC storage")
    return None


def _pixels_to_rows_rule(a, settings):
    reshape, permute, data = a["root"], a["permute"], a["input"]
    found = _tensors_problem(reshape, [data], settings)
    if found:
        return found
    if len(expr_shape(data)) != 4 or [int(x) for x in permute.attrs.axes] != [0, 2, 3, 1]:
        return reshape, "pixel rows are permute_dims [0, 2, 3, 1] of a 4-D value then a reshape to 2-D"
    return _pixel_rows_problem(reshape, expr_shape(data), expr_shape(reshape))


def _rows_to_pixels_rule(a, settings):
    permute, data = a["root"], a["input"]
    found = _tensors_problem(permute, [data], settings)
    if found:
        return found
    if len(expr_shape(permute)) != 4 or [int(x) for x in permute.attrs.axes] != [0, 3, 1, 2]:
        return permute, "an image from pixel rows is a reshape to (N, H, W, C) then permute_dims [0, 3, 1, 2]"
    return _pixel_rows_problem(permute, expr_shape(permute), expr_shape(data))


# ---- image.resize2d (ONNX Resize, torch interpolate) --------------------------------


def _resize_rule(a, settings):
    op = a["root"]
    found = _tensors_problem(op, [a["input"]], settings)
    if found:
        return found
    attrs = op.attrs
    if attrs.out_dtype is not None and str(attrs.out_dtype) not in ("", "void", str(op.args[0].ty.dtype)):
        return op, f"resize to dtype {attrs.out_dtype}: LPX resizes within one dtype"
    problem = resize_problem(len(expr_shape(a["input"])), str(attrs.layout), str(attrs.method),
                             str(attrs.coordinate_transformation_mode), str(attrs.rounding_method))
    return (op, problem) if problem else None


# ---- elementwise ops composed on the VXM (lowerings/activations.py, elementwise.py) ---

# Unary ops the VXM computes as a short chain of its ops.
_VXM_UNARY = (("abs", "relax.abs"), ("negative", "relax.negative"), ("exp", "relax.exp"),
              ("sqrt", "relax.sqrt"), ("rsqrt", "relax.rsqrt"), ("sign", "relax.sign"),
              ("leakyrelu", "relax.nn.leakyrelu"))

# Ops the VXM has no instruction or exact composition for: they stay on the CPU, and
# the offload report says why.
_NO_VXM_OP = {
    "log": "the VXM has no log (its transcendentals are exp, tanh, sigmoid, erf, GELU, rsqrt and recip)",
    "floor": "the VXM has no floor (its float -> int conversion rounds to nearest and saturates at 2^31)",
    "ceil": "the VXM has no ceil (its float -> int conversion rounds to nearest and saturates at 2^31)",
    "round": "the VXM has no round for the whole float range (its float -> int conversion saturates at 2^31)",
}


def _divide_rule(a, settings):
    op, lhs, rhs = a["root"], a["lhs"], a["rhs"]
    found = _tensors_problem(op, [lhs, rhs], settings) or _same_dtype_problem(op, lhs, rhs)
    if found:
        return found
    problem = divide_operands_problem(expr_shape(lhs), expr_shape(rhs), is_const(lhs), is_const(rhs),
                                      expr_shape(op))
    return (op, problem) if problem else _scalar_problem(op)


def _prelu_rule(a, settings):
    op = a["root"]
    data, slope = op.args
    found = _tensors_problem(op, [data], settings)
    if found:
        return found
    problem = prelu_slope_problem(expr_shape(data), expr_shape(slope), int(op.attrs.axis), is_const(slope))
    return (op, problem) if problem else _scalar_problem(op)


def _power_rule(a, settings):
    """lpx.Decompose has turned the exponents LPX raises to into other ops: what is left
    stays on the CPU."""
    op = a["root"]
    found = _tensors_problem(op, [op.args[0]], settings)
    if found:
        return found
    exponent = op.args[1]
    if not is_const(exponent):
        return op, "power with a runtime exponent: x^y is exp(y * log(x)) and the VXM has no log"
    if scalar_value(exponent) is None:
        return op, f"power with an exponent of shape {expr_shape(exponent)}: LPX raises to one constant exponent"
    return op, (f"power with exponent {scalar_value(exponent):g}: LPX raises to 0.5, -0.5 and the integers "
                f"1 <= |n| <= {MAX_INTEGER_POWER}; other exponents need exp(c * log(x)) and the VXM has no log")


def _no_vxm_op_rule(a, settings):
    op = a["root"]
    return _tensors_problem(op, [op.args[0]], settings) or (op, _NO_VXM_OP[op_name(op)])


# Patterns that only say why an op stays on the CPU: their checks refuse every match, and
# no lowering exists for them (tests/target/test_pattern_lowerings.py holds both).
REFUSE_ONLY = ("power", *_NO_VXM_OP, "conv2d_transpose")


def _vxm_elementwise_table() -> list:
    table = [(op, *_unary_pattern(relax_op), [_unary_rule]) for op, relax_op in _VXM_UNARY]
    table += [(op, *_binary_pattern(f"relax.{op}"), [_binary_rule]) for op in ("minimum", "maximum")]
    table.append(("divide", *_binary_pattern("relax.divide"), [_divide_rule]))
    table.append(("prelu", *_unary_pattern("relax.nn.prelu"), [_prelu_rule]))
    table.append(("power", *_unary_pattern("relax.power"), [_power_rule]))
    table += [(op, *_unary_pattern(f"relax.{op}"), [_no_vxm_op_rule]) for op in _NO_VXM_OP]
    return table


# Whole stored rows: the ViT patch flatten (an alias), concats and slices along an axis
# other than the one in lanes (rows placed or picked whole).


def _flatten_pixels_rule(a, settings):
    reshape, permute, data = a["reshape"], a["root"], a["input"]
    found = _tensors_problem(permute, [data], settings)
    if found:
        return found
    axes = [int(x) for x in permute.attrs.axes] if permute.attrs.axes is not None else None
    src, mid = expr_shape(data), expr_shape(reshape)
    if axes != [0, 2, 1] or mid is None or len(mid) != 3 or mid[:2] != src[:2] \
            or not flattens_pixels(src, expr_shape(permute)):
        return permute, "a pixel flatten is reshape (n, c, h, w) -> (n, c, h*w) then permute_dims [0, 2, 1]"
    return None


def _one_band_problem(op, settings, what):
    """Rows placed or picked read their operands whole: off chip they run as one band,
    so (as a transpose) the result may take at most a quarter of the SRAM."""
    nbytes = math.prod(expr_shape(op)) * settings.activation_bytes
    if 4 * nbytes > settings.config.sram_bytes:
        return op, f"a {what} of rows larger than a quarter of the SRAM (it does not run by bands)"
    return None


def _concat_rows_rule(a, settings):
    return _concat_rule(a, settings, rows=True)


def _slice_rows_rule(a, settings):
    return _slice_rule(a, settings, rows=True)


# ---- patterns -----------------------------------------------------------------------


def _epilogue(out, annotations, bias, activation):
    if bias:
        annotations["bias"] = bias_pat = wildcard()
        out = annotations["bias_add"] = is_op("relax.add")(out, bias_pat)
    if activation:
        out = annotations["activation"] = is_op(_ACTIVATIONS[activation])(
            out, varg_default_wildcard=True
        )
    return out, annotations


def _conv2d_pattern(bias=False, activation=None):
    data, weight = wildcard(), wildcard()
    conv = is_op("relax.nn.conv2d")(data, weight)
    return _epilogue(conv, {"input": data, "weight": weight, "root": conv}, bias, activation)


def _dense_pattern(bias=False, activation=None):
    data, weight = wildcard(), wildcard()
    matmul = is_op("relax.matmul")(data, weight)
    return _epilogue(matmul, {"input": data, "weight": weight, "root": matmul}, bias, activation)


def _binary_pattern(op):
    lhs, rhs = wildcard(), wildcard()
    root = is_op(op)(lhs, rhs)
    return root, {"lhs": lhs, "rhs": rhs, "root": root}


_unary_pattern = unary_pattern


def _act_quant_pattern(rounded=True):
    """``astype(clip(round(x * inv)))`` (int8), or without the round (fp8: the conversion rounds)."""
    data, inv = wildcard(), const_pattern()
    scale = is_op("relax.multiply")(data, inv)
    annotations = {"input": data, "scale": scale, "inv": inv}
    clipped = scale
    if rounded:
        clipped = annotations["round"] = is_op("relax.round")(scale)
    clip = is_op("relax.clip")(clipped, wildcard(), wildcard())
    root = is_op("relax.astype")(clip)
    return root, {**annotations, "clip": clip, "root": root}


def _qlinear_pattern(bias=False):
    data, weight, per_channel = wildcard(), const_pattern(), const_pattern()
    widen = is_op("relax.astype")(data)
    root = is_op("relax.matmul")(widen, weight)
    sums = root | is_op("relax.astype")(root)
    out = scale = is_op("relax.multiply")(sums, per_channel)
    annotations = {"input": data, "widen": widen, "weight": weight, "root": root, "scale": scale,
                   "per_channel": per_channel}
    if bias:
        b = const_pattern()
        out = is_op("relax.add")(scale, b)
        annotations.update(bias=b, bias_add=out)
    return out, annotations


def _argmax_pattern():
    data = wildcard()
    root = is_op("relax.argmax")(data)
    cast = is_op("relax.astype")(root)
    return cast, {"input": data, "root": root, "cast": cast}


def _take_pattern():
    table, indices = wildcard(), wildcard()
    root = is_op("relax.take")(table, indices)
    return root, {"input": table, "indices": indices, "root": root}


def _index_put_pattern():
    data, rows, cols, values = wildcard(), wildcard(), wildcard(), wildcard()
    root = is_op("relax.index_put")(data, is_tuple([rows, cols]), values)
    return root, {"input": data, "rows": rows, "cols": cols, "values": values, "root": root}


def _reshape_pattern():
    data, shape = wildcard(), wildcard()
    root = is_op("relax.reshape")(data, shape)
    return root, {"input": data, "shape": shape, "root": root}


def _split_heads_pattern():
    data, shape = wildcard(), wildcard()
    reshape = is_op("relax.reshape")(data, shape)
    root = is_op("relax.permute_dims")(reshape)
    return root, {"input": data, "reshape": reshape, "root": root}


def _merge_heads_pattern():
    data, shape = wildcard(), wildcard()
    permute = is_op("relax.permute_dims")(data)
    root = is_op("relax.reshape")(permute, shape)
    return root, {"input": data, "permute": permute, "root": root}


def _conv_bias_shapes(c):
    return [(1, c, 1, 1), (c, 1, 1)]


def _dense_bias_shapes(n):
    return [(n,), (1, n)]


# ---- pads and the zero-stuffing of transposed convolutions (lowerings/pad.py) -------


def _pad_rule(a, settings):
    op = a["root"]
    found = _tensors_problem(op, [a["input"]], settings)
    if found:
        return found
    problem = pad_problem(expr_shape(a["input"]), [int(w) for w in op.attrs.pad_width], str(op.attrs.pad_mode))
    return (op, problem) if problem else None


def _zero_stuff_pattern(cropped=False):
    data, shape6, shape4 = wildcard(), wildcard(), wildcard()
    split = is_op("relax.reshape")(data, shape6)
    spread = is_op("relax.nn.pad")(split)
    root = stuffed = is_op("relax.reshape")(spread, shape4)
    if cropped:
        root = is_op("relax.strided_slice")(stuffed, varg_default_wildcard=True)
    return root, {"input": data, "split": split, "pad": spread, "stuffed": stuffed, "root": root}


def _zero_stuff_rule(a, settings):
    """(N, C, H, W) -> (N, C, H, 1, W, 1) -> zeros after the unit axes -> (N, C, H*sh, W*sw):
    the zero-stuffing :mod:`.conv_transpose` writes."""
    root, spread = a["root"], a["pad"]
    found = _tensors_problem(root, [a["input"]], settings)
    if found:
        return found
    src, split = expr_shape(a["input"]), expr_shape(a["split"])
    widths = [int(w) for w in spread.attrs.pad_width]
    if (len(src) != 4 or split != (*src[:3], 1, src[3], 1) or str(spread.attrs.pad_mode) != "constant"
            or float(spread.attrs.pad_value) != 0.0 or any(widths[:7]) or any(widths[8:11])):
        return root, "reshape / pad / reshape that is not the zero-stuffing of an image"
    if not root.same_as(a["stuffed"]):  # a slice of the stuffed image's first rows and columns
        ints = [_int_tuple(t) for t in root.args[1:]]
        if any(t is None for t in ints) or sorted(ints[0]) != [2, 3] or any(ints[1]) or \
                (len(ints) > 3 and any(v != 1 for v in ints[3])):
            return root, "a slice of a zero-stuffed image other than its first rows and columns"
    return None


def _conv2d_transpose_rule(a, settings):
    """Why a transposed convolution is still one: lpx.ConvTransposeAsConv rewrote every
    one LPX runs into zero-stuffing and a conv2d."""
    op = a["root"]
    found = _tensors_problem(op, [a["input"]], settings)
    if found:
        return found
    if not is_const(op.args[1]):
        return op, ("weight is not a constant: LPX runs a transposed convolution as a convolution "
                    "with the kernel flipped at compile time")
    return op, ("layouts other than NCHW/IOHW, or pads beyond the kernel's reach (the equivalent "
                "convolution would crop)")


def _pad_patterns() -> list:
    return [("pad", *_unary_pattern("relax.nn.pad"), [_pad_rule]),
            ("zero_stuff", *_zero_stuff_pattern(), [_zero_stuff_rule]),
            ("zero_stuff_cropped", *_zero_stuff_pattern(cropped=True), [_zero_stuff_rule]),
            ("conv2d_transpose", *_unary_pattern("relax.nn.conv2d_transpose"), [_conv2d_transpose_rule])]


def pattern_table() -> list:
    """Every LPX pattern as ``(name, pattern, annotations, check)``, lowest priority first.

    Single ops come first and fused groups last, so that a fused group wins when its
    check accepts and the single-op patterns pick up the pieces when it does not.
    """
    table = []
    for op in ("add", "subtract", "multiply"):
        table.append((op, *_binary_pattern(f"relax.{op}"), [_binary_rule]))
    for op, relax_op in (
        ("relu", "relax.nn.relu"),
        ("sigmoid", "relax.sigmoid"),
        ("tanh", "relax.tanh"),
        ("clip", "relax.clip"),
        ("erf", "relax.erf"),
        ("gelu", "relax.nn.gelu"),
        ("gelu_tanh", "relax.nn.gelu_tanh"),
        ("silu", "relax.nn.silu"),
    ):
        table.append((op, *_unary_pattern(relax_op), [_unary_rule]))
    table += _vxm_elementwise_table()
    for op in ("max_pool2d", "avg_pool2d"):
        table.append((op, *_unary_pattern(f"relax.nn.{op}"), [_pool2d_rule]))
    table.append(("global_avg_pool2d", *_unary_pattern("relax.mean"), [_global_avg_pool2d_rule]))
    table.append(("reshape", *_reshape_pattern(), [_reshape_rule]))
    table.append(("concat", *_unary_pattern("relax.concat"), [_concat_rule]))
    table.append(("softmax", *_unary_pattern("relax.nn.softmax"), [_softmax_rule]))
    table.append(("argmax", *_argmax_pattern(), [_argmax_rule]))
    table.append(("take", *_take_pattern(), [_take_rule]))
    table.append(("index_put", *_index_put_pattern(), [_index_put_rule]))
    table.append(("astype", *_unary_pattern("relax.astype"), [_astype_rule]))
    table.append(("act_quant", *_act_quant_pattern(), [_act_quant_rule]))
    table.append(("fp8_quant", *_act_quant_pattern(rounded=False), [_act_quant_rule]))
    table.append(("all_reduce", *_unary_pattern("relax.ccl.allreduce"), [_all_reduce_rule]))
    table.append(("layer_norm", *_unary_pattern("relax.nn.layer_norm"), [_norm_rule]))
    table.append(("rms_norm", *_unary_pattern("relax.nn.rms_norm"), [_norm_rule]))
    table.append(("where", *_unary_pattern("relax.where"), [_where_rule]))
    table.append(("permute_dims", *_unary_pattern("relax.permute_dims"), [_permute_dims_rule]))
    table.append(("slice", *_unary_pattern("relax.strided_slice"), [_slice_rule]))
    table.append(("split_heads", *_split_heads_pattern(), [_split_heads_rule]))
    table.append(("merge_heads", *_merge_heads_pattern(), [_merge_heads_rule]))
    # NCHW values and their pixel rows: the same op chains as a head merge / split.
    table.append(("pixels_to_rows", *_merge_heads_pattern(), [_pixels_to_rows_rule]))
    table.append(("rows_to_pixels", *_split_heads_pattern(), [_rows_to_pixels_rule]))
    table.append(("resize2d", *_unary_pattern("relax.image.resize2d"), [_resize_rule]))
    table += _pad_patterns()
    # After the forms they share a pattern with, so those give the last refusal.
    table.append(("flatten_pixels", *_split_heads_pattern(), [_flatten_pixels_rule]))
    table.append(("concat_rows", *_unary_pattern("relax.concat"), [_concat_rows_rule]))
    table.append(("slice_rows", *_unary_pattern("relax.strided_slice"), [_slice_rows_rule]))
    table.append(("permute_lanes", *_permute_lanes_pattern(), [_permute_lanes_rule]))

    families = (
        ("conv2d", _conv2d_pattern, _conv2d_rule, _bias_rule(_conv_bias_shapes)),
        ("dense", _dense_pattern, _dense_rule, _bias_rule(_dense_bias_shapes)),
    )
    # Ascending priority: plain, +bias, +activation, +bias+activation.
    variants = [
        (False, None),
        (True, None),
        (False, "relu"),
        (False, "clip"),
        (True, "relu"),
        (True, "clip"),
    ]
    for bias, activation in variants:
        for family, make, main_rule, bias_rule in families:
            name = family + ("_bias" if bias else "") + (f"_{activation}" if activation else "")
            rules = [main_rule]
            rules += [bias_rule] if bias else []
            rules += [_activation_rule] if activation else []
            table.append((name, *make(bias, activation), rules))

    # 8-bit (int8 or fp8) dense layers of a float build, above the float dense ones.
    table.append(("qlinear", *_qlinear_pattern(), [_qlinear_rule]))
    table.append(("qlinear_bias", *_qlinear_pattern(bias=True), [_qlinear_rule]))
    # The patterns the op families declare beside their lowerings, after these (the
    # collector's own are priority 0), ordered by priority: the shared tensor checks
    # first, then the family's own.
    order = sorted(enumerate(declared_patterns()), key=lambda ip: (ip[1].priority, ip[0]))
    table += [(p.name, *p.make(), [_family_tensors_rule(p.tensors)] + ([p.check] if p.check else []))
              for _, p in order]
    return [
        (PATTERN_PREFIX + name, pattern, annotations, make_check(PATTERN_PREFIX + name, rules))
        for name, pattern, annotations, rules in table
    ] + int8_pattern_table()


def _family_tensors_rule(tensors: tuple):
    """The shared checks of a family's pattern: the tensors' types the build stores, and
    no 0-d result."""

    def rule(a, settings):
        op = a["root"]
        return _tensors_problem(op, [a[t] for t in tensors], settings) or _scalar_problem(op)

    return rule


register_patterns(pattern_table())

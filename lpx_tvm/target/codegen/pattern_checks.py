"""The refusals op families' pattern checks share: tensor types the build stores, 0-d
results, operands of one dtype, clip bounds, per-row reductions over the last axis,
rows moved whole, the fp8 rate, and the bias and activation of a fused MXM op.

A check is ``check(annotated, settings) -> None | (expr to blame, one-line reason)``;
``annotated`` maps a pattern's annotation names to the matched expressions and
``settings`` is the machine and precision judged against (``.config``, ``.precision``,
``.activation_bytes``). The partitioner's collector (:mod:`lpx_tvm.relax_passes.patterns`)
runs :func:`tensors_problem` on a pattern's declared tensors once, before the family's
own checks, and :func:`scalar_problem` after them.
"""

from __future__ import annotations

import math

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...precision import Precision
from .relax_exprs import clip_bounds, expr_shape, is_const, op_name, static_shape
from .rules import activation_row_problem

# Tensor dtypes a graph may carry into LPX; the MXM multiplies them at the build's precision.
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")


def type_problem(ty, settings, activation=True, integers=False) -> str | None:
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


def tensors_problem(op, operands, settings, integers=False):
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
            problem = type_problem(ty, settings, activation, integers)
            if problem:
                return op, problem
    return None


def scalar_problem(op):
    """An elementwise op of single numbers (a Range's bounds, a size computed at run
    time): nothing for the lanes to share, and a region's inputs and outputs are tensors
    of at least one dimension."""
    return None if expr_shape(op) else (op, f"{op_name(op)} of 0-d values (0-d values stay on the CPU)")


def same_dtype_problem(op, lhs, rhs, what=("operand", "operand")):
    if lhs.ty.dtype != rhs.ty.dtype:
        return op, f"{what[0]} dtype {lhs.ty.dtype} and {what[1]} dtype {rhs.ty.dtype} differ"
    return None


def clip_problem(call):
    bounds = clip_bounds(call)
    if bounds is None:
        return call, "clip bounds are not compile-time scalars"
    if bounds[0] > bounds[1]:
        return call, f"clip min {bounds[0]} is above max {bounds[1]}"
    return None


def last_axis_rows_problem(op, shape, settings, what):
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


def one_band_problem(op, settings, what):
    """Rows placed or picked read their operands whole: off chip they run as one band,
    so (as a transpose) the result may take at most a quarter of the SRAM."""
    nbytes = math.prod(expr_shape(op)) * settings.activation_bytes
    if 4 * nbytes > settings.config.sram_bytes:
        return op, f"a {what} of rows larger than a quarter of the SRAM (it does not run by bands)"
    return None


def fp8_problem(op, settings):
    """Why fp8 cannot run on the build's machine (its MXM has no fp8 rate), or None."""
    if "fp8" not in settings.config.mxm_cycles_per_vector:
        return op, f"fp8 e4m3: the MXM of {settings.config.name} does not multiply fp8 (lp30 does)"
    return None


# ---- the epilogue of a fused MXM op (conv2d, dense, qlinear) ---------------------------

ACTIVATIONS = {"relu": "relax.nn.relu", "clip": "relax.clip"}
# Ascending priority: plain, +bias, +activation, +bias+activation.
EPILOGUE_VARIANTS = ((False, None), (True, None), (False, "relu"), (False, "clip"), (True, "relu"),
                     (True, "clip"))


def epilogue_name(family: str, bias: bool, activation: str | None) -> str:
    return family + ("_bias" if bias else "") + (f"_{activation}" if activation else "")


def epilogue_pattern(out, annotations, bias, activation):
    """``out`` followed by a bias add (annotations ``bias``, ``bias_add``) and an
    activation (``activation``), as asked."""
    if bias:
        annotations["bias"] = bias_pat = wildcard()
        out = annotations["bias_add"] = is_op("relax.add")(out, bias_pat)
    if activation:
        out = annotations["activation"] = is_op(ACTIVATIONS[activation])(out, varg_default_wildcard=True)
    return out, annotations


def bias_check(channel_shapes):
    """The check of a fused bias: a constant of one value per output channel;
    ``channel_shapes(n)`` lists the accepted shapes for n channels."""

    def check(a, settings):
        add, bias = a["bias_add"], a["bias"]
        channels = expr_shape(a["root"])[1 if a["root"].op.name == "relax.nn.conv2d" else -1]
        if not is_const(bias):
            return add, "bias is not a constant"
        found = tensors_problem(add, [bias], settings)
        if found:
            return found
        accepted = channel_shapes(channels)
        if expr_shape(bias) not in accepted:
            return add, (
                f"bias of shape {expr_shape(bias)} is not one value per output channel "
                f"({' or '.join(str(s) for s in accepted)})"
            )
        return None

    return check


def activation_check(a, settings):
    """The check of a fused activation (relu, or a clip by compile-time bounds)."""
    act = a.get("activation")
    if act is None:
        return None
    found = tensors_problem(act, [], settings)
    if found:
        return found
    if act.op.name == "relax.clip":
        return clip_problem(act)
    return None


def epilogue_checks(bias: bool, activation: str | None, channel_shapes) -> tuple:
    return ((bias_check(channel_shapes),) if bias else ()) + ((activation_check,) if activation else ())


def binary_pattern(op: str) -> tuple:
    """(pattern, annotations) of one call of Relax op ``op`` on tensors ``lhs`` and ``rhs``."""
    lhs, rhs = wildcard(), wildcard()
    root = is_op(op)(lhs, rhs)
    return root, {"lhs": lhs, "rhs": rhs, "root": root}


def reshape_permute_pattern() -> tuple:
    """``permute_dims(reshape(x))`` (annotations ``input``, ``reshape``, ``root``): a head
    split, an image from pixel rows, a pixel flatten."""
    data, shape = wildcard(), wildcard()
    reshape = is_op("relax.reshape")(data, shape)
    root = is_op("relax.permute_dims")(reshape)
    return root, {"input": data, "reshape": reshape, "root": root}


def permute_reshape_pattern() -> tuple:
    """``reshape(permute_dims(x))`` (annotations ``input``, ``permute``, ``root``): a head
    merge, pixel rows of an image."""
    data, shape = wildcard(), wildcard()
    permute = is_op("relax.permute_dims")(data)
    root = is_op("relax.reshape")(permute, shape)
    return root, {"input": data, "permute": permute, "root": root}

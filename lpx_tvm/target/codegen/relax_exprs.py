"""Facts about Relax expressions that the pattern checks read: op names, constants,
static shapes, compile-time scalars. Pure functions of an expression; no check here."""

from __future__ import annotations

import tvm
from tvm import relax


def op_name(call) -> str:
    """A call's Relax op name without ``relax.``."""
    return call.op.name.removeprefix("relax.")


def is_const(expr) -> bool:
    """Whether ``expr`` is a tensor constant."""
    return isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.ty, relax.TensorType)


def static_shape(ty) -> tuple | None:
    """Static shape of a TensorType as ints, or None if the rank or a dim is unknown."""
    if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    values = ty.shape.values
    if not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return tuple(int(v) for v in values)


def expr_shape(expr) -> tuple | None:
    """Static shape of a tensor expression, or None."""
    return static_shape(expr.ty) if isinstance(expr.ty, relax.TensorType) else None


def scalar_value(value) -> float | None:
    """A compile-time scalar (a clip bound, a fill) as a float, or None."""
    if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return float(value.value)
    if is_const(value) and value.value.numpy().size == 1:
        return float(value.value.numpy().reshape(()))
    return None


def clip_bounds(call) -> tuple | None:
    """(min, max) of a ``relax.clip`` call, or None when they are not constants."""
    lo, hi = scalar_value(call.args[1]), scalar_value(call.args[2])
    return None if lo is None or hi is None else (lo, hi)


def int_tuple(expr) -> list | None:
    """The ints of a tuple of compile-time integers (strided_slice's axes, begin, end, strides)."""
    fields = expr.fields if isinstance(expr, relax.Tuple) else expr.values if isinstance(expr, relax.ShapeExpr) \
        else None
    if fields is None:
        return None
    values = list(fields)
    if not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return [int(v.value) for v in values]

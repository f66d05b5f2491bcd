"""What the ``lpx.`` check functions share: facts about Relax expressions, and the check
builder that applies a pattern's rules and records the first refusal.

The float patterns (:mod:`.patterns`) and the int8 ones (:mod:`.int8_patterns`) both
import this module; it imports neither.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.backend.utils import has_leaking_intermediate_variables

from .check_context import Rejection, current_settings

PATTERN_PREFIX = "lpx."


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


def make_check(name, rules):
    """A check function that applies ``rules`` in order and records the first refusal.

    Each rule is ``rule(annotated, settings) -> None | (op to blame, reason)``."""

    def check(context) -> bool:
        if has_leaking_intermediate_variables(context):
            # An inner result is used outside the group; a smaller pattern will take it.
            return False
        settings = current_settings()
        annotated = {key: context.annotated_expr[key] for key in context.annotated_expr}
        for rule in rules:
            found = rule(annotated, settings)
            if found is not None:
                op, reason = found
                key = context.value_to_bound_var.get(op, op)
                settings.log.record(key, Rejection(name, op_name(op), reason))
                return False
        return True

    check.__name__ = f"check_{name.removeprefix(PATTERN_PREFIX)}"
    return check

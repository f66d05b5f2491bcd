"""lpx.MaskingAdd: a constant mask that fills with an infinity becomes an add.

Attention masks reach Relax as ``where(mask, scores, -inf)`` (or with the branches
swapped) where ``mask`` is a compile-time constant (a causal mask, padding of a fixed
length). Adding the constant ``where(mask, 0, -inf)`` to the scores gives the same
result for every finite score (``x + 0 = x``, ``x - inf = -inf``), and an add of a
constant runs on LPX, where a select with a boolean tensor does not. Only infinite
fills are rewritten: a finite fill (say -1e9) added to a score would round to a value
other than the fill.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._binding_rewrite import bindings, is_const, is_float, op_is, rewrite_bindings, static_shape

__all__ = ["MaskingAdd"]


def _infinite_scalar(expr):
    """The value of a constant scalar that is +inf or -inf, else None."""
    if not is_const(expr):
        return None
    v = expr.value.numpy()
    if v.size != 1 or not np.isinf(v.reshape(-1)[0]):
        return None
    return float(v.reshape(-1)[0])


def _plan(func):
    rebuild = {}
    for var, value in bindings(func):
        if not op_is(value, "relax.where"):
            continue
        cond, a, b = value.args
        shape = static_shape(value)
        if not is_const(cond) or shape is None or not is_float(value.ty.dtype):
            continue
        mask = np.broadcast_to(cond.value.numpy().astype(bool), shape)
        for tensor, fill, keep in ((a, _infinite_scalar(b), mask), (b, _infinite_scalar(a), ~mask)):
            if fill is None or is_const(tensor) or static_shape(tensor) != shape:
                continue
            addend = np.where(keep, 0.0, fill).astype(str(value.ty.dtype))
            rebuild[var] = lambda visit, builder, t=tensor, c=addend: relax.op.add(visit(t), relax.const(c))
            break
    return rebuild


@relax.transform.function_pass(opt_level=0, name="lpx.MaskingAdd")
class MaskingAdd:
    """Replace ``where(const_mask, x, ±inf)`` (either branch order) with ``x + const``."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        return rewrite_bindings(func, mod, set(), _plan(func))

"""lpx.CollapseAffine: a run of elementwise affine ops with constants becomes x * s + t.

A batch norm that does not follow a conv (DenseNet's pre-activation BN, for one)
decomposes into subtract, divide, multiply and add with constants. Nothing absorbs it,
so it collapses into one multiply and one add, and the divide (which LPX has no pattern
for) goes away. Runs after :mod:`fold_scale_shift`, which takes the chains that follow
a conv or dense layer.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._binding_rewrite import (
    bindings,
    block_index,
    is_const,
    op_is,
    rewrite_bindings,
    static_shape,
    use_counts,
    visible_at,
)
from .fold_scale_shift import AFFINE_OPS, affine_step, users_of

__all__ = ["CollapseAffine"]


def _no_growth(data_shape):
    """coerce for affine_step: accept a constant that does not enlarge the data."""

    def coerce(const):
        arr = const.value.numpy()
        try:
            if np.broadcast_shapes(arr.shape, data_shape) != data_shape:
                return None
        except ValueError:
            return None
        return arr.astype(np.float64)

    return coerce


def _chain_from(var, value, uses, users, value_of):
    """The longest affine chain starting at binding ``var``: (source, vars, scale, shift)."""
    lhs, rhs = value.args
    source = rhs if is_const(lhs) else lhs
    data_shape = static_shape(source) if isinstance(source.ty, relax.TensorType) else None
    if data_shape is None:
        return None
    coerce = _no_growth(data_shape)
    step = affine_step(value, source, np.ones(()), np.zeros(()), coerce)
    if step is None:
        return None
    scale, shift = step
    chain, cur = [var], var
    while uses[cur] == 1 and len(users.get(cur, [])) == 1:
        nxt = users[cur][0]
        step = affine_step(value_of[nxt], cur, scale, shift, coerce)
        if step is None:
            break
        scale, shift = step
        chain.append(nxt)
        cur = nxt
    return source, chain, scale, shift


def _plan(func):
    uses, blocks = use_counts(func), block_index(func)
    ordered = bindings(func)
    value_of = dict(ordered)
    users = users_of(ordered)
    claimed, drop, rebuild = set(), set(), {}
    for var, value in ordered:
        if var in claimed or not op_is(value, *AFFINE_OPS):
            continue
        found = _chain_from(var, value, uses, users, value_of)
        if found is None:
            continue
        source, chain, scale, shift = found
        claimed.update(chain)
        has_divide = any(value_of[v].op.name == "relax.divide" for v in chain)
        # Two ops or fewer are already x * s + t (or less), unless one divides.
        if (len(chain) <= 2 and not has_divide) or not visible_at(blocks, source, chain[-1]):
            continue
        drop.update(chain[:-1])
        rebuild[chain[-1]] = _collapsed(source, scale, shift, value.ty.dtype)
    return drop, rebuild


def _collapsed(source, scale, shift, dtype):
    def make(visit, builder):
        out = visit(source)
        if np.any(scale != 1.0):
            out = relax.op.multiply(out, relax.const(scale, dtype))
        if np.any(shift != 0.0):
            if isinstance(out, relax.Call):
                out = builder.emit(out)
            out = relax.op.add(out, relax.const(shift, dtype))
        return out

    return make


@relax.transform.function_pass(opt_level=0, name="lpx.CollapseAffine")
class CollapseAffine:
    """Collapse elementwise affine chains with constant operands into one multiply and
    one add, when the chain is longer than two ops or divides. Constants must not
    enlarge the data; intermediate results must have no other use."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        drop, rebuild = _plan(func)
        return rewrite_bindings(func, mod, drop, rebuild)

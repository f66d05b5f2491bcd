"""lpx.Decompose: ops spelled as other ops that LPX runs.

- ``split(x, ...)`` whose pieces are read only through ``TupleGetItem`` becomes one
  ``strided_slice`` per piece (a fused QKV projection split into Q, K and V): each
  piece is a lane move on LPX, and a slice nothing reads is dropped.
- consecutive ``permute_dims`` whose inner results nothing else reads compose into
  one (dropped when the composition is the identity): torch writes attention's head
  merge as three permutes, two of which cancel.
- ``power(x, c)`` with a constant c of 2 or 3 (the cube in the tanh form of GELU)
  becomes ``x * x`` or ``x * x * x``, elementwise multiplies (two roundings instead of
  one; within the float tolerance of the rest of the graph).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._binding_rewrite import bindings, is_const, is_float, op_is, rewrite_bindings, static_shape

__all__ = ["Decompose"]


def _split_bounds(call, shape) -> list | None:
    """[(begin, end)] of each piece of a ``relax.split`` along its axis, or None."""
    axis = int(call.attrs.axis) % len(shape)
    n = shape[axis]
    ios = call.attrs.indices_or_sections
    if isinstance(ios, (int, np.integer)) or hasattr(ios, "value"):
        k = int(getattr(ios, "value", ios))
        if k <= 0 or n % k:
            return None
        cuts = [n // k * i for i in range(1, k)]
    else:
        cuts = [int(getattr(i, "value", i)) for i in ios]
    edges = [0] + cuts + [n]
    return [(a, b) for a, b in zip(edges, edges[1:])]


def _integer_power(call):
    """2 or 3 when ``call`` is ``power(x, c)`` with c a constant scalar 2 or 3, else None."""
    c = call.args[1]
    if not is_const(c) or c.value.numpy().size != 1:
        return None
    k = float(c.value.numpy().reshape(()))
    return int(k) if k in (2.0, 3.0) else None


def _power(x, k, builder):
    if k == 2:
        return relax.op.multiply(x, x)
    return relax.op.multiply(builder.emit(relax.op.multiply(x, x)), x)


def _permutes(values, uses, drop, rebuild):
    """Chains of permute_dims whose inner results nothing else reads become one permute
    (torch's attention writes the head merge as three), or none when they compose to
    the identity."""
    chain = {}  # var -> (source, axes) of the composed permute it is bound to
    for var, value in values.items():
        if not op_is(value, "relax.permute_dims") or static_shape(value) is None:
            continue
        rank = len(static_shape(value))
        axes = [int(a) for a in value.attrs.axes] if value.attrs.axes is not None else list(range(rank))[::-1]
        src = value.args[0]
        if src in chain and uses.get(src, 0) == 1:
            inner_src, inner_axes = chain[src]
            src, axes = inner_src, [inner_axes[a] for a in axes]
            drop.add(value.args[0])
            rebuild.pop(value.args[0], None)
        chain[var] = (src, axes)
        if src is not value.args[0] or axes == list(range(rank)):
            identity = axes == list(range(rank))
            rebuild[var] = lambda visit, builder, x=src, a=axes, same=identity: \
                visit(x) if same else relax.op.permute_dims(visit(x), a)


def _plan(func):
    drop, rebuild = set(), {}
    values = dict(bindings(func))
    items = {}
    for var, value in values.items():
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            items.setdefault(value.tuple_value, []).append((var, int(value.index)))
    uses = {}
    relax.analysis.post_order_visit(
        func.body, lambda e: uses.__setitem__(e, uses.get(e, 0) + 1) if isinstance(e, relax.Var) else None)
    for var, value in values.items():
        if op_is(value, "relax.split"):
            shape = static_shape(value.args[0])
            bounds = None if shape is None else _split_bounds(value, shape)
            readers = items.get(var, [])
            if bounds is None or uses.get(var, 0) != len(readers):
                continue  # the tuple itself is read: keep the split
            axis = int(value.attrs.axis) % len(shape)
            for item, index in readers:
                begin, end = bounds[index]
                rebuild[item] = lambda visit, builder, x=value.args[0], a=axis, b=begin, e=end: \
                    relax.op.strided_slice(visit(x), axes=[a], begin=[b], end=[e])
            drop.add(var)
        elif op_is(value, "relax.power") and is_float(value.ty.dtype) and _integer_power(value) \
                and static_shape(value.args[0]) == static_shape(value):
            rebuild[var] = lambda visit, builder, x=value.args[0], k=_integer_power(value): \
                _power(visit(x), k, builder)
    _permutes(values, uses, drop, rebuild)
    return drop, rebuild


@relax.transform.function_pass(opt_level=0, name="lpx.Decompose")
class Decompose:
    """Rewrite split into strided slices, permute chains into one, small integer powers into multiplies."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        drop, rebuild = _plan(func)
        return rewrite_bindings(func, mod, drop, rebuild)

"""lpx.UnstackReduce: ``sum / max / min(stack(xs), axis=0)`` becomes pairwise ops.

The ONNX importer spells the variadic Sum, Max and Min as broadcast every input,
stack them on a new axis and reduce that axis. A residual add in ResNet is a Sum of
two tensors, so this turns it back into one elementwise ``add`` that LPX runs in
place, without the stacked copy.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._binding_rewrite import (
    bindings,
    block_index,
    op_is,
    rewrite_bindings,
    static_shape,
    use_counts,
    visible_at,
)

__all__ = ["UnstackReduce"]

_PAIRWISE = {
    "relax.sum": relax.op.add,
    "relax.max": relax.op.maximum,
    "relax.min": relax.op.minimum,
}


def _single_use_binding(expr, value_of, uses):
    """The value bound to ``expr`` if it is a Var used exactly once, else None."""
    if isinstance(expr, relax.Var) and uses[expr] == 1:
        return value_of.get(expr)
    return None


def _plan(func):
    value_of = dict(bindings(func))
    uses, blocks = use_counts(func), block_index(func)
    drop, rebuild = set(), {}
    for var, value in value_of.items():
        if not op_is(value, *_PAIRWISE) or value.attrs.keepdims:
            continue
        if value.attrs.axis is None or [int(a) for a in value.attrs.axis] != [0]:
            continue
        stacked = value.args[0]
        stack = _single_use_binding(stacked, value_of, uses)
        if not op_is(stack, "relax.stack") or int(stack.attrs.axis) != 0:
            continue
        items = stack.args[0]
        tuple_var = None
        if isinstance(items, relax.Var):
            tuple_var, items = items, _single_use_binding(items, value_of, uses)
        if not isinstance(items, relax.Tuple) or len(items.fields) < 2:
            continue

        # Drop the broadcasts: the pairwise ops broadcast by themselves.
        operands, broadcasts = [], []
        for field in items.fields:
            bcast = _single_use_binding(field, value_of, uses)
            if op_is(bcast, "relax.broadcast_to"):
                operands.append(bcast.args[0])
                broadcasts.append(field)
            else:
                operands.append(field)
        shapes = [static_shape(x) for x in operands]
        target = static_shape(var)
        if None in shapes or target is None or np.broadcast_shapes(*shapes) != target:
            operands, broadcasts = list(items.fields), []
        if not all(visible_at(blocks, x, var) for x in operands):
            continue

        drop.update([stacked, *broadcasts] + ([tuple_var] if tuple_var is not None else []))
        rebuild[var] = _pairwise(_PAIRWISE[value.op.name], operands)
    return drop, rebuild


def _pairwise(binary, operands):
    def make(visit, builder):
        acc = visit(operands[0])
        for operand in operands[1:-1]:
            acc = builder.emit(binary(acc, visit(operand)))
        return binary(acc, visit(operands[-1]))

    return make


@relax.transform.function_pass(opt_level=0, name="lpx.UnstackReduce")
class UnstackReduce:
    """Rewrite a reduction over a freshly stacked axis 0 into pairwise binary ops."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        drop, rebuild = _plan(func)
        return rewrite_bindings(func, mod, drop, rebuild)

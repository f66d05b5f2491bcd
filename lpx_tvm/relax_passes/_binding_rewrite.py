"""Shared pieces of the graph passes: binding walks, use counts, and a binding rewriter.

A pass plans on the old function (which bindings to drop, which to rebuild) and then
lets :func:`rewrite_bindings` apply the plan in one walk.
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax

from ..layer_names import with_span
from ..target.codegen.relax_exprs import expr_shape as static_shape  # noqa: F401  (a tensor expression's static shape)
from ..target.codegen.relax_exprs import is_const  # noqa: F401  (the passes import both from here)


def is_float(dtype) -> bool:
    return str(dtype).startswith(("float", "bfloat"))


def bindings(func):
    """The top-level (var, value) bindings of a function, in program order."""
    return [
        (b.var, b.value)
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b, relax.VarBinding)
    ]


def use_counts(func) -> Counter:
    """How many times each Var is used (definitions do not count)."""
    counts = Counter()
    relax.analysis.post_order_visit(
        func.body, lambda e: counts.update([e]) if isinstance(e, relax.Var) else None
    )
    return counts


def op_is(expr, *names) -> bool:
    return (
        isinstance(expr, relax.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and expr.op.name in names
    )


@relax.expr_functor.mutator
class _BindingRewriter(relax.PyExprMutator):
    """Drops some bindings and gives others a new value built by a callback.

    ``rebuild[var](visit, builder)`` returns the new value for ``var``: ``visit`` maps
    an expression of the old function into the new one, and ``builder`` can emit
    helper bindings just before it. The variable itself is kept, so later uses need no
    remapping; the new value must have the same type.
    """

    def __init__(self, mod, drop, rebuild):
        super().__init__(mod)
        self.drop = drop
        self.rebuild = rebuild

    def visit_var_binding_(self, binding):
        if binding.var in self.drop:
            return
        make = self.rebuild.get(binding.var)
        if make is None:
            super().visit_var_binding_(binding)
            return
        value = self.builder_.normalize(make(self.visit_expr, self.builder_))
        if isinstance(value, relax.Call) and value.span is None and getattr(binding.value, "span", None) is not None:
            # The new op stands for the old one: it keeps its source name (lpx_tvm/layer_names.py).
            value = self.builder_.normalize(with_span(value, binding.value.span))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))


def rewrite_bindings(func, mod, drop, rebuild):
    """Apply a plan: skip the bindings of ``drop`` and rebuild those in ``rebuild``."""
    if not drop and not rebuild:
        return func
    return _BindingRewriter(mod, drop, rebuild).visit_expr(func)



def block_index(func) -> dict:
    """The index of the binding block that binds each Var."""
    return {
        b.var: i for i, block in enumerate(func.body.blocks) for b in block.bindings
    }


def visible_at(blocks, expr, var) -> bool:
    """Whether ``expr`` can be used in the binding of ``var``: a DataflowVar only
    within its own block."""
    return not isinstance(expr, relax.DataflowVar) or blocks.get(expr) == blocks.get(var)

"""Stable layer names, carried from the source model to the report.

Relax keeps no node names: the ONNX and torch importers name every value ``lv<N>``, and
a partitioned region names them ``lv`` again. The report must name layers as the user
knows them, so the front end records them at import time, without changing any value's
name (instruction tags, and so program hashes, stay as they are):

1. :func:`owners` says which source node made each binding of ``main``: walking back from
   each node's result (in the node order of the source graph) through the bindings it
   uses, up to the results of other nodes; the bindings found are that node's.
2. :func:`attach` writes the name into the span of each such binding's call
   (``Span(SourceName(name), 0, 0, 0, 0)``). Graph passes copy a call's span when they
   keep the call, and the patterns copy the calls into the composite functions.
3. :func:`region_layer_names` reads them back from a partitioned region: the layer tag
   the code generator gives each composite call (its binding's name hint, made unique
   in the region as codegen makes it) -> the first name among the composite's calls.

A call a pass builds anew (a convolution whose weights absorbed a BatchNorm) has no
span; its composite takes the name of another of its calls (the ReLU that follows), and
a composite with none keeps its tag (docs/report.md).
"""

from __future__ import annotations

import tvm
from tvm import relax


def owners(func: relax.Function, results: list) -> dict:
    """{binding var: source name} of ``func``'s bindings.

    ``results``: ``[(name, expr)]`` in source order, ``expr`` the value a source node
    produced (a bound Var, or the Call a binding holds); entries that are no binding of
    ``func`` (constants, inputs) are skipped.
    """
    value_of, var_of = {}, {}
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b, relax.VarBinding):
                value_of[b.var] = b.value
                var_of[b.value] = b.var
    heads = []
    for name, expr in results:
        var = expr if isinstance(expr, relax.Var) else var_of.get(expr)
        if var is not None and var in value_of:
            heads.append((name, var))
    boundary = {var for _, var in heads}
    out = {}
    for name, head in heads:
        stack = [head]
        while stack:
            var = stack.pop()
            if var in out:
                continue
            out[var] = name
            for used in relax.analysis.free_vars(value_of[var]):
                if used in value_of and used not in boundary and used not in out:
                    stack.append(used)
    return out


@relax.expr_functor.mutator
class _Attach(relax.PyExprMutator):
    def __init__(self, names: dict):
        super().__init__()
        self.names = names

    def visit_var_binding_(self, binding):
        name = self.names.get(binding.var)
        value = binding.value
        if name is None or not isinstance(value, relax.Call) or value.span is not None:
            return super().visit_var_binding_(binding)
        value = self.visit_expr(value)
        named = relax.Call(value.op, value.args, value.attrs, value.ty_args, tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0))
        # The same Var: later uses need no remapping, and its name hint (the tag) stays.
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(named)))


def attach(mod: tvm.IRModule, results: list) -> tvm.IRModule:
    """``mod`` with the source names of ``results`` (see :func:`owners`) in the spans of
    ``main``'s calls."""
    names = owners(mod["main"], results)
    if not names:
        return mod
    out = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    main = _Attach(names).visit_expr(mod["main"])
    out["main"] = main
    return out


def span_name(expr) -> "str | None":
    span = getattr(expr, "span", None)
    return None if span is None else str(span.source_name.name) or None


def region_layer_names(func: relax.Function) -> dict:
    """{layer tag: source name} of a partitioned region (``Codegen="lpx"`` function).

    The tags are the region's composite-call binding names made unique in the order
    codegen reads them (parameters first, then the bindings: ``lv``, ``lv_1``, ...).
    """
    count = {}

    def unique(hint: str) -> str:
        k = count.get(hint, 0)
        count[hint] = k + 1
        return hint if k == 0 else f"{hint}_{k}"

    for p in func.params:
        unique(p.name)
    local, out = {}, {}
    for block in func.body.blocks:
        for b in block.bindings:
            value = b.value
            if isinstance(value, relax.Function):
                local[b.var] = value
            elif isinstance(value, relax.Call) and isinstance(value.op, relax.Var) and value.op in local:
                tag = unique(b.var.name)
                names = [span_name(inner.value) for blk in local[value.op].body.blocks for inner in blk.bindings]
                name = next((n for n in names if n), None)
                if name is not None:
                    out[tag] = name
    return out

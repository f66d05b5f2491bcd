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
3. Fusion keeps one function for structurally equal composites (and with it the first
   one's spans): :func:`unshare_composites` gives each call of a shared one a copy of
   its own, named from the call's source name (:func:`call_names`, read before fusion).
4. :func:`region_layer_names` reads them back from a partitioned region: the layer tag
   the code generator gives each composite call (its binding's name hint, made unique
   in the region as codegen makes it) -> the first name among the composite's calls.
   Several composites may carry one name (a layer made of several ops): the report
   adds them up.

A call a pass builds anew (a convolution whose weights absorbed a BatchNorm) has no
span; its composite takes the name of another of its calls (the ReLU that follows), and
a composite with none keeps its tag (docs/report.md).
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax
from tvm_ffi import structural_hash


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


def name_span(name: str) -> tvm.ir.Span:
    """The span that carries a source name."""
    return tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0)


def with_span(call: relax.Call, span) -> relax.Call:
    """``call`` as it is, with ``span``."""
    return relax.Call(call.op, call.args, call.attrs, call.ty_args, span)


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
        named = with_span(value, name_span(name))
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
    bindings = [b for block in func.body.blocks for b in block.bindings]
    calls = Counter(b.value.op for b in bindings if isinstance(b.value, relax.Call) and isinstance(b.value.op, relax.Var))
    for b in bindings:
        value = b.value
        if isinstance(value, relax.Function):
            local[b.var] = value
        elif isinstance(value, relax.Call) and isinstance(value.op, relax.Var) and value.op in local:
            tag = unique(b.var.name)
            if calls[value.op] > 1:  # one definition for several layers: its name is the first's
                continue
            names = [span_name(inner.value) for blk in local[value.op].body.blocks for inner in blk.bindings]
            name = next((n for n in names if n), None)
            if name is not None:
                out[tag] = name
    return out


def _key(expr, var_id):
    """What identifies a binding's value across fusion: its op, attributes and operands,
    the operands' variables by ``var_id`` (None: not known, and so neither is the key)."""
    if isinstance(expr, relax.Var):
        v = var_id(expr)
        return None if v is None else ("v", v)
    if isinstance(expr, relax.Call):
        args = tuple(_key(a, var_id) for a in expr.args)
        if any(a is None for a in args):
            return None
        attrs = structural_hash(expr.attrs) if expr.attrs is not None else 0
        return ("c", structural_hash(expr.op), args, attrs)
    if isinstance(expr, relax.Tuple):
        fields = tuple(_key(f, var_id) for f in expr.fields)
        return None if any(f is None for f in fields) else ("t", fields)
    if isinstance(expr, relax.TupleGetItem):
        inner = _key(expr.tuple_value, var_id)
        return None if inner is None else ("g", inner, int(expr.index))
    if isinstance(expr, tvm.ir.GenericConst):  # a weight: known by its type (hashing its data is slow)
        return ("k", str(expr.ty))
    return ("s", structural_hash(expr))


class CallNames:
    """The bindings of ``main`` before fusion, to find each fused op's source name after
    it: a binding is known by its op, attributes and operands (:func:`_key`), its
    operands by the binding that made them."""

    def __init__(self, func: relax.Function):
        self.by_key, self.names = {}, {}
        self.ids = {p: self.by_key.setdefault(("p", p.name), len(self.by_key)) for p in func.params}
        for block in func.body.blocks:
            for b in block.bindings:
                if not isinstance(b, relax.VarBinding):
                    continue
                if isinstance(b.value, relax.Var):  # an alias: the same value
                    self.ids[b.var] = self.ids.get(b.value)
                    continue
                key = _key(b.value, self.ids.get)
                if key is None:
                    continue
                # A number per distinct value: keys stay flat (operands by number).
                self.ids[b.var] = number = self.by_key.setdefault(key, len(self.by_key))
                if isinstance(b.value, relax.Call) and span_name(b.value):
                    self.names[number] = span_name(b.value)


@relax.expr_functor.mutator
class _Respan(relax.PyExprMutator):
    """Each call of a composite's body with the span of its own op's source name."""

    def __init__(self, names: dict):
        super().__init__()
        self.names = names  # the body's binding var -> source name (or None)

    def visit_var_binding_(self, binding):
        value = self.visit_expr(binding.value)
        if isinstance(value, relax.Call):
            name = self.names.get(binding.var)
            value = with_span(value, None if name is None else name_span(name))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))


@relax.expr_functor.mutator
class _CallOwnCopy(relax.PyExprMutator):
    def __init__(self, copies: dict):
        super().__init__()
        self.copies = copies  # binding var -> the GlobalVar of its own copy

    def visit_var_binding_(self, binding):
        gv = self.copies.get(binding.var)
        if gv is None:
            return super().visit_var_binding_(binding)
        value = self.visit_expr(binding.value)
        call = relax.Call(gv, value.args, value.attrs, value.ty_args, value.span)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(call)))


def _composite(mod, expr):
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.GlobalVar):
        func = mod[expr.op]
        if isinstance(func, relax.Function) and "Composite" in (func.attrs or {}):
            return func
    return None


def unshare_composites(mod: tvm.IRModule, before: CallNames) -> tvm.IRModule:
    """``mod`` (after ``FuseOpsByPattern``) with each call of a composite function that
    several calls share given a copy of its own, whose ops carry their own source names
    (found in ``before``, ``main`` before fusion; an op not found there gets none).
    Fusion keeps one function for structurally equal composites, and with it the source
    names of the first: layer 3's RoPE would be reported as layer 0's."""
    main = mod["main"]
    ids = {p: before.by_key.get(("p", p.name)) for p in main.params}  # by name (fusion makes new ones)
    bindings = [b for block in main.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)]
    calls = {}
    for b in bindings:
        func = _composite(mod, b.value)
        if func is not None:
            calls.setdefault(b.value.op, []).append(b)
    shared = {gv for gv, bs in calls.items() if len(bs) > 1}
    if not shared:
        return mod
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in shared}, attrs=mod.attrs)
    copies, count = {}, {}
    for b in bindings:
        func = _composite(mod, b.value)
        if isinstance(b.value, relax.Var):
            ids[b.var] = ids.get(b.value)
            continue
        if func is None:  # an op kept as is: known by its operands
            key = _key(b.value, ids.get)
            ids[b.var] = before.by_key.get(key) if key is not None else None
            continue
        # The composite's body, op by op, against main's ops before fusion.
        inner = dict(zip(func.params, (ids.get(a) if isinstance(a, relax.Var) else _key(a, ids.get)
                                       for a in b.value.args)))
        names = {}
        for blk in func.body.blocks:
            for ib in blk.bindings:
                if isinstance(ib.value, relax.Var):
                    inner[ib.var] = inner.get(ib.value)
                    continue
                key = _key(ib.value, inner.get)
                inner[ib.var] = before.by_key.get(key) if key is not None else None
                names[ib.var] = before.names.get(inner[ib.var])
        ids[b.var] = inner.get(func.body.body) if isinstance(func.body.body, relax.Var) else None
        gv = b.value.op
        if gv not in shared:
            continue
        k = count[gv] = count.get(gv, -1) + 1
        copy = tvm.ir.GlobalVar(f"{gv.name_hint}_call{k}")
        relax.expr._update_type(copy, gv.ty)  # a call's type is its callee's
        out[copy] = _Respan(names).visit_expr(func)
        copies[b.var] = copy
    out["main"] = _CallOwnCopy(copies).visit_expr(main)
    return out

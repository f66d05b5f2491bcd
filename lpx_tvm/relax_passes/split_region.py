"""Split an LPX region in two, where its ops fit the SRAM one by one but not together.

``MergeCompositeFunctions`` merges every neighbouring composite into one region, and the
partitioner's fit check judges each op alone. A region keeps all its weights resident
(int8 regions also keep every activation on chip: they have no bands), so a long chain
of ops that each fit can still overflow the SRAM together. The compiler then splits the
region at the middle of its ops into two consecutive regions and compiles each; the
values that cross the cut go through the runtime, as between any two regions.

``split_region(mod, name)`` returns the module with the region function ``name``
replaced by ``name_a`` and ``name_b`` and its call in ``main`` by the two calls.
"""

from __future__ import annotations

import tvm
from tvm import relax

__all__ = ["split_region", "op_calls"]


def op_calls(func: relax.Function) -> int:
    """How many composite calls (ops) a region function makes: a region of one cannot split."""
    return sum(1 for b in _bindings(func) if not isinstance(b.value, relax.Function))


def _bindings(func: relax.Function) -> list:
    return [b for block in func.body.blocks for b in block.bindings]


def _region(params, bindings, result, attrs, name) -> relax.Function:
    body = relax.SeqExpr([relax.BindingBlock(bindings)], result)
    func = relax.Function(params, body, ret_ty=result.ty, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs))
    # Fresh variables: a variable may be defined in one function of a module only.
    func = relax.utils.copy_with_new_vars(func)
    return func.with_attr("global_symbol", name)


def _cut(bindings) -> int:
    """The index of the first binding of the second half: the middle op call, moved back
    before the definitions of the local composite functions that precede it."""
    calls = [i for i, b in enumerate(bindings) if not isinstance(b.value, relax.Function)]
    cut = calls[len(calls) // 2]
    while cut > 0 and isinstance(bindings[cut - 1].value, relax.Function):
        cut -= 1
    return cut


def _packed(values: list):
    return values[0] if len(values) == 1 else relax.Tuple(values)


def split_region(mod: tvm.IRModule, name: str) -> tvm.IRModule:
    gv = mod.get_global_var(name)
    func = mod[gv]
    bindings = _bindings(func)
    result = func.body.body
    outputs = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    cut = _cut(bindings)
    first, second = bindings[:cut], bindings[cut:]
    defined_first = {b.var for b in first}
    # Each output of the region comes from the half that computes it: a value of the
    # first half never travels through the second (it would take SRAM there for nothing).
    from_first = [v for v in dict.fromkeys(outputs) if v in defined_first]
    from_second = [v for v in dict.fromkeys(outputs) if v not in defined_first]
    if not from_second:  # nothing the second half computes is read: it is dead code
        from_first, second = [v for v in dict.fromkeys(outputs)], []
    # Local composite functions defined in the first half and called in the second are
    # defined again there (structurally equal composites share one definition).
    functions = {b.var: b for b in first if isinstance(b.value, relax.Function)}
    used_second = set(relax.analysis.free_vars(relax.SeqExpr([relax.BindingBlock(second)], relax.Tuple(from_second))))
    second = [functions[v] for v in functions if v in used_second] + second
    crossing = [b.var for b in first if b.var in used_second and b.var not in functions]
    out_first = list(dict.fromkeys(crossing + from_first))
    params_second = [p for p in func.params if p in used_second]
    used_first = set(relax.analysis.free_vars(relax.SeqExpr([relax.BindingBlock(first)], relax.Tuple(out_first))))
    params_first = [p for p in func.params if p in used_first]

    attrs = {k: func.attrs[k] for k in func.attrs.keys() if k != "global_symbol"}
    rest = tvm.IRModule({g: f for g, f in mod.functions.items() if not g.same_as(gv)}, attrs=mod.attrs)
    bb = relax.BlockBuilder(rest)
    ga = bb.add_func(_region(params_first, first, _packed(out_first), attrs, f"{name}_a"), f"{name}_a")
    gb = None if not second else bb.add_func(_region(crossing + params_second, second, _packed(from_second), attrs, f"{name}_b"), f"{name}_b")
    mod = bb.get()
    main = mod.get_global_var("main")
    recall = _Recall(mod, gv, (ga, params_first, out_first), (gb, crossing + params_second, from_second),
                     func.params, outputs, isinstance(result, relax.Tuple))
    mod[main] = recall.visit_expr(mod[main])
    return mod


@relax.expr_functor.mutator
class _Recall(relax.PyExprMutator):
    """``y = f(args)`` becomes ``a = f_a(...); b = f_b(...)`` and ``y`` the outputs
    taken from ``a`` and ``b``."""

    def __init__(self, mod, old, half_a, half_b, params, outputs, is_tuple):
        super().__init__(mod)
        self.old, self.half_a, self.half_b = old, half_a, half_b
        self.params, self.outputs, self.is_tuple = list(params), outputs, is_tuple

    def _call(self, half, known: dict):
        gvar, params, results = half
        out = self.builder_.emit(relax.Call(gvar, [known[p] for p in params]))
        if len(results) == 1:
            known[results[0]] = out
        else:
            for i, v in enumerate(results):
                known[v] = self.builder_.emit(relax.TupleGetItem(out, i))

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, relax.GlobalVar) and call.op.same_as(self.old)):
            return call
        known = dict(zip(self.params, call.args))
        self._call(self.half_a, known)
        if self.half_b[0] is not None:
            self._call(self.half_b, known)
        fields = [known[v] for v in self.outputs]
        return relax.Tuple(fields) if self.is_tuple else fields[0]

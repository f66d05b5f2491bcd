"""Replace calls of compiled LPX regions with extern calls the VM makes at run time."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ...runtime.compiled_region import REGION_PREFIX


def lpx_functions(mod) -> dict:
    """{name: function} of the Codegen="lpx" functions of a partitioned module."""
    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, relax.Function) and f.attrs is not None and "Codegen" in f.attrs
            and str(f.attrs["Codegen"]) == "lpx"}


@mutator
class _Outline(PyExprMutator):
    def __init__(self, mod, names):
        super().__init__(mod)
        self.names = names

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, relax.GlobalVar) and call.op.name_hint in self.names:
            # A region with several outputs returns a tuple: one destination tensor each.
            out_ty = list(call.ty.fields) if isinstance(call.ty, relax.TupleType) else call.ty
            return relax.call_dps_packed(REGION_PREFIX + self.names[call.op.name_hint], relax.Tuple(list(call.args)),
                                         out_ty=out_ty)
        return call


def outline_regions(mod, names: dict) -> tvm.IRModule:
    """The module with each region call an extern call and the region functions removed.

    ``names`` maps each region function's name to the name its extern call uses."""
    m = _Outline(mod, names)
    out = {}
    for gv, f in mod.functions.items():
        if gv.name_hint in names:
            continue
        # Keyed by the GlobalVar itself: call_tir references in main must keep resolving.
        out[gv] = m.visit_expr(f) if isinstance(f, relax.Function) else f
    new = tvm.IRModule(out)
    return new.with_attrs(mod.attrs) if mod.attrs is not None else new

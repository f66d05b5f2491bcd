"""Control flow and data-dependent shapes through region merging, on the CPU.

TVM's ``MergeCompositeFunctions`` visits only bindings of calls of ops or global
functions on values of known shape: it stops at an ``If`` ("Do not have a default for
relax.expr.If"), at a ``match_cast`` binding, which the ONNX importer writes after every
op whose result shape depends on values (NonZero, Unique, Range of run-time inputs), at
a call of a packed function (the shape held in a run-time tensor), and at an op of a
shape variable (``arange(0, n)``). None of them can go to LPX, whose schedules are
static, so :func:`hide` replaces each such binding of ``main`` by a call of a function
of the Vars it reads (a CPU op to the merge, which keeps LPX regions on either side of
it, never across it), and :func:`restore` puts them back:

- a ``match_cast`` or a packed call in place;
- an ``If`` as a call of a function of its own (``main_if<i>``: the condition and the
  values its branches read are its parameters), whose branches run on the CPU and which
  carries the reason for the offload report (:data:`CPU_REASON_ATTR`).

A module with none of them passes through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from ..layer_names import span_name

__all__ = ["CPU_REASON_ATTR", "Hidden", "hide", "name_ifs", "restore", "static_type"]

# The opaque calls' callees: global vars named _STUB and the index of the binding they
# stand for, bound to an extern function (the merge looks callees up in the module; it
# cannot visit an ExternFunc inside a call).
_STUB = "lpx_cpu_only"
# A function attribute: why every op in that function runs on the CPU (offload report).
CPU_REASON_ATTR = "lpx_cpu_reason"


@dataclass(frozen=True)
class _Item:
    kind: str  # "match_cast", "if", "call" (of a packed function) or "dynamic" (shape)
    value: relax.Expr  # the binding's value, as it was
    ty: object  # the match_cast's type, else None
    reads: tuple  # the Vars the value reads, in order: the opaque call's arguments


@dataclass
class Hidden:
    """What :func:`hide` took out of ``main``, by index."""

    items: list

    def __bool__(self) -> bool:
        return bool(self.items)


def name_ifs(mod: tvm.IRModule, names: dict) -> tvm.IRModule:
    """``mod`` with the source name of each If of ``main`` in its span (``names``:
    {the Var an If binds: its source node's name}), for the offload report's reason."""
    if not names:
        return mod
    out = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out["main"] = _NameIfs(names).visit_expr(mod["main"])
    return out


@relax.expr_functor.mutator
class _NameIfs(relax.PyExprMutator):
    def __init__(self, names):
        super().__init__()
        self.names = names

    def visit_var_binding_(self, binding):
        name = self.names.get(binding.var)
        if name is None or not isinstance(binding.value, relax.If):
            return super().visit_var_binding_(binding)
        node = self.visit_expr(binding.value)
        span = tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0)
        named = relax.If(node.cond, node.true_branch, node.false_branch, span)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(named)))


def hide(mod: tvm.IRModule) -> tuple:
    """``(module, Hidden)``: the bindings of ``main`` the merge cannot visit, as opaque
    calls."""
    if not any(gv.name_hint == "main" for gv in mod.get_global_vars()):
        return mod, Hidden([])
    hider = _Hider(mod)
    func = hider.visit_expr(mod["main"])
    if not hider.items:
        return mod, Hidden([])
    out = hider.builder_.get()
    out[out.get_global_var("main")] = func
    return out, Hidden(hider.items)


def restore(mod: tvm.IRModule, hidden: Hidden) -> tvm.IRModule:
    """The module with every opaque call of ``hidden`` back as what it stood for."""
    if not hidden:
        return mod
    main = mod.get_global_var("main")
    restorer = _Restorer(mod, hidden.items)
    func = restorer.visit_expr(mod[main])
    out = restorer.builder_.get()
    out[out.get_global_var("main")] = func
    for gv in out.get_global_vars():
        if _stub_index(gv) is not None:
            del out[gv]
    return out


def _kind(binding) -> "str | None":
    if isinstance(binding, relax.MatchCast):
        return "match_cast"
    value = binding.value
    if isinstance(value, relax.If):
        return "if"
    if isinstance(value, relax.Call) and any(isinstance(e, relax.ExternFunc) for e in [value.op, *value.args]):
        return "call"
    if not static_type(binding.var.ty):
        return "dynamic"
    return None


def static_type(ty) -> bool:
    """Whether a value of type ``ty`` has a shape known at compile time (the merge does
    not follow shape variables: an ``arange(0, n)`` of a variable ``n`` stops it)."""
    if isinstance(ty, relax.TupleType):
        return all(static_type(field) for field in ty.fields)
    if isinstance(ty, relax.TensorType):
        shape = ty.shape
        return isinstance(shape, relax.ShapeExpr) and all(isinstance(v, tvm.tirx.IntImm) for v in shape.values)
    if isinstance(ty, relax.ShapeType):
        return ty.values is not None and all(isinstance(v, tvm.tirx.IntImm) for v in ty.values)
    return True


def _stub_index(op) -> "int | None":
    if isinstance(op, relax.GlobalVar):
        suffix = op.name_hint[len(_STUB):]
        if op.name_hint.startswith(_STUB) and suffix.isdigit():
            return int(suffix)
    return None


@relax.expr_functor.mutator
class _Hider(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.items = []

    def visit_match_cast_(self, binding):
        self._hide(binding)

    def visit_var_binding_(self, binding):
        if _kind(binding) is None:
            super().visit_var_binding_(binding)
        else:
            self._hide(binding)

    def _hide(self, binding):
        """Bind ``binding.var`` to an opaque call of the Vars its value reads."""
        # Shape variables (of type int64) are not values the merge can follow.
        reads = tuple(v for v in relax.analysis.free_vars(binding.value) if not isinstance(v.ty, tvm.ir.PrimType))
        cast_ty = binding.ty if isinstance(binding, relax.MatchCast) else None
        self.items.append(_Item(_kind(binding), binding.value, cast_ty, reads))
        # Impure, so that the merge keeps it where nothing reads its result (a match_cast
        # is read through the shape variables it defines).
        stub = _outlined(self.items[-1], binding.var, pure=False)
        callee = self.builder_.add_func(stub, f"{_STUB}{len(self.items) - 1}")
        call = relax.Call(callee, [self.visit_expr(v) for v in reads])
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(call)))


@relax.expr_functor.mutator
class _Substitute(relax.PyExprMutator):
    """An expression with some Vars replaced."""

    def __init__(self, mod, mapping):
        super().__init__(mod)
        self.mapping = mapping

    def visit_var_(self, var):
        return self.mapping.get(var, var)

    def visit_dataflow_var_(self, var):
        return self.mapping.get(var, var)


@relax.expr_functor.mutator
class _Restorer(relax.PyExprMutator):
    def __init__(self, mod, items):
        super().__init__(mod)
        self.mod = mod
        self.items = items
        self.branches = 0

    def visit_var_binding_(self, binding):
        index = _stub_index(binding.value.op) if isinstance(binding.value, relax.Call) else None
        if index is None:
            super().visit_var_binding_(binding)
            return
        item = self.items[index]
        args = [self.visit_expr(a) for a in binding.value.args]
        if item.kind == "if":
            name = span_name(item.value) or binding.var.name
            reason = f"in a branch of If {name!r}: control flow and its branches run on the CPU"
            func = _outlined(item, binding.var).with_attr(CPU_REASON_ATTR, reason)
            callee = self.builder_.add_func(func, f"main_if{self.branches}")
            self.branches += 1
            value = relax.Call(callee, args)
        else:
            mapping = {old: new for old, new in zip(item.reads, args) if not old.same_as(new)}
            value = _Substitute(self.mod, mapping).visit_expr(item.value) if mapping else item.value
        value = self.builder_.normalize(value)
        if item.kind == "match_cast":
            self.builder_.emit_normalized(relax.MatchCast(binding.var, value, item.ty))
        else:
            self.builder_.emit_normalized(relax.VarBinding(binding.var, value))


def _outlined(item, var, pure=True) -> relax.Function:
    """The value of ``item`` as a function of the Vars it reads (a match_cast binds it
    and returns the cast value)."""
    body = item.value
    if item.kind == "match_cast":
        cast = relax.Var(var.name, item.ty)
        body = relax.SeqExpr([relax.BindingBlock([relax.MatchCast(cast, body, item.ty)])], cast)
    func = relax.Function(list(item.reads), body, var.ty, is_pure=pure)
    return relax.utils.copy_with_new_vars(func)

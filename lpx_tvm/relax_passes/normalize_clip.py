"""lpx.NormalizeClip: one canonical op per clamp (ReLU, ReLU6, Clip).

The ONNX importer spells Clip as a TOPI max and min (``call_tir``); other frontends use
``relax.clip``, ``relax.nn.relu`` or Relax max / min with a scalar. The patterns want
one ``relax.clip`` (or ``relax.nn.relu``) per clamp.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, te, topi

from ._binding_rewrite import (
    bindings,
    block_index,
    is_const,
    is_float,
    op_is,
    rewrite_bindings,
    static_shape,
    use_counts,
    visible_at,
)

__all__ = ["NormalizeClip"]

_INF = float("inf")


def _scalar_const(expr):
    if is_const(expr) and expr.value.numpy().size == 1 and is_float(expr.ty.dtype):
        return float(expr.value.numpy().reshape(()))
    return None


def _is_topi_binary(prim, topi_op, x, c):
    """Whether ``prim`` is exactly what ``emit_te(topi_op, x, c)`` builds for these shapes."""
    if not isinstance(prim, tvm.tirx.PrimFunc):
        return False
    a = te.placeholder([tvm.tirx.IntImm("int64", n) for n in static_shape(x)], x.ty.dtype, "A")
    b = te.placeholder([tvm.tirx.IntImm("int64", n) for n in static_shape(c)], c.ty.dtype, "B")
    ref = te.create_prim_func([a, b, topi_op(a, b)]).without_attr("global_symbol")
    return tvm_ffi.structural_equal(prim.without_attr("global_symbol"), ref, map_free_vars=True)


def _bounds_form(value, mod):
    """(source, lo, hi) if ``value`` clamps one float tensor to [lo, hi], else None."""
    if not isinstance(value, relax.Call) or not is_float(getattr(value.ty, "dtype", "")):
        return None
    if op_is(value, "relax.nn.relu"):
        return value.args[0], 0.0, _INF
    if op_is(value, "relax.clip"):
        lo, hi = (_prim_scalar(a) for a in value.args[1:])
        if lo is None or hi is None:
            return None
        return value.args[0], lo, hi
    if op_is(value, "relax.maximum", "relax.minimum"):
        x, c = value.args
        which = value.op.name.removeprefix("relax.")
    elif op_is(value, "relax.call_tir") and isinstance(value.args[0], relax.GlobalVar):
        fields = value.args[1].fields if isinstance(value.args[1], relax.Tuple) else ()
        if len(fields) != 2:
            return None
        x, c = fields
        if static_shape(x) is None or _scalar_const(c) is None or static_shape(c) is None:
            return None
        prim = mod[value.args[0]]
        if _is_topi_binary(prim, topi.maximum, x, c):
            which = "maximum"
        elif _is_topi_binary(prim, topi.minimum, x, c):
            which = "minimum"
        else:
            return None
    else:
        return None
    bound = _scalar_const(c)
    if bound is None or static_shape(value) != static_shape(x) or c.ty.dtype != x.ty.dtype:
        return None
    return (x, bound, _INF) if which == "maximum" else (x, -_INF, bound)


def _prim_scalar(value):
    if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return float(value.value)
    return _scalar_const(value)


def _canonical_kind(lo, hi):
    if lo == 0.0 and hi == _INF:
        return "relax.nn.relu"
    if hi == _INF:
        return "relax.maximum"
    if lo == -_INF:
        return "relax.minimum"
    return "relax.clip"


def _clamp_value(src, lo, hi, dtype):
    kind = _canonical_kind(lo, hi)
    if kind == "relax.nn.relu":
        return relax.op.nn.relu(src)
    if kind == "relax.maximum":
        return relax.op.maximum(src, relax.const(lo, dtype))
    if kind == "relax.minimum":
        return relax.op.minimum(src, relax.const(hi, dtype))
    return relax.op.clip(src, tvm.tirx.FloatImm("float64", lo), tvm.tirx.FloatImm("float64", hi))


def _clamp_builder(src, lo, hi, dtype):
    def make(visit, builder):
        return _clamp_value(visit(src), lo, hi, dtype)

    return make


def _plan_clip(func, mod):
    uses, blocks = use_counts(func), block_index(func)
    forms, drop, rebuild = {}, set(), {}
    for var, value in bindings(func):
        form = _bounds_form(value, mod)
        if form is None:
            continue
        src, lo, hi = form
        merged = False
        inner = forms.get(src) if isinstance(src, relax.Var) else None
        # clip(clip(x, a, b), c, d) == clip(x, max(a, c), min(b, d)) when the ranges meet.
        if (
            inner is not None
            and uses[src] == 1
            and max(lo, inner[1]) <= min(hi, inner[2])
            and visible_at(blocks, inner[0], var)
        ):
            src, lo, hi = inner[0], max(lo, inner[1]), min(hi, inner[2])
            drop.add(form[0])
            rebuild.pop(form[0], None)
            merged = True
        forms[var] = (src, lo, hi)
        if merged or value.op.name != _canonical_kind(lo, hi):
            rebuild[var] = _clamp_builder(src, lo, hi, value.ty.dtype)
    return drop, rebuild


@relax.transform.function_pass(opt_level=0, name="lpx.NormalizeClip")
class NormalizeClip:
    """Rewrite clamps into one canonical op each.

    ``relu``, ``clip`` and max / min with a scalar constant (as Relax ops or as the
    TOPI ``call_tir`` the ONNX Clip importer emits) are read as a range [lo, hi];
    nested ranges with a single use merge. A range becomes ``relax.nn.relu`` for
    [0, inf), ``relax.clip`` when both ends are finite (ReLU6 is ``clip(x, 0, 6)``),
    and ``relax.maximum`` / ``relax.minimum`` when one end is open.
    """

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        drop, rebuild = _plan_clip(func, mod)
        return rewrite_bindings(func, mod, drop, rebuild)

"""lpx.PadFromTIR: the generated TIR pads of the ONNX importer become ``relax.nn.pad``.

TVM's ONNX importer emits ``Pad`` (and the pad that ``Conv`` with ``auto_pad=SAME_*``
puts before the convolution) as a ``call_tir`` of a TOPI PrimFunc (``pad``,
``mirror_pad``, ``replicate_pad``), where the torch importer emits ``relax.nn.pad``.
The patterns, and :mod:`.fold_pad`, read ``nn.pad``: this pass reads the pad widths,
mode and value back from the PrimFunc and rebuilds the op.

The widths are read by evaluating the input index expressions of the PrimFunc's one
buffer store at every output coordinate, and the whole mapping is checked against the
mode's before rebuilding: a PrimFunc that is not exactly such a pad is left alone.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..target.codegen.rules import pad_source
from ._binding_rewrite import bindings, rewrite_bindings, static_shape

__all__ = ["PadFromTIR"]


def _chain(prim):
    """The innermost block's iteration variables and its BufferStore, when the PrimFunc
    is one nest of loops and blocks around one store (what ``te.create_prim_func``
    makes of one compute), else None."""
    stmt, ivars = prim.body, None
    while not isinstance(stmt, tirx.BufferStore):
        if getattr(stmt, "iter_vars", None):
            ivars = [iv.var for iv in stmt.iter_vars]
        nxt = getattr(stmt, "block", None) or getattr(stmt, "body", None)
        if nxt is None or isinstance(stmt, tirx.SeqStmt):
            return None
        stmt = nxt
    return (ivars, stmt) if ivars else None


_BINARY = {
    tirx.Add: lambda a, b: a + b, tirx.Sub: lambda a, b: a - b, tirx.Mul: lambda a, b: a * b,
    tirx.Min: min, tirx.Max: max, tirx.LT: lambda a, b: int(a < b), tirx.LE: lambda a, b: int(a <= b),
    tirx.GT: lambda a, b: int(a > b), tirx.GE: lambda a, b: int(a >= b), tirx.EQ: lambda a, b: int(a == b),
    tirx.NE: lambda a, b: int(a != b), tirx.And: lambda a, b: int(a and b), tirx.Or: lambda a, b: int(a or b),
}


def _is_if_then_else(expr) -> bool:
    return isinstance(expr, tvm.ir.Call) and getattr(expr.op, "name", "") in ("prim.if_then_else", "tirx.if_then_else")


def _evaluate(expr, env: dict) -> int:
    """The integer value of a TIR index or condition expression with ``env``'s variables
    bound; ValueError for anything that is not such an expression."""
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.Var):
        if expr not in env:
            raise ValueError(f"unbound {expr}")
        return env[expr]
    if isinstance(expr, tirx.Cast):
        return _evaluate(expr.value, env)
    if isinstance(expr, tirx.Not):
        return int(not _evaluate(expr.a, env))
    if type(expr) in _BINARY:
        return _BINARY[type(expr)](_evaluate(expr.a, env), _evaluate(expr.b, env))
    if isinstance(expr, tirx.Select) or _is_if_then_else(expr):
        c, t, f = (expr.condition, expr.true_value, expr.false_value) if isinstance(expr, tirx.Select) \
            else expr.args
        return _evaluate(t if _evaluate(c, env) else f, env)
    raise ValueError(f"not an index expression: {type(expr).__name__}")


def _read_pad(prim, name: str, in_shape, out_shape):
    """``(mode, pad_width, value)`` of a TOPI pad PrimFunc, or None if it is not one."""
    chain = _chain(prim)
    if chain is None:
        return None
    ivars, store = chain
    if len(ivars) != len(out_shape) or len(store.indices) != len(ivars):
        return None
    if [str(i) for i in store.indices] != [str(v) for v in ivars]:
        return None
    value, fill, cond = store.value, None, None
    if _is_if_then_else(value):
        if not isinstance(value.args[2], (tirx.FloatImm, tirx.IntImm)):
            return None
        cond, fill, value = value.args[0], float(value.args[2].value), value.args[1]
    if not isinstance(value, tvm.ir.expr.TensorLoad) or len(value.indices) != len(in_shape):
        return None
    mode = "constant" if fill is not None else "reflect" if "mirror" in name else "replicate" if "replicate" in name \
        else None
    if mode is None:
        return None
    def at(expr, point):
        try:
            return _evaluate(expr, point)
        except ValueError:
            return None

    befores = []
    for axis, (index, n, out) in enumerate(zip(value.indices, in_shape, out_shape)):
        if out == n and all(at(index, {ivars[axis]: k}) == k for k in range(n)):  # an axis not padded
            befores.append(0)
            continue
        if out < n or (mode != "constant" and n < 2):
            return None
        reads = [at(index, {ivars[axis]: k}) for k in range(out)]
        # Every mode reads input row 0 at output ``before`` and row 1 right after it.
        starts = [k for k in range(out - 1) if reads[k] == 0 and reads[k + 1] == 1] if n > 1 else \
            [k for k in range(out) if reads[k] == 0]
        if len(starts) != 1:
            return None
        before = starts[0]
        if out - n - before < 0:
            return None
        for k, r in enumerate(reads):
            expected = pad_source(mode, k, before, n)
            if expected is not None and expected != r:  # padding of a constant reads anything
                return None
        befores.append(before)
    if cond is not None:  # the fill goes exactly where an axis leaves the input
        inside = dict(zip(ivars, befores))
        for axis, (n, out) in enumerate(zip(in_shape, out_shape)):
            for k in range(out):
                if at(cond, {**inside, ivars[axis]: k}) != int(0 <= k - befores[axis] < n):
                    return None
    widths = [w for b, n, out in zip(befores, in_shape, out_shape) for w in (b, out - n - b)]
    return mode, widths, 0.0 if fill is None else fill


def _plan(func, mod):
    rebuild = {}
    for var, value in bindings(func):
        if not (isinstance(value, relax.Call) and value.op == tvm.ir.Op.get("relax.call_tir")):
            continue
        callee, args = value.args[0], value.args[1]
        prim = mod[callee] if callee in mod.get_global_vars() else None
        if not isinstance(prim, tirx.PrimFunc) or not isinstance(args, relax.Tuple) or len(args.fields) != 1:
            continue
        x = args.fields[0]
        in_shape, out_shape = static_shape(x), static_shape(var)
        if in_shape is None or out_shape is None or len(in_shape) != len(out_shape):
            continue
        if len(prim.params) != 2 or str(x.ty.dtype) != str(var.ty.dtype):
            continue
        found = _read_pad(prim, callee.name_hint, in_shape, out_shape)
        if found is None:
            continue
        mode, widths, fill = found
        rebuild[var] = lambda visit, builder, x=x, w=widths, m=mode, f=fill: relax.op.nn.pad(visit(x), w, m, f)
    return rebuild


@relax.transform.function_pass(opt_level=0, name="lpx.PadFromTIR")
class PadFromTIR:
    """Replace ``call_tir`` of a TOPI constant / reflect / edge pad with ``relax.nn.pad``."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        return rewrite_bindings(func, mod, set(), _plan(func, mod))

"""lpx.TakeAsSlice: ``take`` of a runtime value at constant indices becomes slices.

A ViT's class token ``x[:, 0]`` is exported as a Gather of one constant index; the
importer writes it as ``take(x, 0, axis=1)``. LPX gathers rows of constant tables only,
but picking fixed positions along an axis is a slice: the same elements as
``strided_slice(x, [axis], [i], [i + 1])`` with the axis then dropped (a reshape).
Indices of rank 1 become one slice per run of consecutive indices, concatenated along
the axis when there are several. The slices are ops LPX already runs (rows picked
whole, ``lpx.slice_rows``, or lanes moved, ``lpx.slice``), so the class token no longer
splits the model.

Indices of higher rank, out of range under ``mode="fast"``, and takes of constants
(folded by ``lpx.EvalConstants``) are left as they are.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._binding_rewrite import bindings, is_const, op_is, rewrite_bindings, static_shape

__all__ = ["TakeAsSlice", "index_runs"]


def index_runs(indices, n: int, mode: str):
    """[(begin, end)] runs of consecutive positions the constant ``indices`` pick along an
    axis of ``n``, in order (TVM's wrap / clip / fast modes), or None for indices of rank
    above 1 or out of range under ``fast``."""
    idx = np.asarray(indices).astype(np.int64)
    if idx.ndim > 1 or n == 0:
        return None
    flat = idx.reshape(-1)
    if mode == "clip":
        flat = np.clip(flat, 0, n - 1)
    elif mode == "fast" and not np.all((flat >= -n) & (flat < n)):
        return None
    flat = np.mod(flat, n)
    runs = []
    for i in flat.tolist():
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return [tuple(r) for r in runs]


def _constant_indices(expr, consts):
    if is_const(expr):
        return expr.value.numpy()
    return consts.get(expr)


def _slices(x, axis: int, runs: list, builder):
    pieces = []
    for begin, end in runs:
        pieces.append(builder.emit(relax.op.strided_slice(x, [axis], [begin], [end])))
    return pieces[0] if len(pieces) == 1 else builder.emit(relax.op.concat(pieces, axis=axis))


@relax.transform.function_pass(opt_level=0, name="lpx.TakeAsSlice")
class TakeAsSlice:
    """Rewrite ``take(x, constant indices, axis)`` of a runtime ``x`` into slices."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        consts = {var: value.value.numpy() for var, value in bindings(func) if is_const(value)}
        rebuild = {}
        for var, value in bindings(func):
            if not op_is(value, "relax.take"):
                continue
            x, indices = value.args
            shape, out = static_shape(x), static_shape(value)
            if is_const(x) or shape is None or out is None or value.attrs.axis is None:
                continue
            idx = _constant_indices(indices, consts)
            if idx is None or np.asarray(idx).dtype.kind not in "iu":
                continue
            axis = int(value.attrs.axis) % len(shape)
            runs = index_runs(idx, shape[axis], str(value.attrs.mode))
            if runs is None:
                continue
            scalar = np.ndim(idx) == 0

            def make(visit, builder, x=x, axis=axis, runs=runs, scalar=scalar, out=out):
                y = _slices(visit(x), axis, runs, builder)
                return relax.op.reshape(y, out) if scalar else y
            rebuild[var] = make
        return rewrite_bindings(func, mod, set(), rebuild)

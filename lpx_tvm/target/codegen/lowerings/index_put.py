"""``index_put`` of whole rows of a 2-D value by runtime int32 row indices (a decoder's
KV cache written at the position): ``mem.scatter`` into the value's lines, in place when
this is the value's last use."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple, wildcard

from ....machine.isa import DType
from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..registry import OpPattern, register_lowering, register_pattern
from ..pattern_checks import tensors_problem
from ..relax_exprs import expr_shape, is_const, static_shape
from ..storage import Stored, one
from ..values import copy_value


@register_lowering("index_put")
def lower_index_put(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """``index_put(data, (rows, arange(D)), values)``: one scatter per lane tile of
    ``data``, each row of ``values`` to the row its index names (the indices are stored
    one per vector, in lane 0, which is what ``mem.scatter`` reads). ``data`` is updated
    where it lies when no later op reads it; otherwise the scatter goes into a copy."""
    assert len(op.main.args) == 4 and not op.main.attrs.get("accumulate"), \
        "the index_put pattern takes two index tensors, no accumulate"
    data, rows, cols, values = op.main.args
    r, d = op.shape
    assert not data.is_const and cols.is_const and np.asarray(cols.const).reshape(-1).tolist() == list(range(d)), \
        "the index_put pattern takes whole rows (columns arange(D)) of a runtime value"
    x, v = ctx.value(data), ctx.value(values)
    if rows.is_const:
        idx = ctx.temp(ctx.builder.constant(f"{op.out}.rows", np.asarray(rows.const, np.int32).reshape(-1, 1),
                                            DType.INT32))
    else:
        idx = ctx.value(rows).tensor
    if idx.layout.dtype != DType.INT32 or idx.layout.cols != 1:
        raise UnsupportedOnLPX(f"index_put by row indices of shape {rows.shape} (LPX scatters by int32 (N, 1))")
    if x.tensor.layout.nchunks != 1:
        raise UnsupportedOnLPX(f"index_put into a value of {r} rows: a column tile spans several slices")
    if v.tensor.layout.dtype != x.tensor.layout.dtype:
        raise UnsupportedOnLPX(f"index_put of {v.tensor.layout.dtype.short} rows into a "
                               f"{x.tensor.layout.dtype.short} value")
    # In place: no later op reads data, and no other live value (a reshape alias) shares it.
    in_place = ctx.last_use.get(data.name, -1) <= ctx.op_index and \
        all(s.tensor is not x.tensor for name, s in ctx.values.items() if name != data.name)
    y = x if in_place else copy_value(ctx, x, op.out, is_output)
    # The scatter reads the indices and the rows side by side: a slice has one read port,
    # so rows that share a slice with the indices are read from a copy elsewhere.
    idx_slices = {sl for sl, _ in idx.layout.tiles}
    if idx_slices & {sl for sl, _ in v.tensor.layout.tiles}:
        v = ctx.temp(copy_value(ctx, v, f"{op.out}.rows", avoid=(Stored(idx, tuple(rows.shape)),)))
    n, lanes = rows.shape[0], ctx.cfg.lanes
    for b0 in range(0, n, lanes):
        b1 = min(n, b0 + lanes)
        for j in range(y.tensor.ntiles):
            g = ctx.builder.group(f"{op.out}.scatter")
            index = g.read(one(idx.segments(0, b0, b1)))
            rows_in = g.read(one(v.tensor.segments(j, b0, b1)))
            g.scatter(rows_in, index, y.tensor.tile(j))
    ctx.values[op.out] = Stored(y.tensor, tuple(op.shape))
    if in_place:
        ctx.updated_in_place.add(op.out)


# ---- patterns ---------------------------------------------------------------------------


def _index_put_pattern():
    data, rows, cols, values = wildcard(), wildcard(), wildcard(), wildcard()
    root = is_op("relax.index_put")(data, is_tuple([rows, cols]), values)
    return root, {"input": data, "rows": rows, "cols": cols, "values": values, "root": root}


def _index_put_check(a, settings):
    """``index_put(data, (rows, cols), values)`` writing whole rows of a runtime 2-D value
    (a decoder's KV cache): ``rows`` int32 of shape (N, 1), ``cols`` the constant
    ``arange(D)`` of shape (1, D), ``values`` (N, D)."""
    op, data, rows, cols, values = a["root"], a["input"], a["rows"], a["cols"], a["values"]
    if is_const(data):
        return op, "index_put into a constant (folded at compile time)"
    found = tensors_problem(op, [data, values], settings)
    if found:
        return found
    if op.attrs.accumulate:
        return op, "index_put with accumulate=True: LPX scatters rows, it does not add them"
    shape = expr_shape(data)
    if len(shape) != 2:
        return op, f"index_put into a {len(shape)}-D value: LPX scatters rows of a 2-D value"
    d = shape[1]
    if not isinstance(rows.ty, relax.TensorType) or rows.ty.dtype != "int32" or \
            static_shape(rows.ty) is None or len(static_shape(rows.ty)) != 2 or static_shape(rows.ty)[1] != 1:
        return op, f"index_put by row indices of type {rows.ty}: LPX scatters by int32 indices of shape (N, 1)"
    n = static_shape(rows.ty)[0]
    whole_rows = is_const(cols) and cols.value.numpy().reshape(-1).tolist() == list(range(d)) and \
        tuple(cols.value.numpy().shape) in ((1, d), (d,))
    if not whole_rows:
        return op, "index_put of part of a row: LPX scatters whole rows (columns arange(D))"
    if tuple(expr_shape(values)) != (n, d):
        return op, f"index_put of values of shape {expr_shape(values)} into rows of {shape} by {n} indices"
    lines = settings.config.lines_per_slice
    if shape[0] * settings.activation_bytes > lines:  # a stored row takes one line per byte
        return op, (f"index_put into a value of {shape[0]} rows: a column tile of it must fit one slice "
                    f"({lines} lines)")
    return None


# Keys: ``input`` (the 2-D value), ``rows`` (int32 (N, 1)), ``cols`` (constant
# ``arange(D)``), ``values``, ``root``.
register_pattern(OpPattern("index_put", _index_put_pattern, None, (_index_put_check,), priority=75,
                           zero_d=True))

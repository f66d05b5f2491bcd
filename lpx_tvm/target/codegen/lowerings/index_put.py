"""A decoder's KV cache written at the position, in place when this is the cache's last
use: ``index_put`` of whole rows by runtime int32 row indices (a value cache: one
``mem.scatter`` per row), and the new columns of a key cache stored transposed
(``cache * keep + k^T @ columns``: one MXM pass and one VXM blend per lane tile)."""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple, wildcard

from ....errors import SramFull
from ....machine.isa import DType
from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..registry import OpPattern, register_lowering, register_pattern
from ..pattern_checks import tensors_problem
from ..relax_exprs import expr_shape, is_const, static_shape
from ..storage import Stored, one, slices_of
from ...sram_plan import chunk_span, spread_chunks
from ..values import copy_value, whole_groups


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
    lay = x.tensor.layout
    if lay.nchunks != 1 and not lay.margin:
        raise UnsupportedOnLPX(f"index_put into a value of {r} rows: a column tile spans several slices "
                               "without the spare rows a scatter per chunk needs (a step's value cache has them)")
    if v.tensor.layout.dtype != x.tensor.layout.dtype:
        raise UnsupportedOnLPX(f"index_put of {v.tensor.layout.dtype.short} rows into a "
                               f"{x.tensor.layout.dtype.short} value")
    y, in_place = _written_in_place(ctx, op, data, x, is_output)
    # The scatter reads the indices and the rows side by side: a slice has one read port,
    # so rows that share a slice with the indices are read from a copy elsewhere.
    idx_slices = {sl for sl, _ in idx.layout.tiles}
    if idx_slices & {sl for sl, _ in v.tensor.layout.tiles}:
        v = ctx.temp(copy_value(ctx, v, f"{op.out}.rows", avoid=(Stored(idx, tuple(rows.shape)),)))
    n, lanes = rows.shape[0], ctx.cfg.lanes
    for b0 in range(0, n, lanes):
        b1 = min(n, b0 + lanes)
        for j in range(y.tensor.ntiles):
            # The new rows as they lie (a prefill's rows may be cut into chunks), each
            # piece with its own indices.
            for s0, rows_span in v.tensor.segments(j, b0, b1):
                for q in range(lay.nchunks):
                    g = ctx.builder.group(f"{op.out}.scatter")
                    index = g.read(one(idx.segments(0, s0, s0 + rows_span.count)))
                    if lay.nchunks > 1:
                        index = chunk_index(g, index, lay, q)
                    g.scatter(g.read(rows_span), index, chunk_span(y.tensor.layout, j, q))
    ctx.values[op.out] = Stored(y.tensor, tuple(op.shape))
    if in_place:
        ctx.updated_in_place.add(op.out)


def chunk_index(g, index, layout, q: int):
    """Row indices into chunk ``q`` of ``layout`` (a value spread over slices, one scatter
    a chunk): a row the chunk holds goes to its line, any other to a spare row of the
    chunk's margins (below the chunk for a row before it, past it for one after), which
    no read of the value's rows sees. Three int32 VXM passes in the scatter's group."""
    _, r0, count = layout.chunk(0, q)
    m = layout.margin
    local = g.vxm("vxm.add", index, imm=m - r0)  # vector m + r - r0 of the chunk with its margins
    local = g.vxm("vxm.max", local, imm=m - 1)
    return g.vxm("vxm.min", local, imm=m + count)


def _written_in_place(ctx: LoweringContext, op: RegionOp, data, x: Stored, is_output: bool) -> tuple:
    """(the value to write into, whether it is ``data``'s own lines): ``data`` itself when
    no later op reads it and no other live value (a reshape alias) shares it, else a copy."""
    in_place = ctx.last_use.get(data.name, -1) <= ctx.op_index and \
        all(s.tensor.base is not x.tensor.base for name, s in ctx.values.items() if name != data.name)
    return (x if in_place else copy_value(ctx, x, op.out, is_output)), in_place


@register_lowering("lpx.cache_columns")
def lower_cache_columns(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """``cache * keep + kt @ columns``: a key cache stored transposed (``D`` rows of ``N``
    positions) with the step's ``T`` new keys (``kt``, ``D`` x ``T``) written into the
    columns the one-hot ``columns`` (``T`` x ``N``) name, and ``keep`` (1 x ``N``) 0 there.
    The cache is written where it lies, ``D`` rows a lane tile: no transpose of its ``N``
    rows. Exact: each new value is one key times 1, each old one times 1 or 0.

    One new key (a decode step, batch 1): key ``r`` broadcast to every lane of row ``r``
    (SXM), times the one-hot row, plus the old row times ``keep``, in one pass. Several
    (a prompt, a batch): ``columns``' rows installed and ``kt``'s ``D`` rows multiplied
    through the MXM, each drained row blended with the old one in the same pass."""
    ops = [op.main] + op.epilogue
    mul = next(o for o in ops if o.op == "multiply")
    mm = next(o for o in ops if o.op == "matmul")
    data, keep = mul.args
    if math.prod(data.shape) < math.prod(keep.shape):
        data, keep = keep, data
    kt, cols = mm.args
    d, n = data.shape
    t = cols.shape[0]
    lanes, b = ctx.cfg.lanes, ctx.builder
    x = ctx.value(data)
    y, in_place = _written_in_place(ctx, op, data, x, is_output)
    # Read side by side in one group: each on slices of its own (a slice has one read port).
    kv = _clear_of(ctx, ctx.value(keep), [y], f"{op.out}.keep")
    try:
        a = _clear_of(ctx, ctx.value(kt), [y, kv], f"{op.out}.kt")
    except SramFull:
        # Several new keys are multiplied in groups of their own, which read no cache: a
        # copy clear of it only spares their reads (a batch's cache may take every slice).
        if t == 1:
            raise
        a = ctx.value(kt)
    oh = _clear_of(ctx, ctx.value(cols), [y, kv, a], f"{op.out}.columns") if t == 1 else \
        whole_groups(ctx, ctx.value(cols), t, f"{op.out}.columns")
    assert ctx.mxm_dtype(op) == y.tensor.layout.dtype == a.tensor.layout.dtype == oh.tensor.layout.dtype, \
        "the cache_columns pattern takes operands of the cache's dtype"
    for j in range(y.tensor.ntiles):
        if t > 1:
            ctx.macs += d * t * min(lanes, n - j * lanes)
            plane, acc = ctx.planes.new_block(d)
            for k0 in range(0, t, lanes):  # the new keys, a lane tile of them at a time
                k1 = min(t, k0 + lanes)
                buf = ctx.planes.buffer(plane)
                b.install(f"{op.out}.install", plane, buf, [(r - k0, span) for r, span in oh.tensor.segments(j, k0, k1)],
                          width=min(n - j * lanes, lanes))
                for r0, span in a.tensor.segments(k0 // lanes, 0, d):
                    g = b.group(f"{op.out}.mul")
                    g.mul(plane, buf, g.read(span), acc=acc + r0, accumulate=k0 > 0)
        for r0, span in y.tensor.segments(j, 0, d):
            g = b.group(f"{op.out}.blend")
            if t == 1:
                new = g.sxm("sxm.broadcast", g.read(one(a.tensor.segments(0, r0, r0 + span.count))), lane=0)
                new = g.vxm("vxm.mul", new, g.read(oh.tensor.tile(j).repeat(span.count)))
            else:
                new = g.drain(plane, acc + r0, span.count, ctx.acc_dtype(op))
                new = g.vxm("vxm.cvt", new, to=y.tensor.layout.dtype)
            kept = g.vxm("vxm.mul", g.read(span), g.read(kv.tensor.tile(j).repeat(span.count)))
            g.write(g.vxm("vxm.add", new, kept), span)
    ctx.values[op.out] = Stored(y.tensor, tuple(op.shape))
    if in_place:
        ctx.updated_in_place.add(op.out)


def _clear_of(ctx: LoweringContext, x: Stored, others: list, tag: str) -> Stored:
    """``x``, or a copy of it clear of the slices of ``others``."""
    if set(slices_of([x])) & set(slices_of(others)):
        return ctx.temp(copy_value(ctx, x, tag, avoid=others))
    return x


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
    cfg, w = settings.config, settings.activation_bytes
    spread = spread_chunks(cfg, shape[0], w)  # as a step's value cache is spread; a stored row: a line a byte
    if spread.fullest > cfg.lines_per_slice:
        return op, (f"index_put into a value of {shape[0]} rows: a column tile of it, spread over {spread.slices} "
                    f"slices, must fit them ({cfg.lines_per_slice} lines each)")
    return None


# Keys: ``input`` (the 2-D value), ``rows`` (int32 (N, 1)), ``cols`` (constant
# ``arange(D)``), ``values``, ``root``.
register_pattern(OpPattern("index_put", _index_put_pattern, None, (_index_put_check,), priority=75,
                           zero_d=True))


def _cache_columns_pattern():
    data, keep, kt, cols = wildcard(), wildcard(), wildcard(), wildcard()
    kept = is_op("relax.multiply")(data, keep)
    new = is_op("relax.matmul")(kt, cols)
    root = is_op("relax.add")(kept, new)  # as the decoder step writes it
    return root, {"input": data, "keep": keep, "kt": kt, "columns": cols, "root": root}


def _cache_columns_check(a, settings):
    """``cache * keep + kt @ columns`` of runtime 2-D values: the cache (D, N), ``keep``
    (1, N), ``kt`` (D, T), ``columns`` (T, N)."""
    op, data, keep, kt, cols = a["root"], a["input"], a["keep"], a["kt"], a["columns"]
    if any(is_const(e) for e in (data, keep, kt, cols)):
        return op, "a key cache's columns written with a constant operand"
    found = tensors_problem(op, [data, keep, kt, cols], settings)
    if found:
        return found
    shapes = [tuple(expr_shape(e)) for e in (data, keep, kt, cols)]
    (d, n), t = shapes[0], shapes[3][0] if len(shapes[3]) == 2 else None
    if any(len(sh) != 2 for sh in shapes) or shapes[1] != (1, n) or shapes[2] != (d, t) or shapes[3] != (t, n):
        return op, (f"cache * keep + kt @ columns of shapes {shapes}: LPX writes a key cache's columns as "
                    "(D, N) * (1, N) + (D, T) @ (T, N)")
    return None


# Keys: ``input`` (the key cache, stored transposed), ``keep``, ``kt`` (the new keys,
# transposed), ``columns`` (one-hot), ``root``. Tried before the dense patterns, which would
# take its product.
register_pattern(OpPattern("cache_columns", _cache_columns_pattern, None, (_cache_columns_check,), priority=112))

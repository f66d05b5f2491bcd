"""``take`` of rows of a constant table by runtime int32 indices (a decoder's token
embedding, and its position tables at a runtime position): ``mem.gather`` on the
table's slices, the indices put one per vector by an SXM transpose."""

from __future__ import annotations

import math

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ....machine.isa import DType
from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..row_passes import write_rows
from ..registry import OpPattern, register_lowering, register_pattern
from ..pattern_checks import type_problem
from ..relax_exprs import expr_shape, is_const, static_shape
from ..storage import Stored, one
from ..values import new_value
from ...sram_plan import SPREAD_MARGIN, chunk_span
from .index_put import chunk_index


def _place_table(ctx: LoweringContext, op: RegionOp):
    """The table read by gather: each lane tile one run of lines on one slice (a gather
    addresses one slice) when a slice still has room for it; else cut into chunks on
    several slices, each between spare rows of zeros (one gather a chunk: see
    :func:`lower_take`), as when a batch's key caches already take a part of every slice."""
    table = op.main.args[0].const
    whole = ctx.builder.sram.allocator.constant_fits(table.shape[0] * DType.parse(ctx.dtype).itemsize)
    return ctx.builder.constant(f"{op.out}.table", table, ctx.dtype, spread=1,
                                margin=0 if whole else SPREAD_MARGIN)


@register_lowering("take", weights=_place_table)
def lower_take(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """``take(table, indices, axis=0)``: the indices (one row of int32 lanes, or one per
    row) become one vector each with the index in lane 0, which every column tile's
    gather reads; the gathered rows are written in index order."""
    table, idx = op.main.args
    assert table.is_const and len(table.shape) == 2 and int(op.main.attrs.get("axis", 0) or 0) == 0, \
        "the take pattern gathers rows of a constant 2-D table"
    x = ctx.value(idx)
    if x.tensor.layout.dtype != DType.INT32:
        raise UnsupportedOnLPX(f"take with {x.tensor.layout.dtype.short} indices (LPX gathers by int32)")
    n = math.prod(idx.shape) if idx.shape else 1
    lanes = ctx.cfg.lanes
    t = ctx.weights[op.out]  # placed with the weights (_place_table)
    if t.layout.nchunks != 1 and not t.layout.margin:
        raise UnsupportedOnLPX(f"take from a table of {table.shape[0]} rows: a column tile spans several slices "
                               "without the spare rows a gather per chunk needs")
    # Chunks after the first read the rows so far beside the indices and the table.
    y = new_value(ctx, op.out, op.shape, is_output,
                  avoid=[x, Stored(t, tuple(table.shape))] if t.layout.margin else ())
    rows_per_index = x.tensor.layout.cols == 1  # indices stored one per row: already in lane 0
    layout = t.layout
    for b0 in range(0, n, lanes):
        b1 = min(n, b0 + lanes)
        for j in range(t.ntiles):
            # A table with spare rows (in chunks): one gather a chunk, each index made local
            # to it, so a row the chunk does not hold reads a spare row of zeros; each
            # chunk's rows added to the sum so far (a row is its own chunk's row plus
            # zeros: exact). A sum in one group would need the gathers' rows at one cycle.
            for q in range(layout.nchunks):
                g = ctx.builder.group(f"{op.out}.gather")
                if rows_per_index:
                    index = g.read(one(x.tensor.segments(0, b0, b1)))
                else:
                    # One vector of indices (lanes b0..b1 of the row) -> b1 - b0 vectors, index in lane 0.
                    if x.tensor.layout.rows != 1:
                        raise UnsupportedOnLPX(f"take by indices of shape {idx.shape}")
                    row = g.read(one(x.tensor.segments(b0 // lanes, 0, 1)))
                    index = g.sxm("sxm.transpose", row, out=b1 - b0)
                if not layout.margin:
                    got = g.gather(index, t.tile(j))
                else:
                    got = g.gather(chunk_index(g, index, layout, q), chunk_span(layout, j, q))
                    if q:
                        got = g.vxm("vxm.add", g.read(one(y.tensor.segments(j, b0, b1))), got)
                write_rows(ctx, g, got, y, j, b0, b1)
    ctx.values[op.out] = y


# ---- patterns ---------------------------------------------------------------------------


def _take_pattern():
    table, indices = wildcard(), wildcard()
    root = is_op("relax.take")(table, indices)
    return root, {"input": table, "indices": indices, "root": root}


def _take_check(a, settings):
    op, table, idx = a["root"], a["input"], a["indices"]
    if not is_const(table):
        return op, "take from a runtime tensor: LPX gathers rows of a constant 2-D table"
    if len(expr_shape(table)) != 2:
        return op, (f"take from a {len(expr_shape(table))}-D constant: LPX gathers rows of a 2-D table, "
                    "and installs a matrix of a 3-D stack only for a product by it (docs/moe.md)")
    if op.attrs.axis is None or int(op.attrs.axis) != 0:
        return op, "take along an axis other than 0: LPX gathers whole rows"
    problem = type_problem(op.ty, settings)
    if problem:
        return op, problem
    if not isinstance(idx.ty, relax.TensorType) or idx.ty.dtype != "int32" or static_shape(idx.ty) is None:
        return op, f"take by indices of type {idx.ty}: LPX gathers by static-shape int32 indices"
    shape = static_shape(idx.ty)
    if is_const(idx) or len(shape) > 2 or (len(shape) == 2 and shape[-1] != 1):
        return op, f"take by indices of shape {shape}: LPX gathers by a row of indices or one per row"
    rows = expr_shape(table)[0]
    lines = settings.config.lines_per_slice
    if rows * settings.activation_bytes > lines:  # a stored row takes one line per byte
        return op, f"take from a table of {rows} rows: a column tile of it must fit one slice ({lines} lines)"
    return None


# Keys: ``input`` (the constant table), ``indices`` (int32), ``root``.
register_pattern(OpPattern("take", _take_pattern, None, (_take_check,), priority=74, zero_d=True))

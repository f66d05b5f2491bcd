"""``take`` of rows of a constant table by runtime int32 indices (a decoder's token
embedding, and its position tables at a runtime position): ``mem.gather`` on the
table's slices, the indices put one per vector by an SXM transpose."""

from __future__ import annotations

import math

from ....machine.isa import DType
from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..row_passes import write_rows
from ..registry import register_lowering
from ..storage import one
from ..values import new_value


@register_lowering("take")
def lower_take(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """``take(table, indices, axis=0)``: the indices (one row of int32 lanes, or one per
    row) become one vector each with the index in lane 0, which every column tile's
    gather reads; the gathered rows are written in index order."""
    table, idx = op.main.args
    if not table.is_const or len(table.shape) != 2 or int(op.main.attrs.get("axis", 0) or 0) != 0:
        raise UnsupportedOnLPX("take on LPX gathers rows of a constant 2-D table")
    x = ctx.value(idx)
    if x.tensor.layout.dtype != DType.INT32:
        raise UnsupportedOnLPX(f"take with {x.tensor.layout.dtype.short} indices (LPX gathers by int32)")
    n = math.prod(idx.shape) if idx.shape else 1
    lanes = ctx.cfg.lanes
    t = ctx.weights[op.out]  # placed with the weights (weights.place_weights)
    if t.layout.nchunks != 1:
        raise UnsupportedOnLPX(f"take from a table of {table.shape[0]} rows: a column tile spans several slices")
    y = new_value(ctx, op.out, op.shape, is_output)
    rows_per_index = x.tensor.layout.cols == 1  # indices stored one per row: already in lane 0
    for b0 in range(0, n, lanes):
        b1 = min(n, b0 + lanes)
        for j in range(t.ntiles):
            g = ctx.builder.group(f"{op.out}.gather")
            if rows_per_index:
                index = g.read(one(x.tensor.segments(0, b0, b1)))
            else:
                # One vector of indices (lanes b0..b1 of the row) -> b1 - b0 vectors, index in lane 0.
                if x.tensor.layout.rows != 1:
                    raise UnsupportedOnLPX(f"take by indices of shape {idx.shape}")
                row = g.read(one(x.tensor.segments(b0 // lanes, 0, 1)))
                index = g.sxm("sxm.transpose", row, out=b1 - b0)
            write_rows(ctx, g, g.gather(index, t.tile(j)), y, j, b0, b1)
    ctx.values[op.out] = y

"""``nn.softmax`` over the last axis, numerically stable, in fp32 on the VXM."""

from __future__ import annotations

from ..lowering_context import LoweringContext
from ..graph import RegionOp
from ..row_passes import finish, reduce_tiles
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..pattern_checks import last_axis_rows_problem
from ..relax_exprs import expr_shape
from ..storage import chunk_of, one, runs
from ..values import new_value


@register_lowering("nn.softmax")
def lower_softmax(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Per run of rows, the row maximum over every lane tile (``reduce_max`` fills its
    vector with it), then exp(x - max) kept in fp32 with its running row sum, whose
    reciprocal the same pass writes, then the scaling by it: three passes over the rows,
    each a step of a decode step's chain."""
    x = ctx.value(op.main.args[0])
    assert not x.nhwc, "the softmax pattern refuses 4-D values (their last axis spans vectors)"
    lay = x.tensor.layout
    rows, cols, lanes, f32 = lay.rows, lay.cols, ctx.cfg.lanes, ctx.acc
    mx = ctx.temp(new_value(ctx, f"{op.out}.max", (rows, lanes), avoid=[x], dtype=f32))
    ex = ctx.temp(new_value(ctx, f"{op.out}.exp", (rows, cols), avoid=[x, mx], dtype=f32))
    sm = ctx.temp(new_value(ctx, f"{op.out}.sum", (rows, lanes), avoid=[x, mx, ex], dtype=f32))
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[ex, sm])
    tag = op.out
    tensors = [x.tensor, mx.tensor, ex.tensor, sm.tensor, y.tensor]
    seg = lambda v, j, r0, r1: one(v.tensor.segments(j, r0, r1))  # noqa: E731
    for r0, r1 in runs(rows, lambda r: tuple(chunk_of(t, r) for t in tensors)):
        reduce_tiles(ctx, f"{tag}.max", x, mx, r0, r1, "vxm.reduce_max", "vxm.max")

        def exp(g, j, v, read):  # exp(x - max), kept for the scaling
            e = g.vxm("vxm.exp", g.vxm("vxm.sub", v, read(seg(mx, 0, r0, r1))))
            g.write(e, seg(ex, j, r0, r1))
            return e
        reduce_tiles(ctx, f"{tag}.exp", x, sm, r0, r1, "vxm.reduce_sum", "vxm.add", each=exp,
                     last=lambda g, v: g.vxm("vxm.recip", v), written=ex)
        for j in range(x.tensor.ntiles):
            g = ctx.builder.group(f"{tag}.scale")
            v = g.vxm("vxm.mul", g.read(seg(ex, j, r0, r1)), g.read(seg(sm, 0, r0, r1)))
            finish(g, v, seg(y, j, r0, r1))
    ctx.values[op.out] = y


# ---- patterns ---------------------------------------------------------------------------


def _softmax_check(a, settings):
    op = a["root"]
    shape = expr_shape(a["input"])
    rank = len(shape)
    if int(op.attrs.axis) % max(rank, 1) != rank - 1:
        return op, f"softmax over axis {int(op.attrs.axis)} of a {rank}-D tensor: LPX reduces the last axis"
    return last_axis_rows_problem(op, shape, settings, "softmax")


register_pattern(OpPattern("softmax", lambda: unary_pattern("relax.nn.softmax"), checks=(_softmax_check,),
                           priority=72, zero_d=True))

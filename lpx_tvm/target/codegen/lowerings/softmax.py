"""``nn.softmax`` over the last axis, numerically stable, in fp32 on the VXM."""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ..lowering_context import LoweringContext
from ..graph import RegionOp
from ..row_passes import finish, reduce_tiles, rowwise
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..pattern_checks import last_axis_rows_problem
from ..relax_exprs import expr_shape, is_const
from ..storage import chunk_of, one, runs
from ..values import apart, new_value


@register_lowering("nn.softmax")
def lower_softmax(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Per run of rows, the row maximum over every lane tile (``reduce_max`` fills its
    vector with it), then exp(x - max) kept in fp32 with its running row sum, whose
    reciprocal the same pass writes, then the scaling by it: three passes over the rows,
    each a step of a decode step's chain."""
    _softmax(ctx, op, [ctx.value(op.main.args[0])], is_output)


@register_lowering("lpx.softmax_of_sum")
def lower_softmax_of_sum(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """``softmax(a + b)``: a row of one lane tile has the add read in the softmax's two
    reading passes (a tile of each, added in their dtype as the add would) instead of a
    pass of its own, one step fewer on a decode step's chain (its scores are ``q @
    cache`` plus the new key's). A longer row is added first: read in the passes, two
    terms' tiles a group must all lie on different slices, so a group holds half as many
    tiles (a Llama-3-8B TP8 stage at 4k, 13 tiles a row, lost 8% that way)."""
    a = ctx.value(op.main.args[0])
    b = apart(ctx, ctx.value(op.main.args[1]), a, op.out)
    if a.tensor.ntiles == 1:
        _softmax(ctx, op, [a, b], is_output)
        return
    total = ctx.temp(new_value(ctx, f"{op.out}.sum", a.shape, avoid=[a, b], dtype=a.tensor.layout.dtype))
    rowwise(ctx, f"{op.out}.add", [a, b], total, lambda g, vs: g.vxm("vxm.add", vs[0], vs[1]))
    _softmax(ctx, op, [total], is_output)


def _softmax(ctx: LoweringContext, op: RegionOp, terms: list, is_output: bool):
    """The softmax of the sum of ``terms`` (values of one shape on different slices)."""
    x = terms[0]
    assert not any(t.nhwc for t in terms), "the softmax patterns refuse 4-D values (their last axis spans vectors)"
    lay = x.tensor.layout
    rows, cols, lanes, f32 = lay.rows, lay.cols, ctx.cfg.lanes, ctx.acc
    mx = ctx.temp(new_value(ctx, f"{op.out}.max", (rows, lanes), avoid=terms, dtype=f32))
    ex = ctx.temp(new_value(ctx, f"{op.out}.exp", (rows, cols), avoid=[*terms, mx], dtype=f32))
    sm = ctx.temp(new_value(ctx, f"{op.out}.sum", (rows, lanes), avoid=[*terms, mx, ex], dtype=f32))
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[ex, sm])
    tag = op.out
    tensors = [*(t.tensor for t in terms), mx.tensor, ex.tensor, sm.tensor, y.tensor]
    seg = lambda v, j, r0, r1: one(v.tensor.segments(j, r0, r1))  # noqa: E731
    for r0, r1 in runs(rows, lambda r: tuple(chunk_of(t, r) for t in tensors)):
        reduce_tiles(ctx, f"{tag}.max", terms, mx, r0, r1, "vxm.reduce_max", "vxm.max")

        def exp(g, j, v, read):  # exp(x - max), kept for the scaling
            e = g.vxm("vxm.exp", g.vxm("vxm.sub", v, read(seg(mx, 0, r0, r1))))
            g.write(e, seg(ex, j, r0, r1))
            return e
        reduce_tiles(ctx, f"{tag}.exp", terms, sm, r0, r1, "vxm.reduce_sum", "vxm.add", each=exp,
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


def _softmax_of_sum_pattern():
    lhs, rhs = wildcard(), wildcard()
    total = is_op("relax.add")(lhs, rhs)
    root = is_op("relax.nn.softmax")(total)
    return root, {"input": total, "lhs": lhs, "rhs": rhs, "root": root}


def _sum_check(a, settings):
    """Two runtime values of the softmax's own shape and dtype: no broadcast, no constant."""
    total = a["input"]
    for side in ("lhs", "rhs"):
        if is_const(a[side]) or expr_shape(a[side]) != expr_shape(total) or a[side].ty.dtype != total.ty.dtype:
            return total, "an add before a softmax of values not both of its shape: the add runs alone"
    return None


register_pattern(
    OpPattern("softmax", lambda: unary_pattern("relax.nn.softmax"), checks=(_softmax_check,), priority=72,
              zero_d=True),
    # ``softmax(a + b)`` with a and b of one shape: the add read in the softmax's passes.
    OpPattern("softmax_of_sum", _softmax_of_sum_pattern, ("lhs", "rhs"), (_sum_check, _softmax_check),
              priority=98, zero_d=True))

"""``argmax`` over the last axis, to int32 (greedy sampling of a decoder's next token):
exact, first index on ties, with no comparison op on the VXM."""

from __future__ import annotations

import math

import numpy as np
from tvm.relax.dpl import is_op, wildcard

from ....machine.isa import DType
from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..row_passes import reduce_tiles
from ..registry import OpPattern, register_lowering, register_pattern
from ..pattern_checks import last_axis_rows_problem, type_problem
from ..relax_exprs import expr_shape
from ..storage import Stored, chunk_of, one, runs, slices_of
from ..values import copy_value, new_value


# (m - x) * 2^100 * 2^100 is at least 2^51 for any positive fp32 difference (the smallest
# is 2^-149) and exactly 0 at a maximum: min(., 1) marks the lanes that are not maxima.
_HUGE = 2.0 ** 100
# Added to the index of a lane that is not a maximum: above every index (vocabularies
# are far below 2^24, where fp32 holds every integer exactly).
_NOT_MAX = 2.0 ** 24


def iota_vector(ctx: LoweringContext, cols: int):
    """A constant row of the lane indices 0 .. cols-1 in fp32 (one per width)."""
    key = ("iota", cols)
    if key not in ctx.fills:
        ctx.fills[key] = ctx.builder.constant(f"iota{cols}", np.arange(cols, dtype=np.float32)[None, :], DType.FP32)
    return ctx.fills[key]


@register_lowering("argmax")
def lower_argmax(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Per run of rows: the row maximum m over every lane tile, then the row minimum of
    ``j + min((m - x_j) * 2^200, 1) * 2^24`` (as the maximum of its negation), whose value is
    the first index where x equals m; converted to int32."""
    x = ctx.value(op.main.args[0])
    assert not x.nhwc, "the argmax pattern refuses 4-D values (their last axis spans vectors)"
    assert [s.op for s in op.epilogue] == ["astype"] and op.dtype == "int32", \
        "the argmax pattern takes argmax then astype int32 only"
    lay = x.tensor.layout
    rows, cols, lanes, f32 = lay.rows, lay.cols, ctx.cfg.lanes, DType.FP32
    if cols >= _NOT_MAX:
        raise UnsupportedOnLPX(f"argmax over {cols} values (at most {int(_NOT_MAX) - 1})")
    mx = ctx.temp(new_value(ctx, f"{op.out}.max", (rows, lanes), avoid=[x], dtype=f32))
    neg = ctx.temp(new_value(ctx, f"{op.out}.first", (rows, lanes), avoid=[x, mx], dtype=f32))
    y = new_value(ctx, op.out, (rows, 1), is_output, avoid=[neg], dtype=DType.INT32)
    # One row of a vector's lane indices, which every tile's group reads once (tile j adds
    # j * lanes): on a slice apart from the tiles, the row maximum and the running result.
    iota = iota_vector(ctx, lanes)
    if {sl for sl, _ in iota.layout.tiles} & set(slices_of([x, mx, neg])):
        iota = ctx.temp(copy_value(ctx, Stored(iota, (1, lanes)), f"{op.out}.iota", avoid=[x, mx, neg])).tensor
    tensors = [x.tensor, mx.tensor, neg.tensor, y.tensor]
    for r0, r1 in runs(rows, lambda r: tuple(chunk_of(t, r) for t in tensors)):
        reduce_tiles(ctx, f"{op.out}.max", x, mx, r0, r1, "vxm.reduce_max", "vxm.max")
        m = one(mx.tensor.segments(0, r0, r1))

        def first(g, j, v, read):  # -(j + not_max * 2^24)
            gap = g.vxm("vxm.sub", read(m), v)
            gap = g.vxm("vxm.mul", g.vxm("vxm.mul", gap, imm=_HUGE), imm=_HUGE)
            not_max = g.vxm("vxm.min", gap, imm=1.0)
            index = g.vxm("vxm.add", g.vxm("vxm.mul", not_max, imm=_NOT_MAX), read(iota.tile(0).repeat(r1 - r0)))
            return g.vxm("vxm.mul", g.vxm("vxm.add", index, imm=float(j * lanes)), imm=-1.0)
        reduce_tiles(ctx, f"{op.out}.first", x, neg, r0, r1, "vxm.reduce_max", "vxm.max", each=first)
        g = ctx.builder.group(f"{op.out}.index")
        v = g.vxm("vxm.mul", g.read(one(neg.tensor.segments(0, r0, r1))), imm=-1.0)
        g.write(g.vxm("vxm.cvt", v, to=DType.INT32), one(y.tensor.segments(0, r0, r1)))
    ctx.values[op.out] = type(y)(y.tensor, op.shape)


# ---- patterns ---------------------------------------------------------------------------


def _argmax_pattern():
    data = wildcard()
    root = is_op("relax.argmax")(data)
    cast = is_op("relax.astype")(root)
    return cast, {"input": data, "root": root, "cast": cast}


def _argmax_check(a, settings):
    op, cast = a["root"], a["cast"]
    problem = type_problem(a["input"].ty, settings)
    if problem:
        return op, problem
    shape = expr_shape(a["input"])
    rank = len(shape)
    if op.attrs.axis is None or int(op.attrs.axis) % max(rank, 1) != rank - 1:
        return op, "argmax over all axes or not the last one: LPX reduces the last axis"
    if cast.ty.dtype != "int32":
        return cast, f"argmax as {cast.ty.dtype}: LPX gives int32 indices"
    rows = math.prod(shape[:-1])
    if rows > 1 and not bool(op.attrs.keepdims):
        return op, "argmax of several rows without keepdims (the indices would be stored across lanes)"
    return last_axis_rows_problem(op, shape, settings, "argmax")


# Keys: ``input``, ``root`` (the ``argmax``), ``cast`` (the ``astype`` to int32).
register_pattern(OpPattern("argmax", _argmax_pattern, None, (_argmax_check,), priority=73, zero_d=True))

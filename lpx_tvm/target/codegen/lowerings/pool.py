"""Poolings: max and average pooling over windows (VXM, one tap per group), and the
global average pooling (``mean`` over H and W) as pixel sums on the MXM."""

from __future__ import annotations

import numpy as np

from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..mxm_tiles import pixel_sums
from ..padding import padded
from ..row_passes import finish, write_rows
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..relax_exprs import expr_shape
from ..rules import spatial_mean_problem
from ..storage import Stored, chunk_of, one, runs, slices_of
from ..values import apart, new_value


@register_lowering("nn.max_pool2d", "nn.avg_pool2d", banding="window")
def lower_pool(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Max or average pooling: fold the window taps into an fp32 accumulator one tap per
    group (the taps of one image share a slice, so they cannot stream together), then
    scale (average) and convert."""
    a = op.main.attrs
    assert a.get("layout", "NCHW") == "NCHW" and not a.get("ceil_mode", False), \
        "the pooling pattern takes NCHW, floor mode only"
    is_max = op.main.op == "nn.max_pool2d"
    x = ctx.value(op.main.args[0])
    n, c, h, w = x.shape
    kh, kw = a["pool_size"]
    (sh, sw), (dh, dw) = a["strides"], a["dilation"]
    pads = tuple(a["padding"])
    xp = padded(ctx, x, pads, op.out, fill=-np.inf if is_max else 0.0)
    hp, wp = xp.shape[2], xp.shape[3]
    oh, ow = op.shape[2], op.shape[3]
    total = ctx.temp(new_value(ctx, f"{op.out}.acc", op.shape, avoid=[xp], dtype=ctx.acc))
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[total], dtype=x.tensor.layout.dtype if ctx.int8 else None)
    lanes = ctx.cfg.lanes
    scale_t = None
    if not is_max:
        if a.get("count_include_pad", False) or not any(pads):
            scale = np.full(oh * ow, 1.0 / (kh * kw), np.float32)
        else:  # taps that fall on padding do not count
            inside = np.zeros((hp, wp), np.float32)
            inside[pads[0]:pads[0] + h, pads[1]:pads[1] + w] = 1
            counts = [[inside[i * sh:i * sh + (kh - 1) * dh + 1:dh, j * sw:j * sw + (kw - 1) * dw + 1:dw].sum()
                       for j in range(ow)] for i in range(oh)]
            scale = 1.0 / np.array(counts, np.float32).reshape(-1)
        scale_map = np.repeat(np.tile(scale, n)[:, None], lanes, axis=1)
        scale_t = Stored(ctx.temp(ctx.builder.tensor(f"{op.out}.scale", (n * oh * ow, lanes), ctx.acc,
                                                     data=scale_map, avoid=slices_of([total]), row_align=ow)),
                         (n, lanes, oh, ow))
    combine = "vxm.max" if is_max else "vxm.add"
    if scale_t is not None:
        scale_t = apart(ctx, scale_t, total, op.out)
    for i in range(n):
        firsts = [(t, (i * hp + (t // kw) * dh) * wp + (t % kw) * dw) for t in range(kh * kw)]

        # Run by run of output rows, all taps then the result: the next layer can start
        # on the first rows while later ones are pooled.
        def chunks(o):
            row = (i * oh + o) * ow
            key = [chunk_of(xp.tensor, f + o * sh * wp) for _, f in firsts]
            key += [chunk_of(total.tensor, row), chunk_of(y.tensor, row)]
            return tuple(key + ([chunk_of(scale_t.tensor, row)] if scale_t is not None else []))
        for o0, o1 in runs(oh, chunks):
            r0, r1 = (i * oh + o0) * ow, (i * oh + o1) * ow
            for j in range(x.tensor.ntiles):
                out = one(total.tensor.segments(j, r0, r1))
                for t, first in firsts:
                    g = ctx.builder.group(f"{op.out}.pool")
                    win = one(xp.tensor.window_segments(j, first + o0 * sh * wp, o1 - o0, ow, sh * wp, sw))
                    v = g.read(win)
                    if v.dtype != ctx.acc:
                        v = g.vxm("vxm.cvt", v, to=ctx.acc)
                    if t:
                        v = g.vxm(combine, v, g.read(out))
                    g.write(v, out)
                g = ctx.builder.group(f"{op.out}.pool")
                v = g.read(out)
                if scale_t is not None:
                    v = g.vxm("vxm.mul", v, g.read(one(scale_t.tensor.segments(0, r0, r1))))
                finish(g, v, one(y.tensor.segments(j, r0, r1)))
    ctx.values[op.out] = y


@register_lowering("mean", banding="channels")
def lower_global_avg_pool(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Mean over H and W: the pixel sums of :func:`..mxm_tiles.pixel_sums` against a
    column of 1/(H*W)."""
    a = op.main.attrs
    x = ctx.value(op.main.args[0])
    problem = spatial_mean_problem(len(x.shape), a.get("axis", []))
    if problem:
        raise UnsupportedOnLPX(problem)
    hw = x.shape[2] * x.shape[3]
    column = ctx.temp(ctx.builder.constant(f"{op.out}.scale", np.full((ctx.cfg.lanes, 1), 1.0 / hw, np.float32),
                                           ctx.dtype))
    y = new_value(ctx, op.out, op.shape, is_output)
    for g, v, i, j in pixel_sums(ctx, op.out, x, column, ctx.acc):
        write_rows(ctx, g, v, y, j, i, i + 1)
    ctx.values[op.out] = y


# ---- patterns ---------------------------------------------------------------------------


def pool2d_check(a, settings):
    pool = a["root"]
    attrs = pool.attrs
    if len(expr_shape(a["input"])) != 4:
        return pool, "pooling input is not 4-D"
    if (attrs.layout, attrs.out_layout or attrs.layout) != ("NCHW", "NCHW"):
        return pool, f"layout {attrs.layout}/{attrs.out_layout}: LPX pooling takes NCHW"
    if attrs.ceil_mode:
        return pool, "ceil_mode=True: LPX pooling windows follow floor mode only"
    if any(int(d) != 1 for d in attrs.dilation):
        return pool, f"dilation {tuple(attrs.dilation)}: dilated pooling is not supported"
    return None


def global_avg_pool2d_check(a, settings):
    mean = a["root"]
    rank = len(expr_shape(a["input"]))
    problem = spatial_mean_problem(rank, mean.attrs.axis or range(rank))
    return (mean, problem) if problem else None


register_pattern(
    *(OpPattern(op, lambda op=op: unary_pattern(f"relax.nn.{op}"), checks=(pool2d_check,), priority=60,
                zero_d=True) for op in ("max_pool2d", "avg_pool2d")),
    OpPattern("global_avg_pool2d", lambda: unary_pattern("relax.mean"), checks=(global_avg_pool2d_check,),
              priority=61, zero_d=True),
)

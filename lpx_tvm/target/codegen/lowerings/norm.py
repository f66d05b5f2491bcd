"""``nn.layer_norm`` and ``nn.rms_norm`` over the last axis, in fp32 on the VXM."""

from __future__ import annotations

import numpy as np

from ..lowering_context import LoweringContext
from ..graph import RegionOp
from ..row_passes import finish, reduce_tiles
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..pattern_checks import last_axis_rows_problem
from ..relax_exprs import expr_shape, is_const, op_name
from ..storage import chunk_of, one, runs, slices_of
from ..values import new_value


@register_lowering("nn.layer_norm", "nn.rms_norm")
def lower_norm(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """LayerNorm per run of rows: the mean (lane sums of every tile), the centered values
    kept in fp32 with their running sum of squares, then 1 / sqrt(var + eps) and the
    per-column gamma and beta. RMSNorm (``nn.rms_norm``) is the same without the mean
    and beta."""
    x = ctx.value(op.main.args[0])
    a = op.main.attrs
    rms = op.main.op == "nn.rms_norm"
    assert not x.nhwc and [int(v) % len(x.shape) for v in a.get("axes", [-1])] == [len(x.shape) - 1], \
        "the norm patterns take the last axis of a value that is not 4-D"
    lay = x.tensor.layout
    rows, cols, lanes, f32 = lay.rows, lay.cols, ctx.cfg.lanes, ctx.acc
    eps = float(a.get("epsilon", 1e-5))
    mean = None if rms else ctx.temp(new_value(ctx, f"{op.out}.mean", (rows, lanes), avoid=[x], dtype=f32))
    cen = ctx.temp(new_value(ctx, f"{op.out}.centered", (rows, cols), avoid=[x] + ([mean] if mean else []),
                             dtype=f32))
    var = ctx.temp(new_value(ctx, f"{op.out}.var", (rows, lanes), avoid=[x, cen] + ([mean] if mean else []),
                             dtype=f32))
    # gamma and beta, read beside the centered values and the scale (none when 1 and 0)
    affine = []
    params = [(op.main.args[1], True, 1.0, "vxm.mul")] if rms else \
        [(op.main.args[1], a.get("scale", True), 1.0, "vxm.mul"),
         (op.main.args[2], a.get("center", True), 0.0, "vxm.add")]
    for arg, use, neutral, vop in params:
        v = np.broadcast_to(np.asarray(arg.const, np.float32).reshape(-1), (cols,)) if use else None
        if v is not None and np.any(v != neutral):
            t = ctx.temp(ctx.builder.constant(f"{op.out}.{'gamma' if neutral else 'beta'}", v.reshape(1, cols),
                                              f32, avoid=slices_of([cen, var]) +
                                              [sl for _, u in affine for sl, _ in u.layout.tiles]))
            affine.append((vop, t))
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[cen, var])
    tag = op.out
    tensors = [t.tensor for t in (x, mean, cen, var, y) if t is not None]
    seg = lambda v, j, r0, r1: one(v.tensor.segments(j, r0, r1))  # noqa: E731
    for r0, r1 in runs(rows, lambda r: tuple(chunk_of(t, r) for t in tensors)):
        n = r1 - r0
        if not rms:
            reduce_tiles(ctx, f"{tag}.mean", x, mean, r0, r1, "vxm.reduce_sum", "vxm.add", scale=1.0 / cols)

        def squares(g, j, v, read):  # x - mean (x for RMSNorm), kept; its square, summed
            if rms:  # through the VXM (x * 1, exact) when read as is: it flows one way from there
                d = v if v.node.op.startswith("vxm.") else g.vxm("vxm.mul", v, imm=1.0)
            else:
                d = g.vxm("vxm.sub", v, read(seg(mean, 0, r0, r1)))
            g.write(d, seg(cen, j, r0, r1))
            return g.vxm("vxm.mul", d, d)
        # 1 / sqrt(var + eps) in the pass that sums the squares (no pass of its own).
        reduce_tiles(ctx, f"{tag}.var", x, var, r0, r1, "vxm.reduce_sum", "vxm.add", each=squares, scale=1.0 / cols,
                     last=lambda g, v: g.vxm("vxm.rsqrt", g.vxm("vxm.add", v, imm=eps)), written=cen)
        for j in range(x.tensor.ntiles):
            # One pass a tile: the centered values, the scale and gamma (and beta) each
            # read through its own slice's port.
            g = ctx.builder.group(f"{tag}.affine")
            v = g.vxm("vxm.mul", g.read(seg(cen, j, r0, r1)), g.read(seg(var, 0, r0, r1)))
            for vop, t in affine:
                v = g.vxm(vop, v, g.read(t.tile(j).repeat(n)))
            finish(g, v, seg(y, j, r0, r1))
    ctx.values[op.out] = y


# ---- patterns ---------------------------------------------------------------------------


def _norm_check(a, settings):
    """layer_norm (data, gamma, beta) and rms_norm (data, weight) over the last axis."""
    op = a["root"]
    data, *params = op.args
    what = op_name(op).removeprefix("nn.")
    if not all(is_const(p) for p in params):
        return op, f"{what} with a runtime " + ("gamma or beta" if len(params) == 2 else "weight")
    shape = expr_shape(data)
    rank = len(shape)
    if [int(ax) % max(rank, 1) for ax in op.attrs.axes] != [rank - 1]:
        return op, f"{what} over axes {[int(x) for x in op.attrs.axes]}: LPX normalizes the last axis"
    return last_axis_rows_problem(op, shape, settings, what)


register_pattern(*(OpPattern(op, lambda op=op: unary_pattern(f"relax.nn.{op}"), checks=(_norm_check,),
                             priority=80, zero_d=True) for op in ("layer_norm", "rms_norm")))

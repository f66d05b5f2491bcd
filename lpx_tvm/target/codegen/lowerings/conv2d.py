"""``nn.conv2d`` through its scheduled TensorIR tiles: dense convolutions (taps as
reduction tiles, or packed several to a tile by a tuned tiling), grouped ones as a
dense convolution with a block-diagonal weight, depthwise ones (:mod:`.depthwise`),
and image stems whose input arrives as im2col rows (one matmul)."""

from __future__ import annotations

import numpy as np

from ....machine.isa import Unit
from ....machine.timing import unit_count
from ....tir_schedules import DenseTiling
from ....tir_schedules.schedules import taps_per_tile
from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..lanes import lane_pass
from ..mxm_tiles import conv_tiles, conv_workload, emit_mxm, layer_tiling, matmul, tuned_pack
from ..padding import padded
from ..registry import register_lowering
from ..rules import grouped_conv_problem, is_depthwise
from ..storage import Stored, chunk_of, one, runs
from .depthwise import lower_depthwise


@register_lowering("nn.conv2d", banding="window")
def lower_conv2d(ctx: LoweringContext, op: RegionOp, is_output: bool, q=None):
    """A convolution; ``q`` (int8): the zero-point fill, int32 epilogue and output dtype."""
    a = op.main.attrs
    if a.get("data_layout", "NCHW") != "NCHW" or a.get("kernel_layout", "OIHW") != "OIHW":
        raise UnsupportedOnLPX("conv2d layouts other than NCHW/OIHW")
    x = ctx.value(op.main.args[0])
    w = np.asarray(op.main.args[1].const, np.float32)
    if op.main.args[0].name in ctx.im2col_values:
        return _conv_from_im2col(ctx, op, x, w, is_output, q)
    groups = a.get("groups", 1)
    if groups != 1:
        if is_depthwise(groups, x.shape[1], w.shape):
            return lower_depthwise(ctx, op, x, w, is_output, q)
        # Any other grouping runs as a dense conv with a block-diagonal weight
        # (built by weights.weight_matrix): the MXM also multiplies the zeros between groups.
        problem = grouped_conv_problem(groups, x.shape[1], w.shape[0])
        if problem:
            raise UnsupportedOnLPX(problem)
    n, c, h, wd = x.shape
    co, cg, kh, kw = w.shape
    lanes = ctx.cfg.lanes
    work = conv_workload(ctx, x.shape, w.shape, a)
    oh, ow = work.OH, work.OW
    t = layer_tiling(ctx, op, work)
    pack = tuned_pack(ctx, op, work)
    xp = padded(ctx, x, tuple(a["padding"]), op.out, fill=q.fill if q else 0.0, spread=bool(pack))
    ctx.macs += n * oh * ow * co * cg * kh * kw  # useful MACs: cg = c / groups
    if pack == "taps":
        return _conv_taps_packed(ctx, op, xp, work, t, c, co, is_output, q)
    per = taps_per_tile(work, lanes, pack) if pack == "rows" else 1
    image = _row_image(ctx, op, xp, work, t, c, per) if pack == "rows" else None
    steps, window, block, tiling = conv_tiles(ctx, work, t, xp, per, image)

    def weights(step):
        # Row (tap * c + ci) of the weight matrix: input channel ci at one tap.
        kh0, kw0, ci0, co0 = (step.reads["W"][d][0] for d in range(4))
        base = (kh0 * kw + kw0) * c + ci0
        return co0 // lanes, base, base + min(c - ci0, lanes) * min(per, kw - kw0)  # rows packing: the row's taps

    emit_mxm(ctx, op, steps, window, weights, block, co, is_output, tiling, q=q)


def _conv_taps_packed(ctx: LoweringContext, op: RegionOp, xp: Stored, work, t, c: int, co: int, is_output: bool,
                      q=None):
    """A convolution with its taps packed into reduction tiles: an im2col built on chip
    (one row per output pixel; tile k holds taps k*T .. side by side, ``c`` lanes
    each), then one matmul with the packed weight matrix (:mod:`..weights`).

    Each im2col tile is written one tap at a time (:func:`..lanes.lane_pass`): an SXM moves
    the tap's channels to its lanes (``sxm.pad``: zeros elsewhere, so the lanes past
    the channels, unspecified in the image, never reach the sum), and the VXM adds the
    tile written so far; the passes alternate between the SXMs. The padded image is spread over
    slices so that passes of different row blocks read through different ports."""
    lanes = ctx.cfg.lanes
    (sh, sw), (dh, dw) = work.stride, work.dilation
    hp, wp, oh, ow = work.Hp, work.Wp, work.OH, work.OW
    taps = [(a, b) for a in range(work.KH) for b in range(work.KW)]
    per = taps_per_tile(work, lanes, "taps")
    tiles = [taps[i:i + per] for i in range(0, len(taps), per)]
    rows = work.N * oh * ow
    n_sxm = unit_count(ctx.cfg, Unit.SXM)
    cols = ctx.temp(ctx.builder.tensor(f"{op.out}.im2col", (rows, len(tiles) * lanes), xp.tensor.layout.dtype,
                                       row_align=ow, spread=ctx.options.spread,
                                       avoid=[sl for sl, _ in xp.tensor.layout.tiles]))  # read side by side

    def first(i, r, tap):  # the image vector tap ``tap`` reads for output row r, column 0
        return (i * hp + r * sh + tap[0] * dh) * wp + tap[1] * dw

    passes = 0
    for i in range(work.N):
        for r0 in range(0, oh, t.oh):  # the matmul's blocks: a block's rows are ready early
            r1 = min(oh, r0 + t.oh)
            for k, tile in enumerate(tiles):
                for slot, tap in enumerate(tile):
                    def key(r):
                        return chunk_of(cols, (i * oh + r) * ow), chunk_of(xp.tensor, first(i, r, tap))

                    for ra, rb in runs(r1 - r0, lambda r: key(r0 + r)):
                        ra, rb = r0 + ra, r0 + rb
                        src = one(xp.tensor.window_segments(0, first(i, ra, tap), rb - ra, ow, sh * wp, sw))
                        dst = one(cols.segments(k, (i * oh + ra) * ow, (i * oh + rb) * ow))
                        lane_pass(ctx, f"{op.out}.im2col", src, dst, slot * c, c, passes % n_sxm, add=slot > 0)
                        passes += 1
    order = {"noc": "mnk", "nco": "nmk"}[t.order]
    tiling = DenseTiling(m=t.oh * ow, k=lanes, n=lanes, order=order, k_split=t.k_split,
                         first_plane=t.first_plane, install_ahead=t.install_ahead)
    matmul(ctx, op, Stored(cols, (rows, len(tiles) * lanes)), rows, len(tiles) * lanes, co, is_output, q=q,
           tiling=tiling)


def _row_image(ctx: LoweringContext, op: RegionOp, xp: Stored, work, t, c: int, per: int):
    """The image of a convolution whose kernel rows are packed: R
    whose pixel p holds the padded image's pixels p, p + d, .. p + (P-1) d side by side
    (``c`` lanes each; d the horizontal dilation), with the padded image's layout. Each
    reduction tile then multiplies P taps of one kernel row by reading R at that row's
    offset (:func:`..mxm_tiles.conv_tiles`; a last tap of the row left alone reads the image itself).

    R is built in passes, one per neighbour: an SXM moves the neighbour's channels to
    its lanes (``sxm.pad``, zeros elsewhere) and the VXM adds what earlier passes
    wrote; passes alternate between the SXMs, band by band of image rows in the order
    the output blocks need them."""
    lanes = ctx.cfg.lanes
    (sh, _), (dh, dw) = work.stride, work.dilation
    hp, wp, oh = work.Hp, work.Wp, work.OH
    n_sxm = unit_count(ctx.cfg, Unit.SXM)
    image = ctx.temp(ctx.builder.tensor(f"{op.out}.rows", (work.N * hp * wp, lanes), xp.tensor.layout.dtype,
                                        row_align=wp, spread=ctx.options.spread,
                                        avoid=[sl for sl, _ in xp.tensor.layout.tiles]))  # read side by side
    passes = 0
    for i in range(work.N):
        built = 0
        for r0 in range(0, oh, t.oh):
            need = min(hp, (min(oh, r0 + t.oh) - 1) * sh + (work.KH - 1) * dh + 1)
            for s in range(per):  # neighbour s of every pixel of image rows built .. need
                width = wp - s * dw  # pixels whose neighbour s is on their own image row

                def key(r):
                    return chunk_of(xp.tensor, (i * hp + r) * wp), chunk_of(image, (i * hp + r) * wp)

                for ra, rb in runs(need - built, lambda r: key(built + r)):
                    ra, rb = built + ra, built + rb
                    src = one(xp.tensor.window_segments(0, (i * hp + ra) * wp + s * dw, rb - ra, width, wp))
                    dst = one(image.window_segments(0, (i * hp + ra) * wp, rb - ra, width, wp))
                    lane_pass(ctx, f"{op.out}.rows", src, dst, s * c, c, passes % n_sxm, add=s > 0)
                    passes += 1
            built = need
    return image


def _conv_from_im2col(ctx: LoweringContext, op: RegionOp, x: Stored, w: np.ndarray, is_output: bool, q=None):
    """A convolution whose input arrives as im2col rows: a dense matmul with the
    (taps x channels, out channels) weight matrix."""
    co, cg, kh, kw = w.shape
    matmul(ctx, op, x, x.tensor.layout.rows, kh * kw * cg, co, is_output, q=q)

"""``nn.conv2d`` through its scheduled TensorIR tiles: dense convolutions (taps as
reduction tiles, or packed several to a tile by a tuned tiling), grouped ones as a
dense convolution with a block-diagonal weight, depthwise ones (:mod:`.depthwise`),
and image stems whose input arrives as im2col rows (one matmul)."""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import is_op, wildcard

from ....machine.isa import Unit
from ....machine.timing import unit_count
from ....tir_schedules import DenseTiling, round_up
from ....tir_schedules.schedules import taps_per_tile
from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..lanes import lane_pass
from ..mxm_tiles import conv_tiles, conv_workload, emit_mxm, layer_tiling, matmul, tuned_pack
from ..padding import padded
from ..quant import mxm_view
from ..registry import OpPattern, register_lowering, register_pattern
from ..pattern_checks import EPILOGUE_VARIANTS, epilogue_checks, epilogue_name, epilogue_pattern, same_dtype_problem
from ..relax_exprs import expr_shape, is_const
from ..rules import block_diagonal, grouped_conv_problem, is_depthwise
from ..storage import Stored, chunk_of, one, runs
from ..weights import place_matrix
from .depthwise import lower_depthwise


def _place_weights(ctx: LoweringContext, op: RegionOp):
    """The weight matrix as the lowering reads it, placed (:func:`~..weights.place_matrix`):
    row (tap * c + ci) of a dense convolution, whole taps per chunk (or lane tiles) so no
    K tile straddles slices; a diagonal tile per tap of a depthwise one; a block-diagonal
    weight for other groupings; a tuned packing's rows or tiles of taps."""
    view = mxm_view(op)  # an int8 composite as its integer conv2d
    args, a = view.main.args, view.main.attrs
    if len(args) < 2 or not args[1].is_const:
        return None
    lanes = ctx.cfg.lanes
    align = lanes
    w = np.asarray(args[1].const, np.float32)
    co, cg, kh, kw = w.shape
    c, groups = args[0].shape[1], a.get("groups", 1)
    depthwise = is_depthwise(groups, c, w.shape)
    if groups != 1 and not depthwise:
        w = block_diagonal(w, groups)  # other groupings are lowered as a dense conv
        co, cg, kh, kw = w.shape
    if depthwise:
        cpad = round_up(c, lanes)
        # Row (tap * cpad + ch) holds w[ch, tap] at lane ch % lanes: a diagonal tile per tap.
        diag = np.zeros((kh * kw, cpad, lanes), np.float32)
        diag[:, np.arange(c), np.arange(c) % lanes] = w.reshape(c, kh * kw).T
        return place_matrix(ctx, op, diag.reshape(-1, lanes), align)
    matrix = w.transpose(2, 3, 1, 0).reshape(-1, co)
    im2col = args[0].name in ctx.im2col_values  # one matmul: whole lane tiles
    align = lanes if cg % lanes == 0 or kh * kw == 1 or im2col else cg
    work = None if im2col else conv_workload(ctx, args[0].shape, w.shape, a)
    pack = "" if im2col else tuned_pack(ctx, view, work)
    if pack == "rows":
        align = kw * c  # a kernel row's taps (one reduction tile, or two) never straddle slices
    elif pack == "taps":
        # Reduction tile t holds taps t*T .. side by side, c rows each (the lanes of the
        # on-chip im2col), zero rows after the last tap.
        per, taps = taps_per_tile(work, lanes, pack), kh * kw
        tiles = np.zeros((-(-taps // per) * per, c, co), np.float32)
        tiles[:taps] = matrix.reshape(taps, c, co)
        tiles = tiles.reshape(-1, per * c, co)
        matrix = np.zeros((len(tiles), lanes, co), np.float32)
        matrix[:, :per * c] = tiles
        matrix, align = matrix.reshape(-1, co), lanes
    return place_matrix(ctx, op, matrix, align)


@register_lowering("nn.conv2d", banding="window", weights=_place_weights)
def lower_conv2d(ctx: LoweringContext, op: RegionOp, is_output: bool, q=None):
    """A convolution; ``q`` (int8): the zero-point fill, int32 epilogue and output dtype."""
    a = op.main.attrs
    assert a.get("data_layout", "NCHW") == "NCHW" and a.get("kernel_layout", "OIHW") == "OIHW", \
        "the conv2d patterns take NCHW / OIHW"
    x = ctx.value(op.main.args[0])
    w = np.asarray(op.main.args[1].const, np.float32)
    if op.main.args[0].name in ctx.im2col_values:
        return _conv_from_im2col(ctx, op, x, w, is_output, q)
    groups = a.get("groups", 1)
    if groups != 1:
        if is_depthwise(groups, x.shape[1], w.shape):
            return lower_depthwise(ctx, op, x, w, is_output, q)
        # Any other grouping runs as a dense conv with a block-diagonal weight
        # (built by _place_weights): the MXM also multiplies the zeros between groups.
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


# ---- patterns ---------------------------------------------------------------------------


def _conv2d_pattern(bias=False, activation=None):
    data, weight = wildcard(), wildcard()
    conv = is_op("relax.nn.conv2d")(data, weight)
    return epilogue_pattern(conv, {"input": data, "weight": weight, "root": conv}, bias, activation)


def _conv2d_check(a, settings):
    conv, data, weight = a["root"], a["input"], a["weight"]
    found = same_dtype_problem(conv, data, weight, ("input", "weight"))
    if found:
        return found
    attrs = conv.attrs
    layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout or attrs.data_layout)
    if layouts != ("NCHW", "OIHW", "NCHW"):
        return conv, (
            f"layouts data={layouts[0]} weight={layouts[1]} out={layouts[2]}: "
            "LPX convolution takes NCHW activations and OIHW weights"
        )
    if not is_const(weight):
        return conv, (
            "weight is not a constant: LPX keeps conv weights in SRAM, fixed at compile time"
        )
    groups, cin, cout = int(attrs.groups), expr_shape(data)[1], expr_shape(weight)[0]
    problem = grouped_conv_problem(groups, cin, cout) if groups != 1 else None
    return (conv, problem) if problem else None


def _conv_bias_shapes(c):
    return [(1, c, 1, 1), (c, 1, 1)]


# ``lpx.conv2d[_bias][_relu|_clip]``: keys ``input``, ``weight`` (constant OIHW), ``root``
# (the ``nn.conv2d`` call), ``bias`` (constant), ``bias_add``, ``activation``. Above the
# single ops (the fused group wins when its checks accept), each variant above the
# smaller ones.
register_pattern(*(
    OpPattern(epilogue_name("conv2d", bias, act), lambda bias=bias, act=act: _conv2d_pattern(bias, act),
              ("input", "weight"), (_conv2d_check, *epilogue_checks(bias, act, _conv_bias_shapes)),
              priority=100 + 2 * i, zero_d=True)
    for i, (bias, act) in enumerate(EPILOGUE_VARIANTS)))

"""Where each MXM layer's weight matrix lives: resident in SRAM while the constants'
budget lasts, else streamed from off-chip memory. Placed before any working space (the
initial image must sit in lines working space never touches)."""

from __future__ import annotations

import numpy as np

from ...errors import SchedulingError
from ...machine.isa import DType
from ...machine.timing import install_lanes, nearest_vxm, planes_beside, slices_beside
from ...tir_schedules import round_up
from ...tir_schedules.schedules import taps_per_tile
from .lowering_context import LoweringContext
from .graph import RegionOp
from .mxm_tiles import conv_workload, dense_install_planes, tuned_pack
from .quant import mxm_view
from .rules import block_diagonal, is_depthwise
from .storage import StreamedWeights


def weight_matrix(ctx: LoweringContext, op: RegionOp) -> "tuple | None":
    """(matrix, row alignment) of an op's MXM weights as its lowering reads them, or None
    for an op without constant MXM weights."""
    lanes = ctx.cfg.lanes
    op = mxm_view(op)  # an int8 composite as its integer conv2d / matmul
    kind, args, a = op.main.op, op.main.args, op.main.attrs
    matrix, align = None, lanes
    if kind == "nn.conv2d" and len(args) > 1 and args[1].is_const:
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
            matrix = diag.reshape(-1, lanes)
        else:
            # Row (tap * c + ci): whole taps per chunk (or lane tiles) so no K tile straddles slices.
            matrix = w.transpose(2, 3, 1, 0).reshape(-1, co)
            im2col = args[0].name in ctx.im2col_values  # one matmul: whole lane tiles
            align = lanes if cg % lanes == 0 or kh * kw == 1 or im2col else cg
            work = None if im2col else conv_workload(ctx, args[0].shape, w.shape, a)
            pack = "" if im2col else tuned_pack(ctx, op, work)
            if pack == "rows":
                align = kw * c  # a kernel row's taps (one reduction tile, or two) never straddle slices
            elif pack == "taps":
                # Reduction tile t holds taps t*T .. side by side, c rows each (the lanes
                # of the on-chip im2col), zero rows after the last tap.
                per, taps = taps_per_tile(work, lanes, pack), kh * kw
                tiles = np.zeros((-(-taps // per) * per, c, co), np.float32)
                tiles[:taps] = matrix.reshape(taps, c, co)
                tiles = tiles.reshape(-1, per * c, co)
                matrix = np.zeros((len(tiles), lanes, co), np.float32)
                matrix[:, :per * c] = tiles
                matrix, align = matrix.reshape(-1, co), lanes
    elif kind == "matmul" and len(args) > 1 and args[1].is_const and len(args[1].shape) == 2:
        matrix = np.asarray(args[1].const, np.float32)
    return None if matrix is None else (matrix, align)


def install_pool(cfg, plane: int, lane: int, lanes: int) -> tuple:
    """The SRAM slice(s) install lane ``lane`` (of ``lanes``) of ``plane`` reads its weight
    rows from: the slices on the plane's side of the VXM, dealt out in turn to the lanes
    of the planes on that side. Planes installing at once, and the lanes of one plane,
    then read through different slices' ports, and no weight crosses the VXM. A lane
    reads one chunk at a time: one slice per lane of the widest case (int8, a lane per
    install stream) is enough, and the side's slices beyond those, the ones nearest the
    VXM, are left to the working space (the layer's input and output, K parts' sums),
    whose reads would otherwise hold a port an install part needs for all its rows."""
    planes = planes_beside(cfg, plane)
    slices = slices_beside(cfg, plane)
    k, n = planes.index(plane) * lanes + lane, len(planes) * lanes
    widest = len(planes) * install_lanes(cfg, DType.INT8)
    if len(slices) > widest:
        slices = sorted(nearest_vxm(cfg, slices)[-widest:])  # the farthest from the VXM
    return tuple(slices[k::n]) if len(slices) >= n else (slices[k % len(slices)],)


def _install_pools(ctx: LoweringContext, op: RegionOp, matrix, align: int):
    """For a dense layer whose every weight tile one plane installs: chunk (column tile
    ``j``, ``q``) -> the pool of the plane and lane that install it (None otherwise)."""
    view = mxm_view(op)
    if view.main.op != "matmul" or align != ctx.cfg.lanes:
        return None
    x = view.main.args[0].shape
    rows = int(np.prod(x[:-1]))
    k, nn = matrix.shape
    planes = dense_install_planes(ctx, view, rows, k, nn)
    lanes = install_lanes(ctx.cfg, ctx.mxm_dtype(op))
    per = -(-min(align, k) // lanes)  # a chunk's rows (builder.tensor's install_align cut)
    chunks = -(-align // per)

    def pools(j, q):
        plane = planes.get((j, q // chunks))
        return None if plane is None else install_pool(ctx.cfg, plane, q % chunks, lanes)

    return pools if planes else None


def place_weights(ctx: LoweringContext, op: RegionOp):
    """The MXM weight matrix of an op, placed (None for vector ops): an SRAM tensor while
    the budget lasts, else :class:`~.storage.StreamedWeights`."""
    if op.main.op == "take":
        # A table read by gather: each lane tile one run of lines on one slice (a gather
        # addresses one slice), placed while the slices are still empty.
        table = op.main.args[0].const
        return ctx.builder.constant(f"{op.out}.table", table, ctx.dtype, spread=1)
    found = weight_matrix(ctx, op)
    if found is None:
        return None
    matrix, align = found
    lanes = ctx.cfg.lanes
    dtype = ctx.mxm_dtype(op)
    rows, cols = matrix.shape
    lines = -(-cols // lanes) * rows * dtype.itemsize
    held = ctx.builder.resident(matrix.shape, dtype, matrix, align, align)
    if held is not None:  # already resident (another program of the chip placed it): it costs nothing
        return held
    share = ctx.options.offchip_weight_budget if ctx.offchip else ctx.options.weight_budget
    budget = share * ctx.cfg.mem_slices * ctx.cfg.lines_per_slice
    if ctx.builder.constant_lines + lines <= budget:
        try:
            # Reduction tiles spread over slices, each cut over the plane's install lanes on
            # different slices: planes, and the lanes of one plane, read through different
            # slices' ports at once (installs at the plane's full rate).
            return ctx.builder.tensor(f"{op.out}.weight", matrix.shape, dtype, data=matrix, row_align=align,
                                      spread=ctx.options.weight_spread, install_align=align,
                                      install_pools=_install_pools(ctx, op, matrix, align))
        except SchedulingError:
            pass
    return StreamedWeights.place(ctx.builder, matrix, dtype, lanes)

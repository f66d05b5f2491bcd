"""Where each MXM layer's weight matrix lives: resident in SRAM while the constants'
budget lasts, else streamed from off-chip memory. Placed before any working space (the
initial image must sit in lines working space never touches)."""

from __future__ import annotations

import numpy as np

from ...errors import SchedulingError
from ...machine.isa import DType
from ...machine.timing import install_lanes, nearest_vxm, planes_beside, slices_beside
from .lowering_context import LoweringContext
from .graph import RegionOp
from .mxm_tiles import dense_install_planes
from .quant import mxm_view
from .registry import weights_of
from .storage import StreamedWeights


def install_pool(cfg, plane: int, lane: int, lanes: int) -> tuple:
    """The SRAM slice(s) install lane ``lane`` (of ``lanes``) of ``plane`` reads its weight
    rows from: the slices on the plane's side of the VXM, dealt out in turn to the lanes
    of the planes on that side. Planes installing at once, and the lanes of one plane,
    then read through different slices' ports, and no weight crosses the VXM. A lane
    reads one chunk at a time: one slice per lane of the widest case (int8, a lane per
    install stream) is enough, and the side's slices beyond those, the ones nearest the
    VXM, are left to the working space (the layer's input and output, K parts' sums),
    whose reads would otherwise hold a port an install part needs for all its rows
    (weights go there, :func:`install_pool_beyond`, once these are full)."""
    slices = slices_beside(cfg, plane)
    widest = _widest(cfg, plane)
    if len(slices) > widest:
        slices = sorted(nearest_vxm(cfg, slices)[-widest:])  # the farthest from the VXM
    return _dealt(cfg, slices, plane, lane, lanes)


def install_pool_beyond(cfg, plane: int, lane: int, lanes: int) -> tuple:
    """Where install lane ``lane`` of ``plane`` keeps its weight rows once its
    :func:`install_pool` is full (a chip holding more layers than those slices do): the
    side's next slices towards the VXM, as many again (one per int8 lane), dealt out to
    the lanes the same way, so that the planes and lanes still read through different
    ports and no weight crosses the VXM; the slices nearer still stay with the working
    space. None where the side has not that many (``tsp``: 12 beyond its pools)."""
    widest = _widest(cfg, plane)
    rest = nearest_vxm(cfg, slices_beside(cfg, plane))[:-widest]
    if len(rest) < widest:
        return ()
    return _dealt(cfg, sorted(rest[-widest:]), plane, lane, lanes)  # the farthest of the rest


def _widest(cfg, plane: int) -> int:
    """Install lanes of the planes on ``plane``'s side in the widest case (int8): the
    slices a tier of pools holds, one a lane."""
    return len(planes_beside(cfg, plane)) * install_lanes(cfg, DType.INT8)


def _dealt(cfg, slices: list, plane: int, lane: int, lanes: int) -> tuple:
    """``slices`` dealt out in turn to the ``lanes`` install lanes of each plane on
    ``plane``'s side: lane ``lane`` of ``plane``'s share (one of them when there are fewer
    slices than lanes)."""
    planes = planes_beside(cfg, plane)
    k, n = planes.index(plane) * lanes + lane, len(planes) * lanes
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

    def pools(j, q):  # in the order to try, each made only when the one before is full
        plane = planes.get((j, q // chunks))
        return () if plane is None else (tier(ctx.cfg, plane, q % chunks, lanes)
                                         for tier in (install_pool, install_pool_beyond))

    return pools if planes else None


def place_weights(ctx: LoweringContext, op: RegionOp):
    """The constants an op's lowering reads (its MXM weight matrix, a gather's table),
    placed before any working space as its family lays them out
    (:func:`~.registry.weights_of`); None for an op without."""
    place = weights_of(mxm_view(op))  # an int8 composite as its integer conv2d / matmul
    return None if place is None else place(ctx, op)


def place_matrix(ctx: LoweringContext, op: RegionOp, matrix, align: int):
    """An op's MXM weight matrix (rows cut at multiples of ``align`` between slices):
    an SRAM tensor while the budget lasts, else :class:`~.storage.StreamedWeights`."""
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

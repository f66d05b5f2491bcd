"""Region values in SRAM: allocating, copying, freeing, and keeping operands that are
read side by side on different slices (a slice has one read port)."""

from __future__ import annotations

import math

from ...errors import SramFull
from ...machine.isa import DType
from ...machine.timing import nearest_vxm
from ..builder import OffchipTensor
from .lowering_context import LoweringContext
from .row_passes import rowwise
from .storage import Stored, row_align, slices_of, stored_shape


# A sequence's value (2-D or 3-D) of this many rows or more keeps its column tiles (and
# row chunks) on distinct slices where there is room: a prefill's activations (a row per
# token), read by a product a tile at a time, once per column block. A decode step's row
# or few rows are read in a few cycles anyway; images keep the allocator's packing.
APART_ROWS = 16


def constant_beside(ctx: LoweringContext, name: str, array, first, dtype: DType = DType.FP32):
    """A constant row read beside ``first`` (another constant row) in one drain, tile by
    tile: clear of every slice of ``first``, or, where ``first``'s tiles already cover
    every slice (e.g. 256 channels on 16 lanes), clear of the slice of the same tile."""
    slices = [sl for sl, _ in first.layout.tiles]
    if len(set(slices)) < ctx.builder.config.mem_slices:
        return ctx.builder.constant(name, array, dtype, avoid=slices)
    return ctx.builder.constant(name, array, dtype, tile_avoid=[{sl} for sl in slices])


def new_value(ctx: LoweringContext, name: str, shape: tuple, is_output: bool = False, avoid=(),
              dtype=None, beside=None, drained: bool = False) -> Stored:
    """A new value of logical ``shape`` (an output binding when ``is_output``), clear of
    the slices of the values in ``avoid`` — or, when those cover every slice with room
    (a value of many column tiles spreads over all of them), each column tile clear of
    the slices of the tiles of ``avoid`` read beside it (:func:`beside_slices`; ``beside``
    names those tiles when the default rule does not know them). An output binding goes
    next to the VXM. ``drained``: the MXM planes write it (a product's output)."""
    stored, dt = stored_shape(shape), dtype or ctx.dtype
    ntiles = -(-stored[-1] // ctx.cfg.lanes)
    tall = len(shape) in (2, 3) and not ctx.offchip and math.prod(stored[:-1]) >= APART_ROWS
    kw = dict(role="output" if is_output else None, row_align=row_align(shape), spread=ctx.spread_of(shape),
              tiles_apart=tall)
    if tall and (name in ctx.multiplied or drained) and ntiles < ctx.cfg.mxm_planes:
        # Fewer column tiles than planes: the planes read (or drain) its rows side by
        # side, a row chunk each, each on its own slice.
        kw.update(spread=ctx.cfg.mxm_planes)
    if tall and name in ctx.installed and len(shape) == 2:
        # A product installs it: a tile's rows cut into a chunk per install lane, on
        # different slices, which then read at the install rate, not one port's.
        kw.update(row_align=1, install_align=ctx.cfg.lanes)
    clear = set(slices_of(avoid))
    near = nearest_vxm(ctx.cfg, [s for s in range(ctx.cfg.mem_slices) if s not in clear]) if is_output else []
    if near:
        # Read only by the host: nearest the VXM, which writes it (the far end of a side is
        # 44 hops away on tsp), tile j on the j-th nearest slice clear of ``avoid``.
        try:
            return Stored(ctx.builder.tensor(name, stored, dt, slices=near, **kw), shape)
        except SramFull:
            pass  # no room on those: wherever the allocator finds it
    try:
        t = ctx.builder.tensor(name, stored, dt, avoid=slices_of(avoid), **kw)
    except SramFull:
        if not avoid:
            raise
        t = ctx.builder.tensor(name, stored, dt, tile_avoid=beside_slices(avoid, ntiles, beside), **kw)
    return Stored(t, shape)


def beside_slices(values, ntiles: int, beside=None) -> list:
    """For each of ``ntiles`` column tiles of a new value, the slices of ``values`` a group
    reads beside that tile: the tiles ``beside[i][j]`` of value i when given, else tile j
    of a value with as many tiles, the single tile of a one-tile value (a per-row
    statistic read with every tile), else all of the value."""
    out = [set() for _ in range(ntiles)]
    for i, v in enumerate(values):
        per_tile = tile_slices(v)
        for j in range(ntiles):
            if beside is not None and beside[i] is not None:
                out[j] |= set().union(*(per_tile[t] for t in beside[i][j]))
            elif len(per_tile) == ntiles:
                out[j] |= per_tile[j]
            elif len(per_tile) == 1:
                out[j] |= per_tile[0]
            else:
                out[j] |= set(slices_of([v]))
    return out


def copy_value(ctx: LoweringContext, x: Stored, name: str, is_output: bool = False, avoid=(),
               slices=None) -> Stored:
    """A copy of ``x`` (on ``slices`` when given, one per column tile)."""
    # Reading x and writing the copy use a slice's two ports: they may share slices.
    if slices is None:
        y = new_value(ctx, name, x.shape, is_output, avoid=avoid, dtype=x.tensor.layout.dtype)
    else:
        y = Stored(ctx.builder.tensor(name, stored_shape(x.shape), x.tensor.layout.dtype, slices=slices,
                                      row_align=row_align(x.shape), role="output" if is_output else None), x.shape)
    rowwise(ctx, f"{name}.copy", [x], y, lambda g, vs: vs[0])
    return y


def release(ctx: LoweringContext, name: str):
    """Free a dead value's tensor unless another live value (a reshape alias, a view of
    its tiles) shares its lines."""
    tensor = ctx.values.pop(name).tensor
    if isinstance(tensor, OffchipTensor):
        return  # off-chip working space is not reused
    if all(v.tensor.base is not tensor.base for v in ctx.values.values()):
        ctx.builder.free(tensor.base)


def whole_groups(ctx: LoweringContext, x: Stored, rows: int, tag: str) -> Stored:
    """``x``, or a copy of it whose SRAM chunks hold whole groups of ``rows`` rows (a
    batch of a matmul operand or of a transpose, read a block at a time)."""
    lay = x.tensor.layout
    if lay.nchunks == 1 or lay.rows_per_chunk % rows == 0:
        return x
    y = Stored(ctx.temp(ctx.builder.tensor(tag, stored_shape(x.shape), lay.dtype, row_align=rows)), x.shape)
    rowwise(ctx, tag, [x], y, lambda g, vs: vs[0])
    return y


def tile_slices(v: Stored) -> list:
    """The slices each column tile of ``v`` sits on."""
    lay = v.tensor.layout
    return [{sl for sl, _ in lay.tiles[j * lay.nchunks:(j + 1) * lay.nchunks]} for j in range(v.tensor.ntiles)]


def clashes(x: Stored, other: Stored) -> bool:
    """Whether a column tile of ``x`` shares a slice with the same tile of ``other`` (both
    read in one group: a slice has one read port)."""
    lx, lo = x.tensor.layout, other.tensor.layout
    if (lx.rows, lx.rows_per_chunk, len(lx.tiles)) == (lo.rows, lo.rows_per_chunk, len(lo.tiles)):
        # Chunked alike: a group reads chunk q of both, so only equal chunks matter.
        if all(a[0] != b[0] for a, b in zip(lx.tiles, lo.tiles)):
            return False
    return any(a & b for a, b in zip(tile_slices(x), tile_slices(other)))


def apart(ctx: LoweringContext, x: Stored, other: Stored, tag: str) -> Stored:
    """``x``, or a copy of it on other slices when it clashes with ``other`` (see
    :func:`clashes`)."""
    if not clashes(x, other):
        return x
    xs, os_ = tile_slices(x), tile_slices(other)
    if x.tensor.layout.nchunks == 1 and other.tensor.layout.nchunks == 1 and len(xs) == len(os_):
        # Tile by tile, the least used slice that tile of ``other`` does not use.
        used = ctx.builder.slice_lines_used
        slices = [min((s for s in range(ctx.cfg.mem_slices) if s not in b), key=lambda s: (used[s], s))
                  for b in os_]
        try:
            return ctx.temp(copy_value(ctx, x, f"{tag}.apart", slices=slices))
        except SramFull:
            pass  # a slice's lines in use do not say it has a hole that long: anywhere clear of ``other``
    return ctx.temp(copy_value(ctx, x, f"{tag}.apart", avoid=[other]))

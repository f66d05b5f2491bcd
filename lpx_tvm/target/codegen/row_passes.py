"""Row-wise VXM passes over stored values: read rows, transform, write them back."""

from __future__ import annotations

import numpy as np

from .lowering_context import LoweringContext
from .storage import Stored, chunk_of, one, runs


def finish(g, y, out_region):
    """Write ``y`` to ``out_region``, converted to its dtype."""
    if y.dtype != out_region.dtype:
        y = g.vxm("vxm.cvt", y, to=out_region.dtype)
    g.write(y, out_region)


def write_rows(ctx: LoweringContext, g, v, y: Stored, j: int, r0: int, r1: int):
    """Write value ``v`` (rows r0..r1 of tile j) across the chunks it covers."""
    if v.dtype != y.tensor.layout.dtype:
        v = g.vxm("vxm.cvt", v, to=y.tensor.layout.dtype)
    segments = y.tensor.segments(j, r0, r1)
    mid = ctx.cfg.position("VXM")
    west = {ctx.cfg.position("MEM", region.slice) < mid for _, region in segments}
    # A VXM result flows one way: chunks on both sides of the VXM get a recomputed twin.
    twin = g.again(v) if len(west) == 2 and v.node.op.startswith("vxm.") else v
    for first, region in segments:
        src = twin if ctx.cfg.position("MEM", region.slice) < mid else v
        g.write(src.part(first - r0, region.count) if (first, region.count) != (r0, r1 - r0) else src, region)


def rowwise(ctx: LoweringContext, tag: str, inputs: list, y: Stored, body, tiles=None):
    """For each column tile and run of rows that sits in one chunk of every tensor:
    read the inputs' rows, ``body(group, values) -> value``, write it to ``y``."""
    rows = y.tensor.layout.rows
    # An input given as (value, tile) always supplies that column tile (e.g. a per-row scale).
    inputs = [x if isinstance(x, tuple) else (x, None) for x in inputs]
    tensors = [x.tensor for x, _ in inputs] + [y.tensor]
    for j in range(y.tensor.ntiles) if tiles is None else tiles:
        for r0, r1 in runs(rows, lambda r: tuple(chunk_of(t, r) for t in tensors)):
            g = ctx.builder.group(tag)
            vs = [g.read(one(x.tensor.segments(j if t is None else t, r0, r1))) for x, t in inputs]
            v = body(g, vs)
            finish(g, v, y.tensor.segments(j, r0, r1)[0][1])


def fill_vector(ctx: LoweringContext, value: float, dtype=None):
    """A constant vector of ``value`` in every lane (one per value, dtype and region)."""
    dtype = dtype or ctx.dtype
    if dtype.is_int and not np.isfinite(value):  # -inf of a max pooling: the dtype's least value
        value = float(np.iinfo(dtype.np).min if value < 0 else np.iinfo(dtype.np).max)
    key = (float(value), dtype)
    if key not in ctx.fills:
        ctx.fills[key] = ctx.builder.constant(f"fill{len(ctx.fills)}", np.full((1, ctx.cfg.lanes), key[0],
                                                                               np.float32), dtype)
    return ctx.fills[key]


# A max or min does not depend on its order: whole lane tiles are combined lane by lane
# first, up to TREE_TILES to a group as a tree, and reduced across lanes once per group.
# A sum keeps its order (its rounding is the reference's), and so does a reduction that
# transforms each tile (the transform may read other tensors through the same ports).
TREE_TILES = 4
TREE_COMBINES = ("vxm.max", "vxm.min")


def reduce_tiles(ctx: LoweringContext, tag: str, x: Stored, acc: Stored, r0: int, r1: int, reduce: str,
                 combine: str, each=None, scale=None, last=None):
    """Reduce rows r0 .. r1 of ``x`` across all its lanes into ``acc`` (fp32, one tile;
    the reduction fills each vector), one group per lane tile: the tile in fp32,
    transformed by ``each(group, tile, value)`` when given, reduced over its valid
    lanes, combined with the tiles before it, and multiplied by ``scale`` at the last,
    or transformed there by ``last(group, value)`` (in the same pass: no group of its own)."""
    lanes, f32, ntiles = ctx.cfg.lanes, ctx.acc, x.tensor.ntiles
    dst = one(acc.tensor.segments(0, r0, r1))
    cols = x.tensor.layout.cols
    runs = _tile_runs(x, r0, r1, dst.slice, ntiles, TREE_TILES if combine in TREE_COMBINES and each is None else 1)
    for k, run in enumerate(runs):
        g = ctx.builder.group(tag)
        tiles = []
        for j in run:
            v = g.read(one(x.tensor.segments(j, r0, r1)))
            v = v if v.dtype == f32 else g.vxm("vxm.cvt", v, to=f32)
            tiles.append((j, each(g, j, v) if each is not None else v))
        whole = [v for j, v in tiles if cols - j * lanes >= lanes]
        while len(whole) > 1:  # whole tiles lane by lane, pairwise
            whole = [g.vxm(combine, a, b) for a, b in zip(whole[::2], whole[1::2])] + whole[len(whole) // 2 * 2:]
        parts = [g.vxm(reduce, v, width=lanes) for v in whole]
        parts += [g.vxm(reduce, v, width=cols - j * lanes) for j, v in tiles if cols - j * lanes < lanes]
        v = parts[0]
        for p in parts[1:]:
            v = g.vxm(combine, v, p)
        if k:
            v = g.vxm(combine, v, g.read(dst))
        if scale is not None and k == len(runs) - 1:
            v = g.vxm("vxm.mul", v, imm=scale)
        if last is not None and k == len(runs) - 1:
            v = last(g, v)
        g.write(v, dst)


def _tile_runs(x: Stored, r0: int, r1: int, dst_slice: int, ntiles: int, most: int) -> list:
    """The lane tiles of rows r0 .. r1 cut into runs of at most ``most`` consecutive tiles
    on different slices (a group reads each through its own slice's port), the runs after
    the first also apart from the accumulator's slice (they read it)."""
    runs, used = [], set()
    for j in range(ntiles):
        sl = one(x.tensor.segments(j, r0, r1)).slice
        if not runs or len(runs[-1]) >= most or sl in used:
            runs.append([])
            used = {dst_slice} if len(runs) > 1 else set()  # (the accumulator lies apart from x)
        runs[-1].append(j)
        used.add(sl)
    return runs

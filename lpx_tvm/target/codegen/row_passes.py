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


# Whole lane tiles are combined lane by lane first, up to TREE_TILES to a group as a tree
# (SUM_TILES for a sum), and reduced across lanes once per group: one trip through SRAM
# for the running result per group instead of per tile (a 4k softmax's 13 tiles, a 70B
# norm's 26). Sums two to a group: four took a 70B TP8 layer at 4k from 10,837 cycles to
# 10,828 and two to 10,234, and a Llama-2-70B rack plan lost 4.5% at four (its stages'
# groups contend for ports and streams), none at two. A max or min
# does not depend on that order; a sum's rounding does, within fp32 (reference checks
# hold it to tolerances). A tile transformed on the way (``each``) may read a row every
# tile of its group reads too (a max, a mean): read once in the group, so the group's
# tiles are a power of two, each at the same depth of the tree, and the last, partial
# tile has a group of its own.
TREE_TILES = 4
SUM_TILES = 2
TREE_COMBINES = ("vxm.max", "vxm.min", "vxm.add")


def reduce_tiles(ctx: LoweringContext, tag: str, x, acc: Stored, r0: int, r1: int, reduce: str,
                 combine: str, each=None, scale=None, last=None, written=None):
    """Reduce rows r0 .. r1 of ``x`` across all its lanes into ``acc`` (fp32, one tile;
    the reduction fills each vector), a group per run of lane tiles (TREE_TILES, SUM_TILES): the
    tiles in fp32, each transformed by ``each(group, tile, value, read)`` when given
    (``read(region)`` reads a row the group's tiles share once), combined lane by lane,
    reduced over the valid lanes, combined with the runs before, and multiplied by
    ``scale`` at the last, or transformed there by ``last(group, value)`` (in the same
    pass: no group of its own). ``written``: a value ``each`` writes tile ``j`` of (a
    run's tiles then write different slices too). ``x`` may be a list of values of one
    shape on different slices: their sum, added as it is read (in their dtype, as an
    add of its own would)."""
    terms = x if isinstance(x, list) else [x]
    x = terms[0]
    lanes, ntiles = ctx.cfg.lanes, x.tensor.ntiles
    dst = one(acc.tensor.segments(0, r0, r1))
    cols = x.tensor.layout.cols
    most = 1 if combine not in TREE_COMBINES else SUM_TILES if combine == "vxm.add" else TREE_TILES
    runs = _tile_runs(terms, r0, r1, dst.slice, ntiles, most, written)
    if each is not None:
        runs = [part for run in runs for part in _even_runs(run, cols // lanes)]
    # A run whose group needs more stream registers than the machine has (wide rows, fp32
    # values each way) is halved until its group fits.
    kept = 0
    for i, run in enumerate(runs):
        pending = [run]
        while pending:
            part = pending.pop(0)
            final = i == len(runs) - 1 and not pending  # the scale or the transform, in the same pass
            g = _reduce_group(ctx, tag, terms, dst, r0, r1, part, reduce, combine, each, kept > 0,
                              scale if final else None, last if final else None)
            if len(part) == 1 or ctx.builder.fits_alone(g):
                ctx.builder.keep(g)
                kept += 1
            else:
                half = len(part) // 2
                pending[:0] = [part[:half], part[half:]]


def _reduce_group(ctx, tag, terms, dst, r0, r1, run, reduce, combine, each, after, scale=None, last=None):
    """The group reducing lane tiles ``run`` of rows r0 .. r1 of the sum of ``terms``
    into ``dst``, combined with ``dst``'s runs before (``after``); not yet in the program."""
    lanes, f32 = ctx.cfg.lanes, ctx.acc
    cols = terms[0].tensor.layout.cols
    g = ctx.builder.trial_group(tag)
    shared = {}

    def read(region):  # a row the run's tiles share, read once
        if region not in shared:
            shared[region] = g.read(region)
        return shared[region]

    tiles = []
    for j in run:
        v = g.read(one(terms[0].tensor.segments(j, r0, r1)))
        for t in terms[1:]:
            v = g.vxm("vxm.add", v, g.read(one(t.tensor.segments(j, r0, r1))))
        v = v if v.dtype == f32 else g.vxm("vxm.cvt", v, to=f32)
        tiles.append((j, each(g, j, v, read) if each is not None else v))
    whole = [v for j, v in tiles if cols - j * lanes >= lanes]
    while len(whole) > 1:  # whole tiles lane by lane, pairwise
        whole = [g.vxm(combine, a, b) for a, b in zip(whole[::2], whole[1::2])] + whole[len(whole) // 2 * 2:]
    parts = [g.vxm(reduce, v, width=lanes) for v in whole]
    parts += [g.vxm(reduce, v, width=cols - j * lanes) for j, v in tiles if cols - j * lanes < lanes]
    v = parts[0]
    for p in parts[1:]:
        v = g.vxm(combine, v, p)
    if after:
        v = g.vxm(combine, v, g.read(dst))
    if scale is not None:
        v = g.vxm("vxm.mul", v, imm=scale)
    if last is not None:
        v = last(g, v)
    g.write(v, dst)
    return g


def _tile_runs(terms: list, r0: int, r1: int, dst_slice: int, ntiles: int, most: int, written=None) -> list:
    """The lane tiles of rows r0 .. r1 dealt into runs of at most ``most`` tiles on
    different slices (a group reads each, of every term, through its own slice's port,
    and writes tile ``j`` of ``written`` through another's), each tile to the first run
    it fits, the runs after the first also apart from the accumulator's slice (they read
    it)."""
    runs = []  # [(tiles, slices used)]
    for j in range(ntiles):
        sls = {one(t.tensor.segments(j, r0, r1)).slice for t in terms}
        if written is not None:
            sls.add(one(written.tensor.segments(j, r0, r1)).slice)
        for tiles, used in runs:
            if len(tiles) < most and not sls & used:
                tiles.append(j)
                used |= sls
                break
        else:
            runs.append(([j], sls | ({dst_slice} if runs else set())))  # (the accumulator lies apart from x)
    return [tiles for tiles, _ in runs]


def _even_runs(run: list, whole: int) -> list:
    """``run`` cut into runs of a power of two whole tiles, the partial tile (index
    ``whole`` and on) alone: every tile of a run then meets a row it shares with the
    others at one depth of the tree, one read of it serving all."""
    out, full = [], [j for j in run if j < whole]
    while full:
        n = 1 << (len(full).bit_length() - 1)
        out.append(full[:n])
        full = full[n:]
    return out + [[j] for j in run if j >= whole]

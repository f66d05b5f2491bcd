"""Spatially padded copies of image values (for convolutions and poolings)."""

from __future__ import annotations

from .lowering_context import LoweringContext
from .row_passes import fill_vector
from .storage import Stored, chunk_of, one, runs


def padded(ctx: LoweringContext, x: Stored, pads, tag: str, fill: float = 0.0, spread: bool = False) -> Stored:
    """A spatially padded copy of an NHWC value (the value itself when no padding).

    The border is written explicitly with ``fill`` (a reused buffer holds old data).
    ``spread``: over several slices (row-wise passes then read through several ports)."""
    pt, pl, pb, pr = pads
    if not any(pads):
        return x
    n, c, h, w = x.shape
    hp, wp = h + pt + pb, w + pl + pr
    # A slice has a read and a write port: the copy may share slices with ``x``.
    dtype = x.tensor.layout.dtype
    # int8: the planes multiply one vector per cycle each, more than one slice's read port
    # feeds, so the padded copy is spread over slices like the values themselves.
    b = ctx.builder
    xp = Stored(ctx.temp(b.tensor(f"{tag}.padded", (n * hp * wp, c), dtype, row_align=wp,
                                  spread=ctx.options.spread if ctx.int8 or spread else 1)), (n, c, hp, wp))
    fill_row = fill_vector(ctx, fill, dtype)
    border = [(0, pt, 0, wp), (pt + h, pb, 0, wp), (pt, h, 0, pl), (pt, h, pl + w, pr)]  # rows, cols
    for i in range(n):
        for r_first, nrows, c_first, ncols in border:
            if not nrows or not ncols:
                continue
            base = (i * hp + r_first) * wp + c_first
            for r0, r1 in runs(nrows, lambda r: chunk_of(xp.tensor, base + r * wp)):
                for j in range(x.tensor.ntiles):
                    g = b.group(f"{tag}.border")
                    dst = one(xp.tensor.window_segments(j, base + r0 * wp, r1 - r0, ncols, wp))
                    g.write(g.read(fill_row.tile(0).repeat(dst.count)), dst)
        for r0, r1 in runs(h, lambda r: (chunk_of(x.tensor, (i * h + r) * w),
                                         chunk_of(xp.tensor, (i * hp + pt + r) * wp))):
            for j in range(x.tensor.ntiles):
                g = b.group(f"{tag}.pad")
                src = one(x.tensor.segments(j, (i * h + r0) * w, (i * h + r1) * w))
                dst = one(xp.tensor.window_segments(j, (i * hp + pt + r0) * wp + pl, r1 - r0, w, wp))
                g.write(g.read(src), dst)
    return xp

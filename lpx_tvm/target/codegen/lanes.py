"""Moving lanes with the SXM: permutation tables, lane moves between values, and the
passes that pack channels side by side."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .lowering_context import LoweringContext
from .graph import UnsupportedOnLPX
from .storage import Stored, chunk_of, one, runs


def permute_table(ctx: LoweringContext, table: np.ndarray) -> int:
    """The program's index of ``sxm.permute`` map ``table`` (``lanes`` entries, -1 for a
    zero lane), added once however many permutes use it."""
    key = table.astype(np.int32).tobytes()
    if key not in ctx.lane_maps:
        ctx.lane_maps[key] = ctx.builder.table(table)
    return ctx.lane_maps[key]


def lane_map(ctx: LoweringContext, src: int, dst: int, length: int) -> int:
    """A permutation table moving lanes src..src+length-1 to dst.., zero elsewhere."""
    table = np.full(ctx.cfg.lanes, -1, np.int32)
    table[dst:dst + length] = np.arange(src, src + length)
    return permute_table(ctx, table)


def gather_lanes(ctx: LoweringContext, tag: str, x: Stored, y: Stored, source):
    """``y[:, j] = x[:, source[j]]`` for every column ``j`` of ``y``, row for row: per
    column tile of ``y`` and tile of ``x`` it draws from, one SXM permute whose table
    picks all those lanes at once (the other lanes become zero), the pieces from
    different tiles of ``x`` added."""
    lanes, rows = ctx.cfg.lanes, y.tensor.layout.rows
    source = np.asarray(source)
    for yt in range(y.tensor.ntiles):
        cols = source[yt * lanes:(yt + 1) * lanes]
        for n, xt in enumerate(sorted(set((cols // lanes).tolist()))):
            table = np.full(lanes, -1, np.int32)
            mine = cols // lanes == xt
            table[:len(cols)][mine] = cols[mine] - xt * lanes
            index = permute_table(ctx, table)
            for r0, r1 in runs(rows, lambda r: (chunk_of(x.tensor, r), chunk_of(y.tensor, r))):
                g = ctx.builder.group(tag)
                v = g.sxm("sxm.permute", g.read(one(x.tensor.segments(xt, r0, r1))), map=index)
                out = one(y.tensor.segments(yt, r0, r1))
                if n:
                    v = g.vxm("vxm.add", v, g.read(out))
                g.write(v, out)


def lane_pass(ctx: LoweringContext, tag: str, src, dst, before: int, width: int, sxm: int, add: bool):
    """One pass of a packing: the first ``width`` lanes of ``src`` go to lanes
    ``before ..`` of ``dst`` (``sxm.pad`` on SXM ``sxm``: zeros in every other lane),
    added to what ``dst`` holds when ``add``."""
    g = ctx.builder.group(tag)
    v = g.sxm("sxm.pad", g.read(src), unit=sxm, before=before, width=width)
    if add:
        v = g.vxm("vxm.add", v, g.read(dst))
    g.write(v, dst)


@dataclass(frozen=True, slots=True)
class LaneMove:
    """``rows`` rows of ``width`` lanes moved from (``src_row``, ``src_col``) of a value
    to (``dst_row``, ``dst_col``) of another (:func:`move_lanes`)."""

    src_row: int
    dst_row: int
    rows: int
    src_col: int
    dst_col: int
    width: int


def tiles_moved_into(moves, lanes: int, ntiles: int) -> list:
    """For each of the ``ntiles`` column tiles of a :func:`move_lanes` result, the column
    tiles of the source it receives lanes from (a group reads them beside it)."""
    out = [set() for _ in range(ntiles)]
    for m in moves:
        for c in range(m.width):
            out[(m.dst_col + c) // lanes].add((m.src_col + c) // lanes)
    return out


def move_lanes(ctx: LoweringContext, tag: str, x: Stored, y: Stored, moves):
    """``y[yr:yr+n, yc:yc+w] = x[xr:xr+n, xc:xc+w]`` for each :class:`LaneMove` (xr, yr,
    n, xc, yc, w) of ``moves``, which together cover every element of ``y``: per piece within one column
    tile of each, an SXM permute moves the lanes into place (the other lanes become
    zero) and pieces landing on rows already written are added to them."""
    lanes = ctx.cfg.lanes
    ycols = y.tensor.layout.cols
    written = np.zeros((y.tensor.ntiles, y.tensor.layout.rows), bool)
    for m in moves:
        xr, yr, n, xc, yc, w = m.src_row, m.dst_row, m.rows, m.src_col, m.dst_col, m.width
        done = 0
        while done < w:
            xt, xb = divmod(xc + done, lanes)
            yt, yb = divmod(yc + done, lanes)
            length = min(w - done, lanes - xb, lanes - yb)
            seen = written[yt]
            key = lambda r: (chunk_of(x.tensor, xr + r), chunk_of(y.tensor, yr + r), bool(seen[yr + r]))  # noqa: E731
            for r0, r1 in runs(n, key):
                g = ctx.builder.group(tag)
                v = g.read(one(x.tensor.segments(xt, xr + r0, xr + r1)))
                if (xb, yb, length) != (0, 0, lanes):
                    v = g.sxm("sxm.permute", v, map=lane_map(ctx, xb, yb, length))
                out = one(y.tensor.segments(yt, yr + r0, yr + r1))
                if seen[yr + r0]:
                    v = g.vxm("vxm.add", v, g.read(out))
                g.write(v, out)
            seen[yr:yr + n] = True
            done += length
    if not written.all() or ycols > len(written) * lanes:
        raise UnsupportedOnLPX(f"{tag}: the lane moves leave part of the result unwritten")

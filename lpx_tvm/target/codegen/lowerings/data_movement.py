"""Ops that move elements without arithmetic: transposes (``permute_dims``), channel
``concat``, ``reshape`` (a free alias when storage stays put), slices of the last axis,
lane permutes (two such slices concatenated), the head split / merge of attention, and
concats and slices along other axes (whole stored rows placed or picked)."""

from __future__ import annotations

import math

import numpy as np
from tvm.relax.dpl import is_op, is_tuple, wildcard

from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..lanes import LaneMove, gather_lanes, lane_map, move_lanes, tiles_moved_into
from ..row_passes import write_rows
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..pattern_checks import (
    one_band_problem,
    permute_reshape_pattern,
    reshape_permute_pattern,
    tensors_problem,
)
from ..relax_exprs import expr_shape, int_tuple, is_const
from ..rules import (
    channel_axis,
    concat_axis_problem,
    flattens_pixels,
    reshape_keeps_storage,
    row_axis_problem,
    row_blocks,
)
from ..storage import Stored, chunk_of, one, row_align, runs, stored_shape
from ..values import copy_value, new_value, whole_groups
from ...program_image import OffchipTensor

# Concats of up to this many lane slices become one composite (``lpx.concat_slices_<n>``:
# a decode step's heads, a chip's query heads; 64 in Llama-2-70B on one chip).
MOST_SLICES = 64


def permute_steps(axes) -> list:
    """The shortest chain of swaps ("last": the last two axes, "first": the first two of
    three) that permutes axes as ``axes`` does: [] for the identity."""
    rank, target = len(axes), tuple(axes)
    moves = {"last": list(range(rank - 2)) + [rank - 1, rank - 2]}
    if rank == 3:
        moves["first"] = [1, 0, 2]
    seen, frontier = {tuple(range(rank)): []}, [tuple(range(rank))]
    while frontier and target not in seen:
        nxt = []
        for order in frontier:
            for name, p in moves.items():
                new = tuple(order[i] for i in p)
                if new not in seen:
                    seen[new] = seen[order] + [name]
                    nxt.append(new)
        frontier = nxt
    return seen[target]


@register_lowering("permute_dims", banding="whole")
def lower_transpose(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Any permutation of a 2-D or 3-D value, as a chain of the two swaps LPX does:
    the last two axes (:func:`_swap_last`, through the SXM) and, for 3-D, the first
    two (:func:`_swap_first`, rows moved whole)."""
    x = ctx.value(op.main.args[0])
    rank = len(x.shape)
    assert not x.nhwc and rank in (2, 3), "the permute_dims pattern takes 2-D and 3-D values"
    axes = op.main.attrs.get("axes")
    axes = list(range(rank))[::-1] if axes in (None, []) else [int(a) % rank for a in axes]
    steps = permute_steps(axes)
    if not steps:  # the identity
        ctx.values[op.out] = copy_value(ctx, x, op.out, is_output)
        return
    for k, step in enumerate(steps):
        last = k == len(steps) - 1
        shape = tuple(x.shape[:-2]) + (x.shape[-1], x.shape[-2]) if step == "last" else \
            (x.shape[1], x.shape[0], x.shape[2])
        y = new_value(ctx, op.out if last else f"{op.out}.{k}", shape, is_output and last)
        (_swap_last if step == "last" else _swap_first)(ctx, x, y, op.out)
        if not last:
            ctx.temp(y)
        x = y
    ctx.values[op.out] = x


def _swap_last(ctx: LoweringContext, x: Stored, y: Stored, tag: str):
    """Swap the last two axes: per batch, blocks of up to ``lanes`` rows by one column
    tile go through an SXM transpose (one vector out per column) into the matching
    rows of the result's column tile."""
    lanes = ctx.cfg.lanes
    m, n = x.shape[-2:]
    batches = x.shape[0] if len(x.shape) == 3 else 1
    dtype = x.tensor.layout.dtype
    if m * dtype.itemsize <= ctx.cfg.lines_per_slice:
        x = whole_groups(ctx, x, m, f"{tag}.rows")  # blocks of rows are read whole
        sources = [(x, i * m) for i in range(batches)]
    elif batches == 1:
        # A batch larger than a slice: chunks of whole blocks of ``lanes`` rows suffice.
        sources = [(whole_groups(ctx, x, lanes, f"{tag}.rows"), 0)]
    else:
        sources = None  # each batch copied into chunks of whole blocks (below)
    for i in range(batches):
        if sources is None:
            src = Stored(ctx.builder.tensor(f"{tag}.batch", (m, n), dtype, row_align=lanes), (m, n))
            move_lanes(ctx, f"{tag}.batch", x, src, [LaneMove(i * m, 0, m, 0, 0, n)])
            base = 0
        else:
            src, base = sources[i]
        for r0 in range(0, m, lanes):
            r1 = min(m, r0 + lanes)
            for cb in range(src.tensor.ntiles):
                c0, c1 = cb * lanes, min(n, (cb + 1) * lanes)
                g = ctx.builder.group(f"{tag}.transpose")
                v = g.sxm("sxm.transpose", g.read(one(src.tensor.segments(cb, base + r0, base + r1))),
                          out=c1 - c0)
                write_rows(ctx, g, v, y, r0 // lanes, i * n + c0, i * n + c1)
        if sources is None:
            ctx.builder.free(src.tensor)


def _swap_first(ctx: LoweringContext, x: Stored, y: Stored, tag: str):
    """Swap the first two axes of a 3-D value (a, b, c): row i*b + j moves to row j*a + i,
    whole (the last axis stays in lanes)."""
    a, b, c = x.shape
    move_lanes(ctx, f"{tag}.swap", x, y,
               [LaneMove(i * b + j, j * a + i, 1, 0, 0, c) for i in range(a) for j in range(b)])


@register_lowering("concat")
def lower_concat(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Concatenate along channels: each input's lanes moved into place
    (:func:`_place_lanes`)."""
    axis = op.main.attrs.get("axis", 1)
    axis = axis[0] if isinstance(axis, list) else axis
    parts = [ctx.value(v) for v in op.main.args]
    problem = concat_axis_problem(axis, len(op.shape))
    if problem:
        raise UnsupportedOnLPX(problem)
    widths = [x.shape[1] if len(op.shape) == 4 else x.shape[-1] for x in parts]
    _place_lanes(ctx, op, is_output, [(x, 0, w) for x, w in zip(parts, widths)])


@register_lowering(*(f"lpx.concat_slices_{n}" for n in range(2, MOST_SLICES + 1)))
def lower_concat_slices(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """A concat along the last axis of lane slices (of one value or several: a decode
    step's heads cut from ``p @ V``): each slice's lanes moved straight from its source
    into place, one SXM permute instead of the slice's and then the concat's."""
    steps = [op.main] + op.epilogue[:-1]
    pieces = []
    for step in steps:
        x = ctx.value(step.args[0])
        begin, end = _slice_bounds(step, x.shape[-1])
        pieces.append((x, begin, end - begin))
    _place_lanes(ctx, op, is_output, pieces)


def _place_lanes(ctx: LoweringContext, op: RegionOp, is_output: bool, sources):
    """The result's lanes, in order, from ``sources`` [(value, first lane, lanes)] (rows
    for rows): each piece moved into place with an SXM permute (the other lanes zero), the
    pieces of an output tile added. Two pieces on different slices share a group, one
    through each SXM, so a tile of h pieces is a chain of about h / 2 read-add-write
    groups, not h."""
    lanes = ctx.cfg.lanes
    offsets = np.cumsum([0] + [w for _, _, w in sources])
    beside = [_moved_into(ctx, [LaneMove(0, 0, 0, 0, int(o), w)], stored_shape(op.shape))
              for o, (_, _, w) in zip(offsets, sources)]
    inputs = list({id(x): x for x, _, _ in sources}.values())
    y = new_value(ctx, op.out, op.shape, is_output, avoid=inputs, beside=beside)
    pieces = {}  # output tile -> [(input, its tile, first lane there, first lane in the output tile, lanes)]
    for (x, first, width), offset in zip(sources, offsets):
        done = 0
        while done < width:
            xt, xb = divmod(first + done, lanes)
            tile, b = divmod(int(offset) + done, lanes)
            length = min(width - done, lanes - xb, lanes - b)
            pieces.setdefault(tile, []).append((x, xt, xb, b, length))
            done += length
    for tile, ps in pieces.items():
        key = lambda r, ps=ps: tuple(chunk_of(x.tensor, r) for x, *_ in ps) + (chunk_of(y.tensor, r),)  # noqa: E731
        for r0, r1 in runs(y.tensor.layout.rows, key):
            out = one(y.tensor.segments(tile, r0, r1))
            segs = [one(x.tensor.segments(t, r0, r1)) for x, t, *_ in ps]
            i = 0
            while i < len(ps):
                # A pair when the two inputs (and the tile so far, read back) sit on three slices.
                pair = i + 1 < len(ps) and len({segs[i].slice, segs[i + 1].slice} | ({out.slice} if i else set())) \
                    == 2 + bool(i)
                g = ctx.builder.group(f"{op.out}.concat")
                v = None
                for k, (_, _, src, dst, length) in enumerate(ps[i:i + 1 + pair]):
                    w = g.sxm("sxm.permute", g.read(segs[i + k]), map=lane_map(ctx, src, dst, length),
                              unit=k if pair else None)
                    v = w if v is None else g.vxm("vxm.add", v, w)
                if i:
                    v = g.vxm("vxm.add", v, g.read(out))
                g.write(v, out)
                i += 1 + pair
    ctx.values[op.out] = y


@register_lowering("reshape", "lpx.flatten_pixels", banding="view")
def lower_reshape(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """A reshape that leaves every element where it is stored: the same tensor under the
    new shape (an output alias is copied out by the region driver). So is the patch
    flatten (n, c, h, w) -> (n, h*w, c) (``lpx.flatten_pixels``: a reshape to (n, c, h*w),
    then a swap of the last two axes): the pixel rows of the 4-D value."""
    x = ctx.value(op.main.args[0])
    pixels = op.composite == "lpx.flatten_pixels" and flattens_pixels(x.shape, op.shape)
    if not (pixels or reshape_keeps_storage(x.shape, op.shape)):
        raise UnsupportedOnLPX(f"reshape {x.shape} -> {op.shape} moves data between lanes")
    ctx.values[op.out] = Stored(x.tensor, tuple(op.shape))


def _slice_bounds(step, width: int) -> tuple:
    """(begin, end) of a ``strided_slice`` step of the sliced axis of a ``width``-wide value,
    negative bounds counted from the end and the end clipped to the width."""
    begin, end = (int(np.asarray(a.const).reshape(-1)[0]) for a in step.args[2:4])
    begin, end = (b + width if b < 0 else b for b in (begin, end))
    return begin, min(end, width)


@register_lowering("lpx.slice")
def lower_slice(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Elements begin .. end - 1 of the channels (stride 1), moved to lane 0 on: the last
    axis, or axis 1 of a 4-D value (stored NHWC, its channels in lanes: a C2f block's split)."""
    x = ctx.value(op.main.args[0])
    begin, end = _slice_bounds(op.main, stored_shape(x.shape)[-1])
    lanes = ctx.cfg.lanes
    if begin % lanes == 0 and not is_output and not isinstance(x.tensor, OffchipTensor):
        # From a tile's first lane: the tiles themselves, no move (a SwiGLU's gate and up
        # cut from one projection whose gate fills whole tiles).
        ctx.values[op.out] = Stored(x.tensor.column_tiles(begin // lanes, stored_shape(op.shape), lanes), op.shape)
        return
    moves = [LaneMove(0, 0, x.tensor.layout.rows, begin, 0, end - begin)]
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x],
                  beside=[_moved_into(ctx, moves, stored_shape(op.shape))])
    move_lanes(ctx, f"{op.out}.slice", x, y, moves)
    ctx.values[op.out] = y


@register_lowering("lpx.permute_lanes")
def lower_permute_lanes(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Two slices of the last axis of one value, concatenated along it (RoPE's halves of a
    head swapped): each row's lanes picked in one SXM permute per pair of column tiles,
    instead of the two slices written and moved again by the concat."""
    x = ctx.value(op.main.args[0])
    source, moves = [], []
    for s in (op.main, op.epilogue[0]):
        begin, end = _slice_bounds(s, x.shape[-1])
        moves.append(LaneMove(0, 0, x.tensor.layout.rows, begin, len(source), end - begin))
        source += range(begin, end)
    if len(source) != op.shape[-1]:
        raise UnsupportedOnLPX(f"{op.out}: slices of {len(source)} lanes for a result of {op.shape[-1]}")
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x], beside=[_moved_into(ctx, moves, op.shape)])
    gather_lanes(ctx, f"{op.out}.permute_lanes", x, y, source)
    ctx.values[op.out] = y


@register_lowering("lpx.split_heads", banding="whole")
def lower_split_heads(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """(s, h*d) -> (h, s, d): head i is lanes i*d .. of every row, moved to rows i*s .."""
    x = ctx.value(op.main.args[0])
    h, s, d = op.shape
    moves = [LaneMove(0, i * s, s, i * d, 0, d) for i in range(h)]
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x], beside=[_moved_into(ctx, moves, op.shape)])
    move_lanes(ctx, f"{op.out}.split_heads", x, y, moves)
    ctx.values[op.out] = y


@register_lowering("lpx.merge_heads", banding="whole")
def lower_merge_heads(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """(h, s, d) -> (s, h*d): the inverse of :func:`lower_split_heads`."""
    x = ctx.value(op.main.args[0])
    h, s, d = x.shape
    moves = [LaneMove(i * s, 0, s, 0, i * d, d) for i in range(h)]
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x], beside=[_moved_into(ctx, moves, op.shape)])
    move_lanes(ctx, f"{op.out}.merge_heads", x, y, moves)
    ctx.values[op.out] = y


@register_lowering("lpx.concat_rows", banding="whole")
def lower_concat_rows(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """A concat along an axis other than the last of rank 2 or 3 values: each operand's
    blocks of rows copied whole into place (a class token before the patches, the repeated
    key / value heads of grouped-query attention). A constant operand goes in SRAM first."""
    axis = op.main.attrs.get("axis", 0)
    axis = (axis[0] if isinstance(axis, list) else axis) % len(op.shape)
    problem = row_axis_problem("concat", axis, len(op.shape))
    if problem:
        raise UnsupportedOnLPX(problem)
    parts = []
    for i, a in enumerate(op.main.args):
        if not a.is_const:
            parts.append(ctx.value(a))
            continue
        c = np.asarray(a.const, np.float32)
        parts.append(Stored(ctx.temp(ctx.builder.tensor(f"{op.out}.part{i}", stored_shape(c.shape), ctx.dtype,
                                                        data=c, row_align=row_align(c.shape))), c.shape))
    y = new_value(ctx, op.out, op.shape, is_output)
    outer, inner = row_blocks(op.shape, axis)
    offset = 0
    for x in parts:
        size = x.shape[axis]
        _copy_rows(ctx, f"{op.out}.concat_rows", x, y,
                   [(o * size * inner, (o * op.shape[axis] + offset) * inner, size * inner) for o in range(outer)])
        offset += size
    ctx.values[op.out] = y


@register_lowering("lpx.broadcast_rows", banding="whole")
def lower_broadcast_rows(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """One row repeated along the leading axes (``broadcast_to`` of a ``[1, N]`` value to
    ``[M, N]``): per column tile and run of rows, the row read again each cycle and
    written as the run."""
    x = ctx.value(op.main.args[0])
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x])
    for j in range(y.tensor.ntiles):
        for r0, r1 in runs(y.tensor.layout.rows, lambda r: chunk_of(y.tensor, r)):
            g = ctx.builder.group(f"{op.out}.broadcast_rows")
            g.write(g.read(x.tensor.tile(j).repeat(r1 - r0)), one(y.tensor.segments(j, r0, r1)))
    ctx.values[op.out] = y


@register_lowering("lpx.slice_rows", banding="whole")
def lower_slice_rows(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Elements begin .. end - 1 (stride 1) of an axis other than the last of a rank 2 or
    3 value: its blocks of rows copied whole."""
    x = ctx.value(op.main.args[0])
    axis, begin, end = (int(np.asarray(a.const).reshape(-1)[0]) for a in op.main.args[1:4])
    axis %= len(x.shape)
    problem = row_axis_problem("strided_slice", axis, len(x.shape))
    if problem:
        raise UnsupportedOnLPX(problem)
    size = x.shape[axis]
    begin, end = (min(max(b + size if b < 0 else b, 0), size) for b in (begin, end))
    outer, inner = row_blocks(x.shape, axis)
    y = new_value(ctx, op.out, op.shape, is_output)
    _copy_rows(ctx, f"{op.out}.slice_rows", x, y,
               [((o * size + begin) * inner, o * (end - begin) * inner, (end - begin) * inner) for o in range(outer)])
    ctx.values[op.out] = y


def _copy_rows(ctx: LoweringContext, tag: str, x: Stored, y: Stored, blocks):
    """``y[yr:yr+n] = x[xr:xr+n]`` for each (xr, yr, n) of ``blocks``, every column tile:
    one read and one write per run of rows that sits in one chunk of each (a slice's two
    ports: x and y may share slices)."""
    for xr, yr, n in blocks:
        for j in range(y.tensor.ntiles):
            for r0, r1 in runs(n, lambda r: (chunk_of(x.tensor, xr + r), chunk_of(y.tensor, yr + r))):
                g = ctx.builder.group(tag)
                v = g.read(one(x.tensor.segments(j, xr + r0, xr + r1)))
                g.write(v, one(y.tensor.segments(j, yr + r0, yr + r1)))


def _moved_into(ctx: LoweringContext, moves, shape) -> list:
    """Per column tile of a lane-move result of logical ``shape``, the source tiles moved into it."""
    return tiles_moved_into(moves, ctx.cfg.lanes, -(-shape[-1] // ctx.cfg.lanes))


# ---- patterns ---------------------------------------------------------------------------


def _reshape_pattern():
    data, shape = wildcard(), wildcard()
    root = is_op("relax.reshape")(data, shape)
    return root, {"input": data, "shape": shape, "root": root}


def _reshape_check(a, settings):
    if is_const(a["input"]):
        return a["root"], "reshape of a constant (folded at compile time)"
    src, dst = expr_shape(a["input"]), expr_shape(a["root"])
    if not reshape_keeps_storage(src, dst):
        return a["root"], f"reshape {src} -> {dst} moves data between lanes (NHWC storage)"
    return None


def _concat_check(a, settings, rows=False):
    """``lpx.concat`` (along the lanes), or with ``rows`` ``lpx.concat_rows`` (along another
    axis of a rank 2 or 3 value). The row pattern is tried first and each refuses the
    other's case; this one then gives the row case's reason."""
    concat = a["root"]
    if concat.attrs.axis is None:
        return concat, "concat without an axis (flattening) is not supported"
    fields = getattr(a["input"], "fields", ())
    if row_axis_problem("concat", int(concat.attrs.axis), len(expr_shape(concat))) is None:
        if all(is_const(f) for f in fields):
            return concat, "concat of constants (folded at compile time)"
        found = one_band_problem(concat, settings, "concat")
        return found if rows or found else (concat, "a concat of rows (lpx.concat_rows)")
    if rows:
        return concat, "not a concat of rows"
    if any(is_const(f) for f in fields):
        return concat, "concat of a constant operand is not supported (the concat lowers values in SRAM)"
    problem = concat_axis_problem(int(concat.attrs.axis), len(expr_shape(concat)))
    return (concat, problem) if problem else None


def _permute_dims_check(a, settings):
    op = a["root"]
    rank = len(expr_shape(a["input"]))
    axes = [int(x) for x in op.attrs.axes] if op.attrs.axes is not None else list(range(rank))[::-1]
    if rank not in (2, 3):
        return op, (f"permute_dims {axes} of a {rank}-D tensor: LPX permutes the axes of a 2-D or 3-D "
                    "tensor (4-D values are stored NHWC)")
    nbytes = math.prod(expr_shape(a["input"])) * settings.activation_bytes
    if 4 * nbytes > settings.config.sram_bytes:
        return op, "a transpose larger than a quarter of the SRAM (it does not run by bands)"
    return None


def _slice_check(a, settings, rows=False):
    """``lpx.slice`` (of the last axis), or with ``rows`` ``lpx.slice_rows`` (of another
    axis of a rank 2 or 3 value), as :func:`_concat_check`."""
    op = a["root"]
    shape = expr_shape(a["input"])
    rank = len(shape)
    ints = [int_tuple(t) for t in op.args[1:]]
    if any(t is None for t in ints):
        return op, "strided_slice with runtime bounds"
    axes = [x % rank for x in ints[0]]
    strides = ints[3] if len(ints) > 3 else [1] * len(axes)
    if len(axes) == 1 and strides == [1] and row_axis_problem("strided_slice", axes[0], rank) is None:
        found = one_band_problem(op, settings, "slice")
        return found if rows or found else (op, "a slice of rows (lpx.slice_rows)")
    if rows:
        return op, "not a slice of rows"
    # A 4-D value keeps its channels (axis 1) in lanes: their slice is a lane slice too.
    if axes != [channel_axis(rank)] or strides != [1]:
        return op, (f"strided_slice over axes {axes} with strides {strides} of a {rank}-D value: LPX slices "
                    "the channels (the last axis; axis 1 of a 4-D value) with stride 1")
    return None


def _heads_problem(op, rows_shape, s, h, d):
    """Why a head split / merge of ``s`` rows of ``h`` heads of ``d`` cannot run on LPX, or None."""
    rows = math.prod(rows_shape[:-1]) if len(rows_shape) > 1 else 1
    if rows != s or rows_shape[-1] != h * d:
        return op, f"values {rows_shape} are not {s} rows of {h} heads x {d}: only a batch of one splits into heads"
    return None


def _split_heads_check(a, settings):
    reshape, permute, data = a["reshape"], a["root"], a["input"]
    if len(expr_shape(reshape)) != 3 or [int(x) for x in permute.attrs.axes] != [1, 0, 2]:
        return permute, "a head split is reshape (s, h, d) then permute_dims [1, 0, 2]"
    s, h, d = expr_shape(reshape)
    return _heads_problem(permute, expr_shape(data), s, h, d)


def _merge_heads_check(a, settings):
    reshape, permute, data = a["root"], a["permute"], a["input"]
    if len(expr_shape(data)) != 3 or [int(x) for x in permute.attrs.axes] != [1, 0, 2]:
        return reshape, "a head merge is permute_dims [1, 0, 2] of (h, s, d) then a reshape"
    h, s, d = expr_shape(data)
    return _heads_problem(reshape, expr_shape(reshape), s, h, d)


def _flatten_pixels_check(a, settings):
    reshape, permute, data = a["reshape"], a["root"], a["input"]
    axes = [int(x) for x in permute.attrs.axes] if permute.attrs.axes is not None else None
    src, mid = expr_shape(data), expr_shape(reshape)
    if axes != [0, 2, 1] or mid is None or len(mid) != 3 or mid[:2] != src[:2] \
            or not flattens_pixels(src, expr_shape(permute)):
        return permute, "a pixel flatten is reshape (n, c, h, w) -> (n, c, h*w) then permute_dims [0, 2, 1]"
    return None


def _permute_lanes_pattern():
    """``concat((strided_slice(x), strided_slice(x)), axis=-1)``: lanes of one value
    picked by two slices (RoPE's halves of a head swapped)."""
    data = wildcard()
    first = is_op("relax.strided_slice")(data, varg_default_wildcard=True)
    second = is_op("relax.strided_slice")(data, varg_default_wildcard=True)
    root = is_op("relax.concat")(is_tuple([first, second]))
    return root, {"input": data, "first": first, "second": second, "root": root}


def _concat_slices_pattern(n: int):
    """``concat((strided_slice(x_1), ..., strided_slice(x_n)), axis=-1)``."""
    sources = [wildcard() for _ in range(n)]
    slices = [is_op("relax.strided_slice")(x, varg_default_wildcard=True) for x in sources]
    root = is_op("relax.concat")(is_tuple(slices))
    return root, {**{f"input{i}": x for i, x in enumerate(sources)}, **{f"slice{i}": s for i, s in enumerate(slices)},
                  "root": root}


def _lane_concat_problem(concat, slices, settings):
    """Why ``concat`` of the lane slices ``slices`` [(strided_slice, its input)] is not
    one lane permute a piece, or None (``lpx.permute_lanes``, ``lpx.concat_slices_<n>``)."""
    rank = len(expr_shape(concat))
    if rank == 4 or concat.attrs.axis is None or int(concat.attrs.axis) % rank != rank - 1:
        return concat, "not a concat along the last axis of a value of rank <= 3"
    for s, x in slices:
        found = tensors_problem(s, [x], settings) or _slice_check({"root": s, "input": x}, settings)
        if found:
            return found
    return None


def _concat_slices_check(a, settings):
    concat = a["root"]
    n = sum(1 for k in a if k.startswith("slice"))
    if n == 2 and a["input0"].same_as(a["input1"]):
        return concat, "two slices of one value (lpx.permute_lanes)"
    found = _lane_concat_problem(concat, [(a[f"slice{i}"], a[f"input{i}"]) for i in range(n)], settings)
    if found:
        return found
    if any(expr_shape(a[f"input{i}"])[:-1] != expr_shape(concat)[:-1] for i in range(n)):
        return concat, "slices of values of other rows than the concat's"
    return None


def _broadcast_rows_check(a, settings):
    op, data = a["root"], a["input"]
    src, dst = expr_shape(data), expr_shape(op)
    if is_const(data):
        return op, "broadcast_to of a constant (folded at compile time)"
    if len(dst) > 3 or len(src) > len(dst) or not src or src[-1] != dst[-1] or math.prod(src[:-1]) != 1:
        return op, (f"broadcast_to {src} -> {dst}: LPX repeats one row (a [1, N] value) along the leading "
                    "axes of a value of rank <= 3; other broadcasts move data between lanes")
    return None


def _permute_lanes_check(a, settings):
    return _lane_concat_problem(a["root"], [(a[key], a["input"]) for key in ("first", "second")], settings)


# Keys: ``lpx.reshape`` ``input``, ``shape``, ``root``; ``lpx.concat[_rows]`` ``input`` (the
# tuple), ``root``; ``lpx.slice[_rows]`` ``input``, ``root`` (the ``strided_slice``);
# ``lpx.split_heads`` ``input`` (s, h*d), ``reshape`` (to (s, h, d)), ``root``
# (``permute_dims`` [1, 0, 2]); ``lpx.merge_heads`` ``input`` (h, s, d), ``permute``,
# ``root`` (the reshape to (s, h*d)); ``lpx.flatten_pixels`` ``input`` (n, c, h, w),
# ``reshape`` (to (n, c, h*w)), ``root`` (``permute_dims`` [0, 2, 1]);
# ``lpx.permute_lanes`` ``input``, ``first`` and ``second`` (its slices), ``root``.
# The whole-row forms come after the forms they share a pattern with, so those give the
# last refusal.
register_pattern(
    OpPattern("reshape", _reshape_pattern, checks=(_reshape_check,), priority=70, integers=True, zero_d=True),
    OpPattern("concat", lambda: unary_pattern("relax.concat"), checks=(_concat_check,), priority=71,
              zero_d=True),
    OpPattern("permute_dims", lambda: unary_pattern("relax.permute_dims"), checks=(_permute_dims_check,),
              priority=82, zero_d=True),
    OpPattern("slice", lambda: unary_pattern("relax.strided_slice"), checks=(_slice_check,), priority=83,
              zero_d=True),
    OpPattern("split_heads", reshape_permute_pattern, checks=(_split_heads_check,), priority=84, zero_d=True),
    OpPattern("merge_heads", permute_reshape_pattern, checks=(_merge_heads_check,), priority=85, zero_d=True),
    OpPattern("flatten_pixels", reshape_permute_pattern, checks=(_flatten_pixels_check,), priority=93,
              zero_d=True),
    OpPattern("concat_rows", lambda: unary_pattern("relax.concat"),
              checks=(lambda a, s: _concat_check(a, s, rows=True),), priority=94, zero_d=True),
    OpPattern("slice_rows", lambda: unary_pattern("relax.strided_slice"),
              checks=(lambda a, s: _slice_check(a, s, rows=True),), priority=95, zero_d=True),
    OpPattern("permute_lanes", _permute_lanes_pattern, checks=(_permute_lanes_check,), priority=96,
              zero_d=True),
    OpPattern("broadcast_rows", lambda: unary_pattern("relax.broadcast_to"), checks=(_broadcast_rows_check,),
              priority=98, zero_d=True),
    *(OpPattern(f"concat_slices_{n}", lambda n=n: _concat_slices_pattern(n), tensors=("root",),
                checks=(_concat_slices_check,), priority=97, zero_d=True) for n in range(MOST_SLICES, 1, -1)),
)

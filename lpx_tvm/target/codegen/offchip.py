"""Regions whose activations do not fit the SRAM: values live in off-chip memory and
every op runs band by band.

A band is a run of whole output image rows (a run of rows for 2-D values, a run of
channel tiles for a global pooling). For each band the inputs it reads — with the
window's halo rows for a convolution or pooling, whose padding then applies only at the
image's edges — come over the DMA path into SRAM, the op's ordinary lowering runs on
them as an op of the band's shape, and the band's output goes back over the DMA path.
Weights stay where the weight pre-pass put them (resident, or streamed per band).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..builder import OffchipTensor
from .lowering_context import LoweringContext
from .graph import Operand, RegionOp, UnsupportedOnLPX
from .row_passes import finish
from .registry import band_rows_of, banding_of, cuts_constants, lower
from .rules import activation_row_problem
from .storage import Stored, row_align, stored_shape



@dataclass
class Spilled:
    """A region value in off-chip memory: its logical shape and the tensor holding it."""

    tensor: OffchipTensor
    shape: tuple


@dataclass
class _Load:
    """Rows ``row0 ..`` (``rows`` of them) and column tiles ``tile0 ..`` of a spilled value,
    seen as a value of logical shape ``shape``."""

    row0: int
    rows: int
    tile0: int
    shape: tuple


def spill_param(ctx: LoweringContext, name: str, shape: tuple) -> Spilled:
    """A region input bound in off-chip memory."""
    return Spilled(ctx.builder.offchip(name, stored_shape(shape), ctx.dtype, role="input"), shape)


def lower_by_bands(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Lower one op whose operands and result live off chip, band by band."""
    if banding_of(op) == "view":  # the same bytes seen another way (its pattern checked the storage)
        ctx.values[op.out] = Spilled(ctx.values[op.main.args[0].name].tensor, tuple(op.shape))
        return
    tensors = list({a.name: a for s in [op.main] + op.epilogue for a in s.args
                    if not a.is_const and a.name in ctx.values}.values())
    for shape in [a.shape for a in tensors] + [op.shape]:
        problem = activation_row_problem(shape, ctx.dtype.itemsize, ctx.cfg, ctx.precision)
        if problem:  # not even one row of it fits a band
            raise UnsupportedOnLPX(problem)
    y = Spilled(ctx.builder.offchip(op.out, stored_shape(op.shape), ctx.dtype,
                                    role="output" if is_output else None), op.shape)
    bands = 0
    for band_op, loads, store in _bands(ctx, op, tensors):
        out = _run_band(ctx, band_op, loads, op.out)
        _store_band(ctx, out, y, store, op.out)
        ctx.builder.free(out.tensor)
        bands += 1
    if not bands:  # a global pooling whose channel tiles do not fit whole
        _lower_mean_rows(ctx, op, tensors[0], y, _band_budget(ctx))
    ctx.values[op.out] = y


def _run_band(ctx: LoweringContext, band_op: RegionOp, loads: dict, tag: str) -> Stored:
    """Load a band's inputs, lower the band op; its output, in SRAM (the caller frees it)."""
    saved = ctx.values
    ctx.values = {}
    ctx.scratch = []
    for arg, ld in loads.items():
        ctx.values[arg] = _load_band(ctx, saved[arg], ld, tag)
    lower(ctx, band_op, False)
    out = ctx.values.pop(band_op.out)
    for t in ctx.scratch + [v.tensor for v in ctx.values.values()]:
        ctx.builder.free(t)
    ctx.scratch = []
    ctx.values = saved
    return out


def _band_budget(ctx: LoweringContext) -> float:
    free = ctx.cfg.mem_slices * ctx.cfg.lines_per_slice - ctx.builder.constant_lines
    return ctx.band_share * free * ctx.cfg.lanes


# ---- moving bands ------------------------------------------------------------
def _load_band(ctx: LoweringContext, src: Spilled, ld: _Load, tag: str) -> Stored:
    t = ctx.builder.tensor(f"{tag}.band", stored_shape(ld.shape), ctx.dtype, row_align=row_align(ld.shape))
    for j in range(t.ntiles):
        for first, region in t.segments(j, 0, ld.rows):
            ctx.builder.group(f"{tag}.load").dma_load(src.tensor.at(ld.tile0 + j, ld.row0 + first), region)
    return Stored(t, ld.shape)


def _store_band(ctx: LoweringContext, out: Stored, y: Spilled, store: tuple, tag: str):
    row0, tile0 = store
    t = out.tensor
    for j in range(t.ntiles):
        for first, region in t.segments(j, 0, t.layout.rows):
            ctx.builder.group(f"{tag}.store").dma_store(region, y.tensor.at(tile0 + j, row0 + first))


# ---- band plans --------------------------------------------------------------
def _bands(ctx: LoweringContext, op: RegionOp, tensors: list):
    """Yield (band op, {arg name: _Load}, (first output row, first output tile))."""
    budget = _band_budget(ctx)
    size = ctx.dtype.itemsize * ctx.cfg.lanes
    tiles = lambda c: -(-int(c) // ctx.cfg.lanes)  # noqa: E731
    shape = tuple(op.shape)
    if banding_of(op) == "channels":
        yield from _channel_bands(ctx, op, tensors, budget, size)
        return
    if banding_of(op) == "placement":
        # Output rows are fills or copies of input rows anywhere in the image: one band.
        pixels = lambda s: math.prod(s[:1] + s[2:]) * tiles(s[1])  # noqa: E731
        if (sum(pixels(a.shape) for a in tensors) + pixels(shape)) * size > budget:
            raise UnsupportedOnLPX(f"{op.main.op} {op.out}: its operand and result do not fit the SRAM "
                                   "together (it does not run by bands)")
        yield op, {a.name: _Load(0, math.prod(a.shape[:1] + a.shape[2:]), 0, tuple(a.shape)) for a in tensors}, (0, 0)
        return
    if len(shape) == 4:
        n, co, oh, ow = shape
        plan = {a.name: _row_source(op, a, shape) for a in tensors}

        padded = banding_of(op) == "window" and any(op.main.attrs["padding"])
        # A pooling also keeps an fp32 sum of its output; other outputs may take a copy.
        out_factor = 3 if "pool" in op.main.op else 1.5

        def cost(h):  # bytes of one band's inputs (with a padded copy) and output
            ins = sum((2 if padded and a.name == op.main.args[0].name else 1) * rows(0, h)[1]
                      * tiles(a.shape[1]) * a.shape[3] for a, rows in ((a, plan[a.name]) for a in tensors))
            return (ins + out_factor * h * ow * tiles(co)) * size

        hb = _band_length(oh, cost, budget, op)
        for i in range(n):
            for h0 in range(0, oh, hb):
                h1 = min(oh, h0 + hb)
                loads, band_op = {}, _reshaped(op, (1, co, h1 - h0, ow))
                for a in tensors:
                    r0, nr, pads = plan[a.name](h0, h1 - h0)
                    image = i if a.shape[0] == n else 0  # a batch of one broadcasts
                    w = a.shape[3]
                    loads[a.name] = _Load((image * a.shape[2] + r0) * w, nr * w, 0, (1, a.shape[1], nr, w))
                    if pads is not None:
                        band_op = _with_padding(band_op, pads)
                    if band_rows_of(op) is not None:  # where the band sits in the whole op
                        band_op = replace(band_op, main=replace(band_op.main, attrs={
                            **band_op.main.attrs, "band": (h0, r0, a.shape[2], oh)}))
                band_op = _with_shapes(band_op, {k: v.shape for k, v in loads.items()})
                # A constant with the whole image (a full-tensor operand) gives the band its rows.
                band_op = _with_constant_bands(band_op, lambda c: c[i if c.shape[0] == n else 0][None, :, h0:h1]
                                               if c.ndim == 4 and c.shape[2:] == (oh, ow) else None)
                yield band_op, loads, ((i * oh + h0) * ow, 0)
        return
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    rows_of = lambda a: math.prod(a.shape[:-1]) if len(a.shape) > 1 else 1  # noqa: E731
    if banding_of(op) == "whole":
        # Rows of the result do not map to rows of every input: one band holds it all.
        cost = (sum(rows_of(a) * tiles(a.shape[-1]) for a in tensors) + 1.5 * rows * tiles(shape[-1])) * size
        if cost > budget:
            raise UnsupportedOnLPX(f"{op.main.op} {op.out}: its operands and result do not fit the SRAM "
                                   "together (it does not run by bands)")
        yield op, {a.name: _Load(0, rows_of(a), 0, tuple(a.shape)) for a in tensors}, (0, 0)
        return

    def flat_cost(r):
        return (sum(r * tiles(a.shape[-1]) for a in tensors) + 1.5 * r * tiles(shape[-1])) * size

    rb = _band_length(rows, flat_cost, budget, op)
    for r0 in range(0, rows, rb):
        r1 = min(rows, r0 + rb)
        loads = {}
        for a in tensors:
            a_rows = math.prod(a.shape[:-1]) if len(a.shape) > 1 else 1
            if a_rows == rows:
                loads[a.name] = _Load(r0, r1 - r0, 0, (r1 - r0, a.shape[-1]))
            elif a_rows == 1:
                loads[a.name] = _Load(0, 1, 0, (1, a.shape[-1]))
            else:
                raise UnsupportedOnLPX(f"{op.main.op} of {a.shape} into {shape} on values kept off chip")
        band_op = _with_shapes(_reshaped(op, (r1 - r0, shape[-1])), {k: v.shape for k, v in loads.items()})
        band_op = _with_constant_bands(band_op, lambda c: c.reshape(rows, shape[-1])[r0:r1]
                                       if c.size == rows * shape[-1] and c.shape[-1] == shape[-1] else None)
        yield band_op, loads, (r0, 0)


def _channel_bands(ctx: LoweringContext, op, tensors, budget, size):
    """A global pooling: bands of whole channel tiles and every pixel, or (when one
    tile's pixels do not fit) of one tile and some image rows, summed by
    :func:`_lower_mean_rows`."""
    (a,) = tensors
    n, c, h, w = a.shape
    lanes = ctx.cfg.lanes
    per_tile = 2 * n * h * w * size
    if per_tile > budget:
        return
    nt = max(1, int(budget // per_tile))
    for t0 in range(0, -(-c // lanes), nt):
        c0, c1 = t0 * lanes, min(c, (t0 + nt) * lanes)
        out = (n, c1 - c0) + tuple(op.shape[2:])
        load = _Load(0, n * h * w, t0, (n, c1 - c0, h, w))
        yield _with_shapes(_reshaped(op, out), {a.name: load.shape}), {a.name: load}, (0, t0)


def _lower_mean_rows(ctx: LoweringContext, op: RegionOp, a: Operand, y: Spilled, budget: float):
    """Mean over H and W by row bands of one channel tile: each band's mean, weighted
    by its share of the rows, is added into an fp32 sum that is stored at the end."""
    n, c, h, w = a.shape
    lanes = ctx.cfg.lanes
    b = ctx.builder
    hb = _band_length(h, lambda r: 2 * r * w * ctx.dtype.itemsize * lanes, budget, op)
    for t0 in range(-(-c // lanes)):
        cs = min(c, (t0 + 1) * lanes) - t0 * lanes
        for i in range(n):
            total = b.tensor(f"{op.out}.sum", (1, cs), ctx.acc)
            for h0 in range(0, h, hb):
                h1 = min(h, h0 + hb)
                ld = _Load((i * h + h0) * w, (h1 - h0) * w, t0, (1, cs, h1 - h0, w))
                band_op = _with_shapes(_reshaped(op, (1, cs) + tuple(op.shape[2:])), {a.name: ld.shape})
                part = _run_band(ctx, band_op, {a.name: ld}, op.out)
                scaled = b.tensor(f"{op.out}.part", (1, cs), ctx.acc, avoid=[sl for sl, _ in total.layout.tiles])
                g = b.group(f"{op.out}.sum")
                v = g.read(part.tensor.tile(0))
                if v.dtype != ctx.acc:
                    v = g.vxm("vxm.cvt", v, to=ctx.acc)
                g.write(g.vxm("vxm.mul", v, imm=(h1 - h0) / h), scaled.tile(0) if h0 else total.tile(0))
                if h0:
                    g = b.group(f"{op.out}.sum")
                    g.write(g.vxm("vxm.add", g.read(scaled.tile(0)), g.read(total.tile(0))), total.tile(0))
                b.free(part.tensor)
                b.free(scaled)
            out = b.tensor(f"{op.out}.mean", (1, cs), ctx.dtype)
            g = b.group(f"{op.out}.sum")
            finish(g, g.read(total.tile(0)), out.tile(0))
            b.group(f"{op.out}.store").dma_store(out.tile(0), y.tensor.at(t0, i))
            b.free(total)
            b.free(out)


def _band_length(total: int, cost, budget: float, op: RegionOp) -> int:
    if cost(1) > budget:
        raise UnsupportedOnLPX(f"{op.main.op} {op.out}: one output row of {tuple(op.shape)} and its inputs "
                               f"need {cost(1):.0f} bytes, more than the SRAM leaves for a band")
    lo, hi = 1, total
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid - 1)
    return -(-total // -(-total // lo))  # equal bands


def _row_source(op: RegionOp, a: Operand, out_shape: tuple):
    """For a 4-D operand: (h0, rows) of output rows -> (first input row, input rows,
    band padding or None)."""
    if banding_of(op) == "window" and a.name == op.main.args[0].name:
        attrs = op.main.attrs
        kh, kw = (attrs["pool_size"] if "pool_size" in attrs else op.main.args[1].shape[2:])
        (sh, _), (dh, _) = attrs["strides"], attrs["dilation"]
        pt, pl, _, pr = attrs["padding"]
        height = a.shape[2]

        def window(h0, nrows):
            start = h0 * sh - pt
            end = (h0 + nrows - 1) * sh - pt + (kh - 1) * dh + 1
            r0, r1 = max(0, start), min(height, end)
            return r0, r1 - r0, (r0 - start, pl, end - r1, pr)
        return window
    band_rows = band_rows_of(op)
    if band_rows is not None:
        return band_rows(op.main.attrs, a.shape[2], out_shape[2])
    if a.shape[2:] == tuple(out_shape[2:]):
        return lambda h0, nrows: (h0, nrows, None)
    if a.shape[2:] == (1, 1):
        return lambda h0, nrows: (0, 1, None)
    raise UnsupportedOnLPX(f"{op.main.op} of {a.shape} into {out_shape} on values kept off chip")


# ---- band ops ----------------------------------------------------------------
def _reshaped(op: RegionOp, shape: tuple) -> RegionOp:
    return replace(op, shape=tuple(shape), main=replace(op.main, shape=tuple(shape)),
                   epilogue=[replace(s, shape=tuple(shape)) for s in op.epilogue])


def _with_padding(op: RegionOp, pads: tuple) -> RegionOp:
    return replace(op, main=replace(op.main, attrs={**op.main.attrs, "padding": tuple(int(p) for p in pads)}))


def _with_constant_bands(op: RegionOp, band_of) -> RegionOp:
    """``op`` with each constant operand that ``band_of`` cuts (a full-tensor constant:
    its rows of the band) replaced by its cut; the others (scalars, per-channel) stay."""
    def cut(a):
        piece = band_of(np.asarray(a.const)) if a.is_const and np.ndim(a.const) > 0 else None
        return a if piece is None else replace(a, const=np.ascontiguousarray(piece), shape=tuple(piece.shape))

    def step(s):
        return replace(s, args=[cut(a) for a in s.args]) if cuts_constants(s.op) else s
    return replace(op, main=step(op.main), epilogue=[step(s) for s in op.epilogue])


def _with_shapes(op: RegionOp, shapes: dict) -> RegionOp:
    def step(s):
        return replace(s, args=[replace(a, shape=tuple(shapes[a.name])) if not a.is_const and a.name in shapes
                                else a for a in s.args])
    return replace(op, main=step(op.main), epilogue=[step(s) for s in op.epilogue])

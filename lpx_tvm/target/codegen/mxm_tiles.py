"""MXM tile emission shared by the MXM lowerings: a layer's tiling, the tile steps of its
TensorIR schedule, and the install / multiply / drain groups they become."""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools

from ...errors import SramFull
from ...machine.isa import DType
from ...machine.timing import dma_cycles, install_cycles, nearest_vxm, slices_beside
from ...tir_schedules import Conv2dWorkload, DenseTiling, DenseWorkload, default_tiling, round_up, schedule, tile_steps
from ...tir_schedules.schedules import Conv2dTiling, block_parts, k_split_rule
from .lowering_context import LoweringContext
from .epilogue import apply_epilogue, epilogue_steps
from .graph import RegionOp
from .row_passes import write_rows
from .storage import Stored, StreamedWeights
from .values import new_value

TVM_DTYPE = {DType.FP32: "float32", DType.FP16: "float16", DType.BF16: "bfloat16", DType.INT8: "int8",
             DType.FP8: "float8_e4m3fn"}


@functools.lru_cache(maxsize=512)
def scheduled_steps(work, tiling) -> tuple:
    """The tile steps of a workload's schedule (a region's bands and repeated layers ask
    for the same ones)."""
    return tuple(tile_steps(schedule(work, tiling).mod["main"]))


def layer_tiling(ctx: LoweringContext, op: RegionOp, work, batches: int = 1, record: bool = True,
                 first_plane: int = 0):
    """The tiling of one MXM layer: its tuned one if the policy has it, else the default
    starting on ``first_plane`` (``record``: the layer is a tuning task of this compile)."""
    # The task is the whole composite (an int8 op's MXM view lacks the epilogue its
    # lowering reads); off-chip bands are not tuning tasks.
    fetch = 0
    if isinstance(ctx.weights.get(op.out), StreamedWeights):
        fetch = dma_cycles(ctx.cfg, ctx.cfg.mxm_rows, ctx.mxm_dtype(op))  # every block loads its tiles
    return ctx.policy.tiling((work, op.composite, batches), ctx.layer_ops.get(op.out, op),
                             lambda: dataclasses.replace(default_tiling(ctx.cfg, work, fetch), first_plane=first_plane),
                             record=record and not ctx.offchip)


def tuned_pack(ctx: LoweringContext, op: RegionOp, work: Conv2dWorkload) -> str:
    """The tap packing of a convolution's tuned tiling ("": none; a grouped convolution,
    whose workload has no channel count, and off-chip bands never pack). The weight
    placement and the lowering both ask here, so they agree."""
    if ctx.offchip or not work.channels:
        return ""
    t = ctx.policy.peek((work, op.composite, 1))
    return getattr(t, "pack", "") if t is not None else ""


def conv_workload(ctx: LoweringContext, x_shape, w_shape, attrs) -> Conv2dWorkload:
    """The TensorIR workload of a dense convolution, in storage shapes."""
    n, c, h, wd = x_shape
    co, _, kh, kw = w_shape
    pt, pl, pb, pr = attrs["padding"]
    lanes = ctx.cfg.lanes
    return Conv2dWorkload(n, h + pt + pb, wd + pl + pr, round_up(c, lanes), kh, kw, round_up(co, lanes),
                          tuple(attrs["strides"]), tuple(attrs["dilation"]), TVM_DTYPE[ctx.dtype],
                          channels=c if attrs.get("groups", 1) == 1 else 0)


def conv_tiles(ctx: LoweringContext, work, t, xp: Stored, per: int = 1, image=None):
    """The tile steps of a (dense or depthwise) convolution's tiling ``t``, with the
    activation window each step multiplies, the output block it accumulates into and
    the tiling itself. ``per`` > 1: kernel rows packed ``per`` taps per tile, read
    from ``image`` (the row image of the conv2d lowering): one step per tile, at its
    first tap."""
    lanes = ctx.cfg.lanes
    (sh, sw), (dh, dw) = work.stride, work.dilation
    hp, wp, oh, ow = work.Hp, work.Wp, work.OH, work.OW
    steps = scheduled_steps(work, Conv2dTiling(oh=t.oh, ci=lanes, co=lanes, order=t.order))
    if per > 1:
        steps = [s for s in steps if s.reads["W"][1][0] % per == 0]

    def window(step):
        n0, (oh0, ohe) = step.writes["mxm"][0][0], step.writes["mxm"][1]
        kh0, kw0, c0 = (step.reads["W"][d][0] for d in range(3))
        first = (n0 * hp + oh0 * sh + kh0 * dh) * wp + kw0 * dw
        src = image if per > 1 and min(per, work.KW - kw0) > 1 else xp.tensor
        return src.window_segments(c0 // lanes, first, ohe, ow, sh * wp, sw)

    def block(step):
        n0, (oh0, ohe), c0 = step.writes["mxm"][0][0], step.writes["mxm"][1], step.writes["mxm"][3][0]
        return c0, (n0 * oh + oh0) * ow, ohe * ow

    return steps, window, block, t


def dense_steps(ctx: LoweringContext, op: RegionOp, rows: int, k: int, nn: int, batches: int = 1, tiling=None,
                record: bool = True, first_plane: int = 0) -> tuple:
    """(tiling, steps) of a (rows, k) x (k, nn) product through DenseWorkload tiles; a
    step is (batch, tile step). ``first_plane``: the default tiling's (a tuned one keeps its own)."""
    lanes = ctx.cfg.lanes
    work = DenseWorkload(rows, round_up(k, lanes), round_up(nn, lanes), TVM_DTYPE[ctx.mxm_dtype(op)])
    t = tiling or layer_tiling(ctx, op, work, batches, record=record, first_plane=first_plane)
    steps_of_batch = scheduled_steps(work, DenseTiling(m=t.m, k=lanes, n=lanes, order=t.order))
    return t, [(i, s) for i in range(batches) for s in steps_of_batch]


def dense_block(step, rows: int) -> tuple:
    """(first channel, first output row, rows) of the output block a dense step accumulates into."""
    i, step = step
    (m0, me), (n0, _) = step.writes["mxm"]
    return n0, i * rows + m0, me


def dense_weights(step, k: int, lanes: int) -> tuple:
    """(column tile, first row, end row) of the weight matrix a dense step installs."""
    i, step = step
    (k0, _), (n0, _) = step.reads["B"]
    return n0 // lanes, i * k + k0, i * k + min(k, k0 + lanes)


def matmul(ctx: LoweringContext, op: RegionOp, x: Stored, rows: int, k: int, nn: int, is_output: bool, W=None,
           batches: int = 1, q=None, tiling=None):
    """(rows, k) activations times a (k, nn) matrix — the op's weights, or ``W`` — through
    DenseWorkload tiles; with ``batches``, batch i multiplies rows i * rows .. of ``x``
    by rows i * k .. of ``W``. ``tiling``: a convolution's packed im2col, tiled by the
    convolution's schedule (its MACs are counted there). Untuned, a product by a runtime
    ``W`` starts on the plane after the last op's, as other ops take planes on: products
    with nothing between them (a decode step's scores, one a kv head) then install and
    multiply side by side instead of waiting on one plane's weight buffers."""
    lanes = ctx.cfg.lanes
    t, steps = dense_steps(ctx, op, rows, k, nn, batches, tiling,
                           first_plane=ctx.planes.next if W is not None else 0)

    def window(step):
        i, step = step
        (m0, me), (k0, _) = step.reads["A"]
        first_row = i * rows + m0
        return [(first - first_row, r) for first, r in x.tensor.segments(k0 // lanes, first_row, first_row + me)]

    if tiling is None:
        ctx.macs += batches * rows * k * nn
    emit_mxm(ctx, op, steps, window, lambda s: dense_weights(s, k, lanes), lambda s: dense_block(s, rows), nn,
             is_output, t, W=W, q=q)


def dense_install_planes(ctx: LoweringContext, op: RegionOp, rows: int, k: int, nn: int) -> dict:
    """Which plane installs each weight tile ``(column tile, reduction tile)`` of a dense
    layer, as :func:`emit_mxm` will assign them; a tile that several planes install (a
    layer of several row blocks) is left out."""
    lanes = ctx.cfg.lanes
    t, steps = dense_steps(ctx, op, rows, k, nn, record=False)
    keys = [dense_block(s, rows) for s in steps]
    planes = part_planes(ctx.cfg, keys, k_parts(ctx, keys, t.k_split, ctx.mxm_dtype(op)), t.first_plane)
    found = {}
    for s, plane in zip(steps, planes):
        j, row0, _ = dense_weights(s, k, lanes)
        found.setdefault((j, row0 // lanes), set()).add(plane)
    return {tile: ps.pop() for tile, ps in found.items() if len(ps) == 1}


def k_parts(ctx: LoweringContext, keys: list, split: "int | None", dtype: DType) -> list:
    """For each tile step, which part of its block's reduction it belongs to. A block's
    reduction tiles may be split into parts on different planes (each accumulates its own
    partial sum; the drains add them), so that every plane multiplies: how many parts
    each block has is :func:`~lpx_tvm.tir_schedules.schedules.block_parts` of the K split
    (``split``, a tuned tiling's, or the default rule's)."""
    count = {}
    for k in keys:
        count[k] = count.get(k, 0) + 1
    if split is None:
        split = k_split_rule(ctx.cfg, len(count))
    # A block of n tiles in s parts has n % s parts one tile longer; which parts are long
    # rotates from block to block, so that the planes the parts land on get equal shares.
    tiles, rows = max(count.values(), default=0), max((k[2] for k in count), default=1)
    # ``dtype``: the MXM's (an int8 layer of a float build multiplies int8)
    rate = ctx.cfg.mxm_cycles_per_vector[dtype.short]
    install = install_cycles(ctx.cfg, dtype, ctx.cfg.mxm_rows)
    per_block = dict(zip(count, block_parts(ctx.cfg, len(count), split, tiles, rows, rate, install)))
    ends, seen, out = {}, {}, []
    for k in keys:
        if k not in ends:
            n = count[k]
            s = min(per_block[k], n)
            base, extra = divmod(n, s)
            first = len(ends) * extra
            lengths = [base + ((q - first) % s < extra) for q in range(s)]
            ends[k] = list(itertools.accumulate(lengths))
        i = seen.get(k, 0)
        out.append(next(q for q, end in enumerate(ends[k]) if i < end))
        seen[k] = i + 1
    return out


def part_planes(cfg, keys: list, parts: list, first_plane: int = 0) -> list:
    """The plane of each tile step: the planes take a layer's (block, K part)s round robin
    in the order they first appear, from ``first_plane`` (a tiling's decision; by default
    plane 0, so row block k of consecutive layers share a plane and a plane that finished
    its rows early goes on with the same rows)."""
    first = {}
    return [first.setdefault(kp, (first_plane + len(first)) % cfg.mxm_planes) for kp in zip(keys, parts)]


def partial_buffer(ctx: LoweringContext, name: str, rows: int, plane: int, avoid, acc: DType):
    """An fp32 buffer for one K part's partial sum: on the drained plane's side of the
    VXM, as near the VXM as a slice (not of ``avoid``) has room. The drain streams
    towards the VXM, against the direction the plane's installs and activations flow,
    and the last part's drain reads the buffer back into the VXM on its critical path."""
    cfg, b = ctx.cfg, ctx.builder
    for sl in nearest_vxm(cfg, [s for s in slices_beside(cfg, plane) if s not in avoid]):
        try:
            return b.tensor(name, (rows, cfg.lanes), acc, slices=[sl])
        except SramFull:
            continue
    return b.tensor(name, (rows, cfg.lanes), acc, avoid=avoid)


def wavefront(keys: list, parts: list, planes: list) -> list:
    """The order tile steps are emitted in: the planes' (block, K part)s of one round side
    by side, step by step (step 0 of every plane's part, then step 1, ...), so that the
    placer, which gives earlier groups first pick of ports and streams, meets the planes'
    work in about the order it runs; each part's own steps keep their order."""
    round_of, index, seen = {}, [], {}
    count = {}
    for i, kp in enumerate(zip(keys, parts)):
        if kp not in round_of:
            p = planes[i]
            round_of[kp] = count.get(p, 0)
            count[p] = round_of[kp] + 1
        index.append(seen.get(kp, 0))
        seen[kp] = index[-1] + 1
    return sorted(range(len(keys)), key=lambda i: (round_of[(keys[i], parts[i])], index[i], planes[i]))


def emit_mxm(ctx: LoweringContext, op: RegionOp, steps, window, weights, block, channels: int, is_output: bool,
             tiling, W=None, q=None):
    """Install / multiply groups per tile, a drain group (with the epilogue) per output block.

    ``tiling`` gives the K split, the first block's plane and how many installs each
    plane hoists (``install_ahead``): a plane's first installs of the layer move, in
    program order, to just after the last work that uses their weight buffer
    (:meth:`~lpx_tvm.target.builder.ProgramBuilder.hoist`), ahead of the previous
    layers' remaining drains and multiplies, which then yield them ports and streams.

    ``window(step)`` -> [(row offset in the block, SramSpan)]; ``weights(step)`` -> (column
    tile, first row, end row) of the op's weight matrix; ``block(step)`` -> (first channel,
    first output row, rows). Streamed weights come over the off-chip path, one tile at a
    time, into two staging buffers that alternate so the next load overlaps this install.
    ``q`` (int8 ops): the epilogue (int32 bias, requantization) and the output dtype.
    """
    lanes = ctx.cfg.lanes
    b = ctx.builder
    W = ctx.weights[op.out] if W is None else W
    staging = None
    wdt, acc_dt = ctx.mxm_dtype(op), ctx.acc_dtype(op)
    if isinstance(W, StreamedWeights):
        staging = [ctx.temp(b.tensor(f"{op.out}.staging{i}", (lanes, lanes), wdt)) for i in range(2)]
    y = new_value(ctx, op.out, op.shape, is_output, dtype=q.out_dtype if q else None, drained=True)
    epi = q.epilogue if q else epilogue_steps(ctx, op, channels)
    tag = op.out
    keys = [block(s) for s in steps]
    parts = k_parts(ctx, keys, tiling.k_split, wdt)
    planes = part_planes(ctx.cfg, keys, parts, tiling.first_plane)
    # other ops take planes on in turn
    ctx.planes.next = (tiling.first_plane + len(set(zip(keys, parts)))) % ctx.cfg.mxm_planes
    hoisted = [0] * ctx.cfg.mxm_planes
    order = wavefront(keys, parts, planes)
    last = {(keys[i], parts[i]): i for i in order}
    nparts = collections.Counter(key for key, _ in last)
    drained = {}
    live = {}  # (output block, K part) -> (plane, first accumulator row)
    partial = {}  # output block -> fp32 SRAM sums of its K parts drained so far, one tensor each
    for n_emitted, i in enumerate(order):
        s = steps[i]
        key = block(s)
        col0, first_row, nrows = key
        part = (key, parts[i])
        first = part not in live
        if first:
            live[part] = ctx.planes.new_block(nrows, planes[i])
        plane, acc = live[part]
        buf = ctx.planes.buffer(plane)
        j, row0, row1 = weights(s)
        if staging is None:
            src = [(r - row0, region) for r, region in W.segments(j, row0, row1)]
        else:
            region = staging[n_emitted % 2].tile(0).rows(0, row1 - row0)
            b.group(f"{tag}.stream").dma_load(W.offset(j, row0), region)
            src = [(0, region)]
        installs = b.install(f"{tag}.install", plane, buf, src, width=min(channels - col0, lanes))
        if hoisted[plane] < tiling.install_ahead:
            hoisted[plane] += 1
            b.hoist(installs)
        for offset, region in window(s):
            g = b.group(f"{tag}.mul")
            g.mul(plane, buf, g.read(region), acc=acc + offset, accumulate=not first)
        if last[part] != i:
            continue
        g = b.group(f"{tag}.drain")
        v = g.drain(plane, acc, nrows, acc_dt)
        del live[part]
        drained[key] = drained.get(key, 0) + 1
        if drained[key] < nparts[key]:  # more K parts to come: keep this part's fp32 sum
            # Each part its own buffer, on slices of its own (the last part's drain reads
            # them all, and the rows its epilogue reads: bias, scales, in one group): no
            # part waits on another's sum, only the last on all of them.
            held = partial.setdefault(key, [])
            avoid = [sl for e in epi for t in e.tensors for sl, _ in t.layout.tiles]
            avoid += [sl for t in held for sl, _ in t.layout.tiles]
            held.append(partial_buffer(ctx, f"{tag}.partial{len(held)}", nrows, plane, avoid, acc_dt))
            g.write(v, held[-1].tile(0))
            continue
        for t in partial.pop(key, []):
            v = g.vxm("vxm.add", v, g.read(t.tile(0)))
            b.free(t)
        v = apply_epilogue(g, v, epi, col0 // lanes, nrows)
        write_rows(ctx, g, v, y, col0 // lanes, first_row, first_row + nrows)
    ctx.values[op.out] = y


def pixel_sums(ctx: LoweringContext, tag: str, x: Stored, column, acc_dtype):
    """For each image i and channel tile j of a 4-D ``x``: transpose its pixel chunks on
    the SXM so channels become vectors, multiply them on the MXM into one accumulator
    against ``column`` (a (lanes, 1) weight), drain and transpose the result back into
    one vector. Yields (group, vector, i, j), the group still open for the caller."""
    n, c, h, w = x.shape
    lanes = ctx.cfg.lanes
    hw = h * w
    # Every row of ``column`` holds the same value, so each run of pixels reads its first
    # rows; when the SRAM had no room for the column in one piece, runs are as long as
    # its first chunk.
    chunked = column.layout.chunk_rows
    step = min(lanes, chunked) if chunked else lanes
    for i in range(n):
        for j in range(x.tensor.ntiles):
            cv = min(c - j * lanes, lanes)
            plane, acc = ctx.planes.new_block(cv)
            pieces = [seg for p0 in range(0, hw, step)
                      for seg in x.tensor.segments(j, i * hw + p0, i * hw + min(hw, p0 + step))]
            for q, (_, region) in enumerate(pieces):
                buf = ctx.planes.buffer(plane)
                weights = column.segments(0, 0, region.count) if chunked else [(0, column.tile(0).rows(0, region.count))]
                ctx.builder.install(f"{tag}.install", plane, buf, weights, width=1)
                g = ctx.builder.group(f"{tag}.sum")
                t = g.sxm("sxm.transpose", g.read(region), out=cv)
                g.mul(plane, buf, t, acc=acc, accumulate=q > 0)
            g = ctx.builder.group(f"{tag}.drain")
            yield g, g.sxm("sxm.transpose", g.drain(plane, acc, cv, acc_dtype), out=1), i, j
    ctx.macs += n * c * hw

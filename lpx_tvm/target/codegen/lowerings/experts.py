"""A product by one of a stack of constant matrices, the one a runtime index names (a
mixture-of-experts layer's expert): ``matmul(x, reshape(take(W, e)))``. The chosen
matrix is installed through gathers (``ProgramBuilder.install_by_index``): the program,
and so every cycle, is the same whichever expert ``e`` names, and no other expert's
weights are installed (docs/moe.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ....errors import SramFull
from ....machine.isa import DType
from ....machine.timing import install_lanes, nearest_vxm, slices_beside
from ..graph import RegionOp, UnsupportedOnLPX
from ..lowering_context import LoweringContext
from ..pattern_checks import type_problem
from ..registry import OpPattern, register_lowering, register_pattern
from ..relax_exprs import expr_shape, is_const, static_shape
from ..row_passes import write_rows
from ..storage import one
from ..values import new_value
from ..weights import install_pool, install_pool_beyond


@dataclass(frozen=True)
class ExpertStack:
    """Where a stack of ``entries`` matrices lies: ``parts[j, t]``, the install parts of
    column tile ``j`` and row tile ``t`` (``[(first row in the tile, SramSpan of entry 0's
    rows)]``), each region holding its rows of every entry in turn, ``entry_rows`` vectors
    apart; ``plane[j]``, the plane that installs column tile ``j``; ``counting[plane]``,
    int32 vectors 0, 1, 2, .. in lane 0, one copy a plane (planes installing at once then
    read their own), on its side's slices nearest the VXM that no part uses;
    ``resident_bytes``, the SRAM the stack takes (the report's weights)."""

    entries: int
    entry_rows: int
    parts: dict
    plane: dict
    counting: dict  # plane -> its counting rows (SramSpan)
    resident_bytes: int


def _ops(op: RegionOp) -> dict:
    return {o.op: o for o in [op.main] + op.epilogue}


def _place_experts(ctx: LoweringContext, op: RegionOp) -> ExpertStack:
    """Each install part of each weight tile: its rows of every expert, expert by expert,
    in one region on a slice of its plane's install pool (its lane's, as a dense layer's
    weights lie), padded to the longest part so that every region has one stride."""
    table = np.asarray(_ops(op)["take"].args[0].const, np.float32)
    key = (table.shape, hashlib.blake2b(table.tobytes(), digest_size=16).digest())
    if key in ctx.stacks:  # another pick from the same experts: their lines, counted once
        return dataclasses.replace(ctx.stacks[key], resident_bytes=0)
    ctx.stacks[key] = stack = _placed_stack(ctx, op, table)
    return stack


def _placed_stack(ctx: LoweringContext, op: RegionOp, table: np.ndarray) -> ExpertStack:
    entries, k, nn = table.shape
    cfg, lanes = ctx.cfg, ctx.cfg.lanes
    dtype = DType.parse(ctx.dtype)
    per_lane = install_lanes(cfg, dtype)
    rows_per = {t: -(-min(lanes, k - t * lanes) // per_lane) for t in range(-(-k // lanes))}
    stride_rows = max(rows_per.values())
    parts, plane, used = {}, {}, set()
    for j in range(-(-nn // lanes)):
        plane[j] = j % cfg.mxm_planes
        cols = table[:, :, j * lanes:(j + 1) * lanes]
        for t, per in rows_per.items():
            rows_t = min(lanes, k - t * lanes)
            found = []
            for p, r0 in enumerate(range(0, rows_t, per)):
                n = min(per, rows_t - r0)
                data = np.zeros((entries, stride_rows, lanes), np.float32)
                data[:, :n, :cols.shape[2]] = cols[:, t * lanes + r0:t * lanes + r0 + n]
                pools = install_pool(cfg, plane[j], p % per_lane, per_lane) + \
                    install_pool_beyond(cfg, plane[j], p % per_lane, per_lane)
                # Past the pools: the side's other slices, the farthest from the VXM first
                # (a stack larger than the pools, as a chip holding many layers has).
                pools += tuple(sl for sl in reversed(nearest_vxm(cfg, slices_beside(cfg, plane[j])))
                               if sl not in pools)
                region = _constant_in(ctx, f"{op.out}.experts.{j}.{t}.{p}", data.reshape(-1, lanes), dtype, pools)
                used.add(region.slice)
                found.append((r0, region.rows(0, n)))
            parts[j, t] = found
    counting = np.zeros((stride_rows, lanes), np.int32)
    counting[:, 0] = np.arange(stride_rows)
    count_t = {}
    for p in sorted(set(plane.values())):  # a slice each: planes installing at once read apart
        count_t[p] = _constant_in(ctx, f"{op.out}.counting{p}", counting, DType.INT32, _beside_clear(cfg, p, used))
        used.add(count_t[p].slice)
    regions = sum(len(found) for found in parts.values())
    return ExpertStack(entries, stride_rows, parts, plane, count_t,
                       regions * entries * stride_rows * lanes * dtype.itemsize)


def _beside_clear(cfg, plane: int, used) -> tuple:
    """The slices on ``plane``'s side that no part uses, nearest the VXM first (the
    indices go from the VXM towards the plane, past the parts)."""
    return tuple(s for s in nearest_vxm(cfg, slices_beside(cfg, plane)) if s not in used)


def _constant_in(ctx: LoweringContext, name: str, data: np.ndarray, dtype: DType, pools: tuple):
    """``data`` on the first slice of ``pools`` with room for it: its whole tile."""
    return _first_fit(lambda sl: ctx.builder.constant(name, data, dtype, slices=[sl]).tile(0), name,
                      data.shape[0], pools)


def _first_fit(make, name: str, rows: int, slices: tuple):
    for sl in slices:
        try:
            return make(sl)
        except SramFull:
            continue
    raise UnsupportedOnLPX(f"{name}: {rows} rows find no room on slices {list(slices)}")


@register_lowering("lpx.expert_dense", banding="whole", weights=_place_experts)
def lower_expert_dense(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """``x @ W[e]``: the expert's offset ``e * entry_rows`` computed on chip from the
    index (lane 0), then per column tile one accumulator block on its plane, each row
    tile of the expert's matrix installed by index and multiplied, and the block
    drained."""
    ops = _ops(op)
    take, mm = ops["take"], ops["matmul"]
    stack: ExpertStack = ctx.weights[op.out]
    lanes, b = ctx.cfg.lanes, ctx.builder
    index = ctx.value(take.args[1])
    if index.tensor.layout.dtype != DType.INT32:
        raise UnsupportedOnLPX(f"an expert chosen by {index.tensor.layout.dtype.short} indices (LPX gathers by int32)")
    x = ctx.value(mm.args[0])  # the matmul's other operand is the reshaped expert
    rows = math.prod(x.shape[:-1])
    _, k, nn = take.args[0].shape
    used = {r.slice for regions in stack.parts.values() for _, r in regions} | \
        {c.slice for c in stack.counting.values()}
    base = {}  # plane -> its row of e * entry_rows: where expert e's rows start in each region
    for p in stack.counting:
        base[p] = _first_fit(lambda sl, p=p: ctx.temp(b.tensor(f"{op.out}.base{p}", (1, lanes), DType.INT32,
                                                               slices=[sl])).tile(0),
                             f"{op.out}.base{p}", 1, _beside_clear(ctx.cfg, p, used))
        used.add(base[p].slice)
        g = b.group(f"{op.out}.base")
        g.write(g.vxm("vxm.mul", g.read(one(index.tensor.segments(0, 0, 1))), imm=stack.entry_rows),
                base[p].rows(0, 1))
    y = new_value(ctx, op.out, op.shape, is_output, drained=True)
    acc_dt = ctx.acc_dtype(op)
    blocks = {j: ctx.planes.new_block(rows, stack.plane[j]) for j in range(-(-nn // lanes))}
    for t in range(-(-k // lanes)):  # the planes' row tiles in turn: each plane installs while the others do
        for j, (plane, acc) in blocks.items():
            buf = ctx.planes.buffer(plane)
            b.install_by_index(f"{op.out}.install", plane, buf, stack.parts[j, t], stack.entries, stack.entry_rows,
                               base[plane].rows(0, 1), stack.counting[plane], width=min(nn - j * lanes, lanes))
            for offset, region in x.tensor.segments(t, 0, rows):
                g = b.group(f"{op.out}.mul")
                g.mul(plane, buf, g.read(region), acc=acc + offset, accumulate=t > 0)
    for j, (plane, acc) in blocks.items():
        g = b.group(f"{op.out}.drain")
        write_rows(ctx, g, g.drain(plane, acc, rows, acc_dt), y, j, 0, rows)
    ctx.macs += rows * k * nn
    ctx.values[op.out] = y


# ---- patterns ---------------------------------------------------------------------------


def _expert_pattern():
    table, indices, x = wildcard(), wildcard(), wildcard()
    taken = is_op("relax.take")(table, indices)
    weight = is_op("relax.reshape")(taken, wildcard())
    root = is_op("relax.matmul")(x, weight)
    return root, {"input": x, "table": table, "indices": indices, "take": taken, "weight": weight, "root": root}


def _expert_check(a, settings):
    """``x @ reshape(take(W, e, axis=0), (K, N))``: ``W`` a constant (E, K, N), ``e`` one
    int32 index, ``x`` (M, K) with M rows of one accumulator block."""
    root, table, idx, taken, x = a["root"], a["table"], a["indices"], a["take"], a["input"]
    if not is_const(table) or len(expr_shape(table)) != 3:
        return taken, "an expert's matrix taken from a runtime or non-3-D stack: LPX installs one of a constant stack"
    if taken.attrs.axis is None or int(taken.attrs.axis) != 0:
        return taken, "a matrix taken along an axis other than 0 of the stack"
    if not isinstance(idx.ty, relax.TensorType) or idx.ty.dtype != "int32" or static_shape(idx.ty) is None \
            or math.prod(static_shape(idx.ty)) != 1 or is_const(idx):
        return taken, f"an expert chosen by indices of type {idx.ty}: LPX installs one expert by one int32 index"
    _, k, nn = expr_shape(table)
    if tuple(expr_shape(a["weight"])) != (k, nn):
        return root, f"the expert's matrix reshaped to {expr_shape(a['weight'])}, not ({k}, {nn})"
    xs = expr_shape(x)
    if len(xs) != 2 or xs[1] != k:
        return root, f"an expert's product of a {xs} input: LPX takes (M, {k}) rows"
    if xs[0] > settings.config.mxm_acc_rows:
        return root, f"an expert's product of {xs[0]} rows: more than a plane's accumulator holds"
    cfg = settings.config
    stack = math.prod(expr_shape(table)) * settings.activation_bytes
    if stack > cfg.mem_slices * cfg.lines_per_slice * cfg.lanes // 2:
        return root, (f"a stack of experts of {stack / 2**20:.1f} MiB: more than half the chip's SRAM "
                      "(spread the experts over chips)")
    for t in (root.ty, x.ty, table.ty):
        problem = type_problem(t, settings)
        if problem:
            return root, problem
    if settings.activation_bytes == 1:
        return root, "an expert's product in an 8-bit build: its quantized path is still to come"
    return None


# Keys: ``input`` (x), ``table`` (the constant stack), ``indices`` (the int32 index),
# ``take``, ``weight`` (the reshape), ``root`` (the matmul). Tried before the dense and take
# patterns, which would split it.
register_pattern(OpPattern("expert_dense", _expert_pattern, None, (_expert_check,), priority=114, zero_d=True))

"""Default TensorIR schedules of the MXM workloads, and the LPX tile intrinsic.

A schedule splits the workload into MXM tiles — at most ``mxm.rows`` reduction
elements by ``mxm.cols`` output channels by as many output rows as half the
accumulators hold (the other half drains meanwhile) — orders the tile loops, and turns
the loops inside one tile into a single block marked with :data:`MXM_TILE`. That block
is LPX's tensor intrinsic: codegen replaces each of its instances by an install, a
multiply-accumulate and (after the last reduction tile) a drain. The block keeps its
scalar body, so a cost model still sees the multiply-accumulate it stands for.

The tile sizes and the loop order are the schedule's decisions; the tuner searches
them, and :func:`default_tiling` is one point of that space.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir

from ..target.config import LPXConfig
from .workloads import MXM_BLOCK, DenseWorkload, DepthwiseWorkload

MXM_TILE = "lpx.mxm_tile"  # value of the block annotation ``lpx_intrin``
INTRIN_KEY = "lpx_intrin"


@dataclass(frozen=True)
class DenseTiling:
    m: int  # rows per accumulator block
    k: int  # reduction elements per installed weight tile
    n: int  # output channels per tile
    order: str = "mnk"  # outer-to-inner order of the tile loops; k innermost keeps one accumulator block live


@dataclass(frozen=True)
class Conv2dTiling:
    oh: int  # output rows per accumulator block (oh * OW rows)
    ci: int
    co: int
    order: str = "noc"  # n, output-row block, output-channel tile outside the (kh, kw, ci) reduction


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _block_rows(extent: int, limit: int, other_blocks: int, planes: int, min_rows: int = 1) -> int:
    """Rows per output block: the largest divisor of ``extent`` within ``limit``, but small
    enough that there are at least two output blocks per MXM plane (when the extent
    allows), so every plane gets work and a layer's first rows are ready for the next
    layer early — yet not below ``min_rows``: every block installs
    its own weight tiles, and a block whose multiply takes less time than an install
    would leave its plane waiting on installs (the small images of a network's last
    stages), so such layers keep fewer, larger blocks."""
    fits = [d for d in range(1, min(extent, limit) + 1) if extent % d == 0]
    ok = [d for d in fits if d >= min_rows] or [max(fits)]
    busy = [d for d in ok if (extent // d) * other_blocks >= 2 * planes]
    return max(busy) if busy else min(ok)


def _min_block_pixels(cfg: LPXConfig, dtype: str) -> int:
    """Pixels (activation vectors) whose multiply takes as long as installing one weight
    tile (one vector per MXM row)."""
    cpv = cfg.mxm_cycles_per_vector[_SHORT.get(dtype, dtype)]
    return -(-cfg.mxm_rows // cpv)


_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int8", "uint8": "uint8"}


def default_tiling(cfg: LPXConfig, w) -> "DenseTiling | Conv2dTiling":
    half = cfg.mxm_acc_rows // 2
    planes = cfg.mxm_planes
    pixels = _min_block_pixels(cfg, w.dtype)
    if isinstance(w, DenseWorkload):
        n = _largest_divisor(w.N, cfg.mxm_cols)
        return DenseTiling(m=_block_rows(w.M, half, w.N // n, planes, pixels), k=_largest_divisor(w.K, cfg.mxm_rows),
                           n=n)
    rows = max(1, half // w.OW)
    channels = w.C if isinstance(w, DepthwiseWorkload) else w.CO
    co = _largest_divisor(channels, cfg.mxm_cols)
    oh = _block_rows(w.OH, rows, w.N * (channels // co), planes, -(-pixels // w.OW))
    return Conv2dTiling(oh=oh, ci=_largest_divisor(w.C, cfg.mxm_rows), co=co)


def schedule(workload, tiling) -> s_tir.Schedule:
    """Apply ``tiling`` to the workload's PrimFunc and mark the MXM tile block."""
    sch = s_tir.Schedule(workload.prim_func())
    block = sch.get_sblock(MXM_BLOCK)
    if isinstance(workload, DenseWorkload):
        m, n, k = sch.get_loops(block)
        mo, mi = sch.split(m, [None, tiling.m])
        no, ni = sch.split(n, [None, tiling.n])
        ko, ki = sch.split(k, [None, tiling.k])
        outer = {"m": mo, "n": no, "k": ko}
        sch.reorder(*[outer[c] for c in tiling.order], mi, ni, ki)
        first_inner = mi
    elif isinstance(workload, DepthwiseWorkload):
        n, oh, ow, c, kh, kw = sch.get_loops(block)
        oho, ohi = sch.split(oh, [None, tiling.oh])
        co, ci = sch.split(c, [None, tiling.co])
        outer = {"n": n, "o": oho, "c": co}
        sch.reorder(*[outer[c_] for c_ in tiling.order], kh, kw, ohi, ow, ci)
        first_inner = ohi
    else:
        n, oh, ow, co, kh, kw, ci = sch.get_loops(block)
        oho, ohi = sch.split(oh, [None, tiling.oh])
        coo, coi = sch.split(co, [None, tiling.co])
        cio, cii = sch.split(ci, [None, tiling.ci])
        outer = {"n": n, "o": oho, "c": coo}
        sch.reorder(*[outer[c] for c in tiling.order], kh, kw, cio, ohi, ow, coi, cii)
        first_inner = ohi
    tile = sch.blockize(first_inner)
    sch.annotate(tile, INTRIN_KEY, MXM_TILE)
    return sch

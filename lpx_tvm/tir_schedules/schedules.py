"""Default TensorIR schedules of the MXM workloads, and the LPX tile intrinsic.

A schedule splits the workload into MXM tiles — at most ``mxm.rows`` reduction
elements by ``mxm.cols`` output channels by as many output rows as half the
accumulators hold (the other half drains meanwhile) — orders the tile loops, and turns
the loops inside one tile into a single block marked with :data:`MXM_TILE`. That block
is LPX's tensor intrinsic: codegen replaces each of its instances by an install, a
multiply-accumulate and (after the last reduction tile) a drain. The block keeps its
scalar body, so a cost model still sees the multiply-accumulate it stands for.

The block rows, the loop order, the K split, (convolutions with few input channels)
the tap packing, and two decisions about the layer's place among its neighbours — the
plane that takes its first block (``first_plane``) and how many installs per plane are
issued ahead of the previous layer's remaining work (``install_ahead``) — are the
schedule's decisions; the tile block carries them as annotations (``lpx_rows``,
``lpx_order``, ``lpx_k_split``, ``lpx_pack``, ``lpx_first_plane``,
``lpx_install_ahead``) so that codegen reads a tuned schedule back (:func:`tiling_of`). The tuner searches them
(:mod:`lpx_tvm.tune.space`), and :func:`default_tiling` is one point of that space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir

from ..machine.config import LPXConfig
from ..machine.isa import DType
from ..machine.timing import install_cycles
from .workloads import MXM_BLOCK, Conv2dWorkload, DenseWorkload, DepthwiseWorkload

MXM_TILE = "lpx.mxm_tile"  # value of the block annotation ``lpx_intrin``
INTRIN_KEY = "lpx_intrin"


@dataclass(frozen=True)
class DenseTiling:
    m: int  # rows per accumulator block
    k: int  # reduction elements per installed weight tile
    n: int  # output channels per tile
    order: str = "mnk"  # outer-to-inner order of the tile loops; k innermost keeps one accumulator block live
    k_split: "int | None" = None  # planes sharing one block's reduction; None: codegen's rule (target/codegen/mxm_tiles.py, k_parts)
    first_plane: int = 0  # the plane of the first block; the others follow round robin
    install_ahead: int = 0  # each plane's first installs hoisted ahead of earlier layers' work (mxm_tiles.emit_mxm)


@dataclass(frozen=True)
class Conv2dTiling:
    oh: int  # output rows per accumulator block (oh * OW rows)
    ci: int
    co: int
    order: str = "noc"  # n, output-row block, output-channel tile outside the (kh, kw, ci) reduction
    k_split: "int | None" = None
    pack: str = ""  # "taps" / "rows": an on-chip im2col packs taps into tiles (packings); "": one tap per tile
    first_plane: int = 0
    install_ahead: int = 0


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


def cycles_per_vector(cfg: LPXConfig, dtype: str) -> int:
    """MXM cycles per activation vector of a workload dtype (a TVM dtype name)."""
    return cfg.mxm_cycles_per_vector[_SHORT.get(dtype, dtype)]


def k_split_rule(cfg: LPXConfig, blocks: int) -> int:
    """The default K split: a layer with fewer output blocks than MXM planes splits each
    block's reduction over ``planes // blocks`` planes, so every plane multiplies."""
    return max(1, cfg.mxm_planes // blocks) if blocks else 1


# What one more K part's partial sum costs: per accumulator row, its drain, its fp32
# write and the read beside the next part's drain (cycles); and, per part, the latency
# of that chain (drain, VXM add, write).
PART_CYCLES_PER_ROW = 5
PART_LATENCY = 20


def block_parts(cfg: LPXConfig, blocks: int, k_split: int, tiles: int = 0, rows: int = 1, rate: int = 1,
                install: int = 0) -> list:
    """How many K parts each output block's reduction has, in block order. The planes
    take parts round robin, so with ``k_split`` 1 and ``blocks`` not a multiple of the
    planes the last round would leave planes idle (13 blocks on 4 planes: one plane does
    4 blocks while three do 3): the last ``r = blocks % planes`` blocks are split into
    ``s = planes / gcd(r, planes)`` parts each, so that the last round fills every plane
    too — when that pays. A block of ``tiles`` reduction tiles, each taking the longer of
    its multiply (``rows`` vectors at ``rate`` cycles) and its ``install``, saves
    ``1 - 1/s`` of that on its plane; each extra part costs
    ``PART_CYCLES_PER_ROW * rows + PART_LATENCY``. (Splitting the first ``r`` blocks
    instead, so that their partial sums overlap later blocks, measured slower on the
    1x4096x4096 GEMV: 1,235 cycles against 1,211; splitting whatever the cost, 3.5%
    slower on int8 ResNet-50.)"""
    planes = cfg.mxm_planes
    r = blocks % planes
    if k_split != 1 or r == 0:
        return [k_split] * blocks
    s = planes // math.gcd(r, planes)
    saved = tiles * max(rows * rate, install) * (s - 1) / s
    if saved <= (s - 1) * (PART_CYCLES_PER_ROW * rows + PART_LATENCY):
        return [1] * blocks
    return [1] * (blocks - r) + [s] * r


def tile_install_cycles(cfg: LPXConfig, dtype: str) -> int:
    """Cycles a plane takes to install one full weight tile of a workload dtype (a TVM
    dtype name) over its install lanes."""
    return install_cycles(cfg, DType.parse(_SHORT.get(dtype, dtype)), cfg.mxm_rows)


def _min_block_pixels(cfg: LPXConfig, dtype: str, fetch_cycles: int = 0) -> int:
    """Pixels (activation vectors) whose multiply takes as long as bringing one weight
    tile in: installing it over the plane's install lanes, or ``fetch_cycles`` when each
    block loads its tiles from off-chip memory first."""
    return -(-max(tile_install_cycles(cfg, dtype), fetch_cycles) // cycles_per_vector(cfg, dtype))


_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int8", "uint8": "uint8",
          "float8_e4m3fn": "fp8"}


def default_tiling(cfg: LPXConfig, w, fetch_cycles: int = 0) -> "DenseTiling | Conv2dTiling":
    """The tiling a layer gets without a tuning log. ``fetch_cycles``: the cycles one
    weight tile takes to load when the layer's weights stream from off-chip memory (each
    output block loads them again, so such a layer keeps fewer, larger blocks)."""
    half = cfg.mxm_acc_rows // 2
    planes = cfg.mxm_planes
    pixels = _min_block_pixels(cfg, w.dtype, fetch_cycles)
    if isinstance(w, DenseWorkload):
        n = _largest_divisor(w.N, cfg.mxm_cols)
        return DenseTiling(m=_block_rows(w.M, half, w.N // n, planes, pixels), k=_largest_divisor(w.K, cfg.mxm_rows),
                           n=n)
    rows = max(1, half // w.OW)
    channels = w.C if isinstance(w, DepthwiseWorkload) else w.CO
    co = _largest_divisor(channels, cfg.mxm_cols)
    oh = _block_rows(w.OH, rows, w.N * (channels // co), planes, -(-pixels // w.OW))
    return Conv2dTiling(oh=oh, ci=_largest_divisor(w.C, cfg.mxm_rows), co=co)


def packings(w, lanes: int) -> tuple:
    """How a convolution with few input channels (at most half a tile) may pack its taps
    side by side into the lanes of its reduction tiles (an im2col built on chip), so
    that one pass multiplies what one tap per tile multiplies in several, mostly padding:

    - ``"taps"``: as many taps per tile as fit, an im2col row per output pixel (fewest
      tiles; every tap of every pixel moves through an SXM);
    - ``"rows"``: the taps of one kernel row per tile, from an image whose every pixel
      holds its row neighbours (built once; each kernel row reads it at its own offset).
    """
    c = getattr(w, "channels", 0)
    if not isinstance(w, Conv2dWorkload) or not c or 2 * c > lanes or w.C != lanes:
        return ()
    return (("taps",) if w.KH * w.KW > 1 else ()) + (("rows",) if w.KW > 1 else ())


def taps_per_tile(w, lanes: int, pack: str) -> int:
    """Taps side by side in one reduction tile under a packing (:func:`packings`)."""
    return min(lanes // w.channels, w.KH * w.KW if pack == "taps" else w.KW)


def packed_tiles(w, lanes: int, pack: str) -> int:
    """Reduction tiles per output block under a packing."""
    t = taps_per_tile(w, lanes, pack)
    return -(-w.KH * w.KW // t) if pack == "taps" else w.KH * -(-w.KW // t)


ROWS_KEY, ORDER_KEY, K_SPLIT_KEY, PACK_KEY = "lpx_rows", "lpx_order", "lpx_k_split", "lpx_pack"
FIRST_PLANE_KEY, AHEAD_KEY = "lpx_first_plane", "lpx_install_ahead"
INNER_KEY, COLS_KEY = "lpx_inner", "lpx_cols"


def schedule(workload, tiling) -> s_tir.Schedule:
    """Apply ``tiling`` to the workload's PrimFunc and mark the MXM tile block."""
    sch = s_tir.Schedule(workload.prim_func())
    rows = tiling.m if isinstance(workload, DenseWorkload) else tiling.oh
    inner = tiling.k if isinstance(workload, DenseWorkload) else tiling.ci
    cols = tiling.n if isinstance(workload, DenseWorkload) else tiling.co
    apply_tiling(sch, workload, rows, inner, cols, tiling.order, tiling.k_split, getattr(tiling, "pack", ""),
                 tiling.first_plane or None, tiling.install_ahead or None)
    return sch


def apply_tiling(sch: s_tir.Schedule, workload, rows, inner: int, cols: int, order: str, k_split=None,
                 pack: str = "", first_plane=None, install_ahead=None):
    """Split, reorder and blockize ``sch`` (the workload's PrimFunc) into MXM tiles.

    ``rows`` (output rows, or output image rows, per block), ``k_split``,
    ``first_plane`` and ``install_ahead`` may be integers or sampled random variables of
    a design space; the tile block records them (and the order, and a convolution's tap
    packing ``pack``) as annotations (None: not recorded, the default).
    Returns the tile block.
    """
    block = sch.get_sblock(MXM_BLOCK)
    if isinstance(workload, DenseWorkload):
        m, n, k = sch.get_loops(block)
        mo, mi = sch.split(m, [None, rows])
        no, ni = sch.split(n, [None, cols])
        ko, ki = sch.split(k, [None, inner])
        outer = {"m": mo, "n": no, "k": ko}
        sch.reorder(*[outer[c] for c in order], mi, ni, ki)
        first_inner = mi
    elif isinstance(workload, DepthwiseWorkload):
        n, oh, ow, c, kh, kw = sch.get_loops(block)
        oho, ohi = sch.split(oh, [None, rows])
        co, ci = sch.split(c, [None, cols])
        outer = {"n": n, "o": oho, "c": co}
        sch.reorder(*[outer[c_] for c_ in order], kh, kw, ohi, ow, ci)
        first_inner = ohi
    else:
        n, oh, ow, co, kh, kw, ci = sch.get_loops(block)
        oho, ohi = sch.split(oh, [None, rows])
        coo, coi = sch.split(co, [None, cols])
        cio, cii = sch.split(ci, [None, inner])
        outer = {"n": n, "o": oho, "c": coo}
        sch.reorder(*[outer[c] for c in order], kh, kw, cio, ohi, ow, coi, cii)
        first_inner = ohi
    tile = sch.blockize(first_inner)
    sch.annotate(tile, INTRIN_KEY, MXM_TILE)
    sch.annotate(tile, ROWS_KEY, rows)
    sch.annotate(tile, ORDER_KEY, order)
    sch.annotate(tile, INNER_KEY, inner)
    sch.annotate(tile, COLS_KEY, cols)
    if k_split is not None:
        sch.annotate(tile, K_SPLIT_KEY, k_split)
    if pack:
        sch.annotate(tile, PACK_KEY, pack)
    if first_plane is not None:
        sch.annotate(tile, FIRST_PLANE_KEY, first_plane)
    if install_ahead is not None:
        sch.annotate(tile, AHEAD_KEY, install_ahead)
    return tile


def describe(tiling) -> str:
    """A tiling in a few words, e.g. ``rows 7, noc, K split 1, packed rows, first plane 2``."""
    rows = tiling.m if isinstance(tiling, DenseTiling) else tiling.oh
    k = "K split by rule" if tiling.k_split is None else f"K split {tiling.k_split}"
    pack = getattr(tiling, "pack", "")
    return (f"rows {rows}, {tiling.order}, {k}" + (f", packed {pack}" if pack else "")
            + (f", first plane {tiling.first_plane}" if tiling.first_plane else "")
            + (f", {tiling.install_ahead} install(s) ahead" if tiling.install_ahead else ""))


def tiling_of(workload, func) -> "DenseTiling | Conv2dTiling":
    """The tiling a scheduled PrimFunc of ``workload`` stands for, read from its tile block."""
    found, stack = [], [func.body]
    while stack:
        node = stack.pop()
        kind = type(node).__name__
        if kind == "SeqStmt":
            stack.extend(node.seq)
        elif kind == "SBlockRealize":
            if node.block.annotations.get(INTRIN_KEY) == MXM_TILE:
                found.append(node.block.annotations)
            else:
                stack.append(node.block.body)
        elif hasattr(node, "body"):
            stack.append(node.body)
    if len(found) != 1:
        raise ValueError(f"expected one MXM tile block in the scheduled function, found {len(found)}")
    ann = found[0]
    rows, order = int(ann[ROWS_KEY]), str(ann[ORDER_KEY])
    k_split = int(ann[K_SPLIT_KEY]) if K_SPLIT_KEY in ann else None
    inner, cols = int(ann[INNER_KEY]), int(ann[COLS_KEY])
    # Records made before these two decisions existed leave them at their defaults.
    place = dict(first_plane=int(ann[FIRST_PLANE_KEY]) if FIRST_PLANE_KEY in ann else 0,
                 install_ahead=int(ann[AHEAD_KEY]) if AHEAD_KEY in ann else 0)
    if isinstance(workload, DenseWorkload):
        return DenseTiling(m=rows, k=inner, n=cols, order=order, k_split=k_split, **place)
    pack = str(ann[PACK_KEY]) if PACK_KEY in ann else ""
    return Conv2dTiling(oh=rows, ci=inner, co=cols, order=order, k_split=k_split, pack=pack, **place)

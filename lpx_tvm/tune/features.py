"""What the cost model sees of an LPX candidate.

MetaSchedule's stock feature extractor (``PerStoreFeature``) reads loop nests and
buffer accesses. LPX codegen reads a candidate's decisions from its tile block's
annotations (:func:`~lpx_tvm.tir_schedules.schedules.tiling_of`): the K split and the
tap packing change nothing the stock features see, so two candidates that differ only
there look the same to the model, and it cannot learn what makes them differ.
:class:`LPXFeatures` describes a candidate by its decisions and by the counts they imply
on the machine — output blocks, reduction tiles, weight installs, multiplied vectors,
planes kept busy, packing work — one row per candidate, a few microseconds each.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..machine.config import LPXConfig
from ..tir_schedules import DenseWorkload, DepthwiseWorkload
from ..machine.isa import Unit
from ..machine.timing import unit_count
from ..tir_schedules.schedules import cycles_per_vector, k_split_rule, taps_per_tile, tile_install_cycles, tiling_of
from .space import orders, output_blocks, reduction_tiles, task_key_of

NAMES = ("log2_block_rows", "log2_blocks", "blocks_per_plane", "k_split", "reduction_tiles", "log2_installs",
         "log2_mul_cycles", "log2_mul_cycles_per_busy_plane", "install_over_mul", "busy_planes", "pack_taps",
         "pack_rows", "log2_pack_vectors", "order_second", "log2_macs", "log2_estimated_cycles", "first_plane", "install_ahead")


def _counts(w, tiling, cfg: LPXConfig, batches: int) -> dict:
    """What a tiling implies on the machine: blocks, tiles, installs, vectors, planes."""
    lanes, planes = cfg.lanes, cfg.mxm_planes
    rate = cycles_per_vector(cfg, w.dtype)
    pack = getattr(tiling, "pack", "")
    if isinstance(w, DenseWorkload):
        rows, pixels, col_tiles = tiling.m, batches * w.M, w.N // lanes
        macs = batches * w.M * w.K * w.N
    else:
        rows, pixels = tiling.oh * w.OW, w.N * w.OH * w.OW
        col_tiles = (w.C if isinstance(w, DepthwiseWorkload) else w.CO) // lanes
        macs = pixels * w.KH * w.KW * w.C * (1 if isinstance(w, DepthwiseWorkload) else w.CO)
    tiles = reduction_tiles(w, lanes, pack)
    blocks = output_blocks(w, tiling.m if isinstance(w, DenseWorkload) else tiling.oh, lanes, batches)
    k_split = min(tiling.k_split or k_split_rule(cfg, blocks), tiles)
    if pack == "taps":
        pack_vectors = pixels * w.KH * w.KW
    elif pack == "rows":
        pack_vectors = w.N * w.Hp * w.Wp * taps_per_tile(w, lanes, pack)
    else:
        pack_vectors = 0
    return dict(rate=rate, rows=rows, pixels=pixels, col_tiles=col_tiles, macs=macs, tiles=tiles, blocks=blocks,
                k_split=k_split, busy=min(planes, blocks * k_split), mul=pixels * tiles * col_tiles * rate,
                installs=blocks * tiles, pack_vectors=pack_vectors, pack=pack)


def estimated_cycles(w, tiling, cfg: LPXConfig, batches: int = 1) -> float:
    """A rough analytic estimate of a layer's cycles under a tiling: the MXM planes take
    the blocks' K parts round robin; a part installs and multiplies its reduction tiles
    (an install overlaps the previous tile's multiply: the slower of the two per tile),
    then drains; K parts add their partial sums on the VXM; a packing's moves take the
    SXMs (counted whole: the layer's first blocks wait on them); the last block's
    first multiply is not hidden behind anything."""
    n = _counts(w, tiling, cfg, batches)
    lanes, planes = cfg.lanes, cfg.mxm_planes
    parts = n["blocks"] * n["k_split"]
    install = tile_install_cycles(cfg, w.dtype) + cfg.latency["mxm_install"] + cfg.latency["mem_read"]
    per_part = n["tiles"] / n["k_split"] * max(n["rows"] * n["rate"], install) + lanes + n["rows"]
    mxm = -(-parts // planes) * per_part + n["blocks"] * (n["k_split"] - 1) * n["rows"] / planes
    n_sxm = max(1, unit_count(cfg, Unit.SXM))
    return mxm + n["pack_vectors"] / n_sxm + n["rows"] * n["rate"]


def candidate_features(w, tiling, cfg: LPXConfig, batches: int = 1) -> np.ndarray:
    """The feature row of one tiling of workload ``w`` (see :data:`NAMES`)."""
    n = _counts(w, tiling, cfg, batches)
    return np.array([math.log2(n["rows"]), math.log2(n["blocks"]), n["blocks"] / cfg.mxm_planes, n["k_split"],
                     n["tiles"], math.log2(n["installs"]), math.log2(n["mul"]), math.log2(n["mul"] / n["busy"]),
                     n["installs"] * cfg.lanes / n["mul"], n["busy"], n["pack"] == "taps", n["pack"] == "rows",
                     math.log2(1 + n["pack_vectors"]), tiling.order == orders(w)[1], math.log2(n["macs"]),
                     math.log2(estimated_cycles(w, tiling, cfg, batches)), tiling.first_plane,
                     tiling.install_ahead], np.float32)


@derived_object
class LPXFeatures(ms.feature_extractor.PyFeatureExtractor):
    """Features of LPX candidates from their decisions (:func:`candidate_features`)."""

    def __init__(self, cfg: LPXConfig):
        super().__init__()
        self.cfg = cfg

    def extract_from(self, context, candidates) -> list:
        w, _, batches, _ = task_key_of(context.mod)
        out = []
        for cand in candidates:
            try:
                row = candidate_features(w, tiling_of(w, cand.sch.mod["main"]), self.cfg, batches)
            except (ValueError, KeyError):  # not an LPX tile schedule: all zeros
                row = np.zeros(len(NAMES), np.float32)
            out.append(tvm.runtime.tensor(row.reshape(1, -1)))
        return out

"""TensorIR for LPX: TE computes of the MXM workloads, their schedules, the tile intrinsic."""

from .schedules import MXM_TILE, Conv2dTiling, DenseTiling, default_tiling, schedule
from .tiles import TileStep, tile_steps
from .workloads import Conv2dWorkload, DenseWorkload, DepthwiseWorkload, round_up

__all__ = ["DenseWorkload", "Conv2dWorkload", "DepthwiseWorkload", "DenseTiling", "Conv2dTiling", "default_tiling", "schedule",
           "tile_steps", "TileStep", "MXM_TILE", "round_up"]

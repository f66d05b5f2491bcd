"""Codegen: partitioned Relax regions -> scheduled TensorIR tiles and vector ops -> LPX Programs."""

from .graph import UnsupportedOnLPX, read_region
from .region import CompiledRegion, RegionCompiler, stored_shape

__all__ = ["RegionCompiler", "CompiledRegion", "UnsupportedOnLPX", "read_region", "stored_shape"]

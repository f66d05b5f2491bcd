"""Codegen: partitioned Relax regions -> scheduled TensorIR tiles and vector ops -> LPX Programs."""

from ...runtime.region import CompiledRegion
from .graph import UnsupportedOnLPX, read_region
from .policy import TilingPolicy
from .region import compile_region, stored_shape

__all__ = ["compile_region", "TilingPolicy", "CompiledRegion", "UnsupportedOnLPX", "read_region", "stored_shape"]

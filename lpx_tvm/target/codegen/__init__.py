"""Codegen: partitioned Relax regions -> scheduled TensorIR tiles and vector ops -> LPX Programs.

The one entry is :func:`compile_region`; see docs/compiler.md for the registry of
lowerings, the lowering context and how to add an op.
"""

from ...runtime.compiled_region import CompiledRegion
from .graph import UnsupportedOnLPX, read_region
from .options import CodegenOptions, codegen_options
from .tiling_policy import TilingPolicy
from .region_compiler import compile_region
from .storage import stored_shape

__all__ = ["compile_region", "TilingPolicy", "CodegenOptions", "codegen_options", "CompiledRegion",
           "UnsupportedOnLPX", "read_region", "stored_shape"]

"""Hand-written LPX kernels built with the ProgramBuilder and its list scheduler."""

from .gemm import gemm
from .rownorm import layernorm, softmax
from .transpose import transpose

__all__ = ["gemm", "softmax", "layernorm", "transpose"]

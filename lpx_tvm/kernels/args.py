"""What a hand-written kernel checks of its arguments before building anything, so a bad
size or dtype is one clear error naming the kernel and the argument."""

from __future__ import annotations

from ..errors import ProgramError
from ..machine.isa import DType

FLOATS = (DType.FP16, DType.BF16, DType.FP32)


def kernel_dtype(kernel: str, dtype, allowed) -> DType:
    """``dtype`` parsed, if it is one of ``allowed``; else a ProgramError listing them."""
    names = ", ".join(d.short for d in allowed)
    try:
        dt = DType.parse(dtype)
    except ValueError:
        raise ProgramError(f"{kernel}: unknown dtype {dtype!r} (expected one of: {names})") from None
    if dt not in allowed:
        raise ProgramError(f"{kernel}: dtype {dt.short} is not supported (expected one of: {names})")
    return dt


def check_sizes(kernel: str, **sizes) -> None:
    """Every size a positive integer; else a ProgramError naming it."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProgramError(f"{kernel}: {name} must be a positive integer, got {value!r}")

"""What the region codegen can lower, asked by the BYOC check functions.

Keeping these rules here, beside the lowering, means the partitioner never offloads an
op that codegen would then refuse.
"""

from __future__ import annotations

import math


def _matrix(shape: tuple) -> tuple:
    """The (rows, cols) matrix a value is stored as (4-D NCHW values as NHWC)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 4:
        n, c, h, w = shape
        return (n * h * w, c)
    return (math.prod(shape[:-1]) if len(shape) > 1 else 1, shape[-1] if shape else 1)


def reshape_keeps_storage(src: tuple, dst: tuple) -> bool:
    """True when a reshape leaves every element where it is stored (a free alias)."""
    if _matrix(src) != _matrix(dst):
        return False
    spatial = lambda s: len(s) == 4 and int(s[2]) * int(s[3]) > 1  # noqa: E731
    # NHWC storage orders a 4-D value with pixels differently from its NCHW flattening.
    return spatial(src) == spatial(dst) and (not spatial(src) or tuple(src) == tuple(dst))


def binary_operands_problem(lhs: tuple, rhs: tuple, lhs_const: bool, rhs_const: bool) -> "str | None":
    """Why an elementwise add/subtract/multiply cannot be lowered, or None."""
    lhs, rhs = tuple(int(s) for s in lhs), tuple(int(s) for s in rhs)
    if lhs_const and rhs_const:
        return "both operands are constants (folded at compile time)"
    tensor, other, other_const = (rhs, lhs, lhs_const) if lhs_const else (lhs, rhs, rhs_const)
    if not other_const:
        return None if tensor == other else f"broadcast of {other} against {tensor} moves data between lanes"
    size = math.prod(other) if other else 1
    if size == 1 or other == tensor:
        return None
    channels = tensor[1] if len(tensor) == 4 else tensor[-1]
    if size == channels and (len(tensor) != 4 or len(other) < 2 or other[-2:] == (1, 1)) and \
            (len(tensor) == 4 or other[-1] == channels):
        return None
    return f"constant of shape {other} broadcast against {tensor}: only scalars, one value per channel " \
           "or a full tensor are supported"

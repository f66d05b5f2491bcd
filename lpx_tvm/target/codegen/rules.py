"""What the region codegen can lower, asked by the BYOC check functions.

Keeping these rules here, beside the lowering, means the partitioner never offloads an
op that codegen would then refuse.
"""

from __future__ import annotations

import math

import numpy as np


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


def grouped_conv_problem(groups: int, cin: int, cout: int) -> "str | None":
    """Why a conv2d with ``groups`` cannot be lowered, or None.

    Depthwise convolution has its own lowering (a diagonal weight tile per tap); any other
    grouping becomes a dense convolution whose weight is block-diagonal (see
    :func:`block_diagonal`), which needs only that the groups split both channel counts."""
    if groups < 1 or cin % groups or cout % groups:
        return f"groups={groups} does not divide {cin} input and {cout} output channels"
    return None


def is_depthwise(groups: int, channels: int, w_shape: tuple) -> bool:
    """Whether a conv2d with ``groups`` over ``channels`` inputs and an OIHW weight of
    ``w_shape`` is depthwise (one input channel per group, one output channel each)."""
    return groups != 1 and groups == channels == w_shape[0] and w_shape[1] == 1


def block_diagonal(w, groups: int):
    """The dense (CO, C, KH, KW) weight of a grouped conv's (CO, C / groups, KH, KW) weight:
    output channels of group g read input channels of group g only, zeros elsewhere."""
    co, cg, kh, kw = w.shape
    og = co // groups
    dense = np.zeros((co, cg * groups, kh, kw), np.float32)
    for g in range(groups):
        dense[g * og:(g + 1) * og, g * cg:(g + 1) * cg] = w[g * og:(g + 1) * og]
    return dense

"""A 4-D NCHW value and its (N*H*W, C) pixel rows (``lpx.pixels_to_rows`` and
``lpx.rows_to_pixels``, from :mod:`lpx_tvm.relax_passes.channels_last`): LPX stores
both as one row per pixel with the channels in lanes, so each is the same tensor seen
under the other shape."""

from __future__ import annotations

from ..lowering_context import LoweringContext
from ..graph import RegionOp
from ..registry import OpPattern, register_lowering, register_pattern
from ..pattern_checks import permute_reshape_pattern, reshape_permute_pattern
from ..relax_exprs import expr_shape
from ..storage import Stored
from ..values import copy_value


def _check(shape4: tuple, rows_shape: tuple):
    n, c, h, w = shape4
    assert tuple(rows_shape) == (n * h * w, c), "the pixel-rows patterns take the (N*H*W, C) view only"


@register_lowering("lpx.pixels_to_rows", banding="view")
def lower_pixels_to_rows(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """The image's tensor as (N*H*W, C) (an output alias is copied out by the region driver)."""
    x = ctx.value(op.main.args[0])
    _check(x.shape, op.shape)
    ctx.values[op.out] = Stored(x.tensor, tuple(op.shape))


@register_lowering("lpx.rows_to_pixels", banding="view")
def lower_rows_to_pixels(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """The rows' tensor as (N, C, H, W) when its SRAM chunks hold whole image rows (the
    windows of a convolution or pool never straddle two chunks); else a copy laid out so."""
    x = ctx.value(op.main.args[0])
    _check(op.shape, x.shape)
    lay = x.tensor.layout
    if lay.nchunks == 1 or lay.rows_per_chunk % op.shape[3] == 0:
        ctx.values[op.out] = Stored(x.tensor, tuple(op.shape))
        return
    ctx.values[op.out] = copy_value(ctx, Stored(x.tensor, tuple(op.shape)), op.out, is_output)


# ---- patterns ---------------------------------------------------------------------------


def _pixel_rows_problem(op, shape4, rows_shape):
    """Why ``rows_shape`` is not the (N*H*W, C) pixel-rows view of the NCHW ``shape4``, or None."""
    n, c, h, w = shape4
    if len(rows_shape) != 2 or tuple(rows_shape) != (n * h * w, c):
        return op, (f"{tuple(rows_shape)} is not the (N*H*W, C) = {(n * h * w, c)} pixel rows of {tuple(shape4)}: "
                    "only that view keeps the NHWC storage")
    return None


def _pixels_to_rows_check(a, settings):
    reshape, permute, data = a["root"], a["permute"], a["input"]
    if len(expr_shape(data)) != 4 or [int(x) for x in permute.attrs.axes] != [0, 2, 3, 1]:
        return reshape, "pixel rows are permute_dims [0, 2, 3, 1] of a 4-D value then a reshape to 2-D"
    return _pixel_rows_problem(reshape, expr_shape(data), expr_shape(reshape))


def _rows_to_pixels_check(a, settings):
    permute, data = a["root"], a["input"]
    if len(expr_shape(permute)) != 4 or [int(x) for x in permute.attrs.axes] != [0, 3, 1, 2]:
        return permute, "an image from pixel rows is a reshape to (N, H, W, C) then permute_dims [0, 3, 1, 2]"
    return _pixel_rows_problem(permute, expr_shape(permute), expr_shape(data))


# The same op chains as a head merge / split (lowerings/data_movement.py), of NCHW values.
register_pattern(
    OpPattern("pixels_to_rows", permute_reshape_pattern, checks=(_pixels_to_rows_check,), priority=86,
              zero_d=True),
    OpPattern("rows_to_pixels", reshape_permute_pattern, checks=(_rows_to_pixels_check,), priority=87,
              zero_d=True),
)

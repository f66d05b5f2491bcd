"""A 4-D NCHW value and its (N*H*W, C) pixel rows (``lpx.pixels_to_rows`` and
``lpx.rows_to_pixels``, from :mod:`lpx_tvm.relax_passes.channels_last`): LPX stores
both as one row per pixel with the channels in lanes, so each is the same tensor seen
under the other shape."""

from __future__ import annotations

from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..registry import register_lowering
from ..storage import Stored
from ..values import copy_value


def _check(shape4: tuple, rows_shape: tuple):
    n, c, h, w = shape4
    if tuple(rows_shape) != (n * h * w, c):
        raise UnsupportedOnLPX(f"{tuple(rows_shape)} is not the pixel rows of {tuple(shape4)}")


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

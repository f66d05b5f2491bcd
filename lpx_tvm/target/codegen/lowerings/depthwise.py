"""Depthwise convolution (groups == channels, one input channel per group) on the MXM:
each tap of a channel tile is a diagonal weight tile (see :mod:`..weights`). Reached
through the ``nn.conv2d`` lowering."""

from __future__ import annotations

import numpy as np

from ....tir_schedules import DepthwiseWorkload, round_up
from ..lowering_context import LoweringContext
from ..graph import RegionOp
from ..mxm_tiles import TVM_DTYPE, conv_tiles, emit_mxm, layer_tiling
from ..padding import padded
from ..storage import Stored


def lower_depthwise(ctx: LoweringContext, op: RegionOp, x: Stored, w: np.ndarray, is_output: bool, q=None):
    """Depthwise conv on the MXM: each tap of a channel tile is a diagonal weight tile."""
    a = op.main.attrs
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    (sh, sw), (dh, dw) = a["strides"], a["dilation"]
    lanes = ctx.cfg.lanes
    xp = padded(ctx, x, tuple(a["padding"]), op.out, fill=q.fill if q else 0.0)
    hp, wp = xp.shape[2], xp.shape[3]
    cpad = round_up(c, lanes)
    work = DepthwiseWorkload(n, hp, wp, cpad, kh, kw, (sh, sw), (dh, dw), TVM_DTYPE[ctx.dtype])
    oh, ow = work.OH, work.OW
    steps, window, block, tiling = conv_tiles(ctx, work, layer_tiling(ctx, op, work), xp)

    def weights(step):
        kh0, kw0, c0 = (step.reads["W"][d][0] for d in range(3))
        base = (kh0 * kw + kw0) * cpad + c0
        return 0, base, base + min(c - c0, lanes)

    ctx.macs += n * oh * ow * c * kh * kw
    emit_mxm(ctx, op, steps, window, weights, block, c, is_output, tiling, q=q)

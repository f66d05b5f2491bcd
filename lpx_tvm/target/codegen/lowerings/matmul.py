"""``matmul``: dense layers (a constant (K, N) weight) and activation x activation
products (B installed from its SRAM tensor like a weight matrix, batch by batch)."""

from __future__ import annotations

import math

from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..mxm_tiles import matmul
from ..registry import register_lowering
from ..values import whole_groups


@register_lowering("matmul", banding=lambda op: "rows" if op.main.args[1].is_const else "whole")
def lower_matmul(ctx: LoweringContext, op: RegionOp, is_output: bool):
    x = ctx.value(op.main.args[0])
    b = op.main.args[1]
    if b.is_const:
        if len(b.shape) != 2:
            raise UnsupportedOnLPX("matmul with a constant weight that is not 2-D")
        k, nn = b.shape
        return matmul(ctx, op, x, math.prod(x.shape[:-1]), k, nn, is_output)
    # Activation x activation: B is installed from its SRAM tensor like a weight
    # matrix (rows = K, lane tiles = N), batch by batch.
    w = ctx.value(b)
    if len(w.shape) != len(x.shape) or len(x.shape) not in (2, 3) or tuple(w.shape[:-2]) != tuple(x.shape[:-2]):
        raise UnsupportedOnLPX(f"matmul of {x.shape} by a runtime {w.shape}")
    batches = x.shape[0] if len(x.shape) == 3 else 1
    k, nn = w.shape[-2:]
    matmul(ctx, op, x, x.shape[-2], k, nn, is_output, W=whole_groups(ctx, w, k, f"{op.out}.rhs").tensor,
           batches=batches)

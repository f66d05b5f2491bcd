"""``matmul``: dense layers (a constant (K, N) weight) and activation x activation
products (B installed from its SRAM tensor like a weight matrix, batch by batch)."""

from __future__ import annotations

import math

import numpy as np
from tvm.relax.dpl import is_op, wildcard

from ..lowering_context import LoweringContext
from ..graph import RegionOp
from ..mxm_tiles import matmul
from ..quant import mxm_view
from ..registry import OpPattern, register_lowering, register_pattern
from ..pattern_checks import EPILOGUE_VARIANTS, epilogue_checks, epilogue_name, epilogue_pattern, same_dtype_problem
from ..relax_exprs import expr_shape, is_const
from ..values import whole_groups
from ..weights import place_matrix


def _place_weights(ctx: LoweringContext, op: RegionOp):
    """A dense layer's constant (K, N) weight, placed as it is (:func:`~..weights.place_matrix`)."""
    args = mxm_view(op).main.args  # an 8-bit composite as its matmul
    if len(args) < 2 or not args[1].is_const or len(args[1].shape) != 2:
        return None
    return place_matrix(ctx, op, np.asarray(args[1].const, np.float32), ctx.cfg.lanes)


@register_lowering("matmul", banding=lambda op: "rows" if op.main.args[1].is_const else "whole",
                   weights=_place_weights)
def lower_matmul(ctx: LoweringContext, op: RegionOp, is_output: bool):
    x = ctx.value(op.main.args[0])
    b = op.main.args[1]
    if b.is_const:
        assert len(b.shape) == 2, "the dense patterns take a 2-D constant weight"
        k, nn = b.shape
        return matmul(ctx, op, x, math.prod(x.shape[:-1]), k, nn, is_output)
    # Activation x activation: B is installed from its SRAM tensor like a weight
    # matrix (rows = K, lane tiles = N), batch by batch.
    w = ctx.value(b)
    assert len(w.shape) == len(x.shape) and len(x.shape) in (2, 3) and tuple(w.shape[:-2]) == tuple(x.shape[:-2]), \
        "the dense patterns take 2-D, or 3-D batches of equal size, by a runtime B"
    batches = x.shape[0] if len(x.shape) == 3 else 1
    k, nn = w.shape[-2:]
    # Batches are read a block of K rows at a time; one batch is read chunk by chunk as it
    # lies (a value cache spread over slices for its installs).
    W = whole_groups(ctx, w, k, f"{op.out}.rhs") if batches > 1 else w
    matmul(ctx, op, x, x.shape[-2], k, nn, is_output, W=W.tensor, batches=batches)


# ---- patterns ---------------------------------------------------------------------------


def _dense_pattern(bias=False, activation=None):
    data, weight = wildcard(), wildcard()
    root = is_op("relax.matmul")(data, weight)
    return epilogue_pattern(root, {"input": data, "weight": weight, "root": root}, bias, activation)


def _dense_check(a, settings):
    root, data, weight = a["root"], a["input"], a["weight"]
    found = same_dtype_problem(root, data, weight, ("input", "weight"))
    if found:
        return found
    if not is_const(weight):
        # Activation x activation: B is installed from SRAM like a weight matrix.
        lhs, rhs = expr_shape(data), expr_shape(weight)
        if len(lhs) != len(rhs) or len(lhs) not in (2, 3) or lhs[:-2] != rhs[:-2]:
            return root, (
                f"runtime matmul operands {lhs} x {rhs}: LPX multiplies 2-D matrices, or 3-D "
                "batches of equal size (4-D values are stored NHWC; broadcasts move data between lanes)"
            )
        return None
    if len(expr_shape(weight)) != 2:
        rank = len(expr_shape(weight))
        return root, f"weight of rank {rank}: LPX dense takes a 2-D (K, N) weight"
    if len(expr_shape(data)) < 2:
        return root, "input of rank 1: LPX dense takes an input of rank >= 2"
    return None


def dense_bias_shapes(n):
    return [(n,), (1, n)]


# ``lpx.dense[_bias][_relu|_clip]``: keys ``input``, ``weight`` (constant (K, N), or a
# runtime B), ``root`` (the ``matmul``), ``bias``, ``bias_add``, ``activation``.
register_pattern(*(
    OpPattern(epilogue_name("dense", bias, act), lambda bias=bias, act=act: _dense_pattern(bias, act),
              ("input", "weight"), (_dense_check, *epilogue_checks(bias, act, dense_bias_shapes)),
              priority=101 + 2 * i, zero_d=True)
    for i, (bias, act) in enumerate(EPILOGUE_VARIANTS)))

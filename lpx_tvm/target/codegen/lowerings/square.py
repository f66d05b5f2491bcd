"""``square`` (``torch.square``, Relax's ``R.square``): x * x on the VXM, row by row.

The whole op family in one module: its pattern (the shared tensor checks are all it
needs) and its lowering. The value read from SRAM goes through the VXM once (x * 1,
exact) so that one stream feeds both operands of the multiply.
"""

from __future__ import annotations

from ..graph import RegionOp
from ..lowering_context import LoweringContext
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..row_passes import rowwise
from ..values import new_value

register_pattern(OpPattern("square", lambda: unary_pattern("relax.square"), priority=30))


@register_lowering("square")
def lower_square(ctx: LoweringContext, op: RegionOp, is_output: bool):
    x = ctx.value(op.main.args[0])
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x])

    def body(g, vs):
        v = g.vxm("vxm.mul", vs[0], imm=1.0)
        return g.vxm("vxm.mul", v, v)

    rowwise(ctx, f"{op.out}.square", [x], y, body)
    ctx.values[op.out] = y

"""``lpx.all_reduce``: the sum of a value over the chips of a group (tensor parallelism's
partial sums), inside the chip's program: the collective's groups
(:func:`~lpx_tvm.target.system_programs.emit_all_reduce`) on this region's builder, their
receives timed by the arrivals the peers' programs give (docs/multichip.md)."""

from __future__ import annotations

from ...system_programs import emit_all_reduce
from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..pattern_checks import tensors_problem
from ..relax_exprs import expr_shape
from ..values import new_value


@register_lowering("lpx.all_reduce")
def lower_all_reduce(ctx: LoweringContext, op: RegionOp, is_output: bool):
    place = ctx.interface.chip
    if place is None:
        raise UnsupportedOnLPX(f"{op.composite}: a program of one chip has no peers to sum with; compile it for a "
                               "chip of a system (docs/multichip.md)")
    x = ctx.value(op.main.args[0])
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x])
    emit_all_reduce(ctx.builder, place, x.tensor, y.tensor, f"{op.out}.all_reduce")
    ctx.values[op.out] = y


# ---- patterns ---------------------------------------------------------------------------


def _all_reduce_check(a, settings):
    op = a["root"]
    if str(op.attrs.op_type) != "sum":
        return op, f"an all-reduce by {op.attrs.op_type}: LPX all-reduces by sum"
    if len(expr_shape(op)) != 2:
        return op, f"an all-reduce of a {len(expr_shape(op))}-D value: LPX all-reduces rows of a 2-D value"
    return tensors_problem(op, [a["input"]], settings)


# ``input`` (2-D), ``root`` (``ccl.allreduce``, sum): the sum over the chips of a system's group.
register_pattern(OpPattern("all_reduce", lambda: unary_pattern("relax.ccl.allreduce"), None,
                           (_all_reduce_check,), priority=79, zero_d=True))

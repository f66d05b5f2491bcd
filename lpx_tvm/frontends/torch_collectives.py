"""Collectives a torch model names for a system of chips: ``all_reduce(x)``, the sum of
``x`` over the chips of the model's tensor-parallel group (docs/multichip.md).

Each chip's model is its own torch module (its share of the weights); where the chips'
partial results must be summed, the module calls :func:`all_reduce`. In torch alone (one
process, a group of one) it is the identity; exported, it becomes Relax's
``ccl.allreduce``, which LPX runs inside the chip's program over its links.
"""

_OP = None  # (no ``from __future__ import annotations``: torch reads the op's annotations)


def all_reduce(x):
    """The sum of ``x`` over the chips of the group (the identity in torch)."""
    return _op()(x)


def _op():
    global _OP
    if _OP is None:
        from .torch import require_torch

        torch = require_torch()

        def all_reduce_op(x):
            return x.clone()

        all_reduce_op.__annotations__ = {"x": torch.Tensor, "return": torch.Tensor}
        all_reduce_op = torch.library.custom_op("lpx::all_reduce", mutates_args=())(all_reduce_op)

        @all_reduce_op.register_fake
        def _(x):
            return torch.empty_like(x)

        _OP = torch.ops.lpx.all_reduce
    return _OP

"""The one table of lowerings: which function lowers each Relax op or LPX composite.

A lowering module registers its functions with :func:`register_lowering`, under the
Relax op names (``"nn.conv2d"``, ``"add"``: the op of a composite's first step, without
``relax.``) or the composite names (``"lpx.qconv2d"``) it handles. A region op is looked
up by its composite name first, then by its main op. Every lowering is called as
``lowering(ctx, op, is_output)`` and stores its result in ``ctx.values[op.out]``.

The lowering modules are imported in one place, :mod:`.lowerings`.
"""

from __future__ import annotations

from typing import Callable

from .graph import RegionOp, UnsupportedOnLPX

Lowering = Callable  # (LoweringContext, RegionOp, is_output: bool) -> None

_LOWERINGS: "dict[str, Lowering]" = {}


def register_lowering(*names: str):
    """Register the decorated function as the lowering of each of ``names``."""

    def register(fn: Lowering) -> Lowering:
        for name in names:
            if name in _LOWERINGS:
                raise ValueError(f"{name} already has a lowering ({_LOWERINGS[name].__qualname__})")
            _LOWERINGS[name] = fn
        return fn

    return register


def lowering_for(op: RegionOp) -> Lowering:
    """The lowering of a region op; :class:`UnsupportedOnLPX` naming the op if none."""
    fn = _LOWERINGS.get(op.composite) or _LOWERINGS.get(op.main.op)
    if fn is None:
        raise UnsupportedOnLPX(f"no LPX lowering for {op.main.op}")
    return fn


def lower(ctx, op: RegionOp, is_output: bool):
    """Lower one region op on chip (its values in SRAM)."""
    lowering_for(op)(ctx, op, is_output)


def registered() -> dict:
    """Name -> lowering, for every registered name (a copy)."""
    return dict(_LOWERINGS)

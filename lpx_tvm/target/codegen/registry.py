"""The one table of lowerings: which function lowers each Relax op or LPX composite.

A lowering module registers its functions with :func:`register_lowering`, under the
Relax op names (``"nn.conv2d"``, ``"add"``: the op of a composite's first step, without
``relax.``) or the composite names (``"lpx.qconv2d"``) it handles. A region op is looked
up by its composite name first, then by its main op. Every lowering is called as
``lowering(ctx, op, is_output)`` and stores its result in ``ctx.values[op.out]``.

An op family may also declare its patterns beside its lowering
(:func:`register_pattern`, an :class:`OpPattern` each): the partitioner's collector
(:func:`lpx_tvm.relax_passes.patterns.pattern_table`) takes them with the patterns it
holds itself, orders all by priority, and applies the shared tensor checks once. A new
op is then one module of :mod:`.lowerings` (docs/compiler.md, "Adding an op").

The lowering modules are imported in one place, :mod:`.lowerings`, every module of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tvm.relax.dpl import is_op, wildcard

from .graph import RegionOp, UnsupportedOnLPX

Lowering = Callable  # (LoweringContext, RegionOp, is_output: bool) -> None

_LOWERINGS: "dict[str, Lowering]" = {}
# How the off-chip driver (offchip.py) cuts an op whose values live off chip into bands:
# "rows" (each output row band from the same rows of its inputs), "window" (input rows
# around each output band: a convolution's or a pool's window), "channels" (bands of
# channels: a spatial mean), "whole" (lanes or rows move between rows: one band holds
# the op), "view" (the same bytes seen another way: no band at all), "placement"
# (output rows placed anywhere in the image: one band). A function of the op where it
# depends on its operands.
BANDINGS = ("rows", "window", "channels", "whole", "view", "placement")
_BANDING: dict = {}
_CUTS_CONSTANTS: set = set()  # ops whose full-tensor constant operands a band cuts to its rows
# How an op's constants are laid out and placed before any working space (the MXM
# weight matrix of a conv2d or a dense layer, a gather's table): ``place(ctx, op) ->
# placed | None``, read by :func:`.weights.place_weights`.
_WEIGHTS: dict = {}
# The input rows a band of output rows reads, for a family whose window is its own (a
# resize's taps): ``band_rows(attrs, input height, output height) -> fn(h0, rows) ->
# (first input row, input rows, padding)``; such a band op learns where it sits
# (``attrs["band"]``).
_BAND_ROWS: dict = {}


def register_lowering(*names: str, banding="rows", cuts_constants: bool = False, weights=None, band_rows=None):
    """Register the decorated function as the lowering of each of ``names``, with how
    the off-chip driver bands it (:data:`BANDINGS`, or ``banding(op) -> str``; and
    ``band_rows``, the input rows of a band of output rows where the family has its own
    window), whether a band cuts its full-tensor constant operands (elementwise ops), and
    how its constants are placed (``weights(ctx, op) -> placed | None``: its weight
    layout)."""
    if not callable(banding) and banding not in BANDINGS:
        raise ValueError(f"banding {banding!r}: expected one of {', '.join(BANDINGS)}")

    def register(fn: Lowering) -> Lowering:
        for name in names:
            if name in _LOWERINGS:
                raise ValueError(f"{name} already has a lowering ({_LOWERINGS[name].__qualname__})")
            _LOWERINGS[name] = fn
            _BANDING[name] = banding
            if cuts_constants:
                _CUTS_CONSTANTS.add(name)
            if weights is not None:
                _WEIGHTS[name] = weights
            if band_rows is not None:
                _BAND_ROWS[name] = band_rows
        return fn

    return register


def _of(table: dict, op: RegionOp):
    """``op``'s entry in ``table``: by its composite's name first, then by its main op."""
    return table.get(op.composite) or table.get(op.main.op)


def banding_of(op: RegionOp) -> str:
    """How the off-chip driver bands ``op``: as its lowering was registered (looked up as
    the lowering is, by composite first, then by main op)."""
    kind = _of(_BANDING, op) or "rows"
    return kind(op) if callable(kind) else kind


def band_rows_of(op: RegionOp):
    """The family's own ``band_rows`` of ``op`` (see :func:`register_lowering`), or None."""
    return _of(_BAND_ROWS, op)


def weights_of(op: RegionOp):
    """How ``op``'s constants are placed (``place(ctx, op)``), or None for an op
    without: looked up as the lowering is, by composite first, then by main op."""
    return _of(_WEIGHTS, op)


def cuts_constants(op_name: str) -> bool:
    """Whether a band cuts the full-tensor constant operands of Relax op ``op_name``."""
    return op_name in _CUTS_CONSTANTS


@dataclass(frozen=True)
class OpPattern:
    """A pattern an op family declares beside its lowering.

    ``name``: the composite's name without ``lpx.``; ``make() -> (pattern,
    annotations)``, its dataflow pattern with the matched parts by name (``root``
    the op the lowering is looked up by when no lowering has the composite's name).

    How the partitioner checks a match, in order:

    - ``tensors``: the annotations whose tensors get the shared checks
      (:func:`.pattern_checks.tensors_problem`: dtypes the build stores, static shapes,
      SRAM fit), with ``root``; int32 ones too when ``integers``. None: the family's
      checks look at the tensors themselves (where their own refusals come first).
    - ``checks``: the family's own, each ``check(annotated, settings) -> None |
      (expr, reason)``, made here and nowhere else (the lowering asserts what they
      promise).
    - 0-d results are refused last, unless ``zero_d`` (or ``tensors`` is None).

    ``priority``: where it sits among the patterns, the higher tried first where two
    match the same ops, and the lower's refusal the one a user sees (ties keep
    declaration order; docs/compiler.md lists the priorities). ``precisions``: the
    builds it is tried in (others refuse it without a reason), None for every float
    build and int8. ``lowered``: False for a pattern that only says why an op stays on
    the CPU (its checks refuse every match, and no lowering exists).
    """

    name: str
    make: Callable
    tensors: "tuple | None" = ("input",)
    checks: tuple = ()
    priority: int = 0
    integers: bool = False
    zero_d: bool = False
    precisions: "tuple | None" = None
    lowered: bool = True


_PATTERNS: "list[OpPattern]" = []


def register_pattern(*patterns: OpPattern):
    """Declare ``patterns`` (a family module does, beside its ``@register_lowering``)."""
    for p in patterns:
        if any(q.name == p.name for q in _PATTERNS):
            raise ValueError(f"pattern lpx.{p.name} is already declared")
        _PATTERNS.append(p)


def declared_patterns() -> list:
    """The patterns the families declared, lowest priority first (ties in declaration
    order)."""
    return sorted(_PATTERNS, key=lambda p: p.priority)


def unary_pattern(op: str) -> tuple:
    """(pattern, annotations) of one call of Relax op ``op`` (``"relax.square"``) on a
    tensor ``input`` (its other arguments any)."""
    data = wildcard()
    root = is_op(op)(data, varg_default_wildcard=True)
    return root, {"input": data, "root": root}


def lowering_for(op: RegionOp) -> Lowering:
    """The lowering of a region op; :class:`UnsupportedOnLPX` naming the op if none."""
    fn = _of(_LOWERINGS, op)
    if fn is None:
        raise UnsupportedOnLPX(f"no LPX lowering for {op.main.op}")
    return fn


def lower(ctx, op: RegionOp, is_output: bool):
    """Lower one region op on chip (its values in SRAM)."""
    lowering_for(op)(ctx, op, is_output)


def registered() -> dict:
    """Name -> lowering, for every registered name (a copy)."""
    return dict(_LOWERINGS)

"""BYOC patterns for LPX: which Relax ops (and fused groups) LPX runs, and why not when not.

The patterns live with their op families (:mod:`lpx_tvm.target.codegen.lowerings`, one
module each): each family declares its patterns beside its lowering
(:class:`~lpx_tvm.target.codegen.registry.OpPattern`). This module collects them, orders
them by priority, and gives each the check the partitioner calls: the shared tensor
checks on the tensors the pattern names, then the family's own checks, then the refusal
of 0-d results. Importing it registers every pattern under the ``lpx.`` prefix with
:func:`tvm.relax.backend.pattern_registry.register_patterns`.

A check that says no records a one-line hardware reason in the :class:`RejectionLog` of
the current :func:`check_settings` context, keyed by the variable bound to the rejected
op, so the offload report can say why an op stayed on the CPU. The annotation keys of
each composite are given beside its pattern; docs/compiler.md lists the priorities.
"""

from __future__ import annotations

from tvm.relax.backend.pattern_registry import register_patterns
from tvm.relax.backend.utils import has_leaking_intermediate_variables

from ..target.codegen import lowerings  # noqa: F401  (imports every family: the patterns they declare)
from ..target.codegen.pattern_checks import scalar_problem, tensors_problem
from ..target.codegen.registry import OpPattern, declared_patterns
from ..target.codegen.relax_exprs import op_name
from .check_context import (
    CheckSettings,
    Rejection,
    RejectionLog,
    check_settings,
    current_settings,
)

__all__ = [
    "PATTERN_PREFIX",
    "REFUSE_ONLY",
    "CheckSettings",
    "Rejection",
    "RejectionLog",
    "check_settings",
    "current_settings",
    "pattern_table",
]

PATTERN_PREFIX = "lpx."

# Patterns that only say why an op stays on the CPU: their checks refuse every match, and
# no lowering exists for them (tests/target/test_pattern_lowerings.py holds both).
REFUSE_ONLY = tuple(p.name for p in declared_patterns() if not p.lowered)


def _rules(p: OpPattern) -> list:
    """The checks of ``p`` in the order they run: shared tensor checks, the family's own,
    the refusal of 0-d results."""
    rules = list(p.checks)
    if p.tensors is not None:
        tensors, integers = p.tensors, p.integers

        def shared(a, settings):
            return tensors_problem(a["root"], [a[t] for t in tensors], settings, integers)

        rules.insert(0, shared)
        if not p.zero_d:
            rules.append(lambda a, settings: scalar_problem(a["root"]))
    return rules


def make_check(name: str, rules: list, precisions=None):
    """A check function that applies ``rules`` in order and records the first refusal.

    Each rule is ``rule(annotated, settings) -> None | (op to blame, reason)``. With
    ``precisions``, a build of another precision refuses without a reason (the other
    patterns' reasons stand)."""

    def check(context) -> bool:
        settings = current_settings()
        if precisions is not None and settings.precision not in precisions:
            return False
        if has_leaking_intermediate_variables(context):
            # An inner result is used outside the group; a smaller pattern will take it.
            return False
        annotated = {key: context.annotated_expr[key] for key in context.annotated_expr}
        for rule in rules:
            found = rule(annotated, settings)
            if found is not None:
                op, reason = found
                key = context.value_to_bound_var.get(op, op)
                settings.log.record(key, Rejection(name, op_name(op), reason))
                return False
        return True

    check.__name__ = f"check_{name.removeprefix(PATTERN_PREFIX)}"
    return check


def pattern_table() -> list:
    """Every LPX pattern as ``(name, pattern, annotations, check)``, lowest priority first.

    Single ops come first and fused groups last, so that a fused group wins when its
    check accepts and the single-op patterns pick up the pieces when it does not.
    """
    table = []
    for p in declared_patterns():
        name = PATTERN_PREFIX + p.name
        table.append((name, *p.make(), make_check(name, _rules(p), p.precisions)))
    return table


register_patterns(pattern_table())

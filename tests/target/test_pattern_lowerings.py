"""Every LPX pattern reaches a lowering, and every lowering is reached by a pattern: a
composite the partitioner accepts can always be compiled, and no lowering is dead."""

from tvm.relax.dpl import CallPattern

from lpx_tvm.relax_passes.patterns import PATTERN_PREFIX, REFUSE_ONLY, pattern_table
from lpx_tvm.target.codegen import lowerings  # noqa: F401  (importing them registers every lowering)
from lpx_tvm.target.codegen.registry import registered


def _root_op(pattern, annotations) -> str:
    """The Relax op of a pattern's root (a region op's main op, as the registry looks it up)."""
    root = annotations.get("root", pattern)
    assert isinstance(root, CallPattern), root
    return root.op.expr.name.removeprefix("relax.")


def _patterns() -> dict:
    return {name: _root_op(pattern, annotations) for name, pattern, annotations, _ in pattern_table()}


def test_every_pattern_reaches_a_lowering():
    lowered = registered()
    refuse_only = {PATTERN_PREFIX + name for name in REFUSE_ONLY}
    unreached = [(name, op) for name, op in _patterns().items()
                 if name not in refuse_only and name not in lowered and op not in lowered]
    assert not unreached, f"patterns no lowering takes (composite name, root op): {unreached}"


def test_refuse_only_patterns_have_no_lowering():
    """A refuse-only pattern that gains a lowering must become an ordinary one."""
    lowered, patterns = registered(), _patterns()
    for name in REFUSE_ONLY:
        composite = PATTERN_PREFIX + name
        assert composite in patterns, f"{composite}: declared refuse-only but not a pattern"
        assert composite not in lowered and patterns[composite] not in lowered, composite


def test_every_lowering_has_a_pattern():
    patterns = _patterns()
    reached = set(patterns) | set(patterns.values())
    dead = sorted(name for name in registered() if name not in reached)
    assert not dead, f"lowerings no pattern reaches: {dead}"

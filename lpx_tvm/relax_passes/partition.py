"""Partition a Relax module into LPX regions and report what runs where.

``partition_for_lpx`` groups the ops the ``lpx.`` patterns accept into composite
functions (``FuseOpsByPattern``) and merges neighbouring composites into maximal
``Codegen="lpx"`` functions (``MergeCompositeFunctions``). Everything else stays in
``main`` and runs as TVM's CPU code. Run it before ``LegalizeOps``, on a module that
:func:`~lpx_tvm.relax_passes.canonicalize` has already prepared.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.backend.pattern_registry import get_patterns_with_prefix

from ..layer_names import CallNames, unshare_composites
from ..runtime.report import Offload
from . import cpu_only
from .patterns import PATTERN_PREFIX, check_settings  # importing registers the patterns

__all__ = ["CpuOp", "OffloadReport", "offload_report", "partition_for_lpx"]

CODEGEN = "lpx"


@dataclass(frozen=True)
class CpuOp:
    """One op left on the CPU: its Relax op name, the variable it binds, and why."""

    op: str
    var: str
    reason: str


@dataclass
class OffloadReport(Offload):
    """What partitioning sent to LPX and what it left on the CPU: the runtime's
    :class:`~lpx_tvm.runtime.report.Offload` (the fields, kept in artifacts and reports)
    with the partitioner's view of it (``cpu_ops`` as :class:`CpuOp`, totals, a table).

    Ops are counted one by one (a ``conv2d_bias_relu`` composite counts one
    ``nn.conv2d``, one ``add`` and one ``nn.relu``), by Relax op name without the
    ``relax.`` prefix.
    """

    @property
    def lpx_ops(self) -> int:
        return sum(self.lpx.values())

    @property
    def cpu_op_count(self) -> int:
        return sum(self.cpu.values())

    @property
    def offload_fraction(self) -> float:
        """Share of ops on LPX (1.0 for an empty module)."""
        total = self.lpx_ops + self.cpu_op_count
        return self.lpx_ops / total if total else 1.0

    def to_json(self) -> dict:
        """A dict of plain JSON types; :meth:`from_json` reads it back."""
        out = asdict(self)
        out["cpu_ops"] = [asdict(op) for op in self.cpu_ops]
        return out

    @classmethod
    def from_json(cls, data: dict) -> "OffloadReport":
        data = dict(data)
        data["cpu_ops"] = [CpuOp(**op) for op in data.get("cpu_ops", [])]
        return cls(**data)

    def format_table(self) -> str:
        """A plain-text table: one line per op type, then the CPU reasons."""
        ops = sorted(set(self.lpx) | set(self.cpu))
        width = max([len("op")] + [len(op) for op in ops])
        lines = [f"{'op':<{width}}  {'lpx':>5}  {'cpu':>5}"]
        for op in ops:
            lines.append(f"{op:<{width}}  {self.lpx.get(op, 0):>5}  {self.cpu.get(op, 0):>5}")
        lines.append(
            f"{'total':<{width}}  {self.lpx_ops:>5}  {self.cpu_op_count:>5}"
            f"   ({self.offload_fraction:.0%} on LPX, {self.regions} region(s))"
        )
        for op, reasons in sorted(self.reasons.items()):
            for reason in reasons:
                lines.append(f"cpu {op}: {reason}")
        return "\n".join(lines)


def partition_for_lpx(mod: tvm.IRModule, config=None, precision: str = "fp16"):
    """Partition ``mod`` into maximal ``Codegen="lpx"`` regions.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module, canonicalized and not yet legalized.
    config : LPXConfig, str or os.PathLike, optional
        The machine the checks judge against (default: the ``tsp`` preset).
    precision : str
        ``fp32``, ``fp16``, ``bf16`` or ``int8``: the compute precision on LPX, which
        sets the size of an activation in SRAM.

    Returns
    -------
    mod : tvm.IRModule
        The module with LPX regions as functions carrying ``Codegen="lpx"``; each
        holds inner functions with ``Composite="lpx.<name>"``.
    report : OffloadReport
        Op counts per side and the reason for each op left on the CPU.

    Raises
    ------
    PartitionError
        ``precision`` is unknown.
    """
    with check_settings(config, precision) as settings:
        seq = tvm.ir.transform.Sequential(
            [
                relax.transform.ConvertToDataflow(),
                _fuse_by_pattern,
                _merge_regions,
            ]
        )
        partitioned = seq(mod)
    report = offload_report(partitioned, settings.log)
    report.config = settings.config.name
    report.precision = settings.precision
    return partitioned, report


@tvm.ir.transform.module_pass(opt_level=0, name="lpx.FuseByPattern")
def _fuse_by_pattern(mod, ctx):
    """``FuseOpsByPattern`` with the ``lpx.`` patterns, each composite call keeping the
    source name of its own layer (:func:`~lpx_tvm.layer_names.unshare_composites`)."""
    before = CallNames(mod["main"])
    fuse = relax.transform.FuseOpsByPattern(get_patterns_with_prefix(PATTERN_PREFIX), bind_constants=True,
                                            annotate_codegen=False)
    return unshare_composites(fuse(mod), before)


@tvm.ir.transform.module_pass(opt_level=0, name="lpx.MergeRegions")
def _merge_regions(mod, ctx):
    """``MergeCompositeFunctions``, with the bindings it cannot visit (Ifs, match_casts,
    packed calls: :mod:`.cpu_only`) hidden from it and left on the CPU."""
    mod, hidden = cpu_only.hide(mod)
    return _share_equal_regions(cpu_only.restore(relax.transform.MergeCompositeFunctions()(mod), hidden))


def _share_equal_regions(mod: tvm.IRModule) -> tvm.IRModule:
    """One definition for LPX regions equal but for their name (compiled once, called at
    each place). Each composite call has a function of its own (its layer's names, see
    :func:`_fuse_by_pattern`), so the merged regions are named apart even where they are
    the same program."""
    regions = [(gv, f) for gv, f in mod.functions.items()
               if isinstance(f, relax.Function) and f.attrs is not None and "Codegen" in f.attrs]
    first, same = {}, {}
    for gv, f in regions:
        bare = f.without_attr("global_symbol")
        key = tvm_ffi.structural_hash(bare, map_free_vars=True)
        for other in first.get(key, []):
            if tvm_ffi.structural_equal(bare, mod[other].without_attr("global_symbol"), map_free_vars=True):
                same[gv] = other
                break
        else:
            first.setdefault(key, []).append(gv)
    if not same:
        return mod
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in same}, attrs=mod.attrs)
    for gv, f in list(out.functions.items()):
        if isinstance(f, relax.Function):
            out[gv] = _CallShared(same).visit_expr(f)
    return out


@relax.expr_functor.mutator
class _CallShared(relax.PyExprMutator):
    def __init__(self, same: dict):
        super().__init__()
        self.same = same

    def visit_global_var_(self, gv):
        return self.same.get(gv, gv)


def offload_report(mod: tvm.IRModule, log=None) -> OffloadReport:
    """Count the ops of a partitioned module on each side.

    Parameters
    ----------
    mod : tvm.IRModule
        The output of :func:`partition_for_lpx`.
    log : RejectionLog, optional
        The check functions' refusals; without it every CPU op reads
        "no LPX pattern for <op>".

    Returns
    -------
    OffloadReport
    """
    lpx, cpu, composites = Counter(), Counter(), Counter()
    reasons, cpu_ops, regions = {}, [], 0
    for _, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        if _attr(func, "Codegen") or _attr(func, "Composite"):
            continue
        # A host function: its op calls run on the CPU, its calls of LPX regions do not.
        # (An If's function says why its ops do: cpu_only.)
        whole = _attr(func, cpu_only.CPU_REASON_ATTR)
        for var, call in _call_bindings(func.body):
            if _is_op_call(call):
                op = _op_name(call)
                reason = whole or (log.reason_for(var) if log is not None else None) or _no_pattern(op, call)
                cpu[op] += 1
                cpu_ops.append(CpuOp(op, var.name, reason))
                if reason not in reasons.setdefault(op, []):
                    reasons[op].append(reason)
            elif isinstance(call.op, relax.GlobalVar):
                region = mod[call.op]
                if isinstance(region, relax.Function) and _attr(region, "Codegen") == CODEGEN:
                    regions += 1
                    _count_region(region, mod, lpx, composites)
    return OffloadReport(
        lpx=dict(sorted(lpx.items())),
        cpu=dict(sorted(cpu.items())),
        reasons=reasons,
        cpu_ops=cpu_ops,
        composites=dict(sorted(composites.items())),
        regions=regions,
    )


def _attr(func, name):
    attrs = func.attrs
    if attrs is None or name not in attrs:
        return None
    return str(attrs[name])


def _op_name(call) -> str:
    return call.op.name.removeprefix("relax.")


def _is_op_call(expr) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)


def _count_region(func, mod, ops, composites):
    """Count the ops of an LPX region per call site.

    Merging shares one definition between structurally equal composites, so counting
    definitions would undercount: each call of a composite counts its ops again.
    """
    local = {}

    def callee(op):
        if isinstance(op, relax.GlobalVar):
            return mod[op]
        return local.get(op)

    for var, value in _call_bindings(func.body, functions=True):
        if isinstance(value, relax.Function):
            local[var] = value
        elif _is_op_call(value):
            ops[_op_name(value)] += 1
        elif isinstance(value, relax.Call) and isinstance(callee(value.op), relax.Function):
            inner = callee(value.op)
            composite = _attr(inner, "Composite")
            if composite:
                composites[composite] += 1
            _count_region(inner, mod, ops, composites)


def _call_bindings(body, functions=False):
    """(var, value) of every binding of a call (and of a local function when
    ``functions``) in a SeqExpr, in program order, looking into If branches."""
    found = []

    def walk(expr):
        if not isinstance(expr, relax.SeqExpr):
            return
        for block in expr.blocks:
            for binding in block.bindings:
                value = getattr(binding, "value", None)
                is_function = functions and isinstance(value, relax.Function)
                if isinstance(value, relax.Call) or is_function:
                    found.append((binding.var, value))
                elif isinstance(value, relax.If):
                    walk(value.true_branch)
                    walk(value.false_branch)

    walk(body)
    return found


def _no_pattern(op, call):
    if op == "call_tir" and isinstance(call.args[0], relax.GlobalVar):
        return f"no LPX pattern for call_tir ({call.args[0].name_hint})"
    if op == "take":
        # An embedding lookup: data movement only, by indices the CPU computes anyway
        # (int64 token ids, wrapped for negative values).
        return ("no LPX pattern for take: an embedding lookup moves one table row per token and does no "
                "arithmetic; its int64 indices come from the CPU, so it does not pay to send them to LPX")
    if not cpu_only.static_type(call.ty):
        return f"no LPX pattern for {op}: its result's shape depends on run-time values, and LPX schedules are static"
    return f"no LPX pattern for {op}"

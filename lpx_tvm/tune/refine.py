"""Choosing schedules in context: the whole model measured, one task's choice at a time.

A schedule measured on its layer alone (the one-op region) is not what the layer costs in
the model: in the whole program consecutive layers overlap on the MXM planes (a layer's
first blocks feed the next layer while it drains), and a schedule that wins alone can
lose more of that overlap than it gains. :func:`refine_in_context` therefore compiles the
*whole* model (all its LPX regions) with one candidate tiling for one task and the current
choice for every other task, runs it on the simulator timing only, and keeps the
candidate that gives the fewest total cycles (coordinate descent over the tasks, the
largest first by MACs). The candidates of a task are its best distinct isolated records
plus its default schedule; the start is the better of all-default and all-isolated-best,
so the choice is never slower than either. After the tilings, a last pass places each
layer among its neighbours: it tries the current choice of every task with each other
first plane and install-ahead (decisions that mean little for a layer alone,
:mod:`.space`), keeping what the whole model gains from. A choice whose whole program the compiler
rejects (a combination of tilings that passes each layer alone but not the model's
checks) counts as unusable: it is skipped with a warning, never chosen. The choice is appended to the tuning log as
one line (:meth:`~lpx_tvm.tune.database.TuningLog.commit_applied`), and
``build(tuning_log=)`` applies exactly it.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

from ..errors import LPXError
from ..machine.config import LPXConfig
from ..tir_schedules import DenseWorkload, DepthwiseWorkload
from ..tir_schedules.schedules import describe
import tvm
from tvm.s_tir import meta_schedule as ms

from .check import record_passes
from .database import TuningLog, best_records, load_tuned, measured_records, tiling_of_record
from .space import AHEAD, Task, default_decisions, trace_for, workload_module


def task_macs(task: Task) -> int:
    """MACs of every layer of a task (its weight times one layer's)."""
    w, _, batches = task.key
    if isinstance(w, DenseWorkload):
        one = batches * w.M * w.K * w.N
    elif isinstance(w, DepthwiseWorkload):
        one = w.N * w.OH * w.OW * w.C * w.KH * w.KW
    else:
        one = w.N * w.OH * w.OW * w.C * w.CO * w.KH * w.KW
    return one * task.weight


class ModelContext:
    """A model partitioned once; :meth:`cycles` compiles its LPX regions with given tilings
    and returns their total cycles (timing-only simulation). A region's cycles are cached
    by the tilings of the tasks it holds, so a region a choice does not touch is not
    compiled again."""

    def __init__(self, mod, cfg: LPXConfig, precision: str):
        from ..pipeline import canonicalize_model, partition
        from ..target.codegen.outline import lpx_functions

        self.cfg, self.precision = cfg, precision
        mod, _ = partition(canonicalize_model(mod, precision), cfg, precision)
        self.funcs = [func for _, func in sorted(lpx_functions(mod).items())]
        self.region_keys = [None] * len(self.funcs)  # task keys of each region (known after one compile)
        self.cache = {}
        self.evaluations = 0  # compiles + runs done
        self.eval_s = 0.0

    def _region_cycles(self, i: int, tuned: dict) -> int:
        from ..target.codegen import TilingPolicy, compile_region
        from .measure import simulate_cycles

        keys = self.region_keys[i]
        ck = (i, None if keys is None else tuple(sorted(((repr(k), tuned.get(k)) for k in keys), key=repr)))
        if keys is not None and ck in self.cache:
            return self.cache[ck]
        t = time.perf_counter()
        policy = TilingPolicy(tuned)
        region = compile_region(self.cfg, self.precision, f"ctx_{i}", self.funcs[i], policy)
        cycles = simulate_cycles(region.program, self.cfg)
        self.evaluations += 1
        self.eval_s += time.perf_counter() - t
        if keys is None:
            # Off-chip (band) layers are not collected as tasks, but a tuned tiling still
            # reaches them: key the cache by every task key the compiler looked up or applied.
            self.region_keys[i] = keys = set(policy.tasks) | policy.used
            ck = (i, tuple(sorted(((repr(k), tuned.get(k)) for k in keys), key=repr)))
        self.cache[ck] = cycles
        return cycles

    def cycles(self, tuned: dict) -> int:
        """Total cycles of the model's LPX regions with ``tuned`` tilings (by task key)."""
        return sum(self._region_cycles(i, tuned) for i in range(len(self.funcs)))


@dataclass
class RefineResult:
    default_cycles: int
    isolated_cycles: "int | None"  # every task at its best isolated record (None: rejected by the compiler)
    cycles: int  # the refined choice
    choices: dict = field(default_factory=dict)  # task name -> "default" or "record i: <its tiling>" (i: rank)
    evaluations: int = 0  # whole-model compiles and runs (the other evaluations hit the cache)
    wall_s: float = 0.0
    sweeps: int = 0


def _candidates(db: TuningLog, task: Task, cfg: LPXConfig, top_k: int, best=None) -> list:
    """[(record, tiling)] of the task's best ``top_k`` distinct tilings that pass their
    functional check, best first (``best``: the record the log applies without a choice
    in context, put first)."""
    mod = workload_module(task, cfg)
    if not db.has_workload(mod):
        return []
    out, seen = [], set()
    for rec in ([best] if best is not None else []) + measured_records(db, mod):
        t = tiling_of_record(rec)
        if t in seen:
            continue
        seen.add(t)
        if not record_passes(db, task, cfg, rec):
            continue
        out.append((rec, t))
        if len(out) == top_k:
            break
    return out


def placed(db: TuningLog, task: Task, cfg: LPXConfig, choice, first_plane: int, install_ahead: int):
    """``choice`` ((record, tiling) or None: the default) with the layer placed otherwise:
    a record whose trace takes the given first plane and install-ahead, and its tiling;
    None when the choice's trace has no such decisions (a record older than them)."""
    if choice is None:
        d = {**default_decisions(task, cfg), "first_plane": first_plane, "install_ahead": install_ahead}
        sch = trace_for(task, cfg, **d)
        if sch is None:
            return None
        trace = sch.trace
    else:
        trace = choice[0].trace
        cats = [i for i in trace.insts if i.kind.name == "SampleCategorical"]
        if len(cats) != 3:  # k_split, first_plane, install_ahead (space_fn's order)
            return None
        for inst, value in zip(cats[1:], (first_plane, AHEAD.index(install_ahead))):
            trace = trace.with_decision(inst, tvm.runtime.convert(value), remove_postproc=True)
    rec = ms.database.TuningRecord(trace, db.commit_workload(workload_module(task, cfg)))
    return rec, tiling_of_record(rec)


def refine_in_context(mod, tasks: list, cfg: LPXConfig, log_dir: str, *, top_k: int = 4, sweeps: int = 2,
                      model: "str | None" = None, report=None, place: bool = True) -> RefineResult:
    """Choose each task's schedule by the whole model's cycles (see the module docstring).

    ``mod``: the Relax module the tasks came from; ``tasks``: its tuning tasks (already
    tuned into the log at ``log_dir``); ``top_k`` isolated records per task are tried
    besides the default, over at most ``sweeps`` passes (a pass that changes nothing
    ends it), then (``place``) one pass over each task's first plane and install-ahead.
    ``report(state)`` is called after every evaluation (the CLI's progress bar).
    The choice is appended to the log; returns a :class:`RefineResult`.
    """
    start = time.perf_counter()
    db = TuningLog(log_dir, writer=True)
    ctx = ModelContext(mod, cfg, tasks[0].precision if tasks else "fp16")
    order = sorted(tasks, key=task_macs, reverse=True)
    best_isolated = best_records(db, cfg, accept=db.passed)
    cands = {t.key: _candidates(db, t, cfg, top_k, best_isolated.get(t.key, (None,))[0]) for t in order}
    state = {"phase": "baseline", "task": None, "done": 0, "total": 2 + sum(len(c) for c in cands.values()),
             "best": None, "default": None, "start": start}

    def evaluate(choice: dict):
        tuned = {k: c[1] for k, c in choice.items() if c is not None}
        try:
            cycles = ctx.cycles(tuned)
        except LPXError as e:
            if not tuned:
                raise  # the default schedules must compile
            warnings.warn(f"a choice of schedules the whole model rejects is skipped: {e}", stacklevel=2)
            state["done"] += 1
            if report is not None:
                report(state)
            return None
        state["done"] += 1
        if state["default"] is None:  # the first evaluation is the default choice
            state["default"] = cycles
        if state["best"] is None or cycles < state["best"]:
            state["best"] = cycles
        if report is not None:
            report(state)
        return cycles

    default = {t.key: None for t in order}
    isolated = {t.key: (cands[t.key][0] if cands[t.key] else None) for t in order}
    default_cycles = evaluate(default)
    isolated_cycles = evaluate(isolated)
    current, best = (dict(isolated), isolated_cycles) \
        if isolated_cycles is not None and isolated_cycles <= default_cycles else (dict(default), default_cycles)
    done_sweeps = 0
    for sweep in range(sweeps):
        done_sweeps += 1
        changed = False
        if sweep:
            state["total"] += sum(len(c) for c in cands.values())
        state["phase"] = f"sweep {sweep + 1}"
        for task in order:
            state["task"] = task.name
            options = [None] + cands[task.key]
            for opt in options:
                if opt is current[task.key] or (opt is not None and current[task.key] is not None
                                                 and opt[1] == current[task.key][1]):
                    continue  # the current choice: already measured
                trial = {**current, task.key: opt}
                cycles = evaluate(trial)
                if cycles is not None and cycles < best:
                    current, best, changed = trial, cycles, True
        if not changed:
            break
    if place:
        state["phase"] = "placement"
        for task in order:
            state["task"] = task.name
            for field_, values in (("first_plane", range(cfg.mxm_planes)), ("install_ahead", AHEAD)):
                state["total"] += len(values) - 1
                for value in values:
                    cur = current[task.key]
                    t = cur[1] if cur is not None else None
                    now = dict(first_plane=t.first_plane if t else 0, install_ahead=t.install_ahead if t else 0)
                    if now[field_] == value:
                        continue
                    opt = placed(db, task, cfg, cur, **{**now, field_: value})
                    if opt is None:
                        continue
                    trial = {**current, task.key: opt}
                    cycles = evaluate(trial)
                    if cycles is not None and cycles < best:
                        # Placement does not change the numerics, but the check keeps the
                        # rule that only checked records apply.
                        if record_passes(db, task, cfg, opt[0]):
                            current, best = trial, cycles
    names = {t.key: t.name for t in order}
    choices = {}
    for key, c in current.items():
        records = [r for r, _ in cands[key]]
        choices[names[key]] = ("default" if c is None else
                               f"{f'record {records.index(c[0]) + 1}' if c[0] in records else 'placed'}: "
                               f"{describe(c[1])}")
    db.commit_applied(cfg, {workload_module(t, cfg): (current[t.key][0] if current[t.key] else None) for t in order},
                      model=model, cycles=best, default_cycles=default_cycles, isolated_cycles=isolated_cycles)
    return RefineResult(default_cycles, isolated_cycles, best, choices, ctx.evaluations,
                        time.perf_counter() - start, done_sweeps)


def remeasure_applied(mod, cfg: LPXConfig, log_dir: str, precision: str) -> tuple:
    """Measure the log's in-context choice again on this simulator, and append it as a new
    line with the cycles it has now: for a change of the machine model that leaves the
    config (and so the log's key) as it was, but moves cycles. The choice itself is kept,
    not searched again. Returns (default cycles, cycles of the choice)."""
    db = TuningLog(log_dir, writer=True)
    line = db.applied_line(cfg)
    if line is None:
        raise LPXError(f"tuning log {log_dir}: no in-context choice for machine {cfg.name} to measure again")
    ctx = ModelContext(mod, cfg, precision)
    default_cycles = ctx.cycles({})
    cycles = ctx.cycles(load_tuned(log_dir, cfg))
    db.commit_applied(cfg, db.line_choices(line), model=line.get("model"), cycles=cycles, default_cycles=default_cycles,
                      remeasured={"cycles": line.get("cycles"), "default_cycles": line.get("default_cycles")})
    return default_cycles, cycles


__all__ = ["ModelContext", "RefineResult", "refine_in_context", "remeasure_applied", "task_macs"]

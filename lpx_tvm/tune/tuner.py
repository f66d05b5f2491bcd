"""Tuning a model: extract its MXM tasks, search each task's design space with
MetaSchedule (XGBoost cost model, evolutionary search, the gradient task scheduler
weighted by how often each task appears), measure on the simulator, log to a
:class:`~lpx_tvm.tune.database.TuningLog`.

A rerun with the same log resumes exactly. The job runs again from its start with the
same seed, and every candidate the log already measured is served from the log instead of
being built and simulated again (:class:`~lpx_tvm.tune.measure.MeasuredCandidates`). The
search sees only this job's measurements (:class:`~lpx_tvm.tune.database.SearchDatabase`),
so it makes the same decisions as a job never interrupted: a job killed any number of
times and resumed ends with the records of one uninterrupted run, each once. A job whose
tasks all hold ``trials`` distinct records already is not run at all.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..errors import LPXError
from ..machine.config import LPXConfig
from ..pipeline import lower
from ..sim.workers import make_pool
from ..target.codegen import TilingPolicy
from .check import check_best
from .cost_model import LPXCostModel
from .database import SearchDatabase, TuningLog, best_records, tiling_of_record, write_meta
from .measure import (LPXBuilder, LPXRunner, MeasuredCandidates, TaskFiles, one_op_region, served_from_log,
                      task_cycles)
from .space import Task, design_space, task_key_of, workload_module

TARGET = {"kind": "llvm", "keys": ["lpx", "cpu"]}


def extract_tasks(mod, cfg: LPXConfig, precision: str) -> list:
    """The distinct MXM layers of a Relax module's LPX regions, each with how often it appears."""
    policy = TilingPolicy()
    lower(mod, cfg, precision, policy)
    return [Task(key, one_op_region(ops[0]), precision, weight=len(ops)) for key, ops in policy.tasks.items()]


@dataclass
class TaskResult:
    task: Task
    default_cycles: "int | None"
    tuned_cycles: "int | None" = None
    trials: int = 0
    error: "str | None" = None
    rejected: int = 0  # fast records whose outputs differ from the default schedule's (check.py)


@derived_object
class _Progress(ms.measure_callback.PyMeasureCallback):
    """Counts candidates (``done``; ``served``: those the log had measured) and the best
    latency per task; calls ``report``."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        st = self.state
        name = st["names"][task_id]
        for b, r in zip(builder_results, runner_results):
            st["done"] += 1
            st["served"] += served_from_log(b)
            if r.run_secs and not r.error_msg:
                cycles = round(float(r.run_secs[0]) * st["clock_hz"])
                if name not in st["best"] or cycles < st["best"][name]:
                    st["best"][name] = cycles
        if st["report"] is not None:
            st["report"](st, name)


def search_strategy(kind: str, trials: int):
    """``evolutionary`` (guided by the cost model) or ``random`` (replayed random traces)."""
    if kind == "random":
        return ms.search_strategy.ReplayTrace()
    if kind != "evolutionary":
        raise LPXError(f"search strategy {kind!r}: expected evolutionary or random")
    # A small population and few genetic rounds: search overhead, not the simulator,
    # dominates on a small machine.
    return ms.search_strategy.EvolutionarySearch(
        population_size=16, init_measured_ratio=0.2, init_min_unmeasured=16, genetic_num_iters=1,
        genetic_mutate_prob=0.85, genetic_max_fail_count=4, eps_greedy=0.1)


def cost_model(kind: str, cfg: LPXConfig):
    if kind == "random":
        return ms.cost_model.RandomModel()
    # XGBModel on LPX features, warm-up picks by an analytic estimate (cost_model.py).
    return LPXCostModel(cfg)


def tune(tasks: list, cfg: LPXConfig, log_dir: str, trials: int, *, workers: int = 0,
         ray_address: "str | None" = None, seed: int = 0, strategy: str = "evolutionary",
         trials_per_iter: int = 8, model: "str | None" = None, report=None) -> list:
    """Tune ``tasks`` (``trials`` measured candidates each) into the log at ``log_dir``.

    ``report(state, task_name)`` is called after every measured batch (the CLI's progress
    bar). The fastest records of every task are then checked against its default
    schedule until one passes (:func:`~lpx_tvm.tune.check.check_best`). Returns a
    :class:`TaskResult` per task: default and best checked tuned cycles, and the distinct
    candidates the log holds for it.
    """
    if trials < 1:
        raise LPXError(f"--trials {trials}: at least one trial per task")
    precision = tasks[0].precision if tasks else "fp16"
    write_meta(log_dir, cfg, precision, model)
    db = TuningLog(log_dir, writer=True)
    results, todo = [], []
    for task in tasks:
        try:
            default = task_cycles(task, cfg)
        except Exception as e:  # noqa: BLE001 — a layer the one-op region cannot stand for
            results.append(TaskResult(task, None, error=f"{type(e).__name__}: {e}"))
            continue
        results.append(TaskResult(task, default, trials=db.trial_count(workload_module(task, cfg))))
        todo.append(task)
    state = {"names": [t.name for t in todo], "done": 0, "served": 0, "total": trials * len(todo), "best": {},
             "clock_hz": cfg.clock_hz, "start": time.perf_counter(),
             "report": report, "default": {r.task.name: r.default_cycles for r in results}}
    if todo and any(r.trials < trials for r in results if r.default_cycles is not None):
        _search(todo, cfg, db, trials, state, workers=workers, ray_address=ray_address, seed=seed,
                strategy=strategy, trials_per_iter=trials_per_iter)
    for r in results:
        if r.default_cycles is not None:
            r.rejected = check_best(db, r.task, cfg)
    best = best_records(db, cfg, accept=db.passed)
    for r in results:
        if r.default_cycles is None:
            continue
        r.trials = db.trial_count(workload_module(r.task, cfg))
        if r.task.key in best:
            r.tuned_cycles = round(best[r.task.key][1] * cfg.clock_hz)
    return results


def _search(tasks: list, cfg: LPXConfig, db: TuningLog, trials: int, state: dict, *, workers: int,
            ray_address, seed: int, strategy: str, trials_per_iter: int) -> None:
    """One MetaSchedule run over all ``tasks`` from the start (see the module docstring)."""
    mods = [workload_module(t, cfg) for t in tasks]
    # Candidates the log measured, for these tasks' workloads only.
    keys = {task_key_of(m) for m in mods}
    measured = MeasuredCandidates(r for r in db.get_all_tuning_records() if task_key_of(r.workload.mod) in keys)
    # A new record makes an in-context choice made from the old ones stale until refined again.
    search_db = SearchDatabase(db, on_new_record=lambda: db.withdraw_applied(cfg, mods))
    pool = make_pool(workers, ray_address)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    try:
        with tempfile.TemporaryDirectory(prefix="lpx_tune_") as work_dir:
            files = TaskFiles(work_dir, cfg)
            for t in tasks:
                files.add(t)
            contexts = [_context(m, design_space(t, cfg), search_strategy(strategy, trials), t.name, seed * 1009 + i + 1)
                        for i, (t, m) in enumerate(zip(tasks, mods))]
            ms.tune_tasks(tasks=contexts, task_weights=[float(t.weight) for t in tasks],
                          work_dir=os.path.join(work_dir, "ms"), max_trials_global=trials * len(tasks),
                          max_trials_per_task=trials, num_trials_per_iter=min(trials_per_iter, trials),
                          builder=LPXBuilder(files, pool, measured), runner=LPXRunner(cfg, pool, measured),
                          database=search_db, cost_model=cost_model(strategy, cfg),
                          measure_callbacks=[ms.measure_callback.AddToDatabase(),
                                             ms.measure_callback.UpdateCostModel(), _Progress(state)],
                          task_scheduler="gradient" if len(tasks) > 1 else "round-robin")
    finally:
        pool.shutdown()


def _context(mod, space, strategy, name: str, rand_state: int):
    """A TuneContext, made as ``ms.TuneContext(...)`` makes it but without importing the
    CUDA/ARM tensor intrinsics (``tvm.s_tir.tensor_intrin``: half a minute of TVMScript
    parsing per process) that LPX's design spaces never use."""
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.logging import get_logging_func

    log = logging.getLogger("lpx_tvm.tune")
    log.setLevel(logging.WARNING)
    ctx = ms.TuneContext.__new__(ms.TuneContext)
    ctx.__init_handle_by_constructor__(_ffi_api.TuneContext, mod, tvm.target.Target(TARGET), space, strategy, name,
                                       1, rand_state, get_logging_func(log))
    _ffi_api.TuneContextInitialize(ctx)
    return ctx


__all__ = ["extract_tasks", "tune", "TaskResult", "tiling_of_record"]

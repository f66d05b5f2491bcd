"""Measuring candidates on the simulator.

A candidate (a scheduled workload module) is lowered to an LPX Program by compiling the
task's one-op region with the candidate's tiling (:class:`LPXBuilder`), and the
Program runs on the simulator in timing-only mode (:class:`LPXRunner`): its latency is
its cycle count at the machine's clock. Measurement is deterministic, so one run is
enough, and a candidate the log already measured (same task, same tiling) is not built or
run again: its latency comes from the log (:class:`MeasuredCandidates`). Both stages run in worker processes (a local pool) or on a Ray cluster; every
candidate builds in its own temporary folder, removed once it has run.
"""

from __future__ import annotations

import functools
import os
import pickle
import shutil
import tempfile

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..errors import LPXError
from ..target.codegen.graph import Operand, Region
from ..machine.config import LPXConfig
from ..tir_schedules.schedules import tiling_of
from .database import latency, tiling_of_record
from .space import Task, task_key_of


class MeasureError(LPXError):
    """A candidate that did not compile or run."""


def one_op_region(op) -> Region:
    """A region holding just ``op``: its runtime operands become the region's inputs."""
    params, seen = [], set()
    for step in [op.main] + list(op.epilogue):
        for a in step.args:
            if a.is_const or a.name is None or a.name.startswith("__step") or a.name in seen:
                continue
            seen.add(a.name)
            params.append(Operand(a.name, shape=tuple(a.shape), dtype=a.dtype))
    return Region(f"tune_{op.out}", params, [op], [op.out])


def compile_task(task: Task, cfg: LPXConfig, tiling=None):
    """The Program of the task's one-op region, with ``tiling`` (None: the default)."""
    from ..target.codegen import TilingPolicy, compile_region

    policy = TilingPolicy({} if tiling is None else {task.key: tiling})
    compiled = compile_region(cfg, task.precision, task.region.name, task.region, policy, offchip=False)
    if task.key not in policy.tasks:
        raise MeasureError(f"task {task.name}: its one-op region compiles to another workload")
    if tiling is not None and task.key not in policy.used:
        raise MeasureError(f"task {task.name}: the candidate's tiling was not applied")
    return compiled.program


def simulate_cycles(program, cfg: LPXConfig) -> int:
    from ..sim import Simulator

    return Simulator(cfg).run(program, timing_only=True).cycles


def task_cycles(task: Task, cfg: LPXConfig, tiling=None) -> int:
    return simulate_cycles(compile_task(task, cfg, tiling), cfg)


# ---- worker side ------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _load_task(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)  # (task, config)


def build_candidate(task_path: str, tiling, out_dir: str) -> str:
    """Compile one candidate into ``out_dir``/candidate.lpx (runs in a worker)."""
    from ..machine.encoding import save_program

    task, cfg = _load_task(task_path)
    program = compile_task(task, cfg, tiling)
    path = os.path.join(out_dir, "candidate.lpx")
    save_program(program, path)
    return path


def build_candidate_bytes(task_bytes: bytes, tiling) -> bytes:
    """Compile one candidate and return its program binary (a Ray worker sees no local files)."""
    from ..machine.encoding import save_program

    task, cfg = pickle.loads(task_bytes)
    with tempfile.TemporaryDirectory(prefix="lpx_cand_") as d:
        path = os.path.join(d, "candidate.lpx")
        save_program(compile_task(task, cfg, tiling), path)
        with open(path, "rb") as f:
            return f.read()


def run_candidate_bytes(program: bytes, cfg) -> int:
    with tempfile.TemporaryDirectory(prefix="lpx_cand_") as d:
        path = os.path.join(d, "candidate.lpx")
        with open(path, "wb") as f:
            f.write(program)
        return run_candidate(path, cfg)


def run_candidate(program_path: str, cfg) -> int:
    """Simulate one built candidate, timing only; its cycle count (runs in a worker)."""
    from ..machine.encoding import load_program

    return simulate_cycles(load_program(program_path), cfg)


class TaskFiles:
    """Each task pickled once into the work folder, for the workers to load."""

    def __init__(self, work_dir: str, cfg: LPXConfig):
        self.dir = os.path.join(work_dir, "tasks")
        os.makedirs(self.dir, exist_ok=True)
        self.cfg = cfg
        self.paths = {}  # task key -> path
        self.tasks = {}  # (workload, composite, batches) -> task
        self.data = {}  # task key -> pickled (task, config)

    def add(self, task: Task) -> str:
        path = os.path.join(self.dir, f"task{len(self.paths)}.pkl")
        data = pickle.dumps((task, self.cfg))
        with open(path, "wb") as f:
            f.write(data)
        self.paths[task.key] = path
        self.data[task.key] = data
        self.tasks[task.key] = task
        return path


CACHED = "lpx-measured:"  # the artifact path of a candidate measured before
FAILED_BEFORE = "failed when this tuning log measured it"  # the build error of one that failed


def served_from_log(result) -> bool:
    """Whether a build result is a candidate the log had measured (run or failed)."""
    return (result.artifact_path or "").startswith(CACHED) or result.error_msg == FAILED_BEFORE


class MeasuredCandidates:
    """The latencies a tuning log holds, by task key (the machine's config hash included)
    and tiling: a candidate with one is served from here (its build names it, its run
    returns the logged latency)."""

    def __init__(self, records=()):
        self.secs = {}  # (task key, tiling) -> [seconds] or None (failed)
        self.served = []  # [seconds] or None, by the number a built path names
        for rec in records:
            ran = latency(rec) is not None
            self.secs[(task_key_of(rec.workload.mod), tiling_of_record(rec))] = \
                [float(s) for s in rec.run_secs] if ran else None

    def lookup(self, key, tiling):
        """A built result for a candidate measured before, or None."""
        if (key, tiling) not in self.secs:
            return None
        secs = self.secs[(key, tiling)]
        if secs is None:
            return ms.builder.BuilderResult(None, FAILED_BEFORE)
        self.served.append(secs)
        return ms.builder.BuilderResult(f"{CACHED}{len(self.served) - 1}", None)

    def run(self, artifact_path: str):
        return self.served[int(artifact_path[len(CACHED):])]


@derived_object
class LPXBuilder(ms.builder.PyBuilder):
    """Lower each candidate to an LPX Program (in the pool), one temporary folder each."""

    def __init__(self, files: TaskFiles, pool, measured: "MeasuredCandidates | None" = None):
        super().__init__()
        self.files, self.pool = files, pool
        self.measured = measured or MeasuredCandidates()

    def build(self, build_inputs):
        jobs = []
        for bi in build_inputs:
            try:
                w, composite, batches, config_hash = task_key_of(bi.mod)
                key = (w, composite, batches)
                tiling = tiling_of(w, bi.mod["main"])
                served = self.measured.lookup(key + (config_hash,), tiling)
                if served is not None:
                    jobs.append((served, None))
                    continue
                out_dir = tempfile.mkdtemp(prefix="lpx_cand_")
                if getattr(self.pool, "remote", False):
                    fut = self.pool.submit(build_candidate_bytes, self.files.data[key], tiling)
                else:
                    fut = self.pool.submit(build_candidate, self.files.paths[key], tiling, out_dir)
                jobs.append((fut, out_dir))
            except Exception as e:  # noqa: BLE001 — a bad candidate is its own result
                jobs.append((None, f"{type(e).__name__}: {e}"))
        results = []
        for fut, out_dir in jobs:
            if isinstance(fut, ms.builder.BuilderResult):  # measured before
                results.append(fut)
                continue
            if fut is None:
                results.append(ms.builder.BuilderResult(None, out_dir))
                continue
            try:
                path = fut.result()
                if isinstance(path, bytes):  # from a Ray worker
                    with open(os.path.join(out_dir, "candidate.lpx"), "wb") as f:
                        f.write(path)
                    path = os.path.join(out_dir, "candidate.lpx")
                results.append(ms.builder.BuilderResult(path, None))
            except Exception as e:  # noqa: BLE001
                shutil.rmtree(out_dir, ignore_errors=True)
                results.append(ms.builder.BuilderResult(None, f"{type(e).__name__}: {e}"))
        return results


@derived_object
class _Future(ms.runner.PyRunnerFuture):
    def __init__(self, fut, clock_hz: float, out_dir: str):
        super().__init__()
        self.fut, self.clock_hz, self.out_dir = fut, clock_hz, out_dir

    def done(self) -> bool:
        return self.fut.done()

    def result(self):
        try:
            cycles = self.fut.result()
            return ms.runner.RunnerResult([cycles / self.clock_hz], None)
        except Exception as e:  # noqa: BLE001
            return ms.runner.RunnerResult(None, f"{type(e).__name__}: {e}")
        finally:
            shutil.rmtree(self.out_dir, ignore_errors=True)


@derived_object
class _Served(ms.runner.PyRunnerFuture):
    def __init__(self, secs: list):
        super().__init__()
        self.secs = secs

    def done(self) -> bool:
        return True

    def result(self):
        return ms.runner.RunnerResult(self.secs, None)


@derived_object
class LPXRunner(ms.runner.PyRunner):
    """Run each built candidate on the simulator, timing only; latency = cycles / clock."""

    def __init__(self, cfg: LPXConfig, pool, measured: "MeasuredCandidates | None" = None):
        super().__init__()
        self.cfg, self.pool = cfg, pool
        self.measured = measured or MeasuredCandidates()

    def run(self, runner_inputs):
        futures = []
        for ri in runner_inputs:
            if ri.artifact_path.startswith(CACHED):
                futures.append(_Served(self.measured.run(ri.artifact_path)))
                continue
            if getattr(self.pool, "remote", False):
                with open(ri.artifact_path, "rb") as f:
                    fut = self.pool.submit(run_candidate_bytes, f.read(), self.cfg)
            else:
                fut = self.pool.submit(run_candidate, ri.artifact_path, self.cfg)
            futures.append(_Future(fut, self.cfg.clock_hz, os.path.dirname(ri.artifact_path)))
        return futures

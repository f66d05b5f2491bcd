"""Checking a tuned schedule: it must compute what the default schedule computes.

Candidates are measured timing only, so a fast schedule the compiler lowers wrongly would
win the search. Before a record is applied (:func:`~lpx_tvm.tune.database.load_tuned`) or
tried in the whole model (:mod:`.refine`), its task's one-op region is compiled with the
record's tiling and with the default one, both run on the simulator on the same seeded
random inputs, and the outputs compared: exactly for integer programs, within a relative
L2 error of :data:`TOLERANCE` for floating point (another tiling sums a dot product in
another order: the K split adds partial sums in fp32, and the output is rounded once to
the precision's type). The verdict is appended to the log (``lpx_checked.json``), so a
record is checked once.
"""

from __future__ import annotations

import numpy as np

from ..machine.config import LPXConfig
from ..precision import Precision
from .measure import compile_task
from .space import Task

# Relative L2 error allowed between a tuned and the default program: a few roundings of
# the output type (unit roundoff: fp16 2^-11, bf16 2^-8), far below what a wrong sum,
# a lost K part or a misplaced tile gives (order 1).
TOLERANCE = {Precision.FP32: 1e-5, Precision.FP16: 2e-3, Precision.BF16: 1.5e-2, Precision.INT8: 0.0}


def random_inputs(program, seed: int = 0) -> dict:
    """Seeded random values for every input of ``program``: standard normal for floats,
    the whole range for 8-bit integers, small values for wider ones."""
    rng = np.random.default_rng(seed)
    out = {}
    for b in program.inputs:
        dtype, shape = b.layout.dtype, b.layout.shape
        if dtype.is_float:
            out[b.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            info = np.iinfo(dtype.np)
            lo, hi = max(info.min, -1000), min(info.max, 1000)
            out[b.name] = rng.integers(lo, hi + 1, shape).astype(dtype.np)
    return out


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    if not (np.isfinite(got).all() and np.isfinite(want).all()):
        return 0.0 if np.array_equal(got, want, equal_nan=True) else float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


# The default program of the task checked last, its inputs, outputs and simulator:
# consecutive checks are of one task (check_best's records, the refinement's candidates).
_last_default = {}


def _default_run(task: Task, cfg: LPXConfig, seed: int) -> tuple:
    """(default program, seeded inputs, its outputs, a Simulator of ``cfg``) for ``task``."""
    from ..sim import Simulator

    # By the task object: tasks of one workload hold other weights in other models. The
    # entry keeps the task alive, so its id is not reused while it is there.
    key = (id(task), cfg.hash, seed)
    if key not in _last_default:
        _last_default.clear()
        default = compile_task(task, cfg)
        inputs = random_inputs(default, seed)
        sim = Simulator(cfg)
        # A copy: a Simulator reuses its memory from run to run.
        want = {name: np.array(out, copy=True) for name, out in sim.run(default, inputs).outputs.items()}
        _last_default[key] = (task, default, inputs, want, sim)
    return _last_default[key][1:]


def check_tiling(task: Task, cfg: LPXConfig, tiling, seed: int = 0) -> "str | None":
    """None if ``tiling`` computes what the default tiling computes for ``task`` on seeded
    random inputs, else what differs (an output and its error, or the compile error)."""
    from ..errors import LPXError

    default, inputs, want, sim = _default_run(task, cfg, seed)
    try:
        tuned = compile_task(task, cfg, tiling)
    except LPXError as e:
        return f"does not compile: {e}"
    if [(b.name, b.layout.shape) for b in tuned.inputs] != [(b.name, b.layout.shape) for b in default.inputs]:
        return "takes other inputs than the default program"
    try:
        got = sim.run(tuned, inputs).outputs
    except LPXError as e:
        return f"does not run: {e}"
    tolerance = TOLERANCE[Precision(task.precision)]
    for name, w in want.items():
        if name not in got or got[name].shape != w.shape:
            return f"output {name}: missing or of another shape"
        err = relative_error(got[name], w)
        if err > tolerance:
            return f"output {name}: relative L2 error {err:.2e} against the default schedule (allowed {tolerance:g})"
    return None


def record_passes(db, task: Task, cfg: LPXConfig, record) -> bool:
    """Whether ``record`` (of ``task``, in the tuning log ``db``) passed its check: the
    verdict the log holds, else the check is run now and its verdict kept in the log."""
    from .database import tiling_of_record

    verdict = db.check_of(record)
    if verdict is None:
        error = check_tiling(task, cfg, tiling_of_record(record))
        db.commit_check(record, error)
        verdict = True if error is None else error
    return verdict is True


def check_best(db, task: Task, cfg: LPXConfig, limit: int = 8) -> int:
    """Check ``task``'s records fastest first until one passes, so the record a build
    applies is known to be right (at most ``limit`` checks run: a compiler that lowers one
    tiling wrongly usually lowers its neighbours wrongly too). The number that failed."""
    from .database import measured_records
    from .space import workload_module

    mod = workload_module(task, cfg)
    if not db.has_workload(mod):
        return 0
    failed = ran = 0
    for rec in measured_records(db, mod):
        verdict = db.check_of(rec)
        if verdict is True:
            break
        if verdict is not None:
            continue  # failed before
        if ran == limit:
            break
        ran += 1
        if record_passes(db, task, cfg, rec):
            break
        failed += 1
    return failed


__all__ = ["TOLERANCE", "check_best", "check_tiling", "random_inputs", "record_passes", "relative_error"]

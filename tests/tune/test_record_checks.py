"""Tuned records are checked functionally against the default schedule before they are
applied (tune/check.py): a fast but wrong candidate is never chosen."""

import os
import shutil
from dataclasses import replace

import numpy as np
import pytest

import lpx_tvm
import lpx_tvm.tune.check as check
import lpx_tvm.tune.measure as measure
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.tir_schedules import default_tiling
from lpx_tvm.tune.database import CHECKS, TuningLog, TuningLogWarning, best_records, load_tuned, tiling_of_record
from lpx_tvm.tune.tuner import tune

from test_tune import MINI, matmul_model, mm_tasks  # noqa: F401 — the fixture


def wrong_weights(compile_task):
    """``compile_task`` with every tiling but the default one compiled wrongly: the
    program's weights are zero (its timing, all the search measures, is unchanged)."""
    def compile_wrongly(task, cfg, tiling=None):
        program = compile_task(task, cfg, tiling)
        if tiling is not None and tiling != default_tiling(cfg, task.workload):
            program.sram_init = [replace(img, data=bytes(len(img.data))) for img in program.sram_init]
        return program
    return compile_wrongly


def test_the_check_tells_a_right_schedule_from_a_wrong_one(mm_tasks, monkeypatch):  # noqa: F811
    (task,) = mm_tasks
    from lpx_tvm.tune.space import default_decisions, trace_for
    from lpx_tvm.tir_schedules.schedules import tiling_of

    d = default_decisions(task, MINI)
    other = tiling_of(task.workload, trace_for(task, MINI, **{**d, "k_split": 2}).mod["main"])
    assert other != default_tiling(MINI, task.workload)
    assert check.check_tiling(task, MINI, other) is None  # another order of the same sums
    monkeypatch.setattr(check, "compile_task", wrong_weights(check.compile_task))
    assert "relative L2 error" in check.check_tiling(task, MINI, other)
    assert check.check_tiling(task, MINI, default_tiling(MINI, task.workload)) is None


def test_a_fast_but_wrong_candidate_is_never_applied(tmp_path, mm_tasks, monkeypatch):  # noqa: F811
    (task,) = mm_tasks
    monkeypatch.setattr(measure, "compile_task", wrong_weights(measure.compile_task))
    monkeypatch.setattr(check, "compile_task", wrong_weights(check.compile_task))
    log = str(tmp_path / "wrong")
    (r,) = tune(mm_tasks, MINI, log, 8, seed=1)
    db = TuningLog(log)
    fastest, _ = best_records(db, MINI)[task.key]
    assert tiling_of_record(fastest) != default_tiling(MINI, task.workload)  # the search picked a wrong one
    assert r.rejected >= 1 and isinstance(db.check_of(fastest), str)
    # Only the default tiling (the one right program here) can apply.
    assert all(t == default_tiling(MINI, task.workload) for t in load_tuned(log, MINI).values())
    monkeypatch.undo()
    mod = import_onnx(matmul_model()).mod
    x = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    plain = lpx_tvm.build(mod, preset="mini", precision="fp16").run([x])[0]
    np.testing.assert_array_equal(lpx_tvm.build(mod, preset="mini", precision="fp16", tuning_log=log).run([x])[0],
                                  plain)


def test_unchecked_records_are_not_applied_until_tune_checks_them(tmp_path, mm_tasks):  # noqa: F811
    log = str(tmp_path / "log")
    tune(mm_tasks, MINI, log, 8, seed=1)
    tuned = load_tuned(log, MINI)
    assert tuned
    copy = str(tmp_path / "unchecked")
    shutil.copytree(log, copy)
    os.remove(os.path.join(copy, CHECKS))
    with pytest.warns(TuningLogWarning, match="never checked against the default schedule"):
        assert load_tuned(copy, MINI) == {}
    records = open(os.path.join(copy, "database_tuning_record.json"), "rb").read()
    tune(mm_tasks, MINI, copy, 8, seed=1)  # nothing to measure: checks the best records
    assert open(os.path.join(copy, "database_tuning_record.json"), "rb").read() == records
    assert load_tuned(copy, MINI) == tuned


def test_every_record_a_shipped_log_applies_passed_its_check():
    import warnings

    from lpx_tvm.machine.config import load_config
    from lpx_tvm.tune.database import shipped_logs

    for path, meta in shipped_logs():
        cfg = load_config(meta["preset"])
        db = TuningLog(path)
        with warnings.catch_warnings():
            warnings.simplefilter("error", TuningLogWarning)  # "never checked" would fail here
            tuned = load_tuned(path, cfg)
        applied = [rec for rec in db.applied_choices(cfg).values() if rec is not None]
        assert applied and all(db.passed(rec) for rec in applied), path
        best = best_records(db, cfg, accept=db.passed)
        assert set(tuned) <= set(best) | set(db.applied_choices(cfg)), path

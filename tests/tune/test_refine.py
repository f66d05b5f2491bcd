"""Choosing schedules in context: whole-model cycles, the applied choice in the log, build(tuning_log=)."""

import os
import shutil

import numpy as np
import pytest
from onnx import helper

import lpx_tvm
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.machine.config import load_config
from lpx_tvm.tune import extract_tasks, refine_in_context, tune
from lpx_tvm.tune.refine import ModelContext
from lpx_tvm.tune.database import APPLIED, TuningLog, TuningLogWarning, best_records, load_tuned, tiling_of_record

from test_tune import _model, _w

MINI = load_config("mini")


def chain_model(integers=False):
    """Three matmuls in a row (96x48 -> 64 -> 48 -> 32): layers that overlap on the planes."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("MatMul", ["b", "w2"], ["c"]), helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("MatMul", ["d", "w3"], ["y"])]
    return _model(nodes, [96, 48], [96, 32],
                  [_w("w1", (48, 64), integers), _w("w2", (64, 48), integers), _w("w3", (48, 32), integers)])


@pytest.fixture(scope="module")
def refined(tmp_path_factory):
    mod = import_onnx(chain_model()).mod
    tasks = extract_tasks(mod, MINI, "fp16")
    log = str(tmp_path_factory.mktemp("logs") / "chain")
    tune(tasks, MINI, log, 8, seed=1)
    states = []
    result = refine_in_context(mod, tasks, MINI, log, top_k=3, report=lambda st: states.append(dict(st)))
    return mod, tasks, log, result, states


def _cycles(exe, x):
    out = exe.run([x])[0]
    return exe.stats.cycles, out


def test_refined_choice_is_no_slower_than_default_or_isolated(refined):
    mod, tasks, log, r, states = refined
    assert len(tasks) == 3
    assert r.cycles <= r.default_cycles and r.cycles <= r.isolated_cycles
    assert set(r.choices) == {t.name for t in tasks}
    # Every evaluation was reported (compiled, or found in the cache: r.evaluations counts
    # the compiles); the first two are the default and the isolated best.
    assert len(states) == states[-1]["done"] and 0 < r.evaluations <= len(states)
    assert states[0]["best"] == r.default_cycles and states[-1]["best"] == r.cycles
    # The isolated best schedules, measured in the whole model, are what the log gave before.
    ctx = ModelContext(mod, MINI, "fp16")
    best = {k: tiling_of_record(rec) for k, (rec, _) in best_records(TuningLog(log), MINI).items()}
    assert ctx.cycles(best) == r.isolated_cycles and ctx.cycles({}) == r.default_cycles


def test_build_reproduces_the_refined_cycles_with_the_same_numerics(refined):
    _, tasks, log, r, _ = refined
    mod = import_onnx(chain_model(integers=True)).mod  # same shapes; integers: every summation order is exact
    x = np.random.default_rng(0).integers(-3, 4, (96, 48)).astype(np.float32)
    plain_cycles, plain = _cycles(lpx_tvm.build(mod, preset="mini", precision="fp16"), x)
    exe = lpx_tvm.build(mod, preset="mini", precision="fp16", tuning_log=log)
    tuned_cycles, out = _cycles(exe, x)
    assert plain_cycles == r.default_cycles
    assert tuned_cycles == r.cycles
    np.testing.assert_array_equal(out, plain)
    chosen = sorted(n for n, c in r.choices.items() if c != "default")
    assert exe.tuning["tuned_layers"] == chosen


def test_old_log_without_the_choice_applies_best_records(refined, tmp_path):
    _, _, log, r, _ = refined
    old = str(tmp_path / "old")
    shutil.copytree(log, old)
    os.remove(os.path.join(old, APPLIED))
    best = best_records(TuningLog(old), MINI)
    assert load_tuned(old, MINI) == {k: tiling_of_record(rec) for k, (rec, _) in best.items()}
    x = np.ones((96, 48), np.float32)
    cycles, _ = _cycles(lpx_tvm.build(import_onnx(chain_model()).mod, preset="mini", precision="fp16",
                                      tuning_log=old), x)
    assert cycles == r.isolated_cycles


def test_truncated_choice_line_falls_back_and_new_trials_withdraw_it(refined, tmp_path):
    mod, tasks, log, r, _ = refined
    copy = str(tmp_path / "copy")
    shutil.copytree(log, copy)
    refined_tuned = load_tuned(copy, MINI)
    # A second choice cut short by kill -9: dropped, the complete line before it applies.
    with open(os.path.join(copy, APPLIED), "ab") as f:
        f.write(b'{"kind":"context","config_hash":"')
    with pytest.warns(TuningLogWarning, match="truncated"):
        assert load_tuned(copy, MINI) == refined_tuned
    # More trials: the choice made from the old records is withdrawn (best records again).
    with pytest.warns(TuningLogWarning):
        tune(tasks[:1], MINI, copy, 9, seed=1)
    db = TuningLog(copy)
    assert db.applied_line(MINI) is None and db.applied[-2][1]["kind"] == "context"
    best = {k: tiling_of_record(rec) for k, (rec, _) in best_records(db, MINI).items()}
    assert load_tuned(copy, MINI) == best


def test_a_choice_the_whole_model_rejects_is_skipped(refined, tmp_path, monkeypatch):
    # Tilings that pass each layer alone can meet a check of the whole program (a port
    # conflict between layers): such a choice is skipped with a warning, never chosen.
    from lpx_tvm.errors import LPXError

    mod, tasks, log, r, _ = refined
    copy = str(tmp_path / "log")
    shutil.copytree(log, copy)
    cycles = ModelContext.cycles

    def rejecting(self, tuned):
        if tuned:
            raise LPXError("group 'x': mem.read on unit 1 overlaps another instruction")
        return cycles(self, tuned)

    monkeypatch.setattr(ModelContext, "cycles", rejecting)
    with pytest.warns(UserWarning, match="whole model rejects"):
        again = refine_in_context(mod, tasks, MINI, copy, top_k=2)
    assert again.isolated_cycles is None and again.cycles == again.default_cycles == r.default_cycles
    assert set(again.choices.values()) == {"default"}
    assert load_tuned(copy, MINI) == {}

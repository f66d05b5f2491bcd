"""Auto-tuning: design spaces, measurement on the simulator, tuning logs, build(tuning_log=)."""

import os
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir

import lpx_tvm
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.machine.config import load_config
from lpx_tvm.machine.isa import DType
from lpx_tvm.tir_schedules import Conv2dTiling, DenseTiling, DenseWorkload, DepthwiseWorkload, default_tiling
from lpx_tvm.tir_schedules.schedules import tiling_of
from lpx_tvm.tune.database import (RECORDS, TuningLog, TuningLogError, TuningLogWarning, best_records, load_tuned)
from lpx_tvm.tune.measure import compile_task, task_cycles
from lpx_tvm.tune.space import LPXFits, default_decisions, fits, space_fn, trace_for, workload_module
from lpx_tvm.tune.tuner import extract_tasks, tune

MINI = load_config("mini")
RNG = np.random.default_rng(0)


def _model(nodes, x_shape, y_shape, inits):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _w(name, shape, integers=False):
    a = RNG.integers(-2, 3, shape) if integers else RNG.standard_normal(shape) * 0.3
    return numpy_helper.from_array(a.astype(np.float32), name)


def matmul_model(m=64, k=48, n=32, integers=False):
    return _model([helper.make_node("MatMul", ["x", "w"], ["y0"]), helper.make_node("Relu", ["y0"], ["y"])],
                  [m, k], [m, n], [_w("w", (k, n), integers)])


def conv_model(c=16, co=32, hw=12, integers=False):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "dw"], ["y"], pads=[1, 1, 1, 1], group=co)]
    return _model(nodes, [1, c, hw, hw], [1, co, hw, hw],
                  [_w("w", (co, c, 3, 3), integers), _w("b", (co,), integers), _w("dw", (co, 1, 3, 3), integers)])


@pytest.fixture(scope="module")
def mm_tasks():
    return extract_tasks(import_onnx(matmul_model()).mod, MINI, "fp16")


@pytest.fixture(scope="module")
def conv_tasks():
    return extract_tasks(import_onnx(conv_model()).mod, MINI, "fp16")


def test_tasks_of_a_model(mm_tasks, conv_tasks):
    assert [t.name for t in mm_tasks] == ["matmul_64x48x32_float16_dense_relu"]
    kinds = sorted(type(t.workload).__name__ for t in conv_tasks)
    assert kinds == ["Conv2dWorkload", "DepthwiseWorkload"]
    assert all(t.weight == 1 for t in mm_tasks + conv_tasks)


@pytest.mark.parametrize("which", ["mm", "conv"])
def test_default_schedule_is_a_point_of_the_space(which, mm_tasks, conv_tasks):
    for task in mm_tasks if which == "mm" else conv_tasks:
        d = default_decisions(task, MINI)
        sch = trace_for(task, MINI, **d)
        t = tiling_of(task.workload, sch.mod["main"])
        default = default_tiling(MINI, task.workload)
        rows = default.m if isinstance(task.workload, DenseWorkload) else default.oh
        assert (t.order, t.m if isinstance(task.workload, DenseWorkload) else t.oh) == (default.order, rows)
        assert LPXFits(MINI, task.workload).apply(sch)
        # The same program as an untuned compile: same instructions, same cycles.
        a, b = compile_task(task, MINI), compile_task(task, MINI, t)
        assert [str(i) for i in a.instrs] == [str(i) for i in b.instrs]


def test_every_candidate_that_fits_compiles_and_runs(conv_tasks, mm_tasks):
    """Random points of each design space: those the postprocessor accepts compile and run
    on the simulator without a hazard (the simulator checks the whole schedule)."""
    checked = rejected = 0
    for task in mm_tasks + conv_tasks:
        post = LPXFits(MINI, task.workload)
        for seed in range(6):
            sch = s_tir.Schedule(workload_module(task, MINI), seed=seed + 1)
            space = space_fn(task.workload, MINI)(sch)[seed % 2]
            if not post.apply(space):
                rejected += 1
                continue
            assert task_cycles(task, MINI, tiling_of(task.workload, space.mod["main"])) > 0
            checked += 1
    assert checked >= 12


def test_postprocessor_rejects_what_cannot_run():
    w = DepthwiseWorkload(1, 10, 10, 16, 3, 3, (1, 1), (1, 1), "float16")
    assert fits(w, Conv2dTiling(oh=8, ci=16, co=16, order="noc", k_split=2), MINI) is None
    assert "accumulators" in fits(w, Conv2dTiling(oh=8 * 256, ci=16, co=16), MINI)
    assert "reduction tiles" in fits(DenseWorkload(32, 16, 16, "float16"),
                                     DenseTiling(8, 16, 16, k_split=2), MINI)


@pytest.fixture(scope="module")
def tuned_mm(tmp_path_factory, mm_tasks):
    log = str(tmp_path_factory.mktemp("logs") / "mm")
    t0 = time.perf_counter()
    results = tune(mm_tasks, MINI, log, 8, seed=1)
    return log, results, time.perf_counter() - t0


def test_tuning_a_small_matmul_is_no_worse_than_default(tuned_mm):
    log, results, _ = tuned_mm
    (r,) = results
    assert r.error is None and r.trials == 8
    assert r.tuned_cycles <= r.default_cycles
    db = TuningLog(log)
    assert len(db) == 8
    # The best record's schedule compiles to its measured cycles.
    (key, (rec, lat)), = best_records(db, MINI).items()
    assert round(lat * MINI.clock_hz) == r.tuned_cycles


def test_rerun_resumes_without_new_trials(tuned_mm, mm_tasks):
    log, results, _ = tuned_mm
    again = tune(mm_tasks, MINI, log, 8, seed=1)
    assert again[0].trials == 8 and again[0].tuned_cycles == results[0].tuned_cycles
    assert len(TuningLog(log)) == 8


def test_build_with_tuning_log_is_numerically_identical(tuned_mm):
    log, results, _ = tuned_mm
    model = matmul_model(integers=True)  # same shapes; integer data: every summation order is exact
    mod = import_onnx(model).mod
    x = RNG.integers(-3, 4, (64, 48)).astype(np.float32)
    plain = lpx_tvm.build(mod, preset="mini", precision="fp16")
    tuned = lpx_tvm.build(mod, preset="mini", precision="fp16", tuning_log=log)
    assert tuned.tuning["tuned_layers"] == ["matmul_64x48x32_float16_dense_relu"]
    assert tuned.tuning["default_layers"] == []
    assert plain.tuning is None
    np.testing.assert_array_equal(tuned.run([x])[0], plain.run([x])[0])
    if results[0].tuned_cycles < results[0].default_cycles:
        assert tuned.stats.cycles < plain.stats.cycles


def test_log_for_mini_is_not_applied_on_tsp(tuned_mm):
    log, _, _ = tuned_mm
    tsp = load_config("tsp")
    with pytest.warns(TuningLogWarning, match="made for machine mini"):
        assert load_tuned(log, tsp) == {}
    mod = import_onnx(matmul_model()).mod
    with pytest.warns(TuningLogWarning):
        exe = lpx_tvm.build(mod, preset="tsp", precision="fp16", tuning_log=log)
    assert exe.tuning["tuned_layers"] == [] and len(exe.tuning["default_layers"]) == 1
    # The records themselves carry the machine: without the meta file they still do not apply.
    os.rename(os.path.join(log, "lpx_tuning.json"), os.path.join(log, "meta.bak"))
    try:
        with pytest.warns(TuningLogWarning, match="no records for machine tsp"):
            assert load_tuned(log, tsp) == {}
        assert load_tuned(log, MINI)
    finally:
        os.rename(os.path.join(log, "meta.bak"), os.path.join(log, "lpx_tuning.json"))


def test_corrupt_line_is_named(tuned_mm, tmp_path):
    import shutil

    log = str(tmp_path / "copy")
    shutil.copytree(tuned_mm[0], log)
    path = os.path.join(log, RECORDS)
    lines = open(path).read().splitlines(keepends=True)
    # A truncated last line (a write cut short) is dropped with a warning.
    with open(path, "w") as f:
        f.writelines(lines[:-1] + [lines[-1][:40]])
    with pytest.warns(TuningLogWarning, match=f"{path}:{len(lines)}: dropping a truncated"):
        assert len(TuningLog(log)) == len(lines) - 1
    # A damaged line anywhere else is corruption: a clear error naming the file and line.
    lines[2] = lines[2][:30] + "}\n"
    with open(path, "w") as f:
        f.writelines(lines)
    with pytest.raises(TuningLogError, match=f"{path}:3: corrupt"):
        TuningLog(log)


def test_default_blocks_of_a_layer_whose_weights_stream_from_off_chip():
    """tsp, fp16, a BERT-base projection: M 128, K = N = 960 (768 padded), column tiles
    of 320 (3 of them). Resident, a block's multiply need only cover a 40-cycle install
    (320 rows over 8 fp16 lanes): 10 pixels at 4 cycles each, so blocks of 16, 32, 64 or
    128 rows qualify and 32 is the largest that gives each of the 4 planes two blocks
    (128 / 32 x 3 = 12 >= 8). Streamed, every block loads each of its weight tiles over
    the off-chip path first: 900 + 320 x 320 x 2 / 35.56 = 6,660 cycles, 1,665 pixels,
    more than M: one block of all 128 rows, so each tile is loaded once."""
    from lpx_tvm.machine.timing import dma_cycles

    tsp = load_config("tsp")
    w = DenseWorkload(128, 960, 960, "float16")
    fetch = dma_cycles(tsp, 320, DType.FP16)
    assert fetch == 900 + 5760
    assert default_tiling(tsp, w).m == 32
    assert default_tiling(tsp, w, fetch).m == 128

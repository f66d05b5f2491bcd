"""The cost model's view of LPX candidates: features that see every decision, and an
analytic estimate that ranks candidates like the simulator does."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.machine.config import load_config
from lpx_tvm.tir_schedules import Conv2dTiling
from lpx_tvm.tir_schedules.schedules import tiling_of
from lpx_tvm.tune.cost_model import LPXCostModel
from lpx_tvm.tune.features import NAMES, LPXFeatures, candidate_features, estimated_cycles
from lpx_tvm.tune.measure import task_cycles
from lpx_tvm.tune.space import LPXFits, design_space, fits, space_fn, structures, workload_module
from lpx_tvm.tune.tuner import _context, extract_tasks, search_strategy

MINI = load_config("mini")


def _conv_task(c=4, co=16, h=16, w=8):
    rng = np.random.default_rng(0)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "m",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, co, h, w])],
                          [numpy_helper.from_array(rng.standard_normal((co, c, 3, 3)).astype(np.float32), "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (task,) = extract_tasks(import_onnx(model).mod, MINI, "fp16")
    return task


def _tune_context(task):
    return _context(workload_module(task, MINI), design_space(task, MINI), search_strategy("random", 1), task.name, 1)


def _ranks(a):
    return np.argsort(np.argsort(a))


def test_features_see_the_k_split_and_the_packing():
    w = _conv_task().workload
    base = Conv2dTiling(oh=4, ci=16, co=16, order="noc", k_split=1)
    rows = [candidate_features(w, t, MINI) for t in
            (base, Conv2dTiling(4, 16, 16, "noc", 2), Conv2dTiling(4, 16, 16, "noc", 1, "taps"),
             Conv2dTiling(4, 16, 16, "noc", 1, "rows"))]
    assert all(len(r) == len(NAMES) for r in rows)
    for i in range(len(rows)):
        for j in range(i):
            assert not np.array_equal(rows[i], rows[j])
    # Packing cuts the reduction tiles: 9 taps of one tile each, against 3 packed tiles.
    tiles = NAMES.index("reduction_tiles")
    assert [r[tiles] for r in rows] == [9, 9, 3, 3]


def test_features_of_measure_candidates():
    task = _conv_task()
    ext = LPXFeatures(MINI)
    ctx = _tune_context(task)
    cands = []
    for i, sch in enumerate(space_fn(task.workload, MINI)(s_tir.Schedule(workload_module(task, MINI), seed=3))):
        cands.append(ms.MeasureCandidate(sch, []))
    feats = [f.numpy() for f in ext.extract_from(ctx, cands)]
    assert len(feats) == len(structures(task.workload, MINI.lanes)) == 6
    for f, c in zip(feats, cands):
        assert f.shape == (1, len(NAMES))
        want = candidate_features(task.workload, tiling_of(task.workload, c.sch.mod["main"]), MINI)
        np.testing.assert_array_equal(f[0], want)


def test_estimate_ranks_like_the_simulator():
    """Rank correlation of the estimate with simulated cycles over a whole small space."""
    task = _conv_task()
    w = task.workload
    est, sim = [], []
    for order, pack in structures(w, MINI.lanes):
        for oh in (1, 2, 4, 8):
            for k in (1, 2):
                t = Conv2dTiling(oh, 16, 16, order, k, pack)
                if fits(w, t, MINI) is None:
                    est.append(estimated_cycles(w, t, MINI))
                    sim.append(task_cycles(task, MINI, t))
    assert len(sim) >= 30
    rho = np.corrcoef(_ranks(est), _ranks(sim))[0, 1]
    assert rho > 0.7, rho
    # The estimate's favourite is within 10% of the best point.
    assert sim[int(np.argmin(est))] <= 1.1 * min(sim)


def test_warm_up_ranks_by_the_estimate():
    task = _conv_task()
    model = LPXCostModel(MINI)
    ctx = _tune_context(task)
    post = LPXFits(MINI, task.workload)
    cands = [ms.MeasureCandidate(s, []) for seed in range(4)
             for s in space_fn(task.workload, MINI)(s_tir.Schedule(workload_module(task, MINI), seed=seed + 1))
             if post.apply(s)]
    scores = model.predict(ctx, cands)
    est = [estimated_cycles(task.workload, tiling_of(task.workload, c.sch.mod["main"]), MINI) for c in cands]
    assert scores.max() == 1.0
    np.testing.assert_allclose(scores, min(est) / np.asarray(est))

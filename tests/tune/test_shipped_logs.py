"""The tuning logs shipped inside the package (lpx_tvm/tuning_logs/) and lpx-tvm demo's use of them."""

import os

import numpy as np
import onnxruntime as ort
import pytest

from lpx_tvm import compile_model
from lpx_tvm.cli import _bundled_model, main
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.machine.config import load_config
from lpx_tvm.tune.database import SHIPPED_DIR, TuningLog, load_tuned, read_meta, shipped_log, shipped_logs

TSP = load_config("tsp")


def test_the_resnet50_log_ships_for_tsp_bf16():
    log = shipped_log("light_resnet50", TSP, "bf16")
    assert log is not None and os.path.dirname(log) == SHIPPED_DIR
    meta = read_meta(log)
    assert meta["preset"] == "tsp" and meta["config_hash"] == TSP.hash and meta["precision"] == "bf16"
    applied = TuningLog(log).applied_line(TSP)  # the whole-model choice of the refinement
    assert applied is not None and applied["cycles"] < applied["default_cycles"]
    assert load_tuned(log, TSP)
    # Another machine, precision or model: not this log.
    assert shipped_log("light_resnet50", load_config("mini"), "bf16") is None
    assert shipped_log("light_resnet50", TSP, "fp16") is None
    assert shipped_log("light_squeezenet", TSP, "bf16") is None
    # By path too (the file name names the model).
    assert shipped_log(_bundled_model("light_resnet50"), TSP, "bf16") == log


def test_every_shipped_log_is_keyed_to_its_machine():
    for path, meta in shipped_logs():
        cfg = load_config(meta["preset"])
        assert meta["config_hash"] == cfg.hash, f"{path}: made for another {meta['preset']} (re-tune it)"
        assert TuningLog(path).applied_line(cfg) is not None, f"{path}: no in-context choice"


def test_resnet50_with_the_shipped_log_is_faster_and_matches_onnxruntime():
    from lpx_tvm.tune.context import ModelContext

    path = _bundled_model("light_resnet50")
    log = shipped_log("light_resnet50", TSP, "bf16")
    model = compile_model(path, preset="tsp", precision="bf16", tuning_log=log)
    name, shape, dtype = model.inputs[0]
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    got = model.run({name: x})
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {name: x})))
    for k in got:
        assert np.linalg.norm(got[k] - want[k]) / np.linalg.norm(want[k]) <= 2e-2
    rep = model.report
    assert rep["tuning"]["tuned_layers"]
    default = ModelContext(import_onnx(path).mod, TSP, "bf16").cycles({})
    assert rep["cycles"] < default
    # What the refinement measured is what the build compiles.
    assert rep["cycles"] == TuningLog(log).applied_line(TSP)["cycles"]


@pytest.mark.parametrize("flag", [[], ["--no-tuning-log"]])
def test_demo_says_whether_it_runs_tuned(flag, tmp_path, capsys, monkeypatch):
    # A small model with a shipped log of its own (made here): the demo finds it by name.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import lpx_tvm.tune.database as database

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((48, 32)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 48])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 32])], initializer=[w])
    model = str(tmp_path / "mm.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    shipped = tmp_path / "shipped"
    assert main(["tune", model, "--preset", "mini", "--precision", "fp32", "--trials", "4",
                 "--log", str(shipped / "mm_mini"), "--seed", "3"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(database, "SHIPPED_DIR", str(shipped))
    assert main(["demo", "--model", model, "--preset", "mini", "--precision", "fp32", *flag]) == 0
    out = capsys.readouterr().out
    assert "relative L2 error vs onnxruntime" in out
    if flag:
        assert "default schedules (--no-tuning-log)" in out
    else:
        assert "tuned: shipped log lpx_tvm/tuning_logs/mm_mini" in out and "with the default schedules" in out

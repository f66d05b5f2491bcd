"""The tuning logs shipped inside the package (lpx_tvm/tuning_logs/) and lpx-tvm demo's use of them."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from lpx_tvm import compile_model
from lpx_tvm.cli import _bundled_model, main
from lpx_tvm.light_models import compare_outputs, expose_logits, with_random_weights
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


def test_a_log_of_the_machine_before_full_rate_installs_is_refused(tmp_path):
    """The tsp preset before mxm.install_streams (installs at one row per cycle) had config
    251c8d37...; its logs' tilings were tuned for another machine and must not apply."""
    import json
    import shutil
    import warnings

    from lpx_tvm.tune.database import TuningLogWarning

    old = tmp_path / "light_resnet50_tsp_old"
    shutil.copytree(shipped_log("light_resnet50", TSP, "bf16"), old)
    meta = read_meta(str(old))
    meta["config_hash"] = "251c8d379005fcaf216e4b1347584f5c"
    (old / "lpx_tuning.json").write_text(json.dumps(meta))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_tuned(str(old), TSP) == {}
    assert any(issubclass(w.category, TuningLogWarning) and "251c8d379005fcaf216e4b1347584f5c" in str(w.message)
               for w in caught)
    assert load_tuned(shipped_log("light_resnet50", TSP, "bf16"), TSP)  # the shipped one applies


def _flipped_kernel(model, weight: str):
    """A copy of ``model`` with the 3x3 kernel ``weight`` flipped in both spatial axes: the
    answer of a convolution that reads its taps in the wrong order."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    init = next(i for i in out.graph.initializer if i.name == weight)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init)[:, :, ::-1, ::-1].copy(), weight))
    return out


def _onnxruntime(model, feeds) -> dict:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def test_resnet50_with_the_shipped_log_is_faster_and_matches_onnxruntime():
    # About 30 s (21 s with the constant weights and no logits): one compile and run, two
    # onnxruntime runs, three timing-only compiles.
    from lpx_tvm.tune.refine import ModelContext

    bundled = onnx.load(_bundled_model("light_resnet50"))
    model = with_random_weights(bundled, seed=0)  # the demo's: the bundled weights are all 0.02
    logits = expose_logits(model)
    log = shipped_log("light_resnet50", TSP, "bf16")
    compiled = compile_model(model, preset="tsp", precision="bf16", tuning_log=log)
    name, shape, dtype = compiled.inputs[0]
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    got = compiled.run({name: x})
    # The tuned whole-model build against onnxruntime, logits included (they are about
    # 6 apart: a wrong answer moves them).
    errors = compare_outputs(got, _onnxruntime(model, {name: x}), "bf16", logits)
    assert all(e <= t for e, t in errors.values()), errors
    # The check fails a subtle wrong answer: one 3x3 kernel of the 16 blocks read in the
    # wrong tap order (the last block's, whose logits move least: 3.6%, against 0.6%).
    wrong = compare_outputs(got, _onnxruntime(_flipped_kernel(model, "gpu_0/res5_2_branch2b_w_0"), {name: x}),
                            "bf16", logits)
    assert wrong[logits][0] > wrong[logits][1], wrong

    rep = compiled.report
    assert rep["tuning"]["tuned_layers"]
    tuned = load_tuned(log, TSP)
    ctx = ModelContext(import_onnx(model).mod, TSP, "bf16")
    assert rep["cycles"] == ctx.cycles(tuned)  # the build compiles the log's choice
    assert rep["cycles"] < ctx.cycles({})
    # What the refinement measured is that choice on the bundled graph, where equal
    # constants share one SRAM image (random weights share none: other cycles).
    applied = TuningLog(log).applied_line(TSP)["cycles"]
    assert ModelContext(import_onnx(bundled).mod, TSP, "bf16").cycles(tuned) == applied


@pytest.mark.parametrize("flag", [[], ["--no-tuning-log"]])
def test_demo_says_whether_it_runs_tuned(flag, tmp_path, capsys, monkeypatch):
    # A small model with a shipped log of its own (made here): the demo finds it by name.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import lpx_tvm.tune.database as database

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((48, 32)).astype(np.float32), "w")
    # A softmax of random logits: the demo compares both with onnxruntime.
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])],
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
    assert "output y: relative L2 error vs onnxruntime" in out
    assert "logits m (the softmax input): relative L2 error vs onnxruntime" in out
    assert "weights:" not in out  # a file runs with its own weights
    if flag:
        assert "default schedules (--no-tuning-log)" in out
    else:
        assert "tuned: shipped log lpx_tvm/tuning_logs/mm_mini" in out and "with the default schedules" in out

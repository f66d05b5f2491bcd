"""lpx-tvm tune, and compile / run --tuning-log."""

import json
import os

import numpy as np
import onnx

from lpx_tvm.cli import main
from lpx_tvm.machine.config import load_config
from lpx_tvm.tune.database import TuningLog, read_meta

from test_tune import matmul_model


def test_tune_then_run_with_the_log(tmp_path, capsys):
    model = str(tmp_path / "mm.onnx")
    onnx.save(matmul_model(), model)
    log = str(tmp_path / "logs" / "mm")
    assert main(["tune", model, "--preset", "mini", "--trials", "4", "--log", log, "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "1 tuning task(s)" in out and "default cycles" in out and "matmul_64x48x32" in out
    assert "chosen in the whole model" in out and "whole model: default" in out
    db = TuningLog(log)
    assert len(db) == 4
    assert read_meta(log)["preset"] == "mini"
    # The refinement keeps the tuned schedule unless the default is faster in the whole model.
    applied = db.applied_line(load_config("mini"))
    assert applied["cycles"] <= applied["default_cycles"]
    (_, record), = applied["choices"]
    expected = [] if record is None else ["matmul_64x48x32_float16_dense_relu"]
    report, inputs = str(tmp_path / "report.json"), str(tmp_path / "x.npz")
    np.savez(inputs, x=np.ones((64, 48), np.float32))
    assert main(["run", model, "--preset", "mini", "--tuning-log", log, "--inputs", inputs, "--report", report]) == 0
    with open(report) as f:
        tuning = json.load(f)["tuning"]
    assert tuning["log"] == log and tuning["tuned_layers"] == expected
    art = str(tmp_path / "art")
    assert main(["compile", model, "--preset", "mini", "--tuning-log", log, "-o", art]) == 0
    assert os.path.isdir(art)


def test_tune_into_a_log_of_another_machine_is_refused(tmp_path, capsys):
    model = str(tmp_path / "mm.onnx")
    onnx.save(matmul_model(), model)
    log = str(tmp_path / "log")
    assert main(["tune", model, "--preset", "mini", "--trials", "1", "--log", log]) == 0
    assert main(["tune", model, "--preset", "tsp", "--trials", "1", "--log", log]) == 2
    assert "is a tuning log for machine mini" in capsys.readouterr().err


def test_tune_without_the_refinement(tmp_path, capsys):
    model = str(tmp_path / "mm.onnx")
    onnx.save(matmul_model(), model)
    log = str(tmp_path / "log")
    assert main(["tune", model, "--preset", "mini", "--trials", "2", "--log", log, "--no-context"]) == 0
    out = capsys.readouterr().out
    assert "whole model" not in out
    assert not os.path.exists(os.path.join(log, "lpx_applied.json"))

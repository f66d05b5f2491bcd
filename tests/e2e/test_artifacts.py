"""Artifacts reload in a fresh process; the CLI contract; tvm.compile with the lpx pipeline."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import tvm
import tvm.testing
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm
from lpx_tvm.cli import main

RNG = np.random.default_rng(3)


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)  # the same weights on every call
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], initializer=[w, fc])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, x):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "tiny.onnx"
    onnx.save(_model(), path)
    return path


def test_artifact_reloads_in_a_fresh_process(onnx_file, tmp_path):
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert main(["compile", str(onnx_file), "-o", str(tmp_path / "art"), "--preset", "mini",
                 "--precision", "fp32"]) == 0
    code = (f"import numpy as np, lpx_tvm; m = lpx_tvm.load({str(tmp_path / 'art')!r}); "
            f"np.save({str(tmp_path / 'out.npy')!r}, m.run({{'x': np.load({str(tmp_path / 'in.npz')!r})['x']}})['y'])")
    subprocess.run([sys.executable, "-c", code], check=True)
    tvm.testing.assert_allclose(np.load(tmp_path / "out.npy"), _ort(_model(), x), rtol=1e-4, atol=1e-4)


def test_cli_run_writes_outputs_and_the_report_contract(onnx_file, tmp_path, capsys):
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    args = ["run", str(onnx_file), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz"),
            "--report", str(tmp_path / "r.json"), "--preset", "mini", "--precision", "fp32"]
    assert main(args) == 0
    with np.load(tmp_path / "out.npz") as out:
        tvm.testing.assert_allclose(out["y"], _ort(_model(), x), rtol=1e-4, atol=1e-4)
    rep = json.loads((tmp_path / "r.json").read_text())
    for key in ("preset", "precision", "cycles", "latency_s", "macs", "mxm_utilization", "offload", "layers"):
        assert key in rep
    assert rep["preset"] == "mini" and rep["precision"] == "fp32"
    assert rep["macs"] == 6 * 6 * 4 * 3 * 9 + 4 * 6 * 6 + 4 * 2  # conv, pooling sums, dense
    assert set(rep["offload"]) >= {"lpx", "cpu"} and rep["offload"]["lpx"]["nn.conv2d"] == 1
    assert all({"name", "cycles", "macs"} <= set(layer) for layer in rep["layers"])


@pytest.mark.parametrize("bad", ["missing", "corrupt", "input-name", "input-shape"])
def test_cli_bad_input_is_one_clear_line(bad, onnx_file, tmp_path, capsys):
    model = str(onnx_file)
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 3, 6, 6), np.float32))
    if bad == "missing":
        model = str(tmp_path / "nope.onnx")
    elif bad == "corrupt":
        (tmp_path / "bad.onnx").write_bytes(b"\x08\x07not a model")
        model = str(tmp_path / "bad.onnx")
    elif bad == "input-name":
        np.savez(tmp_path / "in.npz", z=np.zeros((1, 3, 6, 6), np.float32))
    else:
        np.savez(tmp_path / "in.npz", x=np.zeros((1, 3, 5, 6), np.float32))
    capsys.readouterr()
    assert main(["run", model, "--inputs", str(tmp_path / "in.npz"), "--preset", "mini"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lpx-tvm: error:")


def test_tvm_compile_with_the_lpx_pipeline():
    from lpx_tvm.relax_passes import import_onnx

    imported = import_onnx(_model())
    ex = tvm.compile(imported.mod, target="lpx", relax_pipeline="lpx")
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    # The default pipeline preset is tsp / fp16.
    assert np.linalg.norm(got - _ort(_model(), x)) / np.linalg.norm(_ort(_model(), x)) < 1e-2


def test_build_returns_a_vm_executable_with_regions():
    from lpx_tvm.relax_passes import import_onnx

    exe = lpx_tvm.build(import_onnx(_model()).mod, target="lpx", preset="mini", precision="fp32")
    assert len(exe.regions) >= 1
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    (got,) = exe.run([x])
    tvm.testing.assert_allclose(got, _ort(_model(), x), rtol=1e-4, atol=1e-4)
    assert exe.stats.cycles > 0

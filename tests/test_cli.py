"""The lpx-tvm command line: kernels to binaries, runs with npz files, reports, traces, errors."""

import json

import numpy as np
import pytest

from lpx_tvm.cli import main


def _gemm_binary(tmp_path, preset="mini", shape=(24, 40, 20), dtype="int8"):
    path = tmp_path / "gemm.lpx"
    assert main(["kernel", "gemm", "--shape", *map(str, shape), "--dtype", dtype, "--preset", preset,
                 "-o", str(path)]) == 0
    return path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lpx-tvm: error: ")
    return err[0]


def test_run_gemm_with_npz_report_and_trace(tmp_path, capsys):
    prog = _gemm_binary(tmp_path)
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (24, 40), dtype=np.int8)
    b = rng.integers(-128, 128, (40, 20), dtype=np.int8)
    np.savez(tmp_path / "in.npz", A=a, B=b)
    args = ["run", str(prog), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz"),
            "--report", str(tmp_path / "r.json"), "--trace", str(tmp_path / "t.json")]
    assert main(args) == 0
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["C"], a.astype(np.int64) @ b.astype(np.int64))
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["preset"] == "mini"
    assert report["macs"] == 24 * 40 * 20
    assert report["cycles"] > 0 and report["latency_s"] == pytest.approx(report["cycles"] / 900e6)
    assert sum(layer["macs"] for layer in report["layers"]) == report["macs"]
    trace = json.loads((tmp_path / "t.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert {"mxm0", "mxm1"} <= names  # one track group per queue
    ops = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {"mem.read", "mxm.install", "mxm.mul", "mxm.drain", "mem.write"} <= ops


def test_timing_only_run_needs_no_inputs(tmp_path, capsys):
    prog = _gemm_binary(tmp_path)
    assert main(["run", str(prog), "--timing-only", "--report", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["macs"] == 24 * 40 * 20


def test_disasm_lists_every_instruction(tmp_path, capsys):
    prog = _gemm_binary(tmp_path)
    capsys.readouterr()
    assert main(["disasm", str(prog)]) == 0
    listing = capsys.readouterr().out
    assert "mxm.install" in listing and "mxm.drain" in listing


def test_missing_input_file(tmp_path, capsys):
    prog = _gemm_binary(tmp_path)
    assert main(["run", str(prog), "--inputs", str(tmp_path / "nope.npz")]) == 2
    assert "nope.npz" in _one_error_line(capsys)


def test_wrong_input_name_and_shape(tmp_path, capsys):
    prog = _gemm_binary(tmp_path)
    np.savez(tmp_path / "bad.npz", A=np.zeros((24, 40), np.int8), X=np.zeros((40, 20), np.int8))
    assert main(["run", str(prog), "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "'X'" in _one_error_line(capsys)
    np.savez(tmp_path / "bad.npz", A=np.zeros((24, 41), np.int8), B=np.zeros((40, 20), np.int8))
    assert main(["run", str(prog), "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "shape" in _one_error_line(capsys)


def test_program_for_another_machine(tmp_path, capsys):
    prog = _gemm_binary(tmp_path, preset="mini")
    assert main(["run", str(prog), "--preset", "tsp", "--timing-only"]) == 2
    assert "rebuild it for tsp" in _one_error_line(capsys)


def test_corrupt_npz(tmp_path, capsys):
    prog = _gemm_binary(tmp_path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    assert main(["run", str(prog), "--inputs", str(tmp_path / "junk.npz")]) == 2
    assert "junk.npz" in _one_error_line(capsys)


def _softmax_model(tmp_path):
    """A MatMul and a Softmax of random weights, as an .onnx file."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], initializer=[w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_demo_on_a_small_onnx_file(tmp_path, capsys):
    path = _softmax_model(tmp_path)
    assert main(["demo", "--model", str(path), "--preset", "mini", "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "output y: relative L2 error vs onnxruntime" in out
    assert "logits m (the softmax input): relative L2 error vs onnxruntime" in out
    assert out.splitlines()[-1].startswith("PASS: 2 output(s) match onnxruntime within tolerance")


@pytest.mark.parametrize("wrong", ["swapped classes", "one logit off by 1%"])
def test_the_demo_refuses_a_wrong_answer(wrong, tmp_path, capsys, monkeypatch):
    # The simulated outputs perturbed after the run: the demo's comparison must say so
    # (exit 2, one line), also where the softmax output alone would hide it.
    from lpx_tvm.runtime.compiled_model import CompiledModel

    run = CompiledModel.run

    def perturbed(self, inputs):
        out = run(self, inputs)
        m = out["m"].copy()
        if wrong == "swapped classes":  # the same probabilities, for the wrong classes
            m[:, [0, 1]] = m[:, [1, 0]]
            out["y"] = out["y"][:, [1, 0, 2, 3]]
        else:  # one of the 12 logits 1% off (the softmax output left right)
            m[0, 0] *= 1.01
        out["m"] = m
        return out

    monkeypatch.setattr(CompiledModel, "run", perturbed)
    path = _softmax_model(tmp_path)
    assert main(["demo", "--model", str(path), "--preset", "mini", "--precision", "fp32"]) == 2
    assert "differ from onnxruntime beyond tolerance" in _one_error_line(capsys)

"""lpx-tvm compile / run: --input-shapes pins dynamic dimensions, --fill-mode runs without
an npz, and bundled model names are accepted as by demo and tune."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import lpx_tvm
from lpx_tvm.cli import fill_inputs, main
from lpx_tvm.errors import LPXError


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lpx-tvm: error: "), err
    return err[0]


@pytest.fixture(scope="module")
def dynamic_model(tmp_path_factory):
    """x (N, 4, H, W) -> Relu(Reshape(x, Concat(Shape(x)[:1], ReduceProd(Shape(x)[1:])))) * 2:
    an exporter's flatten of a dynamic input, which TVM's importer alone refuses."""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)  # noqa: E731
    nodes = [h.make_node("Shape", ["x"], ["s"], name="shape"),
             h.make_node("Slice", ["s", "st1", "st4"], ["t"], name="tail"),
             h.make_node("ReduceProd", ["t"], ["p"], keepdims=1, name="features"),
             h.make_node("Slice", ["s", "st0", "st1"], ["b"], name="batch"),
             h.make_node("Concat", ["b", "p"], ["ns"], axis=0, name="new_shape"),
             h.make_node("Reshape", ["x", "ns"], ["r"], name="flatten"),
             h.make_node("Tanh", ["r"], ["a"], name="tanh"),
             h.make_node("Mul", ["a", "two"], ["y"], name="scale")]
    graph = h.make_graph(nodes, "flatten", [h.make_tensor_value_info("x", T.FLOAT, ["N", 4, "H", "W"])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["N", "F"])],
                         [c("st0", [0]), c("st1", [1]), c("st4", [4]), c("two", np.float32(2.0))])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("dyn") / "flatten.onnx"
    onnx.save(model, path)
    return path


def _onnxruntime(path, inputs):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)[0]


def _rel_l2(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def test_run_with_input_shapes_matches_onnxruntime(dynamic_model, tmp_path):
    x = np.random.default_rng(3).standard_normal((2, 4, 3, 5)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert main(["run", str(dynamic_model), "--input-shapes", "x:2x4x3x5", "--inputs", str(tmp_path / "in.npz"),
                 "--outputs", str(tmp_path / "out.npz"), "--preset", "mini", "--precision", "fp32"]) == 0
    with np.load(tmp_path / "out.npz") as out:
        got = out["y"]
    assert got.shape == (2, 60)
    assert _rel_l2(got, _onnxruntime(dynamic_model, {"x": x})) <= 1e-5


def test_compile_with_input_shapes_then_run_the_artifact_with_random_fill(dynamic_model, tmp_path, capsys):
    art = tmp_path / "model.lpxa"
    assert main(["compile", str(dynamic_model), "-o", str(art), "--input-shapes", "x:1x4x2x6",
                 "--preset", "mini", "--precision", "fp32"]) == 0
    assert "1 LPX region" in capsys.readouterr().out
    assert main(["run", str(art), "--fill-mode", "random", "--outputs", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as out:
        got = out["y"]
    x = fill_inputs([("x", (1, 4, 2, 6), "float32")], "random")["x"]
    assert got.shape == (1, 48)
    assert _rel_l2(got, _onnxruntime(dynamic_model, {"x": x})) <= 1e-5
    # the artifact was compiled for its shapes: --input-shapes cannot change them
    assert main(["run", str(art), "--fill-mode", "zeros", "--input-shapes", "x:2x4x2x6"]) == 2
    assert "--input-shapes cannot be used here" in _one_error_line(capsys)


def test_a_dynamic_model_without_input_shapes_names_the_input(dynamic_model, capsys):
    assert main(["run", str(dynamic_model), "--fill-mode", "zeros", "--preset", "mini"]) == 2
    line = _one_error_line(capsys)
    assert "input 'x' has dynamic dimensions (['N', 4, 'H', 'W'])" in line


@pytest.mark.parametrize("spec, why", [
    ("x", "'x' is not NAME:DIMS"),
    (":1x4x2x2", "':1x4x2x2' has no input name before ':'"),
    ("x:1x4xHx2", "the shape '1x4xHx2' of 'x' is not positive integers joined by 'x'"),
    ("x:1x4x0x2", "the shape '1x4x0x2' of 'x' is not positive integers"),
    ("x:1x4x2x2,x:1x4x2x2", "'x' is given twice"),
    ("x:", "the shape '' of 'x'"),
])
@pytest.mark.parametrize("command", ["compile", "run"])
def test_a_bad_input_shapes_spec_is_named(command, spec, why, dynamic_model, tmp_path, capsys):
    args = [command, str(dynamic_model), "--input-shapes", spec]
    args += ["-o", str(tmp_path / "a.lpxa")] if command == "compile" else ["--fill-mode", "zeros"]
    assert main(args) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"lpx-tvm: error: --input-shapes {spec!r}: {why}")
    assert "expected NAME:DIMS[,NAME:DIMS...]" in line


@pytest.mark.parametrize("spec, message", [
    ("y:1x4x2x2", "input_shapes names ['y'], which are not model inputs (inputs: ['x'])"),
    ("x:1x4x2", "input_shapes['x'] = (1, 4, 2) has rank 3, the model declares rank 4"),
])
def test_input_shapes_that_do_not_fit_the_model(spec, message, dynamic_model, tmp_path, capsys):
    assert main(["compile", str(dynamic_model), "-o", str(tmp_path / "a.lpxa"), "--input-shapes", spec]) == 2
    assert message in _one_error_line(capsys)


@pytest.mark.parametrize("mode, value", [("zeros", 0), ("ones", 1)])
def test_fill_mode_on_a_program_binary(mode, value, tmp_path):
    """C = A @ B of int8 (24x40) and (40x20): ones give K = 40 everywhere, zeros give 0."""
    prog = tmp_path / "gemm.lpx"
    assert main(["kernel", "gemm", "--shape", "24", "40", "20", "--dtype", "int8", "--preset", "mini",
                 "-o", str(prog)]) == 0
    assert main(["run", str(prog), "--fill-mode", mode, "--outputs", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["C"], np.full((24, 20), 40 * value))


def test_fill_mode_fills_only_what_the_npz_does_not_give(tmp_path):
    prog = tmp_path / "gemm.lpx"
    assert main(["kernel", "gemm", "--shape", "8", "16", "4", "--dtype", "int8", "--preset", "mini",
                 "-o", str(prog)]) == 0
    a = np.random.default_rng(0).integers(-5, 5, (8, 16), dtype=np.int8)
    np.savez(tmp_path / "in.npz", A=a)
    assert main(["run", str(prog), "--inputs", str(tmp_path / "in.npz"), "--fill-mode", "ones",
                 "--outputs", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["C"], np.repeat(a.astype(np.int64).sum(1, keepdims=True), 4, 1))


def test_fill_inputs_is_seeded_and_typed():
    specs = [("x", (2, 3), "float32"), ("ids", (4,), "int64"), ("mask", (3,), "bool"), ("h", (2,), "float16")]
    a, b = fill_inputs(specs, "random"), fill_inputs(specs, "random")
    for name, shape, dtype in specs:
        assert a[name].shape == shape and a[name].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(a[name], b[name])
    assert a["ids"].min() >= 0 and a["ids"].max() <= 9
    assert np.std(fill_inputs([("x", (1000,), "float32")], "random")["x"]) == pytest.approx(1, abs=0.1)
    assert not fill_inputs([("x", (3,), "float32")], "zeros")["x"].any()


@pytest.mark.parametrize("command", ["compile", "run"])
def test_bundled_model_names(command, tmp_path, capsys, monkeypatch):
    """A name of a model bundled with onnx is compiled from onnx's file (the compile itself
    is the demo's: replaced here by one that records the path it is given)."""
    given = []

    def compile_model(path, **kwargs):
        given.append(str(path))
        raise LPXError("stop here")

    monkeypatch.setattr(lpx_tvm, "compile_model", compile_model)
    args = [command, "light_squeezenet"] + (["-o", str(tmp_path / "a.lpxa")] if command == "compile" else [])
    assert main(args) == 2
    assert _one_error_line(capsys) == "lpx-tvm: error: stop here"
    assert given[0].endswith("/onnx/backend/test/data/light/light_squeezenet.onnx")
    onnx.checker.check_model(given[0])
    assert main([command, "light_nosuchnet"] + args[2:]) == 2
    assert _one_error_line(capsys) == ("lpx-tvm: error: light_nosuchnet: no such file, and no model of that "
                                       "name is bundled with onnx")


def test_input_shapes_is_refused_for_a_program_binary(tmp_path, capsys):
    prog = tmp_path / "gemm.lpx"
    assert main(["kernel", "gemm", "--shape", "8", "16", "4", "--dtype", "int8", "--preset", "mini",
                 "-o", str(prog)]) == 0
    assert main(["run", str(prog), "--input-shapes", "A:8x16"]) == 2
    assert "--input-shapes cannot be used here: a program binary is already compiled" in _one_error_line(capsys)

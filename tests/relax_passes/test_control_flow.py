"""Control flow and data-dependent shapes: an If, NonZero, Unique and Range of run-time
inputs run on the CPU, with LPX regions around them, and match onnxruntime; what TVM's
importer would translate wrongly (Expand to a run-time shape, Unique's unflattened
inverse_indices) is refused naming the node, through the API and the CLI."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import lpx_tvm
from lpx_tvm import cli
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.relax_passes.errors import ModelError

from relax_models import _init, make_model

RNG = np.random.default_rng(12)


def _weight(name, shape):
    return _init(name, RNG.standard_normal(shape).astype(np.float32))


def if_model():
    """MatMul and Sigmoid, then an If on sum(x) > 0 whose branches read the sigmoid (Relu
    or its square), then MatMul and Relu: two LPX ops on each side of the If."""
    then_g = helper.make_graph([helper.make_node("Relu", ["y"], ["t"], name="then_relu")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, 16])])
    else_g = helper.make_graph([helper.make_node("Mul", ["y", "y"], ["e"], name="else_square")], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 16])])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["y0"], name="mm1"),
        helper.make_node("Sigmoid", ["y0"], ["y"], name="sigmoid"),
        helper.make_node("ReduceSum", ["x"], ["total"], name="total", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["c"], name="positive"),
        helper.make_node("If", ["c"], ["z"], name="branch", then_branch=then_g, else_branch=else_g),
        helper.make_node("MatMul", ["z", "w2"], ["z2"], name="mm2"),
        helper.make_node("Relu", ["z2"], ["out"], name="relu"),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, [4, 16])], [("out", TensorProto.FLOAT, [4, 8])],
                      [_weight("w1", (16, 16)), _weight("w2", (16, 8)), _init("zero", np.array(0, np.float32))])


def nonzero_model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
             helper.make_node("Relu", ["y"], ["r"], name="relu"),
             helper.make_node("NonZero", ["r"], ["nz"], name="nonzero")]
    return make_model(nodes, [("x", TensorProto.FLOAT, [4, 16])],
                      [("nz", TensorProto.INT64, [2, None]), ("r", TensorProto.FLOAT, [4, 16])], [_weight("w", (16, 16))])


def unique_model(shape, sorted_):
    names = ["u", "indices", "inverse", "counts"]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Unique", ["r"], names, name="uniq", sorted=sorted_)]
    outputs = [("u", TensorProto.FLOAT, [None])] + [(n, TensorProto.INT64, [None]) for n in names[1:]]
    return make_model(nodes, [("x", TensorProto.FLOAT, list(shape))], outputs)


def range_model(elem_type):
    nodes = [helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range"),
             helper.make_node("Abs", ["r"], ["out"], name="abs")]
    return make_model(nodes, [(n, elem_type, []) for n in ("start", "limit", "delta")], [("out", elem_type, [None])])


def expand_model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
             helper.make_node("Expand", ["y", "shape"], ["e"], name="expand")]
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, 16]), ("shape", TensorProto.INT64, [2])],
                      [("e", TensorProto.FLOAT, [None, 16])], [_weight("w", (16, 16))])


def _check(model, feeds, precision="fp32", rtol=1e-5):
    """Compile once, and compare every output of every feed with onnxruntime."""
    compiled = lpx_tvm.compile_model(model, preset="mini", precision=precision)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for feed in feeds:
        got = compiled.run(feed)
        for name, want in zip(names, session.run(None, feed)):
            assert np.asarray(got[name]).shape == want.shape, (name, feed)
            np.testing.assert_allclose(got[name], want, rtol=rtol, atol=rtol)
    return compiled.report.offload


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_if_runs_on_the_cpu_between_lpx_regions(precision):
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    feeds = [{"x": np.abs(x)}, {"x": -np.abs(x)}]  # the then branch, then the else branch
    offload = _check(if_model(), feeds, precision, rtol=1e-5 if precision == "fp32" else 3e-2)
    # MatMul + Sigmoid before the If and MatMul + Relu after it: one region on each side.
    assert offload.regions == 2
    assert offload.lpx == {"matmul": 2, "nn.relu": 1, "sigmoid": 1}
    branch_ops = [op for op in offload.cpu_ops if op["op"] in ("nn.relu", "multiply")]
    assert len(branch_ops) == 2
    assert all("If 'branch'" in op["reason"] and "control flow" in op["reason"] for op in branch_ops)


def test_nonzero_runs_on_the_cpu():
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    offload = _check(nonzero_model(), [{"x": x}, {"x": -np.abs(x)}])  # the second finds nothing: (2, 0)
    assert offload.lpx == {"matmul": 1, "nn.relu": 1}
    reason = next(op["reason"] for op in offload.cpu_ops if op["op"] == "nonzero")
    assert "depends on run-time values" in reason


@pytest.mark.parametrize("sorted_", [1, 0])
def test_unique_runs_on_the_cpu(sorted_):
    x = np.array([2, 1, 1, 3, -4, 3, 2, 0], np.float32)  # repeats, and a negative value relu makes 0
    _check(unique_model((8,), sorted_), [{"x": x}])


@pytest.mark.parametrize("elem_type", [TensorProto.FLOAT, TensorProto.INT64])
def test_range_of_runtime_inputs_runs_on_the_cpu(elem_type):
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    bounds = [(1.5, 7, 0.5), (5, -4, -2), (3, 1, 1)]  # ascending, descending, empty
    if elem_type == TensorProto.INT64:
        bounds = [(2, 11, 3), (5, -4, -2), (3, 1, 1)]
    feeds = [{k: np.array(v, dtype) for k, v in zip(("start", "limit", "delta"), b)} for b in bounds]
    offload = _check(range_model(elem_type), feeds)
    # The bounds are single numbers: their arithmetic stays on the CPU with the Range.
    assert offload.regions == 0


def test_expand_to_a_runtime_shape_is_refused_by_name():
    with pytest.raises(ModelError, match="Expand 'expand' takes its shape 'shape' at run time"):
        lpx_tvm.compile_model(expand_model(), preset="mini", precision="fp32")


def test_unique_whose_inverse_would_come_out_unflattened_is_refused():
    with pytest.raises(ModelError, match="Unique 'uniq' without axis of a 2-D input"):
        import_onnx(unique_model((2, 4), 1))


def test_a_scalar_op_stays_on_the_cpu():
    """An op of 0-d values (as a Range's bounds are) would be a region of 0-d tensors,
    which a program cannot take: it runs on the CPU."""
    model = make_model([helper.make_node("Sub", ["a", "b"], ["d"], name="sub")],
                       [("a", TensorProto.FLOAT, []), ("b", TensorProto.FLOAT, [])], [("d", TensorProto.FLOAT, [])])
    offload = _check(model, [{"a": np.array(4.0, np.float32), "b": np.array(1.5, np.float32)}])
    assert offload.regions == 0 and "0-d values stay on the CPU" in offload.cpu_ops[0]["reason"]


def test_cli_compiles_and_runs_an_if_and_refuses_expand_in_one_line(tmp_path, capsys):
    onnx.save(if_model(), tmp_path / "if.onnx")
    onnx.save(expand_model(), tmp_path / "expand.onnx")
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert cli.main(["compile", str(tmp_path / "if.onnx"), "-o", str(tmp_path / "art"), "--preset", "mini",
                     "--precision", "fp32"]) == 0
    assert cli.main(["run", str(tmp_path / "art"), "--inputs", str(tmp_path / "in.npz"),
                     "--outputs", str(tmp_path / "out.npz")]) == 0
    want = ort.InferenceSession(str(tmp_path / "if.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["out"], want, rtol=1e-5, atol=1e-5)
    capsys.readouterr()
    assert cli.main(["compile", str(tmp_path / "expand.onnx"), "-o", str(tmp_path / "art2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lpx-tvm: error:") and "Expand 'expand'" in err[0]
    assert not (tmp_path / "art2").exists()

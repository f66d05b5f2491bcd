"""Exporter-style graphs with dynamic dimensions and shape subgraphs import once their
input shapes are pinned, and compute what onnxruntime computes (fp32 on ``mini``).

Without the folding of lpx_tvm.relax_passes.freeze_shapes, TVM's importer refuses
several of these graphs (the errors are checked below), and torch's exports of the
attention and FPN modules at opset 11 failed as well.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import lpx_tvm
from lpx_tvm.relax_passes.errors import ModelError
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.relax_passes.freeze_shapes import fold_shapes, has_shape_subgraph
from lpx_tvm.relax_passes.importer import _from_onnx

from shape_models import BUILDERS, OPSETS, export_torch, torch_modules

RTOL = 1e-5  # relative L2 error against onnxruntime, fp32


def _reference(model, x):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _check_against_onnxruntime(model, shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="fp32", input_shapes={"x": shape})
    got = compiled.run({"x": x})["y"]
    want = _reference(model, x)
    assert got.shape == want.shape
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err <= RTOL, f"relative L2 error {err:.2e}"


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_shape_subgraph_matches_onnxruntime(build, opset):
    model, shape = build(opset)
    assert has_shape_subgraph(model)
    _check_against_onnxruntime(model, shape)


@pytest.mark.parametrize("name, message", [
    ("reduceprod_flatten", "Reshape requires the input new shape to be Shape"),
    ("tiled_class_token", "cannot handle ShapeExpr inputs"),
    ("scaled_resize", "for size is currently unsupported"),
    ("same_pad", "failed on Pad 'pad_same'.*cannot handle ShapeExpr inputs"),
])
def test_tvm_importer_alone_refuses_them(name, message):
    """What the folding is for: the graph as the exporter wrote it, straight into TVM's
    importer with every input dimension pinned, fails."""
    build = next(b for b in BUILDERS if b.__name__ == name)
    model, shape = build(13)
    with pytest.raises(ModelError, match=message):
        _from_onnx(model, [("x", shape, "float32")], "model")
    import_onnx(model, {"x": shape})  # and with the folding it imports


def test_folding_keeps_node_names_and_standard_ops():
    model, shape = BUILDERS[0](17)  # reshape_chain
    folded = fold_shapes(model, {"x": shape})
    assert not has_shape_subgraph(folded)
    assert [n.name for n in folded.graph.node] == ["flatten", "softmax", "unflatten"]
    assert {n.domain for n in folded.graph.node} <= {""}
    shapes = {init.name: list(onnx.numpy_helper.to_array(init)) for init in folded.graph.initializer}
    assert [2, 4, 30] in shapes.values() and [2, 4, 6, 5] in shapes.values()
    assert has_shape_subgraph(model)  # the caller's model is left as it was


def test_graph_without_shape_ops_is_not_rewritten():
    """Static graphs import as they always did (their programs' hashes stay)."""
    model, _ = BUILDERS[0](17)
    assert not has_shape_subgraph(fold_shapes(model, {"x": (1, 4, 3, 3)}))
    static = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])]))
    assert not has_shape_subgraph(static)


def test_pinned_shapes_that_contradict_the_graph_are_refused():
    """A pinned shape the graph cannot take (6 features where the class token has 8)
    fails in one line naming the node, with onnxruntime's reason for not folding."""
    model, _ = BUILDERS[5](13)  # tiled_class_token
    with pytest.raises(ModelError, match=r"failed on Tile 'tile'.*folding its shape computations with "
                                         r"onnxruntime failed: Node \(prepend\) Op \(Concat\).*Inferred=6 Declared=8"):
        import_onnx(model, {"x": (2, 5, 6)})


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("name", ["attention", "fpn", "cls_positions"])
def test_torch_export_with_dynamic_axes(name, opset, tmp_path):
    pytest.importorskip("torch")
    module, x, axes = torch_modules()[name]
    model = export_torch(module, x, axes, opset, tmp_path / f"{name}.onnx")
    assert any(d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim)
    _check_against_onnxruntime(model, tuple(x.shape))
    # another pinned size than the export's example: the dimensions are really free
    bigger = tuple(s + 2 if i in axes and i != 0 else s for i, s in enumerate(x.shape))
    _check_against_onnxruntime(model, bigger, seed=1)


@pytest.mark.parametrize("name", ["attention", "fpn"])
def test_torch_dynamo_export_with_dynamic_axes(name, tmp_path):
    pytest.importorskip("onnxscript")
    module, x, axes = torch_modules()[name]
    model = export_torch(module, x, axes, 18, tmp_path / f"{name}.onnx", dynamo=True)
    _check_against_onnxruntime(model, tuple(x.shape))

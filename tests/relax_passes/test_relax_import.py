"""import_onnx: the model's interface, and one clear error per way an import can fail."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from lpx_tvm.errors import LPXError
from lpx_tvm.relax_passes import ImportedModel, ModelError, import_onnx

from relax_models import convnet, make_model


def _relu_model(shape):
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, shape)],
        [("y", TensorProto.FLOAT, shape)],
    )


def _main_param_shapes(mod):
    return [tuple(int(d) for d in p.ty.shape.values) for p in mod["main"].params]


def test_interface_excludes_initializers():
    model = convnet()
    # Older exporters also list initializers as graph inputs; they are weights, not inputs.
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3, 3, 3]))
    imported = import_onnx(model)
    assert isinstance(imported, ImportedModel)
    assert imported.inputs == [("x", (1, 3, 8, 8), "float32")]
    assert imported.outputs == ["probs"]
    assert imported.opset == 17
    assert _main_param_shapes(imported.mod) == [(1, 3, 8, 8)]
    assert isinstance(imported.mod["main"], relax.Function)


def test_import_from_path(tmp_path):
    path = tmp_path / "relu.onnx"
    onnx.save(_relu_model([2, 3]), path)
    imported = import_onnx(str(path))
    assert imported.inputs == [("x", (2, 3), "float32")]
    assert imported.outputs == ["y"]
    assert import_onnx(path).inputs == imported.inputs  # os.PathLike too


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelError, match="no such file") as info:
        import_onnx(missing)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, LPXError)


def test_not_an_onnx_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("these are my notes, not a model\n" * 10)
    with pytest.raises(ModelError, match="not a valid ONNX model") as info:
        import_onnx(path)
    assert "\n" not in str(info.value)


def test_wrong_argument_type():
    with pytest.raises(ModelError, match="path or an onnx.ModelProto"):
        import_onnx(42)


def test_dynamic_dims_need_input_shapes():
    model = _relu_model(["batch", 3])
    with pytest.raises(ModelError, match=r"input 'x' has dynamic dimensions.*input_shapes") as info:
        import_onnx(model)
    assert "batch" in str(info.value)
    imported = import_onnx(model, input_shapes={"x": (4, 3)})
    assert imported.inputs == [("x", (4, 3), "float32")]
    assert _main_param_shapes(imported.mod) == [(4, 3)]


def test_input_shapes_checked():
    model = _relu_model(["batch", 3])
    with pytest.raises(ModelError, match="not model inputs"):
        import_onnx(model, input_shapes={"y": (1, 3)})
    with pytest.raises(ModelError, match="rank 3"):
        import_onnx(model, input_shapes={"x": (1, 3, 1)})
    with pytest.raises(ModelError, match="non-positive"):
        import_onnx(model, input_shapes={"x": (0, 3)})


def test_unsupported_op_is_named():
    model = make_model(
        [helper.make_node("Celu", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 3])],
    )
    with pytest.raises(ModelError, match="not supported by TVM's ONNX importer: Celu$"):
        import_onnx(model)


def test_invalid_in_memory_model():
    model = _relu_model([2, 3])
    model.graph.node[0].input[0] = "undefined_tensor"
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        import_onnx(model)


def test_int_input_dtype():
    model = make_model(
        [helper.make_node("Add", ["i", "k"], ["j"])],
        [("i", TensorProto.INT32, [2])],
        [("j", TensorProto.INT32, [2])],
        [numpy_helper.from_array(np.array([1, 2], np.int32), "k")],
    )
    assert import_onnx(model).inputs == [("i", (2,), "int32")]

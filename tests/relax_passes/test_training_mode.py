"""A BatchNormalization in training mode (ONNX node cases test_batchnorm_*_training_mode)
is refused by name, not run as inference (which gave wrong numbers); the same node in
inference mode still compiles and matches onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.backend.test.loader import load_model_tests

import lpx_tvm
from lpx_tvm.relax_passes.errors import ModelError


def _case(name):
    case = next(c for c in load_model_tests(kind="node") if c.name == name)
    return onnx.load(f"{case.model_dir}/model.onnx") if case.model_dir else case.model


@pytest.mark.parametrize("name", ["test_batchnorm_example_training_mode", "test_batchnorm_epsilon_training_mode"])
def test_training_mode_batchnorm_is_refused(name):
    with pytest.raises(ModelError, match="training mode"):
        lpx_tvm.compile_model(_case(name), preset="mini", precision="fp32")


def test_inference_batchnorm_still_matches_onnxruntime():
    model = _case("test_batchnorm_example")
    rng = np.random.default_rng(0)
    feed = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feed[vi.name] = rng.standard_normal(shape).astype(np.float32)
        if vi.name == "var":
            feed[vi.name] = np.abs(feed[vi.name]) + 0.5
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = list(lpx_tvm.compile_model(model, preset="mini", precision="fp32").run(feed).values())[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

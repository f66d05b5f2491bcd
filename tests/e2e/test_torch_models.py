"""ResNet-18, ResNet-50 and MobileNetV2 built in torch with random weights and randomized
BatchNorm statistics, exported to ONNX, compiled for tsp, against onnxruntime."""

import numpy as np
import pytest
import tvm.testing

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import lpx_tvm  # noqa: E402

from torch_models import MobileNetV2, randomized, resnet18, resnet50  # noqa: E402

BUILDERS = {"resnet18": resnet18, "resnet50": resnet50, "mobilenet_v2": MobileNetV2}


@pytest.fixture(scope="module", params=list(BUILDERS))
def exported(request, tmp_path_factory):
    import onnxruntime as ort

    torch.manual_seed(0)
    model = randomized(BUILDERS[request.param]())
    x = torch.randn(1, 3, 224, 224)
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=True, verbose=False)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x.numpy()}
    return request.param, path, feed, sess.run(None, feed)[0]


def test_fp32_matches_onnxruntime(exported):
    name, path, feed, want = exported
    model = lpx_tvm.compile_model(str(path), preset="tsp", precision="fp32")
    got = list(model.run(feed).values())[0]
    tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert model.report["offload"]["cpu"] == {}, model.report["offload"]


def test_fp16_within_relative_l2(exported):
    name, path, feed, want = exported
    model = lpx_tvm.compile_model(str(path), preset="tsp", precision="fp16")
    got = list(model.run(feed).values())[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2

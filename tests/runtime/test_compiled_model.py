"""A compiled model's report: layers by ONNX node name, the same in every build and after
an artifact round trip, their cycles adding up to the model's."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm
from lpx_tvm.runtime.report import IDLE

NODES = ("stem_conv", "stem_relu", "pool", "flatten", "head")


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="stem_conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="stem_relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="pool"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "named", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[w, fc])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(6).standard_normal((1, 3, 8, 8)).astype(np.float32)


def _layers(model, x):
    model.run({"x": x})
    rep = model.report
    assert sum(layer.cycles for layer in rep.layers) == rep.cycles > 0
    return [(layer.name, layer.cycles) for layer in rep.layers]


def test_layers_are_named_by_onnx_node_in_every_build(x):
    first = _layers(lpx_tvm.compile_model(_model(), preset="mini", precision="fp32"), x)
    second = _layers(lpx_tvm.compile_model(_model(), preset="mini", precision="fp32"), x)
    assert first == second  # region names differ between builds; layer names do not
    names = [name for name, _ in first]
    assert names[0] == "stem_conv"  # conv + relu fused: the layer takes its first node's name
    assert "head" in names and set(names) <= set(NODES) | {IDLE}


def test_artifact_keeps_the_report(x, tmp_path):
    model = lpx_tvm.compile_model(_model(), preset="mini", precision="fp32")
    want = _layers(model, x)
    model.save(tmp_path / "art")
    loaded = lpx_tvm.load(tmp_path / "art")
    assert _layers(loaded, x) == want
    a, b = model.report.to_json(), loaded.report.to_json()
    for wall in ("sim_wall_s", "cpu_wall_s"):
        a.pop(wall), b.pop(wall)
    assert a == b
    assert loaded.executable.offload.lpx == model.executable.offload.lpx


def test_torch_layers_are_named_by_module_path():
    """A torch model's layers take the path of the module that ran them; a convolution
    whose weights absorbed a BatchNorm keeps its own name."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))

    torch.manual_seed(0)
    module = nn.Sequential(Block()).eval()
    module[0].bn.running_mean.uniform_(-1, 1)
    module[0].bn.running_var.uniform_(0.5, 2)
    xt = torch.randn(1, 3, 8, 8)
    model = lpx_tvm.from_torch(module, (xt,), preset="mini", precision="fp32")
    got = list(model.run([xt.numpy()]).values())[0]
    np.testing.assert_allclose(got, module(xt).detach().numpy(), rtol=1e-4, atol=1e-4)
    rep = model.report
    names = [layer.name for layer in rep.layers]
    assert sum(layer.cycles for layer in rep.layers) == rep.cycles
    assert names[0] == "0.conv" and "0.fc" in names and "0:mean" in names, names


def test_structurally_equal_layers_keep_their_own_names():
    """Fusion keeps one function for equal composites (both tanh here); each call still
    reports its own module, as it did before fusion."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh()).eval()
    xt = torch.randn(4, 8)
    model = lpx_tvm.from_torch(module, (xt,), preset="mini", precision="fp32")
    got = list(model.run([xt.numpy()]).values())[0]
    np.testing.assert_allclose(got, module(xt).detach().numpy(), rtol=1e-4, atol=1e-4)
    names = [layer.name for layer in model.report.layers]
    assert {"0", "1", "2", "3"} <= set(names), names
    assert not any("region" in n for n in names), names

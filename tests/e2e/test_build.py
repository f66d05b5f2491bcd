"""End to end: small ONNX graphs through import, partition, TensorIR tiles, codegen and the
simulator, against onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm.testing
from tvm.script import relax as R
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm
from lpx_tvm.runtime.compiled_model import InputError
from relax_modules import Attention

RNG = np.random.default_rng(0)


def _const(name, shape, scale=0.3):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _bn(prefix, c):
    return [_const(f"{prefix}_s", (c,)), _const(f"{prefix}_b", (c,)), _const(f"{prefix}_m", (c,)),
            numpy_helper.from_array((RNG.random(c) + 0.5).astype(np.float32), f"{prefix}_v")]


def small_cnn(c=8, hw=12) -> onnx.ModelProto:
    """Conv-BN-ReLU, max pool, strided 1x1 conv, residual add, depthwise conv + ReLU6,
    global average pool, flatten, Gemm: the shapes of a tiny ResNet/MobileNet."""
    inits = [_const("w1", (c, 3, 3, 3)), _const("b1", (c,)), *_bn("bn1", c),
             _const("w2", (c, c, 1, 1)), _const("w3", (c, 1, 3, 3)), _const("fc_w", (5, c)), _const("fc_b", (5,)),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn1_s", "bn1_b", "bn1_m", "bn1_v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "p1"], ["a2"]),
        helper.make_node("Conv", ["a2", "w3"], ["c3"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1),
    ]
    graph = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.fixture(scope="module")
def cnn():
    model = small_cnn()
    x = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)
    return model, x, _ort(model, {"x": x})[0]


def test_small_cnn_fp32_matches_onnxruntime(cnn):
    model, x, want = cnn
    m = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    got = m.run({"x": x})["y"]
    tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    rep = m.report
    assert rep["cycles"] > 0 and rep["macs"] > 0
    assert rep["latency_s"] == pytest.approx(rep["cycles"] / 900e6)
    assert rep["offload"]["cpu"] == {}  # every op of this graph runs on LPX
    assert rep["offload"]["lpx"]["nn.conv2d"] == 3


def test_small_cnn_fp16_within_relative_l2(cnn):
    model, x, want = cnn
    got = lpx_tvm.compile_model(model, preset="mini", precision="fp16").run({"x": x})["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


def test_tsp_preset(cnn):
    model, x, want = cnn
    got = lpx_tvm.compile_model(model, preset="tsp", precision="fp32").run({"x": x})["y"]
    tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_unsupported_op_falls_back_to_cpu():
    w = _const("w", (6, 4))
    # The VXM has no cosine: Cos stays on the CPU.
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Cos", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "mm_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((2, 3, 6)).astype(np.float32)
    m = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    tvm.testing.assert_allclose(m.run({"x": x})["y"], _ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    rep = m.report
    assert rep["offload"]["lpx"].get("matmul") == 1
    assert rep["offload"]["cpu"].get("cos") == 1


def test_bad_inputs_are_named(cnn):
    model, x, _ = cnn
    m = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    with pytest.raises(InputError, match="shape"):
        m.run({"x": x[:, :2]})
    with pytest.raises(InputError, match="unknown"):
        m.run({"x": x, "z": x})


def test_weights_stream_over_the_offchip_path_when_sram_is_short(cnn):
    """With no SRAM budget for resident weights every weight tile comes over the DMA path:
    same numbers, off-chip traffic in the report, and more cycles than resident."""
    from lpx_tvm.target.codegen import codegen_options

    model, x, want = cnn
    resident = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    resident.run({"x": x})
    with codegen_options(weight_budget=0.0):
        streamed = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    tvm.testing.assert_allclose(streamed.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
    rep, base = streamed.report, resident.report
    assert rep["streamed_weight_bytes"] == rep["weight_bytes"] > 0
    assert base["streamed_weight_bytes"] == 0 and base["offchip_bytes"] == 0
    assert rep["offchip_bytes"] >= rep["streamed_weight_bytes"] // 2  # each weight tile loaded at least once
    assert rep["cycles"] > base["cycles"]


@pytest.mark.parametrize("cin, cout, groups, kernel", [
    (6, 4, 2, 3),     # AlexNet-like: groups=2
    (24, 40, 4, 1),   # ShuffleNet-like 1x1 group conv, channels past one mini tile (16 lanes)
    (8, 16, 8, 3),    # depthwise with a channel multiplier of 2
])
def test_grouped_conv_runs_on_lpx(cin, cout, groups, kernel):
    """Grouped convolution runs as a dense convolution with a block-diagonal weight;
    the report counts the useful MACs only."""
    w = _const("w", (cout, cin // groups, kernel, kernel))
    b = _const("b", (cout,))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=groups, pads=[kernel // 2] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 7, 7])],
                              initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((1, cin, 7, 7)).astype(np.float32)
    m = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    tvm.testing.assert_allclose(m.run({"x": x})["y"], _ort(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
    rep = m.report
    assert rep["offload"]["cpu"] == {} and rep["offload"]["lpx"]["nn.conv2d"] == 1
    assert rep["macs"] == 7 * 7 * cout * (cin // groups) * kernel * kernel


def test_shared_regions_count_macs_per_call():
    """Two structurally equal LPX regions (split by a CPU op) share one compiled definition;
    the report still counts the MACs of both calls."""
    w = numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "w")
    # Cos (no VXM cosine) stays on the CPU and splits the graph.
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m1"]), helper.make_node("Cos", ["m1"], ["s"]),
             helper.make_node("MatMul", ["s", "w"], ["m2"]), helper.make_node("Cos", ["m2"], ["y"])]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 4])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((2, 6, 4)).astype(np.float32)
    m = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    tvm.testing.assert_allclose(m.run({"x": x})["y"], _ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert len(m.executable.regions) == 1 and m.executable.stats.region_calls == 2
    assert m.report["macs"] == 2 * 2 * 6 * 4 * 4


def test_region_returns_a_value_and_its_reshape():
    """A region whose outputs are a 4-D value and its flattening (one SRAM tensor, as after
    a global pooling) returns each through its own output, in its own shape."""
    w = _const("w", (5, 4, 1, 1))
    shape = numpy_helper.from_array(np.array([1, 5], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Reshape", ["c", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "two_outputs",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5]),
                               helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 5, 1, 1])],
                              initializer=[w, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((1, 4, 1, 1)).astype(np.float32)
    m = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    got = m.run({"x": x})
    for name, want in zip(["y", "c"], _ort(model, {"x": x})):
        tvm.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)
    assert m.report["offload"]["cpu"] == {}


@tvm.script.ir_module
class _ActivationMatmuls:
    @R.function
    def main(a: R.Tensor((3, 37, 50), "float32"), b: R.Tensor((3, 50, 70), "float32"),
             c: R.Tensor((20, 50), "float32"), d: R.Tensor((50, 9), "float32")):
        with R.dataflow():
            y = R.matmul(a, b)
            z = R.nn.relu(R.matmul(c, d))
            R.output(y, z)
        return (y, z)


@pytest.mark.parametrize("preset, precision, tol", [("mini", "fp32", 1e-5), ("tsp", "fp16", 2e-2)])
def test_activation_times_activation_matmul(preset, precision, tol):
    """A runtime B is installed from its SRAM tensor like a weight matrix, batch by batch."""
    exe = lpx_tvm.build(_ActivationMatmuls, preset=preset, precision=precision)
    assert exe.offload.lpx == {"matmul": 2, "nn.relu": 1} and exe.offload.cpu == {}
    a, b, c, d = (RNG.standard_normal(s).astype(np.float32) for s in [(3, 37, 50), (3, 50, 70), (20, 50), (50, 9)])
    y, z = exe.run([a, b, c, d])
    scale = np.abs(a @ b).max()
    assert np.abs(y - a @ b).max() <= tol * scale
    assert np.abs(z - np.maximum(c @ d, 0)).max() <= tol * scale
    assert exe.stats.useful_macs == 3 * 37 * 50 * 70 + 20 * 50 * 9


@pytest.mark.parametrize("preset", ["mini", "tsp"])
def test_attention_block_runs_on_lpx(preset):
    """softmax(Q K^T) V: the SXM transposes K, both matmuls install activations."""
    exe = lpx_tvm.build(Attention, preset=preset, precision="fp32")
    assert exe.offload.cpu == {} and exe.offload.lpx == {"matmul": 2, "nn.softmax": 1, "permute_dims": 1}
    q, k, v = (RNG.standard_normal((2, 40, 24)).astype(np.float32) for _ in range(3))
    (o,) = exe.run([q, k, v])
    s = q @ k.transpose(0, 2, 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    tvm.testing.assert_allclose(o, (e / e.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-5)


def _masked_softmax(fill: float) -> onnx.ModelProto:
    s = 12
    inits = [numpy_helper.from_array(np.tril(np.ones((s, s), bool)), "m"),
             numpy_helper.from_array(np.array(fill, np.float32), "fill")]
    nodes = [helper.make_node("Where", ["m", "x", "fill"], ["w"]), helper.make_node("Softmax", ["w"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "masked_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, s, s])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, s, s])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_constant_attention_mask_becomes_an_add_on_lpx():
    """where(causal mask, scores, -inf) runs as scores + constant; a finite fill stays a
    select (on the CPU), since adding it would not give the fill exactly."""
    x = RNG.standard_normal((2, 12, 12)).astype(np.float32)
    model = _masked_softmax(-np.inf)
    m = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    assert m.report["offload"]["cpu"] == {} and m.report["offload"]["lpx"] == {"add": 1, "nn.softmax": 1}
    tvm.testing.assert_allclose(m.run({"x": x})["y"], _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    finite = _masked_softmax(-1e9)
    m = lpx_tvm.compile_model(finite, preset="mini", precision="fp32")
    assert m.report["offload"]["cpu"] == {"where": 1}
    tvm.testing.assert_allclose(m.run({"x": x})["y"], _ort(finite, {"x": x})[0], rtol=1e-5, atol=1e-6)

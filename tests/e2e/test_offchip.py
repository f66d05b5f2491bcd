"""Regions whose activations do not fit the SRAM keep them off chip and run by bands,
against onnxruntime; and the same model where it fits runs from SRAM alone."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relax_modules import Attention

import lpx_tvm
from lpx_tvm.target.codegen import codegen_options

RNG = np.random.default_rng(3)


def _const(name, *shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.2).astype(np.float32), name)


def wide_cnn(hw: int = 96) -> onnx.ModelProto:
    """Every op kind a band plan distinguishes: padded and strided windows (conv, max and
    average pool with uncounted padding), a depthwise conv, a residual add, a channel
    concat, a global average pool bigger than a band, and a matmul."""
    inits = [_const("w1", 32, 16, 3, 3), _const("b1", 32), _const("w2", 32, 32, 3, 3), _const("b2", 32),
             _const("w3", 24, 32, 1, 1), _const("dw", 32, 1, 3, 3), _const("fc", 56, 10), _const("fcb", 10)]
    h = hw // 2
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "p1"], ["a1"]),
        helper.make_node("Conv", ["a1", "dw"], ["d1"], pads=[1, 1, 1, 1], group=32),
        helper.make_node("AveragePool", ["d1"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["ap", "w3"], ["c3"]),
        helper.make_node("Sigmoid", ["c3"], ["s3"]),
        helper.make_node("Concat", ["s3", "a1"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["mm"]),
        helper.make_node("Add", ["mm", "fcb"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "wide_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [1, 16, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10]),
                               helper.make_tensor_value_info("cat", TensorProto.FLOAT, [1, 56, h, h])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model():
    return wide_cnn()


@pytest.fixture(scope="module")
def expected(model):
    x = RNG.standard_normal((1, 16, 96, 96)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return x, dict(zip(["y", "cat"], sess.run(None, {"x": x})))


def test_offchip_region_matches_onnxruntime(model, expected):
    # 1x32x96x96 in fp32 is 1.1 MiB: more than mini's whole SRAM.
    x, want = expected
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    assert compiled.report["offload"]["cpu"] == {}
    got = compiled.run({"x": x})
    for name in ("y", "cat"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    rep = compiled.report
    # Every activation crossed the off-chip path: at least the input, the outputs and
    # the first convolution's output went out and back.
    assert rep["offchip_bytes"] >= (2 * 32 * 96 * 96 + 16 * 96 * 96) * 4
    assert rep["macs"] > 0 and 0 < rep["mxm_utilization"] <= 1


def test_same_model_fits_tsp_without_spilling(model, expected):
    x, want = expected
    compiled = lpx_tvm.compile_model(model, preset="tsp", precision="fp32")
    got = compiled.run({"x": x})
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-4)
    assert compiled.report["offchip_bytes"] == 0


def test_attention_block_off_chip():
    """Compiled as if its activations overflowed the SRAM: the transpose and the
    activation x activation matmuls run as one band each (their result rows do not map
    to their inputs' rows), the softmax by row bands."""
    with codegen_options(force_offchip=True):
        exe = lpx_tvm.build(Attention, preset="mini", precision="fp32")
    q, k, v = (RNG.standard_normal((2, 40, 24)).astype(np.float32) for _ in range(3))
    (o,) = exe.run([q, k, v])
    s = q @ k.transpose(0, 2, 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(o, (e / e.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-5)
    assert exe.stats.offchip_bytes > 0

"""lpx_tvm.light_models: seeded random weights for onnx's bundled light models, their
logits exposed, and the tolerances of a comparison with onnxruntime (onnxruntime runs
only; the compiled models are in tests/e2e/test_light_models.py)."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lpx_tvm.light_models import compare_outputs, expose_logits, with_random_weights

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _run(model, x) -> dict:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {sess.get_inputs()[0].name: x})))


@pytest.fixture(scope="module")
def resnet50():
    return onnx.load(os.path.join(LIGHT, "light_resnet50.onnx"))


def test_the_graph_keeps_its_ops_and_shapes(resnet50):
    model = with_random_weights(resnet50, seed=0)
    onnx.checker.check_model(model)
    made = {n.output[0]: n for n in resnet50.graph.node if n.op_type == "ConstantOfShape"}
    assert len(made) == 239
    assert [n for n in model.graph.node] == [n for n in resnet50.graph.node if n.op_type != "ConstantOfShape"]
    before = {i.name: numpy_helper.to_array(i) for i in resnet50.graph.initializer}
    after = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for name, node in made.items():  # each constant: an initializer of the shape it had
        assert after[name].shape == tuple(before[node.input[0]]) and after[name].dtype == np.float32
        assert np.unique(after[name]).size > 1
    for name, value in before.items():  # the graph's own values stay (the shape vectors go)
        assert name in made or name in {n.input[0] for n in made.values()} or np.array_equal(after[name], value)
    # IR version 3: every initializer is also a graph input.
    assert {i.name for i in model.graph.initializer} <= {i.name for i in model.graph.input}


def test_the_values_are_seeded():
    squeezenet = onnx.load(os.path.join(LIGHT, "light_squeezenet.onnx"))
    weights = [with_random_weights(squeezenet, seed=s).graph.initializer for s in (0, 0, 1)]
    raw = [{i.name: i.raw_data for i in w} for w in weights]
    assert raw[0] == raw[1] and raw[0] != raw[2]


def test_the_bundled_weights_hide_the_answer_and_random_ones_show_it(resnet50):
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((1, 3, 224, 224)).astype(np.float32) for _ in range(2)]
    bundled = onnx.ModelProto()
    bundled.CopyFrom(resnet50)
    logits = expose_logits(bundled)
    random = with_random_weights(resnet50, seed=0)
    assert expose_logits(random) == logits == "r174"
    constant = [_run(bundled, x) for x in inputs]
    outs = [_run(random, x) for x in inputs]
    # The bundled model: the softmax of 1,000 equal logits, whatever the input.
    for out in constant:
        assert np.ptp(out[logits]) == 0 and np.allclose(out["gpu_0/softmax_1"], 1e-3)
    # Random weights: logits a few units apart, in the range of fp16 and bf16, and another
    # input is another answer, which the comparison refuses.
    for out in outs:
        assert 2 < np.std(out[logits]) and np.abs(out[logits]).max() < 1e3
    wrong = compare_outputs(outs[1], outs[0], "bf16", logits)
    assert all(e > t for e, t in wrong.values()), wrong
    # The bundled model's softmax, the one output the demo used to compare, is the same
    # for both inputs: that check passed any answer.
    softmax = "gpu_0/softmax_1"
    assert compare_outputs({softmax: constant[1][softmax]}, {softmax: constant[0][softmax]}, "fp32")[softmax][0] < 1e-6


def _graph(nodes, inits, x_shape, y_shape, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _constant(name, shape):
    """A ConstantOfShape node of value 0.02 and its shape initializer, as the light models make weights."""
    return (helper.make_node("ConstantOfShape", [f"{name}_shape"], [name],
                             value=numpy_helper.from_array(np.array([0.02], np.float32))),
            numpy_helper.from_array(np.array(shape, np.int64), f"{name}_shape"))


def test_weights_take_he_scaling_by_fan_in():
    # A 3x3 convolution of 4 channels (fan-in 36) and a Gemm with transB (fan-in 512).
    consts = [_constant("w", (8, 4, 3, 3)), _constant("b", (8,)), _constant("g", (10, 512))]
    nodes = [c for c, _ in consts] + [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "flat"], ["f"]),
        helper.make_node("Gemm", ["f", "g"], ["y"], transB=1),
    ]
    inits = [i for _, i in consts] + [numpy_helper.from_array(np.array([1, 512], np.int64), "flat")]
    model = with_random_weights(_graph(nodes, inits, [1, 4, 8, 8], [1, 10]), seed=0)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for name, fan_in in (("w", 36), ("g", 512)):  # uniform in +-sqrt(6 / fan-in): variance 2 / fan-in
        bound = np.sqrt(6 / fan_in)
        assert np.abs(values[name]).max() <= bound
        assert np.std(values[name]) == pytest.approx(np.sqrt(2 / fan_in), rel=0.15)
    assert 0.5 <= values["b"].min() and values["b"].max() < 1.5  # a bias: uniform in [0.5, 1.5)


def test_each_normalization_takes_its_input_statistics():
    # Conv -> BatchNormalization with every parameter a constant: the mean and variance
    # become those of the convolution's output, so the normalization normalizes
    # (per channel: mean the bias, deviation the scale) for any standard-normal input.
    consts = [_constant(n, s) for n, s in (("w", (6, 3, 3, 3)), ("s", (6,)), ("b", (6,)), ("m", (6,)), ("v", (6,)))]
    nodes = [c for c, _ in consts] + [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                                      helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])]
    model = with_random_weights(_graph(nodes, [i for _, i in consts], [1, 3, 64, 64], [1, 6, 64, 64], 9), seed=0)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    y = _run(model, np.random.default_rng(7).standard_normal((1, 3, 64, 64)).astype(np.float32))["y"]
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), values["b"], atol=0.1)
    np.testing.assert_allclose(y.std(axis=(0, 2, 3)), values["s"], rtol=0.1)


def test_expose_logits():
    w = numpy_helper.from_array(np.ones((6, 4), np.float32), "w")
    softmax = _graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])],
                     [w], [3, 6], [3, 4])
    assert expose_logits(softmax) == "m"
    assert [o.name for o in softmax.graph.output] == ["y", "m"]
    assert [d.dim_value for d in softmax.graph.output[1].type.tensor_type.shape.dim] == [3, 4]
    relu = _graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                  [w], [3, 6], [3, 4])
    assert expose_logits(relu) is None and len(relu.graph.output) == 1


def test_compare_outputs_tolerances():
    want = {"p": np.array([[0.1, 0.9]]), "z": np.array([[0.0, 4.0]])}
    got = {"p": want["p"] * 1.001, "z": want["z"] * 1.001}
    errs = compare_outputs(got, want, "fp32")
    assert errs["p"] == (pytest.approx(1e-3), 1e-4) and errs["z"] == (pytest.approx(1e-3), 1e-4)
    assert compare_outputs(got, want, "bf16")["z"] == (pytest.approx(1e-3), 2e-2)
    # The softmax (the first output) of logits 0 and 4 (standard deviation 2): twice the tolerance.
    errs = compare_outputs(got, want, "fp16", logits="z")
    assert errs["p"][1] == pytest.approx(4e-2) and errs["z"][1] == 2e-2

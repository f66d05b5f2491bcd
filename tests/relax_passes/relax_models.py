"""Small ONNX graphs built in memory, and a reference runner, for the relax_passes tests."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

OPSET = 17


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def make_model(nodes, inputs, outputs, initializers=(), name="g"):
    """A checked ModelProto; ``inputs``/``outputs`` are (name, elem_type, shape) triples."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


def _bn_params(prefix, channels, rng):
    """Random BatchNormalization statistics: folding bugs hide behind identity stats."""
    return [
        _init(f"{prefix}_scale", rng.uniform(0.5, 1.5, channels).astype(np.float32)),
        _init(f"{prefix}_shift", rng.standard_normal(channels).astype(np.float32)),
        _init(f"{prefix}_mean", rng.standard_normal(channels).astype(np.float32)),
        _init(f"{prefix}_var", rng.uniform(0.5, 2.0, channels).astype(np.float32)),
    ]


def _bn(prefix, x, y):
    names = [f"{prefix}_{k}" for k in ("scale", "shift", "mean", "var")]
    return helper.make_node("BatchNormalization", [x, *names], [y], epsilon=1e-3)


def convnet(seed=0):
    """Conv+bias -> BatchNorm -> Relu -> Clip(0, 6) -> a residual Conv and Sum -> Dropout ->
    MaxPool -> GlobalAveragePool -> Flatten -> Gemm(transB) -> Softmax, on 1x3x8x8."""
    rng = np.random.default_rng(seed)
    c, classes = 4, 5
    inits = [
        _init("W", rng.standard_normal((c, 3, 3, 3)).astype(np.float32)),
        _init("B", rng.standard_normal(c).astype(np.float32)),
        *_bn_params("bn", c, rng),
        _init("W2", rng.standard_normal((c, c, 1, 1)).astype(np.float32)),
        _init("G", rng.standard_normal((classes, c)).astype(np.float32)),
        _init("gb", rng.standard_normal(classes).astype(np.float32)),
        _init("lo", np.array(0.0, np.float32)),
        _init("hi", np.array(6.0, np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["conv"], pads=[1, 1, 1, 1]),
        _bn("bn", "conv", "bn"),
        helper.make_node("Relu", ["bn"], ["relu"]),
        helper.make_node("Clip", ["relu", "lo", "hi"], ["clip"]),
        helper.make_node("Conv", ["clip", "W2"], ["conv2"]),
        helper.make_node("Sum", ["conv2", "clip"], ["res"]),
        helper.make_node("Dropout", ["res"], ["drop"]),
        helper.make_node("MaxPool", ["drop"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["pool"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "G", "gb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"]),
    ]
    return make_model(
        nodes,
        [("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [("probs", TensorProto.FLOAT, [1, classes])],
        inits,
        "convnet",
    )


def depthwise_net(seed=1):
    """A BatchNorm on the input (no conv to fold into), a depthwise Conv (no bias) ->
    BatchNorm -> Relu, then MatMul -> Mul -> Add -> Sub with per-column constants (a
    dense layer followed by an affine epilogue)."""
    rng = np.random.default_rng(seed)
    c, n = 4, 6
    inits = [
        *_bn_params("bn0", c, rng),
        _init("Wd", rng.standard_normal((c, 1, 3, 3)).astype(np.float32)),
        *_bn_params("bn", c, rng),
        _init("M", rng.standard_normal((c * 4 * 4, n)).astype(np.float32)),
        _init("ms", rng.uniform(0.5, 1.5, (1, n)).astype(np.float32)),
        _init("ma", rng.standard_normal(n).astype(np.float32)),
        _init("mb", rng.standard_normal(n).astype(np.float32)),
        _init("shape", np.array([1, -1], np.int64)),
    ]
    nodes = [
        _bn("bn0", "x", "xn"),
        helper.make_node("Conv", ["xn", "Wd"], ["dw"], group=c, pads=[1, 1, 1, 1]),
        _bn("bn", "dw", "bn"),
        helper.make_node("Relu", ["bn"], ["relu"]),
        helper.make_node("Reshape", ["relu", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "M"], ["mm"]),
        helper.make_node("Mul", ["mm", "ms"], ["scaled"]),
        helper.make_node("Add", ["ma", "scaled"], ["shifted"]),
        helper.make_node("Sub", ["shifted", "mb"], ["y"]),
    ]
    return make_model(
        nodes,
        [("x", TensorProto.FLOAT, [1, c, 4, 4])],
        [("y", TensorProto.FLOAT, [1, n])],
        inits,
        "depthwise_net",
    )


def rejects_net():
    """A conv with a runtime weight, an int64 Add and a Softmax over channels: none can run
    on LPX."""
    inits = [
        _init("k", np.arange(6, dtype=np.int64).reshape(1, 6)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "Wr"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("Softmax", ["relu"], ["probs"], axis=1),
        helper.make_node("Add", ["i", "k"], ["j"]),
    ]
    return make_model(
        nodes,
        [("x", TensorProto.FLOAT, [1, 4, 6, 6]), ("Wr", TensorProto.FLOAT, [4, 4, 3, 3]),
         ("i", TensorProto.INT64, [2, 6])],
        [("probs", TensorProto.FLOAT, [1, 4, 6, 6]), ("j", TensorProto.INT64, [2, 6])],
        inits,
        "rejects_net",
    )


def random_inputs(imported, seed=3):
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal(shape).astype(dtype) for name, shape, dtype in imported.inputs
    }


def run_onnxruntime(model, inputs):
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, inputs)


def run_tvm(mod, imported, inputs):
    """Build ``mod`` for llvm and run ``main`` on the named inputs; outputs as a list."""
    executable = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [tvm.runtime.tensor(inputs[name]) for name, _, _ in imported.inputs]
    result = vm["main"](*args)
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    return [r.numpy() for r in result]


def op_names(func) -> list:
    """Relax op names called anywhere in ``func`` (with repeats), without ``relax.``."""
    names = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.append(expr.op.name.removeprefix("relax."))

    relax.analysis.post_order_visit(func, visit)
    return names

"""The ImageNet models bundled with onnx (``onnx/backend/test/data/light``) made checkable.

The light models make every weight with a ``ConstantOfShape`` node of value 0.02. All
1,000 logits of such a network are equal, its softmax is 0.001 whatever the input, and a
wrong answer (a flipped kernel, swapped channels, a dropped layer) gives the same
numbers. :func:`with_random_weights` replaces those constants by seeded random values of
the same shapes, :func:`expose_logits` adds the softmax input as a graph output, and
:func:`compare_outputs` holds outputs and logits to tolerances a wrong answer fails: so a
comparison with onnxruntime sees the network itself.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .precision import Precision

# Ops that only reshape a constant on its way to the op using it.
_RESHAPES = ("Reshape", "Unsqueeze", "Squeeze", "Flatten")


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of ``model`` whose ``ConstantOfShape`` constants are seeded random initializers
    of the same shapes; the rest of the graph (every op, shape and initializer already
    there) is unchanged, so its compiled workloads, and a tuning log made for it, are too.

    - The weight of a Conv or Gemm (through reshapes): uniform of variance 2 / fan-in
      (He's), so each layer keeps the scale of its input.
    - The mean and variance of a BatchNormalization: the statistics of its input over a
      seeded standard-normal input (one onnxruntime run), as a trained network's are of
      its data. Random ones do not normalize, and residual sums then grow layer by
      layer (ResNet-50's logits reach 1e5, past fp16).
    - Every other constant (biases, scales): uniform in [0.5, 1.5).

    Activations stay of order 1 to 100 and the logits differ clearly from one another.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = _initializers(graph)
    made = [n for n in graph.node if n.op_type == "ConstantOfShape" and n.input[0] in inits]
    if not made:
        return out
    shapes = _tensor_shapes(out)
    consumers = _consumers(graph)
    rng = np.random.default_rng(seed)
    values = {}
    for node in made:
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
        op, index, used_shape = _final_use(node.output[0], consumers, shapes)
        if op is not None and index == 1 and op.op_type in ("Conv", "Gemm"):
            bound = np.sqrt(6 / _fan_in(op, used_shape))  # uniform of variance 2 / fan-in
            value = rng.random(shape, dtype=np.float32)
            value *= np.float32(2 * bound)
            value -= np.float32(bound)
        else:
            value = rng.random(shape, dtype=np.float32)
            value += np.float32(0.5)
        values[node.output[0]] = value
    _replace_constants(out, made, values)
    normalizations = [n for n in graph.node if n.op_type == "BatchNormalization"
                      and n.input[3] in values and n.input[4] in values]
    if normalizations:
        _set_initializers(graph, _measured_statistics(out, normalizations, shapes, rng))
    return out


def expose_logits(model: onnx.ModelProto) -> "str | None":
    """Add the input of the final Softmax of ``model`` as a graph output (in place); its
    name, or None when the first output is not a Softmax's."""
    if not model.graph.output:
        return None
    out = model.graph.output[0].name
    last = next((n for n in model.graph.node if out in n.output), None)
    if last is None or last.op_type != "Softmax":
        return None
    inferred = shape_inference.infer_shapes(model)
    info = next((v for v in inferred.graph.value_info if v.name == last.input[0]), None)
    if info is None:  # its shape is not known before the model runs
        return None
    model.graph.output.append(info)
    return last.input[0]


def compare_outputs(got: dict, want: dict, precision: str, logits: "str | None" = None) -> dict:
    """{output name: (relative L2 error of ``got`` against ``want``, its tolerance)}.

    The tolerance is 1e-4 in fp32 and 2e-2 in fp16 and bf16 (ten of bf16's rounding
    steps). A softmax turns an absolute error d of its input into a relative error of
    about d on its output, so the softmax of ``logits`` (the first output, when
    ``logits`` names one) is held to the tolerance times the logits' spread (their
    standard deviation over the classes, per batch row): the logits carry the tight
    check. One 3x3 kernel flipped in a block of ResNet-50 with random weights moves its
    logits by 3.6% to 7.3%; bf16 rounding moves them by 0.6%.
    """
    tolerance = 1e-4 if Precision.parse(precision) == Precision.FP32 else 2e-2
    out = {}
    for name, value in got.items():
        ref = np.asarray(want[name], np.float64)
        err = float(np.linalg.norm(np.asarray(value, np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))
        out[name] = (err, tolerance)
    if logits is not None:
        first = next(iter(got))
        classes = np.asarray(want[logits], np.float64)
        classes = classes.reshape(len(classes), -1)  # (batch, classes): SqueezeNet's are (1, 1000, 1, 1)
        spread = float(np.sqrt(np.mean(np.var(classes, axis=1))))
        out[first] = (out[first][0], tolerance * max(spread, 1.0))
    return out


def _initializers(graph) -> dict:
    return {i.name: i for i in graph.initializer}


def _consumers(graph) -> dict:
    """{tensor name: [(node, input index), ...]}."""
    uses = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            uses.setdefault(name, []).append((node, k))
    return uses


def _tensor_shapes(model) -> dict:
    inferred = shape_inference.infer_shapes(model).graph
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*inferred.value_info, *inferred.input, *inferred.output)}


def _final_use(name, consumers, shapes) -> tuple:
    """(node, input index, shape there) of the one op that uses constant ``name``, past
    the reshapes on the way; (None, None, None) when it has several users."""
    while True:
        uses = consumers.get(name, [])
        if len(uses) != 1:
            return None, None, None
        node, k = uses[0]
        if node.op_type in _RESHAPES and k == 0:
            name = node.output[0]
            continue
        return node, k, shapes.get(name)


def _fan_in(op, weight_shape) -> int:
    if op.op_type == "Conv":  # (out channels, in channels / groups, kh, kw)
        return int(np.prod(weight_shape[1:]))
    trans_b = next((a.i for a in op.attribute if a.name == "transB"), 0)
    return int(weight_shape[1] if trans_b else weight_shape[0])


def _replace_constants(model, nodes, values) -> None:
    """Drop ``nodes`` and their shape initializers; their outputs become ``values``."""
    graph = model.graph
    drop = {n.output[0] for n in nodes}
    kept = [n for n in graph.node if n.output[0] not in drop]
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for n in kept for name in n.input}
    shape_inits = {n.input[0] for n in nodes} - used
    _remove_initializers(graph, shape_inits)
    _add_initializers(model, values)


def _remove_initializers(graph, names) -> None:
    kept = [i for i in graph.initializer if i.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    # IR version 3 lists every initializer among the graph inputs as well.
    inputs = [i for i in graph.input if i.name not in names]
    del graph.input[:]
    graph.input.extend(inputs)


def _add_initializers(model, values) -> None:
    graph = model.graph
    for name, value in values.items():  # in place: VGG-19's 140 M weights are copied once
        init = graph.initializer.add()
        init.name, init.data_type = name, onnx.TensorProto.FLOAT
        init.dims.extend(value.shape)
        init.raw_data = np.ascontiguousarray(value, "<f4").tobytes()
    if model.ir_version < 4:  # initializers must also be graph inputs
        graph.input.extend(helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape)
                           for k, v in values.items())


def _set_initializers(graph, values) -> None:
    for init in graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))


def _measured_statistics(model, normalizations, shapes, rng) -> dict:
    """{mean or variance name: array}: each normalization's input statistics (per channel,
    over batch and space) on a seeded standard-normal input, every earlier normalization
    already using its own. One onnxruntime run of a copy of the graph whose
    normalizations compute their statistics."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    graph = probe.graph
    targets = {n.output[0] for n in normalizations}
    nodes, outputs, names = [], [], []
    for node in graph.node:
        if node.output[0] not in targets:
            nodes.append(node)
            continue
        x = node.input[0]
        axes = [0, *range(2, len(shapes[x]))]
        centre, diff, square, mean, var = (f"{x}/stat_{s}" for s in ("centre", "diff", "square", "mean", "var"))
        nodes += [helper.make_node("ReduceMean", [x], [centre], axes=axes, keepdims=1),
                  helper.make_node("Sub", [x, centre], [diff]),
                  helper.make_node("Mul", [diff, diff], [square]),
                  helper.make_node("ReduceMean", [x], [mean], axes=axes, keepdims=0),
                  helper.make_node("ReduceMean", [square], [var], axes=axes, keepdims=0)]
        measured = onnx.NodeProto()
        measured.CopyFrom(node)
        measured.input[3], measured.input[4] = mean, var
        nodes.append(measured)
        outputs += [mean, var]
        names += [node.input[3], node.input[4]]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.output[:]
    graph.output.extend(helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs)
    inits = set(_initializers(graph))
    feeds = {}
    for inp in graph.input:
        if inp.name not in inits:
            dims = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
            feeds[inp.name] = rng.standard_normal(dims).astype(np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # its notes on unused initializers are not ours to print
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(outputs, feeds)))

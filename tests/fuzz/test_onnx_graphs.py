"""The fuzz generator: graphs are reproducible, valid, and cover what docs/fuzz.md promises;
the runner's comparison and classification catch wrong answers and errors."""

import collections

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import fuzz_runner
import onnx_graphs

N = 40  # graphs per family inspected for coverage (generating them takes about a second)


def _graphs(family):
    return [onnx_graphs.graph(family, i, 0) for i in range(N)]


def _ops(models):
    return collections.Counter(n.op_type for m in models for n in m.graph.node)


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _nodes(models, op):
    return [(m, n) for m in models for n in m.graph.node if n.op_type == op]


def _shape(model, name):
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return inits[name].shape if name in inits else None


@pytest.mark.parametrize("family", onnx_graphs.FAMILIES)
def test_graph_is_a_function_of_family_index_and_seed(family):
    a = onnx_graphs.graph(family, 7, 3).SerializeToString()
    assert onnx_graphs.graph(family, 7, 3).SerializeToString() == a
    assert onnx_graphs.graph(family, 8, 3).SerializeToString() != a
    assert onnx_graphs.graph(family, 7, 4).SerializeToString() != a
    c1, c2 = onnx_graphs.case(family, 7, 3), onnx_graphs.case(family, 7, 3)
    for name in c1.inputs:
        np.testing.assert_array_equal(c1.inputs[name], c2.inputs[name])


@pytest.mark.parametrize("family", onnx_graphs.FAMILIES)
def test_weights_are_random_not_constant(family):
    # The bundled light models have one value per weight, which hides layout bugs.
    tensors = [numpy_helper.to_array(i) for m in _graphs(family)[:10] for i in m.graph.initializer]
    weights = [w for w in tensors if w.dtype == np.float32 and w.size >= 4]
    assert len(weights) >= 10
    assert all(len(np.unique(w)) > 1 for w in weights)


def test_cnn_family_covers_the_documented_features():
    models = _graphs("cnn")
    ops = _ops(models)
    for op in ("Conv", "BatchNormalization", "Add", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool",
               "Flatten", "Gemm", "Relu", "Clip"):
        assert ops[op] > 0, op
    convs = [n for _, n in _nodes(models, "Conv")]
    pads = [_attr(n, "pads") for n in convs]
    assert any(p[0] != p[2] or p[1] != p[3] for p in pads), "asymmetric pads"
    assert any(max(_attr(n, "strides")) > 1 for n in convs)
    assert any(max(_attr(n, "dilations")) > 1 for n in convs)
    groups = [(m, n) for m, n in _nodes(models, "Conv") if _attr(n, "group", 1) > 1]
    depthwise = [n for m, n in groups if _shape(m, n.input[1])[0] == _attr(n, "group")
                 and _shape(m, n.input[1])[1] == 1]
    assert depthwise and len(depthwise) < len(groups), "depthwise and other grouped convolutions"
    assert {tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim)[0] for m in models} == {1, 2}
    sizes = [d.dim_value for m in models for d in m.graph.input[0].type.tensor_type.shape.dim[2:]]
    assert all(s % 2 for s in sizes), "odd image sizes"
    assert any(_attr(n, "count_include_pad") == 0 for _, n in _nodes(models, "AveragePool"))
    # BatchNormalization's statistics are random, not 0 and 1
    for m, n in _nodes(models, "BatchNormalization")[:5]:
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        mean, var = inits[n.input[3]], inits[n.input[4]]
        assert np.std(mean) > 0 or mean.size == 1
        assert np.all(var > 0) and not np.all(var == 1)


def test_transformer_family_covers_the_documented_features():
    models = _graphs("transformer")
    ops = _ops(models)
    for op in ("LayerNormalization", "MatMul", "Softmax", "Reshape", "Transpose", "Split", "Where", "Erf", "Pow",
               "Gelu"):
        assert ops[op] > 0, op
    seqs = {m.graph.input[0].type.tensor_type.shape.dim[1].dim_value for m in models}
    assert all(s % 2 for s in seqs) and len(seqs) > 5
    # the head count is the third dim of each head split's Reshape (1, s, h, d)
    heads = {int(numpy_helper.to_array(i)[2]) for m in models for n in m.graph.node if n.op_type == "Reshape"
             for i in m.graph.initializer if i.name == n.input[1] and numpy_helper.to_array(i).size == 4}
    assert heads == {1, 2, 3, 4}
    perms = {tuple(_attr(n, "perm")) for _, n in _nodes(models, "Transpose")}
    assert {(0, 2, 1, 3), (0, 2, 3, 1), (0, 1, 3, 2)} <= perms
    # causal masks: an upper-triangular constant added to, or selected into, the scores
    masks = [numpy_helper.to_array(i) for m in models for i in m.graph.initializer if i.name.startswith("causal")]
    assert masks
    for mask in masks:
        s = mask.shape[-1]
        upper = np.triu(np.ones((s, s), bool), 1)
        blocked = mask[(0,) * (mask.ndim - 2)] if mask.dtype == bool else mask[(0,) * (mask.ndim - 2)] < -1e8
        np.testing.assert_array_equal(blocked, upper)


def test_elementwise_family_covers_the_broadcasts():
    models = _graphs("elementwise")
    ops = _ops(models)
    for op in ("Add", "Sub", "Mul", "Relu", "Sigmoid", "Tanh", "Clip", "Erf", "Where"):
        assert ops[op] > 0, op
    kinds = collections.Counter()
    for m in models:
        full = tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim)
        for _, n in _nodes([m], "Add") + _nodes([m], "Sub") + _nodes([m], "Mul"):
            for name in n.input:
                shape = _shape(m, name)
                if shape is None:
                    continue
                size = int(np.prod(shape))
                kinds["scalar" if size == 1 else "full" if shape == full else "channel" if
                      (len(full) == 4 and size == full[1]) else "last" if size == full[-1] else "other"] += 1
    assert kinds["scalar"] and kinds["channel"] and kinds["full"] and kinds["last"]
    assert {len(m.graph.input[0].type.tensor_type.shape.dim) for m in models} == {2, 3, 4}


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="unknown family"):
        onnx_graphs.graph("rnn", 0)


def test_compare_catches_a_wrong_answer():
    rng = np.random.default_rng(0)
    want = {"y": rng.standard_normal((2, 7, 5)).astype(np.float32)}
    ok, err = fuzz_runner.compare({"y": want["y"] * (1 + 1e-6)}, want)
    assert ok is None and err == pytest.approx(1e-6, rel=0.1)
    swapped = want["y"].copy()
    swapped[0, 0, [0, 1]] = swapped[0, 0, [1, 0]]  # two elements exchanged: a layout bug
    problem, _ = fuzz_runner.compare({"y": swapped}, want)
    assert problem.startswith("output y (2, 7, 5): relative L2 error") and "at (0, 0, " in problem
    assert "has shape" in fuzz_runner.compare({"y": want["y"][None]}, want)[0]
    assert "missing" in fuzz_runner.compare({"z": want["y"]}, want)[0]
    nan = want["y"].copy()
    nan[1, 2, 3] = np.nan
    assert "at (1, 2, 3)" in fuzz_runner.compare({"y": nan}, want)[0]


def test_runner_reports_a_user_error_in_one_line(tmp_path):
    case = onnx_graphs.case("elementwise", 2, 0)
    wrong = onnx_graphs.Case(case.family, case.index, case.seed, case.model,
                             {k: v[None] for k, v in case.inputs.items()}, case.expected)
    outcome = fuzz_runner.run_case(wrong, "mini", str(tmp_path))
    assert outcome.kind == "user-error" and outcome.error_type == "InputError"
    assert "\n" not in outcome.message and str(tmp_path) not in outcome.message
    assert outcome.first_line.startswith("user-error: ") and "shape" in outcome.message

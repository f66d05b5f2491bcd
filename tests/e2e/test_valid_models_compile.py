"""Valid models that once stopped with a scheduling or allocation error compile, run and
match onnxruntime on ``mini``; what the machine cannot hold stays on the CPU with the
reason in the offload report.

Each case is the smallest graph that showed the failure:

- a pre-LN transformer block at sequence 17 and width 384 (24 lane tiles: every value
  spreads over every SRAM slice, so "clear of the slices of x" left no slice at all);
- the same block with its activations forced off chip (a head split is no reshape alias);
- a per-channel constant added to a 4-D input whose row chunks cover every slice;
- an int8 QDQ block with a residual add (its dequantize-add-requantize chain needs more
  VXM ALUs than mini has) and a channel concat;
- an int8 convolution whose activations cannot fit the SRAM (int8 has no bands).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import tvm.testing
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm
from lpx_tvm.target.codegen import codegen_options

ort = pytest.importorskip("onnxruntime")


def _reference(model: onnx.ModelProto, feed: dict) -> list:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


class _Graph:
    """A tiny ONNX graph builder: constants and nodes with generated names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def const(self, value) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs, out: "str | None" = None, **attrs) -> str:
        out = out or f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def linear(self, x: str, k: int, n: int) -> str:
        w = (self.rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
        return self.node("Add", [self.node("MatMul", [x, self.const(w)]),
                                 self.const((self.rng.standard_normal(n) * 0.1).astype(np.float32))])

    def layer_norm(self, x: str, d: int) -> str:
        return self.node("LayerNormalization", [x, self.const(self.rng.uniform(0.5, 1.5, d).astype(np.float32)),
                                                self.const(self.rng.normal(0, 0.1, d).astype(np.float32))],
                         axis=-1, epsilon=1e-5)

    def model(self, inputs, outputs) -> onnx.ModelProto:
        info = lambda items: [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in items]  # noqa: E731
        graph = helper.make_graph(self.nodes, "g", info(inputs), info(outputs), self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def transformer_block(seq: int, width: int, heads: int) -> onnx.ModelProto:
    """Pre-LN attention (exporter-style head split and merge) and a GELU MLP of 4x width."""
    g = _Graph(0)
    d = width // heads

    def split(t, perm):
        return g.node("Transpose", [g.node("Reshape", [t, g.const(np.array([1, seq, heads, d], np.int64))])],
                      perm=perm)

    h = g.layer_norm("x", width)
    q, k, v = (g.linear(h, width, width) for _ in range(3))
    scores = g.node("Mul", [g.node("MatMul", [split(q, [0, 2, 1, 3]), split(k, [0, 2, 3, 1])]),
                            g.const(np.array(1 / math.sqrt(d), np.float32))])
    ctx = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), split(v, [0, 2, 1, 3])])
    merged = g.node("Reshape", [g.node("Transpose", [ctx], perm=[0, 2, 1, 3]),
                                g.const(np.array([1, seq, width], np.int64))])
    x1 = g.node("Add", ["x", g.linear(merged, width, width)])
    mlp = g.linear(g.node("Gelu", [g.linear(g.layer_norm(x1, width), width, 4 * width)]), 4 * width, width)
    g.node("Add", [x1, mlp], "y")
    return g.model([("x", (1, seq, width))], [("y", (1, seq, width))])


def _run_against_ort(model, feed, precision="fp32"):
    compiled = lpx_tvm.compile_model(model, preset="mini", precision=precision)
    got = compiled.run(feed)
    return compiled, got, _reference(model, feed)


def test_attention_block_seq17_width384():
    model = transformer_block(17, 384, 6)
    feed = {"x": np.random.default_rng(1).standard_normal((1, 17, 384)).astype(np.float32)}
    compiled, got, (want,) = _run_against_ort(model, feed)
    tvm.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
    offload = compiled.report["offload"]
    # Everything but the LayerNorms (refused by the partitioner, with a reason) on LPX.
    assert set(offload["cpu"]) <= {"nn.layer_norm"}, offload
    assert offload["lpx"]["matmul"] == 8 and offload["lpx"]["nn.softmax"] == 1, offload


def test_head_split_by_bands():
    """Activations forced off chip: the head split and merge run as one band each."""
    model = transformer_block(9, 32, 2)
    feed = {"x": np.random.default_rng(2).standard_normal((1, 9, 32)).astype(np.float32)}
    with codegen_options(force_offchip=True):
        compiled, got, (want,) = _run_against_ort(model, feed)
    tvm.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-4)
    assert compiled.report["offload"]["composites"].get("lpx.split_heads", 0) >= 1, compiled.report["offload"]


def test_channel_constant_beside_a_value_on_every_slice():
    """x (1, 11, 15, 1) is cut into row chunks on every slice; the per-channel constant
    it is added to needs a slice clear of each chunk it is read beside."""
    g = _Graph(3)
    k = g.const(g.rng.standard_normal((1, 11, 1, 1)).astype(np.float32))
    g.node("Erf", [g.node("Relu", ["x0"])], "y0")
    g.node("Add", ["x1", k], "y1")
    shape = (1, 11, 15, 1)
    model = g.model([("x0", shape), ("x1", shape)], [("y0", shape), ("y1", shape)])
    rng = np.random.default_rng(4)
    feed = {n: rng.standard_normal(shape).astype(np.float32) for n in ("x0", "x1")}
    compiled, got, want = _run_against_ort(model, feed)
    for name, ref in zip(("y0", "y1"), want):
        tvm.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5)
    assert compiled.report["offload"]["cpu"] == {}, compiled.report["offload"]


# ---- int8 -----------------------------------------------------------------------------

quantization = pytest.importorskip("onnxruntime.quantization")
from test_int8 import _float_model, check_against_ort, quantize  # noqa: E402


def _weights(rng, *shape):
    return (rng.standard_normal(shape) / math.sqrt(math.prod(shape[1:]))).astype(np.float32)


def _int8_on_mini_matches_ort(tmp_path, nodes, inits, shape):
    """The float graph quantized (QDQ), compiled at int8 on mini and checked against
    onnxruntime on a seeded input; the compiled model."""
    src = tmp_path / "float.onnx"
    onnx.save(_float_model(nodes, inits, shape, shape), str(src))
    path = quantize(src, tmp_path / "qdq.onnx", shape)
    feed = {"x": np.random.default_rng(3).standard_normal(shape).astype(np.float32)}
    compiled = lpx_tvm.compile_model(path, preset="mini", precision="int8")
    check_against_ort(path, feed, compiled)
    return compiled


def test_int8_residual_block_with_concat(tmp_path):
    c, hw = 8, 9
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a0"], ["a"]),
             helper.make_node("Conv", ["x", "wb"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "wc"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])]
    inits = {"wa": _weights(rng, c, c, 3, 3), "wb": _weights(rng, c, c, 1, 1), "wc": _weights(rng, c, 2 * c, 1, 1)}
    compiled = _int8_on_mini_matches_ort(tmp_path, nodes, inits, (1, c, hw, hw))
    assert compiled.report["offload"]["composites"]["lpx.qadd"] == 1, compiled.report["offload"]


def test_int8_too_large_for_the_sram_stays_on_the_cpu(tmp_path):
    """(1, 32, 96, 96) activations: 1.2 MB in fp32 and 295 KB in uint8 against mini's
    512 KiB; the fit check keeps the ops that cannot fit on the CPU, saying why."""
    c, hw = 32, 96
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a0"], ["a"]),
             helper.make_node("Conv", ["a", "wb"], ["y"], pads=[1, 1, 1, 1])]
    inits = {"wa": _weights(rng, c, c, 3, 3), "wb": _weights(rng, c, c, 3, 3)}
    compiled = _int8_on_mini_matches_ort(tmp_path, nodes, inits, (1, c, hw, hw))
    reasons = compiled.report["offload"]["reasons"]
    assert any("int8 ops keep their values on chip (no bands)" in r for r in reasons["quantize"]), reasons
    assert any("(1, 32, 96, 96)" in r and "524288 bytes" in r for r in reasons["quantize"]), reasons


def test_int8_region_too_large_together_is_split(tmp_path):
    """Eight (1, 16, 40, 40) branches, each dequantized as a region output, and a concat:
    every op fits mini's SRAM alone, their region does not. The compiler splits it
    (``relax_passes.split_region``) until each part fits, and the result matches."""
    c, hw, branches = 16, 40, 8
    rng = np.random.default_rng(0)
    nodes, inits = [], {}
    for i in range(branches):
        nodes += [helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"]), helper.make_node("Relu", [f"c{i}"], [f"b{i}"])]
        inits[f"w{i}"] = _weights(rng, c, c, 1, 1)
    nodes += [helper.make_node("Concat", [f"b{i}" for i in range(branches)], ["cat"], axis=1),
              helper.make_node("Conv", ["cat", "wo"], ["y"])]
    inits["wo"] = _weights(rng, c, c * branches, 1, 1)
    compiled = _int8_on_mini_matches_ort(tmp_path, nodes, inits, (1, c, hw, hw))
    assert len(compiled.executable.regions) > 2, compiled.report["offload"]
    assert compiled.report["offload"]["regions"] == len(compiled.executable.regions)


def test_int8_conv_with_channel_constants_on_every_slice(tmp_path):
    """256 output channels on mini (16 lanes, 8 slices): the bias tiles cover every slice,
    and the requantization multipliers go beside them tile by tile."""
    c = 256
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    _int8_on_mini_matches_ort(tmp_path, nodes, {"w": _weights(rng, c, c, 1, 1)}, (1, c, 2, 2))

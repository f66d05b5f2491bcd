"""Random valid ONNX graphs over the op set of docs/ops.md, for the fuzzer (docs/fuzz.md).

Three families:

- ``cnn``: convolution chains on NCHW images of odd sizes (batch 2 mostly): asymmetric
  pads, strides, dilations, depthwise and grouped convolutions, BatchNormalization with
  random statistics, residual adds, channel concats, max and average pools, and a head
  (global average pool, Flatten, Gemm);
- ``transformer``: attention blocks over odd sequence lengths with 1 to 4 heads, the
  exporter's Reshape/Transpose head split and merge, causal masks, LayerNormalization and
  GELU (the Gelu op or its Erf and tanh forms written out);
- ``elementwise``: DAGs of Add, Sub, Mul, Relu, Sigmoid, Tanh, Erf, Clip and Where over
  runtime operands and constants with scalar, per-channel, last-axis and full broadcasts;
  after some nodes, a VXM op or activation of docs/ops.md (Abs, Neg, Sign, Exp, Sqrt,
  Reciprocal, Div, Min, Max, Pow, LeakyRelu, PRelu, HardSigmoid, HardSwish), drawn from
  a generator of its own so that the DAG around them is the one the seed always gave.

Graph ``index`` of ``family`` and ``seed`` is always the same model: it draws from its
own numpy Generator, seeded by ``(seed, family, index)``, and its inputs from another.
Weights are random and scaled so that fp32 activations stay within a few units. Every
graph passes ``onnx.checker`` (full check, strict shape inference) and runs on
onnxruntime, whose outputs are the reference.

Public API: :data:`FAMILIES`, :func:`graph`, :func:`case` (graph, inputs and reference
outputs) and :func:`reference`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

FAMILIES = ("cnn", "transformer", "elementwise")

# Outputs larger than this mean the generator scaled something badly (a bug of this module).
MAX_ABS_OUTPUT = 1e3


class GeneratorError(Exception):
    """The generator built a graph that is not valid or not well scaled (a bug here)."""


@dataclass(frozen=True)
class Case:
    """One fuzz graph with its inputs and onnxruntime's outputs."""

    family: str
    index: int
    seed: int
    model: onnx.ModelProto
    inputs: dict = field(repr=False)
    expected: dict = field(repr=False)

    @property
    def name(self) -> str:
        return f"{self.family}-{self.index}-s{self.seed}"


def graph(family: str, index: int, seed: int = 0) -> onnx.ModelProto:
    """Graph ``index`` of ``family`` for ``seed``: always the same valid ONNX model."""
    if family not in _FAMILY_BUILDERS:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    if index < 0 or seed < 0:
        raise ValueError("index and seed are non-negative")
    b = _Builder(_rng(family, index, seed, stream=0), f"{family}_{index}_s{seed}")
    b.extra_rng = _rng(family, index, seed, stream=2)
    outputs, opset = _FAMILY_BUILDERS[family](b)
    model = b.model(outputs, opset)
    _check(model)
    return model


def case(family: str, index: int, seed: int = 0) -> Case:
    """:func:`graph` with seeded inputs and its onnxruntime outputs (checked finite and
    of sane magnitude)."""
    model = graph(family, index, seed)
    inputs = _inputs(model, _rng(family, index, seed, stream=1))
    expected = reference(model, inputs)
    for name, value in expected.items():
        if not np.all(np.isfinite(value)) or np.max(np.abs(value), initial=0) > MAX_ABS_OUTPUT:
            raise GeneratorError(f"{family}-{index}-s{seed}: output {name} is not finite or above "
                                 f"{MAX_ABS_OUTPUT:g}: the generator's scaling is wrong")
    return Case(family, index, seed, model, inputs, expected)


def reference(model: onnx.ModelProto, inputs: dict) -> dict:
    """onnxruntime's outputs (CPU, graph optimizations off: the graph as written)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


_FAMILY_IDS = {name: i for i, name in enumerate(FAMILIES)}


def _rng(family: str, index: int, seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, _FAMILY_IDS[family], index, stream])


def _inputs(model: onnx.ModelProto, rng: np.random.Generator) -> dict:
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == TensorProto.BOOL:
            out[vi.name] = rng.random(shape) < 0.5
        else:
            out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _check(model: onnx.ModelProto) -> None:
    try:
        onnx.checker.check_model(model, full_check=True)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise GeneratorError(f"{model.graph.name}: invalid graph: {e}") from e
    declared = {o.name: _dims(o) for o in model.graph.output}
    for o in inferred.graph.output:
        if _dims(o) != declared[o.name]:
            raise GeneratorError(f"{model.graph.name}: output {o.name} declared {declared[o.name]}, "
                                 f"inferred {_dims(o)}")


def _dims(value_info) -> tuple:
    return tuple(d.dim_value for d in value_info.type.tensor_type.shape.dim)


class _Builder:
    """Nodes, initializers and the shape of every value, for one graph."""

    def __init__(self, rng: np.random.Generator, name: str):
        self.rng = rng
        self.name = name
        self.nodes, self.inits, self.inputs = [], [], []
        self.shapes, self.dtypes = {}, {}
        self.layers = []  # a short description of each block, for the model's doc string
        self._count = 0

    def fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}{self._count}"

    def input(self, shape, dtype=TensorProto.FLOAT, stem="x") -> str:
        name = stem if stem not in self.shapes else self.fresh(stem)
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        self.shapes[name], self.dtypes[name] = tuple(shape), dtype
        return name

    def const(self, array, stem="w") -> str:
        name = self.fresh(stem)
        array = np.asarray(array)
        self.inits.append(numpy_helper.from_array(array, name))
        self.shapes[name] = array.shape
        self.dtypes[name] = helper.np_dtype_to_tensor_dtype(array.dtype)
        return name

    def weight(self, shape, std: float, stem="w") -> str:
        return self.const((self.rng.standard_normal(shape) * std).astype(np.float32), stem)

    def node(self, op: str, ins, shape, dtype=TensorProto.FLOAT, outputs=1, **attrs):
        """Add ``op`` over ``ins`` whose output(s) have ``shape`` (one shape, or a list of
        shapes for several outputs); returns the output name(s)."""
        names = [self.fresh(op.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, list(ins), names, name=self.fresh(f"{op}_"), **attrs))
        shapes = shape if outputs > 1 else [shape]
        for n, s in zip(names, shapes):
            self.shapes[n], self.dtypes[n] = tuple(s), dtype
        return names if outputs > 1 else names[0]

    def model(self, outputs, opset: int) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, self.dtypes[o], list(self.shapes[o])) for o in outputs]
        g = helper.make_graph(self.nodes, self.name, self.inputs, outs, self.inits)
        opsets = [helper.make_opsetid("", opset)]
        m = helper.make_model(g, opset_imports=opsets, producer_name="lpx-fuzz")
        m.ir_version = helper.find_min_ir_version_for(opsets)  # what exporters of that opset write
        m.doc_string = " | ".join(self.layers)
        return m


def _choice(rng, options, p=None):
    return options[int(rng.choice(len(options), p=p))]


def _odd(rng, lo: int, hi: int) -> int:
    """An odd integer in [lo, hi]."""
    return int(rng.choice([v for v in range(lo, hi + 1) if v % 2]))


# ---- CNN chains ---------------------------------------------------------------------

MAX_CHANNELS = 40


def _conv_out(size: int, k: int, stride: int, dilation: int, pad_lo: int, pad_hi: int) -> int:
    return (size + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1


def _conv(b: _Builder, x: str, cout: int, k, stride=(1, 1), dilation=(1, 1), pads=(0, 0, 0, 0),
          group: int = 1, bias: bool = True) -> str:
    n, cin, h, w = b.shapes[x]
    fan_in = cin // group * k[0] * k[1]
    wgt = b.weight((cout, cin // group, k[0], k[1]), b.rng.uniform(0.8, 1.4) / math.sqrt(fan_in))
    ins = [x, wgt] + ([b.weight((cout,), 0.2, "b")] if bias else [])
    oh = _conv_out(h, k[0], stride[0], dilation[0], pads[0], pads[2])
    ow = _conv_out(w, k[1], stride[1], dilation[1], pads[1], pads[3])
    kind = "depthwise" if group == cin == cout and group > 1 else (f"g{group}" if group > 1 else "dense")
    b.layers.append(f"conv {kind} {cin}->{cout} k{k[0]}x{k[1]} s{stride[0]}x{stride[1]} "
                    f"d{dilation[0]}x{dilation[1]} pads{list(pads)}{' +b' if bias else ''}")
    return b.node("Conv", ins, (n, cout, oh, ow), kernel_shape=list(k), strides=list(stride),
                  dilations=list(dilation), pads=list(pads), group=group)


def _random_conv_geometry(b: _Builder, h: int, w: int, same: bool):
    """Kernel, stride, dilation and pads for an (h, w) image. ``same``: stride 1 and pads
    (split at random, so often asymmetric) that keep the size."""
    rng = b.rng
    geo = []
    for size in (h, w):
        k = int(_choice(rng, [1, 3, 3, 5, 2]))
        d = int(_choice(rng, [1, 1, 1, 2])) if k > 1 else 1
        s = 1 if same else int(_choice(rng, [1, 1, 2, 3]))
        span = d * (k - 1) + 1
        if same:
            lo = int(rng.integers(0, span))
            hi = span - 1 - lo
        else:
            lo, hi = int(rng.integers(0, span)), int(rng.integers(0, span))
        if span > size + lo + hi:  # the window must fit the padded image
            k, d, s, lo, hi = 1, 1, 1, 0, 0
        geo.append((k, s, d, lo, hi))
    (kh, sh, dh, t, bt), (kw, sw, dw, lft, r) = geo
    return (kh, kw), (sh, sw), (dh, dw), (t, lft, bt, r)


def _batchnorm(b: _Builder, x: str) -> str:
    c = b.shapes[x][1]
    rng = b.rng
    params = [rng.uniform(0.5, 1.5, c), rng.normal(0, 0.3, c), rng.normal(0, 0.3, c), rng.uniform(0.5, 2.0, c)]
    names = [b.const(p.astype(np.float32), stem) for p, stem in zip(params, ("gamma", "beta", "mean", "var"))]
    eps = float(_choice(rng, [1e-5, 1e-3]))
    b.layers.append(f"batchnorm eps={eps:g}")
    return b.node("BatchNormalization", [x] + names, b.shapes[x], epsilon=eps)


def _activation(b: _Builder, x: str, allow_none: bool = True) -> str:
    options = ["relu", "relu", "clip6", "clip", "sigmoid", "tanh"] + (["none", "none"] if allow_none else [])
    kind = _choice(b.rng, options)
    if kind == "none":
        return x
    b.layers.append(kind)
    if kind == "relu":
        return b.node("Relu", [x], b.shapes[x])
    if kind == "sigmoid":
        return b.node("Sigmoid", [x], b.shapes[x])
    if kind == "tanh":
        return b.node("Tanh", [x], b.shapes[x])
    lo, hi = (0.0, 6.0) if kind == "clip6" else sorted(b.rng.uniform(-1.5, 1.5, 2))
    bounds = [b.const(np.array(v, np.float32), "clipb") for v in (lo, hi)]
    return b.node("Clip", [x] + bounds, b.shapes[x])


def _after_conv(b: _Builder, y: str) -> str:
    if b.rng.random() < 0.4:
        y = _batchnorm(b, y)
    return _activation(b, y)


def _cnn_conv_block(b: _Builder, x: str, kind: str) -> str:
    rng = b.rng
    _, cin, h, w = b.shapes[x]
    k, s, d, pads = _random_conv_geometry(b, h, w, same=False)
    if kind == "depthwise" and cin > 1:
        return _after_conv(b, _conv(b, x, cin, k, s, d, pads, group=cin, bias=rng.random() < 0.7))
    groups = [g for g in range(2, cin + 1) if cin % g == 0]
    if kind == "grouped" and groups:
        g = int(_choice(rng, groups))
        cout = g * int(rng.integers(1, max(2, MAX_CHANNELS // g) + 1))
        return _after_conv(b, _conv(b, x, min(cout, g * (MAX_CHANNELS // g)), k, s, d, pads, group=g,
                                    bias=rng.random() < 0.7))
    cout = int(rng.integers(1, MAX_CHANNELS + 1))
    return _after_conv(b, _conv(b, x, cout, k, s, d, pads, bias=rng.random() < 0.8))


def _cnn_residual(b: _Builder, x: str) -> str:
    """x + f(x), f one or two same-size convolutions (asymmetric pads keep the size)."""
    rng = b.rng
    _, c, h, w = b.shapes[x]
    b.layers.append("residual[")
    y = x
    for _ in range(int(rng.integers(1, 3))):
        k, s, d, pads = _random_conv_geometry(b, h, w, same=True)
        group = c if (c > 1 and rng.random() < 0.3) else 1
        y = _after_conv(b, _conv(b, y, c, k, s, d, pads, group=group, bias=rng.random() < 0.7))
    b.layers.append("]add")
    out = b.node("Add", [x, y] if rng.random() < 0.5 else [y, x], (b.shapes[x]))
    if rng.random() < 0.5:
        b.layers.append("relu")
        out = b.node("Relu", [out], b.shapes[out])
    return out


def _cnn_concat(b: _Builder, x: str) -> str:
    """Two or three same-size branches of x, concatenated along the channels."""
    rng = b.rng
    n, c, h, w = b.shapes[x]
    b.layers.append("concat[")
    branches = []
    for _ in range(int(rng.integers(2, 4))):
        kind = _choice(rng, ["conv", "conv", "pool", "identity"])
        if kind == "identity":
            b.layers.append("identity")
            branches.append(x)
        elif kind == "pool":
            b.layers.append("maxpool 3x3 s1 pads[1,1,1,1]")
            branches.append(b.node("MaxPool", [x], (n, c, h, w), kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        else:
            k, s, d, pads = _random_conv_geometry(b, h, w, same=True)
            cout = int(rng.integers(1, MAX_CHANNELS // 2 + 1))
            branches.append(_after_conv(b, _conv(b, x, cout, k, s, d, pads, bias=rng.random() < 0.7)))
        b.layers.append(",")
    b.layers.append("]")
    channels = sum(b.shapes[t][1] for t in branches)
    out = b.node("Concat", branches, (n, channels, h, w), axis=1)
    if channels > MAX_CHANNELS:  # a 1x1 convolution brings the width back
        out = _after_conv(b, _conv(b, out, int(rng.integers(4, MAX_CHANNELS + 1)), (1, 1)))
    return out


def _cnn_pool(b: _Builder, x: str) -> str:
    rng = b.rng
    n, c, h, w = b.shapes[x]
    op = _choice(rng, ["MaxPool", "AveragePool"])
    dims = []
    for size in (h, w):
        k = min(int(_choice(rng, [2, 3, 3])), size)
        s = int(_choice(rng, [1, 2, 2]))
        lo, hi = (int(rng.integers(0, k)), int(rng.integers(0, k))) if k > 1 else (0, 0)
        dims.append((k, s, lo, hi, _conv_out(size, k, s, 1, lo, hi)))
    (kh, sh, t, bt, oh), (kw, sw, lft, r, ow) = dims
    attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=[t, lft, bt, r])
    if op == "AveragePool":
        attrs["count_include_pad"] = int(rng.integers(0, 2))
    b.layers.append(f"{op} k{kh}x{kw} s{sh}x{sw} pads{attrs['pads']}"
                    + (f" cip={attrs['count_include_pad']}" if op == "AveragePool" else ""))
    return b.node(op, [x], (n, c, oh, ow), **attrs)


def _cnn_head(b: _Builder, x: str) -> str:
    """Global average pool, Flatten and Gemm (transB, alpha and beta at random); Softmax
    or Relu sometimes."""
    rng = b.rng
    n, c = b.shapes[x][:2]
    g = b.node("GlobalAveragePool", [x], (n, c, 1, 1))
    f = b.node("Flatten", [g], (n, c))
    classes = int(rng.integers(2, 21))
    trans_b = int(rng.integers(0, 2))
    wshape = (classes, c) if trans_b else (c, classes)
    attrs = dict(transB=trans_b)
    if rng.random() < 0.2:
        attrs["alpha"] = float(np.float32(rng.uniform(0.5, 1.5)))
    if rng.random() < 0.2:
        attrs["beta"] = float(np.float32(rng.uniform(0.5, 1.5)))
    ins = [f, b.weight(wshape, 1.0 / math.sqrt(c))]
    if rng.random() < 0.8:
        ins.append(b.weight((classes,), 0.2, "b"))
    b.layers.append(f"head gap flatten gemm {c}->{classes} {attrs}")
    y = b.node("Gemm", ins, (n, classes), **attrs)
    tail = _choice(rng, ["none", "none", "softmax", "relu"])
    if tail == "softmax":
        b.layers.append("softmax")
        y = b.node("Softmax", [y], (n, classes), axis=-1)
    elif tail == "relu":
        b.layers.append("relu")
        y = b.node("Relu", [y], (n, classes))
    return y


def _cnn(b: _Builder):
    rng = b.rng
    n = int(_choice(rng, [2, 2, 2, 1]))
    c = int(rng.integers(1, 9))
    big = rng.random() < 0.15  # images whose activations outgrow mini's SRAM (run by bands)
    x = b.input((n, c, _odd(rng, 5, 57 if big else 25), _odd(rng, 5, 57 if big else 25)))
    b.layers.append(f"input {b.shapes[x]}")
    kinds = ["conv", "conv", "depthwise", "grouped", "residual", "concat", "pool", "batchnorm", "activation"]
    y, taps = x, []
    for _ in range(int(rng.integers(2, 7))):
        kind = _choice(rng, kinds)
        if kind == "pool" and min(b.shapes[y][2:]) < 3:
            kind = "conv"
        if kind == "residual":
            y = _cnn_residual(b, y)
        elif kind == "concat":
            y = _cnn_concat(b, y)
        elif kind == "pool":
            y = _cnn_pool(b, y)
        elif kind == "batchnorm":
            y = _batchnorm(b, y)
        elif kind == "activation":
            y = _activation(b, y, allow_none=False)
        else:
            y = _cnn_conv_block(b, y, kind)
        if y != x and rng.random() < 0.1:
            taps.append(y)  # an intermediate feature map as a second output
    outputs = [_cnn_head(b, y) if rng.random() < 0.85 else y]
    outputs += [t for t in taps[:1] if t not in outputs]
    return outputs, 17


# ---- transformer blocks -------------------------------------------------------------

def _linear(b: _Builder, x: str, n_out: int, bias: bool = True) -> str:
    *lead, k = b.shapes[x]
    y = b.node("MatMul", [x, b.weight((k, n_out), 1.0 / math.sqrt(k))], (*lead, n_out))
    if bias:
        y = b.node("Add", [y, b.weight((n_out,), 0.1, "b")], (*lead, n_out))
    return y


def _layernorm(b: _Builder, x: str) -> str:
    d = b.shapes[x][-1]
    scale = b.const(b.rng.uniform(0.5, 1.5, d).astype(np.float32), "ln_scale")
    bias = b.const(b.rng.normal(0, 0.1, d).astype(np.float32), "ln_bias")
    eps = float(_choice(b.rng, [1e-5, 1e-6, 1e-12]))
    return b.node("LayerNormalization", [x, scale, bias], b.shapes[x], axis=-1, epsilon=eps)


def _shape(b: _Builder, dims) -> str:
    return b.const(np.array(dims, np.int64), "shape")


def _split_heads(b: _Builder, t: str, heads: int, perm) -> str:
    """The exporter's head split: Reshape (1, s, h*d) -> (1, s, h, d), then Transpose."""
    n, s, width = b.shapes[t]
    d = width // heads
    r = b.node("Reshape", [t, _shape(b, [n, s, heads, d])], (n, s, heads, d))
    dims = (n, s, heads, d)
    return b.node("Transpose", [r], tuple(dims[p] for p in perm), perm=list(perm))


def _causal_mask(b: _Builder, scores: str, style: str) -> str:
    n, h, s, _ = b.shapes[scores]
    upper = np.triu(np.ones((s, s), bool), 1)
    if style == "where":  # torch's masked_fill: Where(mask, -inf, scores)
        cond = b.const(upper, "causal")
        fill = b.const(np.array(-np.inf, np.float32), "neg_inf")
        return b.node("Where", [cond, fill, scores], b.shapes[scores])
    value = {"add_min": np.finfo(np.float32).min, "add_1e9": -1e9}[style]
    mask = np.where(upper, value, 0).astype(np.float32)
    shape = _choice(b.rng, [(1, 1, s, s), (n, h, s, s), (s, s)])
    mask = np.broadcast_to(mask, shape).copy()
    return b.node("Add", [scores, b.const(mask, "causal")], b.shapes[scores])


def _gelu(b: _Builder, x: str, form: str) -> str:
    shape = b.shapes[x]

    def scalar(v):
        return b.const(np.array(v, np.float32), "c")

    if form == "op":
        return b.node("Gelu", [x], shape)
    if form == "op_tanh":
        return b.node("Gelu", [x], shape, approximate="tanh")
    if form == "erf":  # x * 0.5 * (1 + erf(x / sqrt 2)), as torch exports it
        e = b.node("Erf", [b.node("Mul", [x, scalar(1 / math.sqrt(2))], shape)], shape)
        return b.node("Mul", [b.node("Mul", [x, scalar(0.5)], shape), b.node("Add", [e, scalar(1.0)], shape)],
                      shape)
    # tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    cube = b.node("Pow", [x, scalar(3.0)], shape)
    inner = b.node("Add", [x, b.node("Mul", [cube, scalar(0.044715)], shape)], shape)
    t = b.node("Tanh", [b.node("Mul", [inner, scalar(math.sqrt(2 / math.pi))], shape)], shape)
    return b.node("Mul", [b.node("Mul", [x, scalar(0.5)], shape), b.node("Add", [t, scalar(1.0)], shape)], shape)


def _attention(b: _Builder, x: str, heads: int, mask: str) -> str:
    rng = b.rng
    n, s, width = b.shapes[x]
    d = width // heads
    if rng.random() < 0.4:  # a fused QKV projection, split along the last axis
        qkv = _linear(b, x, 3 * width)
        split = b.const(np.array([width] * 3, np.int64), "split")
        q, k, v = b.node("Split", [qkv, split], [(n, s, width)] * 3, outputs=3, axis=-1)
    else:
        q, k, v = (_linear(b, x, width) for _ in range(3))
    qh = _split_heads(b, q, heads, (0, 2, 1, 3))
    vh = _split_heads(b, v, heads, (0, 2, 1, 3))
    if rng.random() < 0.5:  # K^T straight from the split (the exporter's perm 0, 2, 3, 1)
        kt = _split_heads(b, k, heads, (0, 2, 3, 1))
    else:
        kh = _split_heads(b, k, heads, (0, 2, 1, 3))
        kt = b.node("Transpose", [kh], (n, heads, d, s), perm=[0, 1, 3, 2])
    scale = b.const(np.array(1 / math.sqrt(d), np.float32), "scale")
    if rng.random() < 0.5:
        scores = b.node("Mul", [b.node("MatMul", [qh, kt], (n, heads, s, s)), scale], (n, heads, s, s))
    else:
        scores = b.node("MatMul", [b.node("Mul", [qh, scale], b.shapes[qh]), kt], (n, heads, s, s))
    if mask != "none":
        scores = _causal_mask(b, scores, mask)
    p = b.node("Softmax", [scores], (n, heads, s, s), axis=-1)
    ctx = b.node("MatMul", [p, vh], (n, heads, s, d))
    merged = b.node("Transpose", [ctx], (n, s, heads, d), perm=[0, 2, 1, 3])
    flat = b.node("Reshape", [merged, _shape(b, [n, s, width])], (n, s, width))
    return _linear(b, flat, width)


def _transformer(b: _Builder):
    rng = b.rng
    s = _odd(rng, 3, 33)
    heads = int(rng.integers(1, 5))
    d = int(_choice(rng, [4, 6, 8, 12, 16]))
    width = heads * d
    ffn = width * int(_choice(rng, [2, 4]))
    mask = _choice(rng, ["none", "add_min", "add_1e9", "where"])
    gelu = _choice(rng, ["op", "op_tanh", "erf", "tanh"])
    pre_ln = bool(rng.random() < 0.5)
    blocks = int(_choice(rng, [1, 1, 2]))
    n = int(_choice(rng, [1, 1, 1, 1, 2]))
    x = b.input((n, s, width))
    b.layers.append(f"input ({n}, {s}, {width}) heads={heads} d={d} ffn={ffn} mask={mask} gelu={gelu} "
                    f"{'pre' if pre_ln else 'post'}-LN blocks={blocks}")
    for _ in range(blocks):
        a = _attention(b, _layernorm(b, x) if pre_ln else x, heads, mask)
        x = b.node("Add", [x, a], b.shapes[x])
        if not pre_ln:
            x = _layernorm(b, x)
        h = _linear(b, _gelu(b, _linear(b, _layernorm(b, x) if pre_ln else x, ffn), gelu), width)
        x = b.node("Add", [x, h], b.shapes[x])
        if not pre_ln:
            x = _layernorm(b, x)
    if pre_ln:
        x = _layernorm(b, x)
    return [x], (20 if gelu.startswith("op") else 17)


# ---- elementwise DAGs ---------------------------------------------------------------

def _elementwise_shape(rng):
    rank = int(_choice(rng, [2, 3, 4, 4]))
    if rank == 4:
        return (int(_choice(rng, [1, 2])), _odd(rng, 1, 15), _odd(rng, 1, 17), _odd(rng, 1, 17))
    if rank == 3:
        return (int(_choice(rng, [1, 2])), _odd(rng, 1, 31), int(rng.integers(1, 49)))
    return (_odd(rng, 1, 31), int(rng.integers(1, 65)))


def _broadcast_constant(b: _Builder, shape, kind: str, values):
    """A constant of ``kind`` broadcasting against ``shape``; ``values(shape)`` draws it."""
    if kind == "scalar":
        cshape = _choice(b.rng, [(), (1,)])
    elif kind == "channel":  # one value per channel of NCHW, or per column of the last axis
        cshape = _choice(b.rng, [(shape[1], 1, 1), (1, shape[1], 1, 1)]) if len(shape) == 4 else \
            _choice(b.rng, [(shape[-1],), (1, shape[-1])])
    elif kind == "last":  # along the last axis, whatever the rank
        cshape = (shape[-1],)
    else:
        cshape = shape
    return b.const(values(cshape), "k"), cshape


def _elementwise(b: _Builder):
    """A random DAG; the values of every node are computed alongside (numpy) so that a
    bounded op can be put where magnitudes would grow."""
    rng = b.rng
    shape = _elementwise_shape(rng)
    n_inputs = int(rng.integers(1, 4))
    names = [b.input(shape, stem=f"x{i}") for i in range(n_inputs)]
    sample = {n: rng.standard_normal(shape) for n in names}
    values = dict(sample)
    consumed = set()
    b.layers.append(f"inputs {n_inputs} x {shape}")

    def draw(cshape):
        mag = rng.uniform(0.3, 1.5, cshape) * rng.choice([-1, 1], cshape)
        return np.asarray(mag, np.float32)

    def pick():
        # unused inputs first, so every input is read
        unused = [n for n in names if n not in consumed and n in sample]
        return unused[0] if unused else names[int(rng.integers(0, len(names)))]

    ops = ["Add", "Sub", "Mul", "Add", "Mul", "Relu", "Sigmoid", "Tanh", "Clip", "Erf", "Where"]
    for _ in range(int(rng.integers(3, 13))):
        op = _choice(rng, ops)
        a = pick()
        consumed.add(a)
        if op in ("Relu", "Sigmoid", "Tanh", "Erf"):
            out = b.node(op, [a], shape)
            v = values[a]
            values[out] = {"Relu": np.maximum(v, 0), "Sigmoid": 1 / (1 + np.exp(-v)), "Tanh": np.tanh(v),
                           "Erf": np.tanh(v)}[op]  # |erf| <= 1 like tanh: enough for magnitudes
            b.layers.append(f"{op}({a})")
        elif op == "Clip":
            if rng.random() < 0.3:
                lo, hi = 0.0, None
            else:
                lo, hi = sorted(rng.uniform(-2, 2, 2))
            bounds = [b.const(np.array(lo, np.float32), "lo")] + \
                ([b.const(np.array(hi, np.float32), "hi")] if hi is not None else [])
            out = b.node("Clip", [a] + bounds, shape)
            values[out] = np.clip(values[a], lo, hi)
            b.layers.append(f"Clip({a}, {lo:.2f}, {hi if hi is None else round(hi, 2)})")
        elif op == "Where":  # a runtime bool condition, two tensors or a scalar
            cond = b.input(shape, TensorProto.BOOL, stem="cond")
            other = pick() if rng.random() < 0.6 else b.const(np.array(rng.uniform(-1, 1), np.float32), "k")
            consumed.add(other)
            ins = [cond, a, other] if rng.random() < 0.5 else [cond, other, a]
            out = b.node("Where", ins, shape)
            values[out] = np.maximum(np.abs(values[a]), np.abs(values.get(other, 1.0)))
            b.layers.append(f"Where({', '.join(ins)})")
        else:
            kind = _choice(rng, ["runtime", "runtime", "scalar", "channel", "last", "full"])
            if kind == "runtime":
                c = pick()
                consumed.add(c)
                cv = values[c]
            else:
                c, cshape = _broadcast_constant(b, shape, kind, draw)
                cv = numpy_helper.to_array(b.inits[-1]).astype(np.float64)
            ins = [a, c] if (kind == "runtime" or rng.random() < 0.8) else [c, a]
            out = b.node(op, ins, shape)
            va, vc = (values[a], cv) if ins[0] == a else (cv, values[a])
            values[out] = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](va, vc)
            b.layers.append(f"{op}({ins[0]}, {ins[1]}) [{kind}]")
        if b.extra_rng.random() < 0.35:
            out = _vxm_op(b, out, shape, values, names)
        if np.max(np.abs(values[out])) > 8:  # keep magnitudes within a few units
            out2 = b.node("Tanh", [out], shape)
            values[out2] = np.tanh(values[out])
            consumed.add(out)
            out = out2
            b.layers.append("Tanh (bound)")
        names.append(out)
    sinks = [n for n in names if n not in consumed and n not in sample]
    return sinks or [names[-1]], 17


def _away_from_zero(b: _Builder, x: str, shape, values) -> str:
    """|x| + 0.5: a denominator or a base whose powers stay well scaled."""
    out = b.node("Add", [b.node("Abs", [x], shape), b.const(np.array(0.5, np.float32), "k")], shape)
    values[out] = np.abs(values[x]) + 0.5
    return out


def _vxm_op(b: _Builder, x: str, shape, values, names) -> str:
    """One of the VXM ops and activations after ``x``, from ``b.extra_rng``."""
    rng = b.extra_rng
    op = _choice(rng, ["Abs", "Neg", "Sign", "Exp", "Sqrt", "Reciprocal", "Div", "Min", "Max", "Pow",
                       "LeakyRelu", "PRelu", "HardSigmoid", "HardSwish"])
    v = values[x]
    if op in ("Abs", "Neg", "Sign", "HardSwish"):
        out = b.node(op, [x], shape)
        values[out] = {"Abs": np.abs(v), "Neg": -v, "Sign": np.sign(v),
                       "HardSwish": v * np.clip(v / 6 + 0.5, 0, 1)}[op]
    elif op == "Exp":
        out = b.node(op, [x], shape)
        values[out] = np.exp(v)
    elif op in ("Sqrt", "Reciprocal"):
        base = _away_from_zero(b, x, shape, values)
        out = b.node(op, [base], shape)
        values[out] = np.sqrt(values[base]) if op == "Sqrt" else 1 / values[base]
    elif op == "Pow":
        k = float(_choice(rng, [0.5, -0.5, -1.0, 2.0, 3.0, 4.0, 5.0, -2.0]))
        base = _away_from_zero(b, x, shape, values) if k != int(k) or k < 0 else x
        out = b.node(op, [base, b.const(np.array(k, np.float32), "k")], shape)
        values[out] = values[base] ** k
    elif op == "Div":
        other = names[int(rng.integers(0, len(names)))]
        den = _away_from_zero(b, other, shape, values)
        out = b.node(op, [x, den], shape)
        values[out] = v / values[den]
    elif op in ("Min", "Max"):
        if rng.random() < 0.5:
            c, cv = names[int(rng.integers(0, len(names)))], None
            cv = values[c]
        else:
            c, _ = _broadcast_constant(b, shape, _choice(rng, ["scalar", "channel", "full"]),
                                       lambda cs: rng.uniform(-1, 1, cs).astype(np.float32))
            cv = numpy_helper.to_array(b.inits[-1]).astype(np.float64)
        out = b.node(op, [x, c], shape)
        values[out] = (np.minimum if op == "Min" else np.maximum)(v, cv)
    elif op == "LeakyRelu":
        alpha = float(_choice(rng, [0.01, 0.1, 0.3, 1.5]))
        out = b.node(op, [x], shape, alpha=alpha)
        values[out] = np.where(v < 0, alpha * v, v)
    elif op == "PRelu":  # one slope per channel of NCHW, else one slope
        sshape = (shape[1], 1, 1) if len(shape) == 4 else (1,)
        slope = rng.uniform(-0.5, 1.5, sshape).astype(np.float32)
        out = b.node(op, [x, b.const(slope, "slope")], shape)
        values[out] = np.where(v < 0, slope * v, v)
    else:  # HardSigmoid
        alpha, beta = float(rng.uniform(0.1, 0.5)), float(rng.uniform(0.2, 0.8))
        out = b.node(op, [x], shape, alpha=alpha, beta=beta)
        values[out] = np.clip(alpha * v + beta, 0, 1)
    b.layers.append(f"{op}({x})")
    return out


_FAMILY_BUILDERS = {"cnn": _cnn, "transformer": _transformer, "elementwise": _elementwise}

"""ONNX graphs as exporters write them for dynamic dimensions: shape subgraphs
(``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``, ``Expand`` and ``Range`` with
computed shapes, ``Resize`` with computed ``sizes``), built for a given opset, and torch
modules exported with ``dynamic_axes``.

Each builder returns (model, the static shape its input ``x`` is pinned to).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

N = h.make_node


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _model(nodes, inits, name, x_dims, y_dims, opset):
    graph = h.make_graph(nodes, name, [h.make_tensor_value_info("x", T.FLOAT, x_dims)],
                         [h.make_tensor_value_info("y", T.FLOAT, y_dims)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 19 else 9
    onnx.checker.check_model(model, full_check=True)
    return model


def _unsqueeze0(opset, x, out, nodes, inits):
    """Unsqueeze on axis 0: an attribute before opset 13, an input since."""
    if opset >= 13:
        inits.append(_const(out + "_axes", np.array([0], np.int64)))
        nodes.append(N("Unsqueeze", [x, out + "_axes"], [out], name=out))
    else:
        nodes.append(N("Unsqueeze", [x], [out], axes=[0], name=out))


def _resize(opset, x, sizes, out, name, nodes, inits):
    """A nearest Resize to ``sizes``: before opset 13 with the empty roi and scales
    inputs it requires (as torch writes them), since with those inputs omitted."""
    if opset >= 13:
        nodes.append(N("Resize", [x, "", "", sizes], [out], mode="nearest", name=name))
    else:
        inits += [_const(name + "_roi", np.array([], np.float32)), _const(name + "_scales", np.array([], np.float32))]
        nodes.append(N("Resize", [x, name + "_roi", name + "_scales", sizes], [out], mode="nearest", name=name))


def reshape_chain(opset):
    """(N, C, H, W) -> (N, C, H*W) with the shape from Shape -> Gather -> Mul -> Unsqueeze ->
    Concat, a softmax over H*W, and back to Shape(x)."""
    nodes, inits = [N("Shape", ["x"], ["s"], name="shape")], []
    for i in range(4):
        inits.append(_const(f"i{i}", np.array(i, np.int64)))
        nodes.append(N("Gather", ["s", f"i{i}"], [f"d{i}"], axis=0, name=f"gather{i}"))
    nodes.append(N("Mul", ["d2", "d3"], ["hw"], name="hw"))
    for src, out in (("d0", "u0"), ("d1", "u1"), ("hw", "u2")):
        _unsqueeze0(opset, src, out, nodes, inits)
    nodes += [N("Concat", ["u0", "u1", "u2"], ["ns"], axis=0, name="concat"),
              N("Reshape", ["x", "ns"], ["r"], name="flatten"),
              N("Softmax", ["r"], ["sm"], axis=2, name="softmax"),
              N("Reshape", ["sm", "s"], ["y"], name="unflatten")]
    return _model(nodes, inits, "reshape_chain", ["N", 4, "H", "W"], ["N", 4, "H", "W"], opset), (2, 4, 6, 5)


def expand_range(opset):
    """A position embedding: Range(0, Shape(x)[1]) gathers rows of a table, Expanded to
    Shape(x) and added."""
    table = np.random.default_rng(1).standard_normal((32, 8)).astype(np.float32)
    inits = [_const("one", np.array(1, np.int64)), _const("zero", np.array(0, np.int64)),
             _const("step", np.array(1, np.int64)), _const("table", table)]
    nodes = [N("Shape", ["x"], ["s"], name="shape"),
             N("Gather", ["s", "one"], ["n"], axis=0, name="seq_len"),
             N("Range", ["zero", "n", "step"], ["pos"], name="positions"),
             N("Gather", ["table", "pos"], ["pe"], axis=0, name="pos_embed"),
             N("Expand", ["pe", "s"], ["pex"], name="expand"),
             N("Add", ["x", "pex"], ["y"], name="add")]
    return _model(nodes, inits, "expand_range", ["B", "S", 8], ["B", "S", 8], opset), (2, 9, 8)


def resize_sizes(opset):
    """An FPN merge: a strided convolution's output resized to its input's H, W with
    sizes = Concat(Shape(b)[:2], Shape(x)[2:]); before opset 13 with the empty scales
    input torch writes."""
    weight = np.random.default_rng(2).standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3
    inits = [_const("w", weight), _const("st0", np.array([0])), _const("st2", np.array([2])),
             _const("st4", np.array([4]))]
    nodes = [N("Conv", ["x", "w"], ["b"], strides=[2, 2], pads=[1, 1, 1, 1], name="down"),
             N("Shape", ["b"], ["sb"], name="shape_b"), N("Shape", ["x"], ["sx"], name="shape_x"),
             N("Slice", ["sb", "st0", "st2"], ["nc"], name="slice_nc"),
             N("Slice", ["sx", "st2", "st4"], ["hw"], name="slice_hw"),
             N("Concat", ["nc", "hw"], ["sizes"], axis=0, name="sizes")]
    _resize(opset, "b", "sizes", "up", "resize", nodes, inits)
    nodes.append(N("Add", ["x", "up"], ["y"], name="add"))
    return _model(nodes, inits, "resize_sizes", ["N", 4, "H", "W"], ["N", 4, "H", "W"], opset), (1, 4, 10, 12)


def reduceprod_flatten(opset):
    """Flatten as Reshape(x, Concat(Shape(x)[:1], ReduceProd(Shape(x)[1:]))): TVM's importer
    gets the shape as a run-time tensor ("Reshape requires the input new shape to be
    Shape")."""
    inits = [_const("st0", np.array([0])), _const("st1", np.array([1])), _const("st4", np.array([4]))]
    nodes = [N("Shape", ["x"], ["s"], name="shape"), N("Slice", ["s", "st1", "st4"], ["t"], name="tail"),
             N("ReduceProd", ["t"], ["p"], keepdims=1, name="features"),
             N("Slice", ["s", "st0", "st1"], ["b"], name="batch"),
             N("Concat", ["b", "p"], ["ns"], axis=0, name="new_shape"),
             N("Reshape", ["x", "ns"], ["r"], name="flatten"), N("Relu", ["r"], ["y"], name="relu")]
    return _model(nodes, inits, "reduceprod_flatten", ["N", 4, "H", "W"], ["N", "F"], opset), (2, 4, 3, 5)


def scaled_resize(opset):
    """torch's F.interpolate(scale_factor=2) of a dynamic H, W as older exporters write it:
    sizes = Cast(Cast(Shape(x), float) * 2, int64)."""
    inits = [_const("two", np.array(2.0, np.float32)), _const("st0", np.array([0])),
             _const("st2", np.array([2])), _const("st4", np.array([4]))]
    nodes = [N("Shape", ["x"], ["s"], name="shape"), N("Cast", ["s"], ["sf"], to=T.FLOAT, name="to_float"),
             N("Mul", ["sf", "two"], ["sf2"], name="scale"), N("Cast", ["sf2"], ["s2"], to=T.INT64, name="to_int"),
             N("Slice", ["s2", "st2", "st4"], ["hw"], name="slice_hw"),
             N("Slice", ["s", "st0", "st2"], ["nc"], name="slice_nc"),
             N("Concat", ["nc", "hw"], ["sizes"], axis=0, name="sizes"),
             ]
    _resize(opset, "x", "sizes", "y", "upsample", nodes, inits)
    return _model(nodes, inits, "scaled_resize", ["N", 4, "H", "W"], ["N", 4, "H2", "W2"], opset), (1, 4, 5, 6)


def tiled_class_token(opset):
    """A class token Tiled to the batch with repeats Concat(Shape(x)[:1], 1, 1) and
    prepended (TVM's importer: "cannot handle ShapeExpr inputs")."""
    token = np.random.default_rng(3).standard_normal((1, 1, 8)).astype(np.float32)
    inits = [_const("st0", np.array([0])), _const("st1", np.array([1])), _const("one", np.array([1])),
             _const("token", token)]
    nodes = [N("Shape", ["x"], ["s"], name="shape"), N("Slice", ["s", "st0", "st1"], ["b"], name="batch"),
             N("Concat", ["b", "one", "one"], ["rep"], axis=0, name="repeats"),
             N("Tile", ["token", "rep"], ["t"], name="tile"), N("Concat", ["t", "x"], ["y"], axis=1, name="prepend")]
    return _model(nodes, inits, "tiled_class_token", ["B", "S", 8], ["B", "S1", 8], opset), (2, 5, 8)


def range_of_size(opset):
    """Range over ReduceProd(Shape(x)), reshaped to Shape(x) and added: an index ramp as
    masks and position ids are built."""
    inits = [_const("zero", np.array(0)), _const("step", np.array(1))]
    nodes = [N("Shape", ["x"], ["s"], name="shape"), N("ReduceProd", ["s"], ["p"], keepdims=0, name="numel"),
             N("Range", ["zero", "p", "step"], ["r"], name="ramp"), N("Cast", ["r"], ["rf"], to=T.FLOAT, name="to_float"),
             N("Reshape", ["rf", "s"], ["rr"], name="as_x"), N("Add", ["x", "rr"], ["y"], name="add")]
    return _model(nodes, inits, "range_of_size", ["B", "S"], ["B", "S"], opset), (2, 7)


def same_pad(opset):
    """TensorFlow's "same" padding of a stride-2 3x3 convolution computed from the input's
    size, as TF exporters and timm's Conv2dSame write it: total = (ceil(H / 2) - 1) * 2 + 3 - H,
    split begin = total // 2, end = total - begin (TVM's importer: "cannot handle ShapeExpr
    inputs" at the Pad)."""
    weight = np.random.default_rng(4).standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3
    inits = [_const("st2", np.array([2])), _const("st4", np.array([4])), _const("one", np.array([1])),
             _const("two", np.array([2])), _const("three", np.array([3])), _const("nc0", np.array([0, 0])),
             _const("w", weight)]
    nodes = [N("Shape", ["x"], ["s"], name="shape"), N("Slice", ["s", "st2", "st4"], ["hw"], name="hw"),
             N("Add", ["hw", "one"], ["hw1"], name="hw_plus_1"), N("Div", ["hw1", "two"], ["out"], name="out_size"),
             N("Sub", ["out", "one"], ["o1"], name="o1"), N("Mul", ["o1", "two"], ["o2"], name="o2"),
             N("Add", ["o2", "three"], ["o3"], name="o3"), N("Sub", ["o3", "hw"], ["total"], name="total"),
             N("Div", ["total", "two"], ["begin"], name="begin"), N("Sub", ["total", "begin"], ["end"], name="end"),
             N("Concat", ["nc0", "begin", "nc0", "end"], ["pads"], axis=0, name="pads"),
             N("Pad", ["x", "pads"], ["p"], name="pad_same"),
             N("Conv", ["p", "w"], ["y"], strides=[2, 2], name="conv")]
    return _model(nodes, inits, "same_pad", ["N", 4, "H", "W"], ["N", 4, "H2", "W2"], opset), (1, 4, 9, 8)


BUILDERS = [reshape_chain, expand_range, resize_sizes, reduceprod_flatten, scaled_resize, tiled_class_token,
            range_of_size, same_pad]
OPSETS = (11, 13, 17, 20)


def torch_modules():
    """name -> (module, example input, dynamic_axes of ``x``): torch models whose exports
    carry shape subgraphs."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        """Heads split with x.shape; the scale (d // heads) ** -0.5 computed from it."""

        def __init__(self, d=32, heads=4):
            super().__init__()
            self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

        def forward(self, x):
            b, n, d = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = (q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5).softmax(-1)
            return self.out((a @ v).transpose(1, 2).reshape(b, n, d))

    class FPN(nn.Module):
        """A coarse map upsampled to the fine one's size and added."""

        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, stride=2, padding=1)
            self.c3 = nn.Conv2d(8, 8, 1)

        def forward(self, x):
            a = self.c1(x)
            b = self.c2(a)
            return self.c3(a + F.interpolate(b, size=(a.shape[2], a.shape[3]), mode="nearest"))

    class ClassTokenPositions(nn.Module):
        """ViT's input: a class token expanded to the batch, positions from arange."""

        def __init__(self, d=16):
            super().__init__()
            self.cls, self.pos = nn.Parameter(torch.randn(1, 1, d)), nn.Embedding(64, d)
            self.lin = nn.Linear(d, d)

        def forward(self, x):
            b, n, _ = x.shape
            t = torch.cat([self.cls.expand(b, -1, -1), x], 1)
            return self.lin(t + self.pos(torch.arange(n + 1)))

    torch.manual_seed(0)
    return {
        "attention": (Attention(), torch.randn(2, 7, 32), {0: "batch", 1: "seq"}),
        "fpn": (FPN(), torch.randn(1, 3, 16, 16), {0: "batch", 2: "height", 3: "width"}),
        "cls_positions": (ClassTokenPositions(), torch.randn(2, 9, 16), {0: "batch", 1: "seq"}),
    }


def export_torch(module, x, dynamic_axes, opset, path, dynamo=False):
    """Export ``module`` in eval mode with input ``x`` and output ``y`` to ``path``."""
    import contextlib
    import io
    import warnings

    import torch

    module.eval()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": dynamic_axes}, opset_version=opset, dynamo=dynamo)
    return onnx.load(str(path))

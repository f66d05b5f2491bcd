"""lpx.PadFromTIR, lpx.FoldPad and lpx.ConvTransposeAsConv: the rewritten modules
compute what the originals do (both built for the CPU with TVM and run on the same
data), and the pads fold exactly where the consumer's own padding means the same."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
import tvm.testing
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from lpx_tvm import pipeline
from lpx_tvm.machine.config import load_config
from lpx_tvm.relax_passes.canonicalize import canonicalize
from lpx_tvm.relax_passes.conv_transpose import ConvTransposeAsConv
from lpx_tvm.relax_passes.fold_pad import FoldPad
from lpx_tvm.relax_passes.importer import import_onnx
from lpx_tvm.relax_passes.tir_pad import PadFromTIR

RNG = np.random.default_rng(0)


def _run(mod, *args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _ops(mod) -> list:
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(e.op.name) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    return names


def _module(shape, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _const(*shape):
    return relax.const(RNG.standard_normal(shape).astype("float32"))


def _check_same(mod, new, shape):
    x = RNG.standard_normal(shape).astype("float32")
    tvm.testing.assert_allclose(_run(new, x), _run(mod, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("consumer, fill, folds", [
    ("conv", 0.0, True),
    ("conv", 1.0, False),          # a non-zero fill is not the conv's zero padding
    ("avg_include", 0.0, True),    # count_include_pad: the zeros count either way
    ("avg_own_pads", 0.0, False),  # own pads not counted: the pad's zeros would be
    ("avg_plain", 0.0, True),      # no pads of its own: it now counts the folded ones
    ("max_inf", -np.inf, True),
    ("max_relu", 0.0, True),       # zeros never beat a ReLU's output
    ("max_signed", 0.0, False),    # but they can beat negative values
    ("max_ceil", -np.inf, False),  # ceil_mode windows reach past the pads
])
def test_fold_pad_only_where_exact(consumer, fill, folds):
    shape = (1, 3, 7, 8)
    weight = _const(4, 3, 3, 3)

    def body(bb, x):
        if consumer in ("max_relu",):
            x = bb.emit(relax.op.nn.relu(x))
        p = bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, 1, 2, 2, 1], "constant", fill))
        if consumer == "conv":
            return relax.op.nn.conv2d(p, weight, strides=2, padding=(1, 0, 0, 1))
        if consumer.startswith("avg"):
            pads = (1, 1, 1, 1) if consumer == "avg_own_pads" else (0, 0, 0, 0) if consumer == "avg_plain" \
                else (1, 0, 1, 0)
            return relax.op.nn.avg_pool2d(p, (3, 3), (2, 2), pads, count_include_pad=consumer == "avg_include")
        return relax.op.nn.max_pool2d(p, (3, 3), (1, 2), (1, 0, 0, 0), ceil_mode=consumer == "max_ceil")

    mod = _module(shape, body)
    new = relax.transform.DeadCodeElimination(["main"])(FoldPad()(mod))
    assert ("relax.nn.pad" not in _ops(new)) == folds, new["main"]
    _check_same(mod, new, shape)


def _onnx_pad(mode, pads, value=None, shape=(1, 2, 5, 6)):
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads")]
    inputs = ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "v"))
        inputs.append("v")
    out = [d + pads[i] + pads[i + len(shape)] for i, d in enumerate(shape)]
    graph = helper.make_graph([helper.make_node("Pad", inputs, ["y"], mode=mode)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("mode, pads, value", [
    ("constant", [0, 0, 1, 2, 0, 0, 3, 0], 2.5),
    ("reflect", [0, 0, 2, 1, 0, 0, 1, 3], None),
    ("edge", [0, 0, 0, 2, 0, 0, 3, 1], None),
    ("constant", [0, 1, 0, 0, 1, 0, 0, 0], None),  # channels too: read back all the same
])
def test_pad_from_tir_reads_the_widths_back(mode, pads, value):
    mod = import_onnx(_onnx_pad(mode, pads, value)).mod
    assert "relax.call_tir" in _ops(mod)
    new = PadFromTIR()(mod)
    calls = [b.value for blk in new["main"].body.blocks for b in blk.bindings if isinstance(b.value, relax.Call)]
    pad = next(c for c in calls if c.op.name == "relax.nn.pad")
    befores, afters = pads[:4], pads[4:]
    assert [int(w) for w in pad.attrs.pad_width] == [w for b, a in zip(befores, afters) for w in (b, a)]
    assert str(pad.attrs.pad_mode) == {"edge": "replicate"}.get(mode, mode)  # Relax's name for edge
    assert float(pad.attrs.pad_value) == (value or 0.0)
    _check_same(mod, new, (1, 2, 5, 6))


@pytest.mark.parametrize("strides, padding, output_padding, dilation, groups", [
    ((2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 1),
    ((3, 2), (0, 1, 2, 0), (0, 1), (1, 1), 1),   # trailing zeros sliced off (after-pad < s - 1)
    ((2, 1), (0, 0, 0, 0), (0, 0), (2, 1), 2),
    ((1, 1), (1, 0, 0, 1), (0, 0), (1, 1), 4),   # depthwise, no stuffing
])
def test_conv_transpose_as_conv(strides, padding, output_padding, dilation, groups):
    shape = (1, 4, 5, 6)
    weight = _const(4, 8 // groups if groups != 4 else 1, 3, 2)

    def body(bb, x):
        return relax.op.nn.conv2d_transpose(x, weight, strides, padding, output_padding, dilation, groups)

    mod = _module(shape, body)
    new = ConvTransposeAsConv()(mod)
    assert "relax.nn.conv2d_transpose" not in _ops(new) and "relax.nn.conv2d" in _ops(new)
    _check_same(mod, new, shape)


def test_conv_transpose_crop_stays():
    """Pads beyond the kernel's reach would crop the image: left as it is."""
    mod = _module((1, 2, 5, 5), lambda bb, x: relax.op.nn.conv2d_transpose(x, _const(2, 2, 3, 3), 2, 3))
    assert "relax.nn.conv2d_transpose" in _ops(ConvTransposeAsConv()(mod))


def test_canonicalize_folds_onnx_autopad_same():
    """Conv with auto_pad=SAME_UPPER: the importer's TIR pad ends up as the conv's pads."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    node = helper.make_node("Conv", ["x", "W"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2], kernel_shape=[3, 3])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 9))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, 4, 5))], [w])
    mod = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])).mod
    new = canonicalize(mod)
    assert _ops(new) == ["relax.nn.conv2d"], new["main"]
    _check_same(mod, new, (1, 3, 8, 9))


def test_mobilenet_v2_is_one_region():
    """transformers' MobileNetV2 pads TF-style ("same") before every strided conv: all
    52 pads fold and the whole network is one LPX region (partition only)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from lpx_tvm.frontends.torch import import_torch

    torch.manual_seed(0)
    config = transformers.MobileNetV2Config(image_size=64, depth_multiplier=0.35)
    model = transformers.MobileNetV2Model(config).eval()

    class Features(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x).last_hidden_state

    imported = import_torch(Features(model).eval(), (torch.randn(1, 3, 64, 64),))
    assert _ops(imported.mod).count("relax.nn.pad") > 0
    mod = pipeline.canonicalize_model(imported.mod, "fp32")
    assert "relax.nn.pad" not in _ops(mod)
    _, report = pipeline.partition(mod, load_config("tsp"), "fp32")
    assert report.regions == 1 and not report.cpu_ops, [(op.op, op.reason) for op in report.cpu_ops]


def test_onnx_model_exported_with_pad_before_conv():
    """A torch model with an explicit ZeroPad2d before a conv and a MaxPool after a ReLU,
    exported to ONNX: the pads fold and nothing is left on the CPU."""
    torch = pytest.importorskip("torch")
    import io

    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.ZeroPad2d((0, 1, 0, 1)), torch.nn.Conv2d(3, 8, 3, 2), torch.nn.ReLU(),
                              torch.nn.ZeroPad2d(1), torch.nn.MaxPool2d(3, 2)).eval()
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.randn(1, 3, 16, 16),), buf, opset_version=13, dynamo=False)
    mod = import_onnx(onnx.load_from_string(buf.getvalue())).mod
    new = canonicalize(mod)
    assert "relax.nn.pad" not in _ops(new) and "relax.call_tir" not in _ops(new), new["main"]
    _check_same(mod, new, (1, 3, 16, 16))

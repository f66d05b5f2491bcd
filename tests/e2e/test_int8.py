"""int8 QDQ models (onnxruntime.quantization.quantize_static) on LPX against onnxruntime.

The reference is onnxruntime with every graph optimization off (ORT_DISABLE_ALL): it
runs the QDQ graph as written, float ops between DequantizeLinear and QuantizeLinear.
LPX runs the folded integer ops (int8 MXM, int32 accumulation, requantization); the
outputs must agree within one quantization step of the model's output.
"""

import subprocess
import sys

import numpy as np
import onnx
import pytest
import tvm.testing
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm
from lpx_tvm.errors import LPXError
from lpx_tvm.machine.isa import DType

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


class _Reader(quantization.CalibrationDataReader):
    def __init__(self, name, shape, samples=2, seed=1):
        rng = np.random.default_rng(seed)
        self._data = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(samples)])

    def get_next(self):
        return next(self._data, None)


def quantize(src, dst, shape, activations="u8", input_name="x"):
    """A QDQ model of ``src``: per-channel int8 weights, uint8 (u8s8) or int8 (s8s8) activations."""
    quantization.quantize_static(
        str(src), str(dst), _Reader(input_name, shape),
        quant_format=quantization.QuantFormat.QDQ,
        activation_type=quantization.QuantType.QUInt8 if activations == "u8" else quantization.QuantType.QInt8,
        weight_type=quantization.QuantType.QInt8, per_channel=True)
    return str(dst)


def ort_reference(path, feed):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feed)


def output_step(path):
    """The scale of the DequantizeLinear that produces the model's (first) output."""
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out = model.graph.output[0].name
    node = next(n for n in model.graph.node if out in n.output)
    assert node.op_type == "DequantizeLinear", node.op_type
    return float(inits[node.input[1]].reshape(-1)[0])


def mxm_dtypes(model):
    """The activation dtypes of every MXM multiply in the model's LPX programs."""
    return {ins.dtype for r in model.executable.regions.values() for ins in r.program.instrs
            if ins.op in ("mxm.mul", "mxm.mac")}


def check_against_ort(path, feed, model):
    got = list(model.run(feed).values())[0]
    want = ort_reference(path, feed)[0]
    step = output_step(path)
    # Within one output quantization step (the float values are steps of the output scale).
    tvm.testing.assert_allclose(got, want, rtol=0, atol=step * 1.001)
    return got, want, step


# ---- whole networks ------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

from torch_models import MobileNetV2, randomized, resnet18  # noqa: E402

HW = 64  # the same networks at a small image size keep the test quick


@pytest.fixture(scope="module")
def float_models(tmp_path_factory):
    out = {}
    for name, make in (("resnet18", resnet18), ("mobilenet_v2", MobileNetV2)):
        torch.manual_seed(0)
        model = randomized(make())
        path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
        torch.onnx.export(model, (torch.randn(1, 3, HW, HW),), str(path), dynamo=True, verbose=False)
        out[name] = path
    return out


@pytest.mark.parametrize("name,activations", [("resnet18", "u8"), ("mobilenet_v2", "u8"), ("resnet18", "s8")])
def test_network_matches_onnxruntime(float_models, tmp_path, name, activations):
    path = quantize(float_models[name], tmp_path / f"{name}_{activations}.onnx", (1, 3, HW, HW), activations)
    feed = {"x": np.random.default_rng(7).standard_normal((1, 3, HW, HW)).astype(np.float32)}
    model = lpx_tvm.compile_model(path, preset="tsp", precision="int8")
    check_against_ort(path, feed, model)
    report = model.report
    assert report["precision"] == "int8"
    # Every convolution ran on LPX as an int8 composite, nothing on the CPU.
    convs = sum(n.op_type == "Conv" for n in onnx.load(path).graph.node)
    assert report["offload"]["composites"]["lpx.qconv2d"] == convs
    assert report["offload"]["cpu"] == {}, report["offload"]
    assert report["offload"]["lpx"]["nn.conv2d"] == convs
    # ... on the MXM at int8 rate: int8 / uint8 activations (int8 weights, int32 accumulators).
    assert mxm_dtypes(model) == {DType.UINT8 if activations == "u8" else DType.INT8}
    assert report["mxm_dtypes"] == ["uint8" if activations == "u8" else "int8"]
    # The report measures utilization against the int8 peak.
    cfg = model.executable.config
    peak = cfg.peak_macs_per_cycle_for("int8")
    assert report["mxm_utilization"] == pytest.approx(report["macs"] / (peak * report["cycles"]))


def test_float_model_asked_for_int8_gets_a_clear_error(float_models):
    with pytest.raises(LPXError, match="needs a quantized \\(QDQ\\) model"):
        lpx_tvm.compile_model(str(float_models["resnet18"]), preset="tsp", precision="int8")


def test_cli_run_int8(float_models, tmp_path):
    path = quantize(float_models["resnet18"], tmp_path / "r18.onnx", (1, 3, HW, HW))
    feed = {"x": np.random.default_rng(9).standard_normal((1, 3, HW, HW)).astype(np.float32)}
    np.savez(tmp_path / "in.npz", **feed)
    cli = [sys.executable, "-m", "lpx_tvm.cli", "run"]
    run = subprocess.run(cli + [path, "--precision", "int8", "--inputs", str(tmp_path / "in.npz"),
                                "--outputs", str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "int8" in run.stdout
    with np.load(tmp_path / "out.npz") as out:
        got = out[out.files[0]]
    tvm.testing.assert_allclose(got, ort_reference(path, feed)[0], rtol=0, atol=output_step(path) * 1.001)
    bad = subprocess.run(cli + [str(float_models["resnet18"]), "--precision", "int8", "--inputs",
                                str(tmp_path / "in.npz")], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0
    assert "needs a quantized (QDQ) model" in bad.stdout + bad.stderr


# ---- single layers -------------------------------------------------------------------


def _float_model(nodes, inits, in_shape, out_shape):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _single(tmp_path, model, in_shape, activations="u8", shift=0.0, preset="tsp"):
    src = tmp_path / "float.onnx"
    onnx.save(model, str(src))
    path = quantize(src, tmp_path / "qdq.onnx", in_shape, activations)
    rng = np.random.default_rng(3)
    feed = {"x": (rng.standard_normal(in_shape) + shift).astype(np.float32)}
    compiled = lpx_tvm.compile_model(path, preset=preset, precision="int8")
    assert compiled.report["offload"]["cpu"] == {}, compiled.report["offload"]
    return path, feed, compiled


def _zero_point(path, dtype=np.uint8):
    """The zero point of the first activation QuantizeLinear of a QDQ model."""
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
    return int(inits[node.input[2]])


@pytest.mark.parametrize("preset", ["tsp", "mini"])
def test_conv_with_padding_and_zero_point(tmp_path, preset):
    """Padding must hold the activation's zero point (real zero), not 0."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((24, 20, 3, 3)) * np.linspace(0.2, 2.0, 24)[:, None, None, None]).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 2, 1, 0], strides=[1, 1])]
    model = _float_model(nodes, {"w": w, "b": b.astype(np.float32)}, (1, 20, 9, 10), (1, 24, 9, 10))
    path, feed, compiled = _single(tmp_path, model, (1, 20, 9, 10), shift=1.5, preset=preset)
    assert _zero_point(path) not in (0, 128)  # an asymmetric input range
    got, want, step = check_against_ort(path, feed, compiled)
    # The border pixels are where a zero-padded convolution would go wrong.
    assert np.abs(got[..., 0] - want[..., 0]).max() <= step * 1.001
    assert compiled.report["offload"]["composites"] == {"lpx.dequantize": 1, "lpx.qconv2d": 1, "lpx.quantize": 1}


def test_depthwise_and_strided_conv(tmp_path):
    rng = np.random.default_rng(1)
    dw = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    pw = rng.standard_normal((8, 16, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "dw"], ["h"], group=16, pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "pw"], ["y"])]
    model = _float_model(nodes, {"dw": dw, "pw": pw}, (1, 16, 12, 12), (1, 8, 6, 6))
    path, feed, compiled = _single(tmp_path, model, (1, 16, 12, 12), shift=-0.7)
    check_against_ort(path, feed, compiled)
    assert compiled.report["offload"]["composites"]["lpx.qconv2d"] == 2


@pytest.mark.parametrize("activations", ["u8", "s8"])
def test_gemm_per_channel(tmp_path, activations):
    """A Gemm (transB) whose output channels have scales spread over a factor 100."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((40, 70)) * np.logspace(-1, 1, 40)[:, None]).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
    model = _float_model(nodes, {"w": w, "b": b}, (6, 70), (6, 40))
    path, feed, compiled = _single(tmp_path, model, (6, 70), activations, shift=0.3)
    scales = [numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer if i.name.endswith("w_scale")]
    assert scales and scales[0].size == 40 and scales[0].max() > 20 * scales[0].min()
    check_against_ort(path, feed, compiled)
    assert compiled.report["offload"]["composites"]["lpx.qdense"] == 1


def test_matmul_add_maxpool(tmp_path):
    """MatMul with a constant weight, a residual Add of two quantized tensors, MaxPool."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["s"]),
             helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"])]
    inits = {"w": w, "shape": np.array([1, 8 * 5 * 5], np.int64),
             "m": rng.standard_normal((200, 12)).astype(np.float32)}
    model = _float_model(nodes, inits, (1, 8, 10, 10), (1, 12))
    src = tmp_path / "float.onnx"
    onnx.save(model, str(src))
    path = quantize(src, tmp_path / "qdq.onnx", (1, 8, 10, 10))
    feed = {"x": np.random.default_rng(3).standard_normal((1, 8, 10, 10)).astype(np.float32)}
    compiled = lpx_tvm.compile_model(path, preset="tsp", precision="int8")
    comps = compiled.report["offload"]["composites"]
    assert comps["lpx.qadd"] == 1 and comps["lpx.qmax_pool2d"] == 1 and comps["lpx.qconv2d"] == 1
    check_against_ort(path, feed, compiled)
    # The flatten of a 4-D value with pixels moves data between lanes: it stays on the CPU
    # (on uint8 values) and the matmul after it still runs on LPX.
    assert set(compiled.report["offload"]["cpu"]) <= {"reshape"}
    assert comps["lpx.qdense"] == 1


def test_artifact_round_trip(tmp_path):
    """An int8 model saved as an artifact (with its im2col stem input) runs the same after loading."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 3, 5, 5)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[2, 2, 2, 2], strides=[2, 2])]
    model = _float_model(nodes, {"w": w}, (1, 3, 16, 16), (1, 16, 8, 8))
    path, feed, compiled = _single(tmp_path, model, (1, 3, 16, 16), shift=0.4)
    assert compiled.executable.regions and all(r.input_transforms for r in compiled.executable.regions.values())
    got, _, _ = check_against_ort(path, feed, compiled)
    compiled.save(str(tmp_path / "artifact"))
    loaded = lpx_tvm.load(str(tmp_path / "artifact"))
    np.testing.assert_array_equal(list(loaded.run(feed).values())[0], got)
    assert loaded.report["precision"] == "int8" and loaded.report["mxm_dtypes"] == ["uint8"]


def test_fold_qdq_integer_graph_runs_on_cpu(tmp_path):
    """lpx.FoldQDQ alone: the folded module holds int8 weights, int32 convolutions and no
    float convolution, and TVM's CPU code of it computes what onnxruntime does."""
    import tvm
    from tvm import relax

    from lpx_tvm.relax_passes import canonicalize, import_onnx
    from lpx_tvm.relax_passes.qdq import FoldQDQ

    rng = np.random.default_rng(6)
    w = rng.standard_normal((12, 6, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = _float_model(nodes, {"w": w, "b": rng.standard_normal(12).astype(np.float32)}, (1, 6, 7, 7),
                         (1, 12, 7, 7))
    onnx.save(model, str(tmp_path / "float.onnx"))
    path = quantize(tmp_path / "float.onnx", tmp_path / "qdq.onnx", (1, 6, 7, 7))
    mod = canonicalize(FoldQDQ(import_onnx(path).mod))
    convs = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: convs.append(e) if isinstance(e, relax.Call)
                                    and getattr(e.op, "name", "") == "relax.nn.conv2d" else None)
    assert len(convs) == 1
    assert convs[0].args[1].ty.dtype == "int8" and convs[0].ty.dtype == "int32"
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    x = rng.standard_normal((1, 6, 7, 7)).astype(np.float32) + 0.5
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    tvm.testing.assert_allclose(got, ort_reference(path, {"x": x})[0], rtol=0, atol=output_step(path) * 1.001)

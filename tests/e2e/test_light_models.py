"""The nine "light" ImageNet models bundled with onnx (onnx/backend/test/data/light) on tsp.

Run time: these tests compile and simulate whole 224x224 models, about 2.5 minutes for
the module on one core (DenseNet-121 alone takes about 35 s); they carry the ``slow``
marker (``pytest -m "not slow"`` leaves them out).

The models' weights are ConstantOfShape subgraphs (every weight 0.02) and the bundled
expected output comes from onnx's backend test runner, which feeds
``arange(n).reshape(shape) / n`` as float32 (``generate_dummy_data(random=False)``). The
expected output of most of them is the softmax of 1000 equal logits (0.001 everywhere),
which says little about the network, so the softmax input is also exposed as a graph
output and compared with onnxruntime on the same input.

Precision: activations of constant-weight networks grow layer by layer. fp16 (max 65504)
holds those of DenseNet-121 (max 616), Inception-v2 (1521) and ShuffleNet (15). The
others overflow it (VGG-19 reaches 3.7e31), so they run in fp32, which also checks their
logits tightly; VGG-19 runs in bf16, because in fp32 its 224x224x64 activations (one
320-lane vector per pixel, 4 bytes a lane) do not fit the SRAM together.

SqueezeNet and ShuffleNet also run on ``mini``, whose 512 KiB of SRAM holds neither
model's activations: their regions keep activations in off-chip memory and run each op
by bands of image rows (docs/compiler.md, "Activations off chip").
"""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper, shape_inference

import lpx_tvm
from onnx_macs import cpu_mxm_macs, mxm_macs

pytestmark = pytest.mark.slow

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

# model -> (precision, rtol of the expected output, rtol of the logits vs onnxruntime)
MODELS = {
    "bvlc_alexnet": ("fp32", 1e-3, 1e-4),
    "densenet121": ("fp16", 2e-3, 2e-3),
    "inception_v1": ("fp32", 1e-3, 1e-4),
    "inception_v2": ("fp16", 2e-3, 2e-3),
    "resnet50": ("fp32", 1e-3, 1e-4),
    "shufflenet": ("fp16", 2e-3, 2e-3),
    "squeezenet": ("fp32", 1e-3, 1e-4),
    # bf16 keeps 8 mantissa bits: two ulps on the output, and its rounding of the
    # all-equal activations adds up over the 19 layers (about 2% on the logits).
    "vgg19": ("bf16", 2 ** -6, 5e-2),
    "zfnet512": ("fp32", 1e-3, 1e-4),
}


def runner_input(model: onnx.ModelProto) -> tuple:
    """(name, array) of the input onnx's backend runner feeds a light model."""
    inits = {i.name for i in model.graph.initializer}
    x = next(i for i in model.graph.input if i.name not in inits)
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return x.name, (np.arange(n).reshape(shape) / n).astype(np.float32)


def expose_logits(model: onnx.ModelProto) -> "str | None":
    """Add the input of a final Softmax as a graph output; its name, or None."""
    out = model.graph.output[0].name
    last = next(n for n in model.graph.node if out in n.output)
    if last.op_type != "Softmax":
        return None
    inferred = shape_inference.infer_shapes(model)
    model.graph.output.append(next(v for v in inferred.graph.value_info if v.name == last.input[0]))
    return last.input[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_light_model_on_tsp(name):
    check_light_model(name, "tsp", *MODELS[name])


# mini's 512 KiB of SRAM holds neither model's activations (SqueezeNet's first
# convolution alone outputs 3 MiB in fp32): their regions keep activations off chip and
# run by bands, and their weights mostly stream.
@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_light_model_on_mini(name):
    check_light_model(name, "mini", *MODELS[name])


def check_light_model(name, preset, precision, rtol, logits_rtol):
    model = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    expected = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    x_name, x = runner_input(model)
    logits = expose_logits(model)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {x_name: x})

    compiled = lpx_tvm.compile_model(model, preset=preset, precision=precision)
    got = compiled.run({x_name: x})
    out = model.graph.output[0].name
    # The softmax of logits this large (SqueezeNet's reach 1e10) turns one rounding step
    # of the largest into a different output: fp32 sums in another order (16-lane tiles
    # on mini, reductions split across planes) make equal logits unequal by an ulp.
    # There only the logits are compared.
    if logits is None or np.spacing(np.abs(want[1]).max()) < rtol:
        np.testing.assert_allclose(got[out], expected, rtol=rtol, atol=1e-7)
    if logits is not None:
        err = np.abs(got[logits] - want[1]).max() / np.abs(want[1]).max()
        assert err < logits_rtol, f"logits: max error {err:.2e} of their largest magnitude"

    report = compiled.report
    per_op = mxm_macs(model)
    cpu = cpu_mxm_macs(per_op, report["offload"]["cpu"])
    # LPX counts useful MACs of every call (global average pooling adds a few).
    assert report["macs"] >= sum(map(sum, per_op.values())) - cpu
    assert report["macs"] / (report["macs"] + cpu) >= 0.95, report["offload"]["reasons"]

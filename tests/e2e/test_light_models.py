"""The nine "light" ImageNet models bundled with onnx (onnx/backend/test/data/light) on tsp.

Run time: these tests compile and simulate whole 224x224 models, about 2.5 minutes for
the module on one idle core, 5 on a busy one (the two mini runs take half of it); the
random weights and the onnxruntime reference add 1 to 5 s a model (VGG-19 has 140 M
weights). They carry the ``slow`` marker (``pytest -m "not slow"`` leaves them out).

The bundled models' weights are ConstantOfShape subgraphs (every weight 0.02): their
1,000 logits are equal and their softmax is 0.001 whatever the network computes. Each
test runs the bundled graph with those constants replaced by seeded random values
(``lpx_tvm.light_models.with_random_weights``), its softmax input exposed as a second
output, and compares outputs and logits with onnxruntime on a seeded standard-normal
input, at the tolerances of ``compare_outputs`` (the demo's: a flipped kernel fails them).
DenseNet-121 ends in a convolution, not a softmax: its one output is its logits.

Precision: five models run in fp32 (logits within 1e-4), DenseNet-121, Inception-v2 and
ShuffleNet in fp16 (the default), VGG-19 in bf16, because in fp32 its 224x224x64
activations (one 320-lane vector per pixel, 4 bytes a lane) do not fit the SRAM together.

SqueezeNet and ShuffleNet also run on ``mini``, whose 512 KiB of SRAM holds neither
model's activations: their regions keep activations in off-chip memory and run each op
by bands of image rows (docs/compiler.md, "Activations off chip").
"""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import lpx_tvm
from lpx_tvm.light_models import compare_outputs, expose_logits, with_random_weights
from onnx_macs import cpu_mxm_macs, mxm_macs

pytestmark = pytest.mark.slow

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

MODELS = {
    "bvlc_alexnet": "fp32",
    "densenet121": "fp16",
    "inception_v1": "fp32",
    "inception_v2": "fp16",
    "resnet50": "fp32",
    "shufflenet": "fp16",
    "squeezenet": "fp32",
    "vgg19": "bf16",
    "zfnet512": "fp32",
}


@pytest.mark.parametrize("name", list(MODELS))
def test_light_model_on_tsp(name):
    check_light_model(name, "tsp", MODELS[name])


# mini's 512 KiB of SRAM holds neither model's activations (SqueezeNet's first
# convolution alone outputs 3 MiB in fp32): their regions keep activations off chip and
# run by bands, and their weights mostly stream.
@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_light_model_on_mini(name):
    check_light_model(name, "mini", MODELS[name])


def check_light_model(name, preset, precision):
    bundled = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    model = with_random_weights(bundled, seed=0)
    logits = expose_logits(model)
    compiled = lpx_tvm.compile_model(model, preset=preset, precision=precision)
    x_name, shape, dtype = compiled.inputs[0]
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    got = compiled.run({x_name: x})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {x_name: x})))
    if logits is not None:  # the logits differ clearly: a wrong answer is visible
        assert np.std(want[logits]) > 1.0
    errors = compare_outputs(got, want, precision, logits)
    print(name, preset, precision, {k: f"{e:.2e} (tolerance {t:.1e})" for k, (e, t) in errors.items()})
    assert all(e <= t for e, t in errors.values()), errors

    report = compiled.report
    per_op = mxm_macs(bundled)  # the same shapes, without VGG-19's 560 MB of weights
    cpu = cpu_mxm_macs(per_op, report["offload"]["cpu"])
    # LPX counts useful MACs of every call (global average pooling adds a few).
    assert report["macs"] >= sum(map(sum, per_op.values())) - cpu
    assert report["macs"] / (report["macs"] + cpu) >= 0.95, report["offload"]["reasons"]

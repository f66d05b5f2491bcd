"""BERT-tiny, GPT-2 tiny and BERT-base from ``transformers`` configs (random weights, no
download), exported to ONNX with ``torch.onnx.export(dynamo=True)``, compiled for tsp
and compared with onnxruntime: fp32 within rtol/atol 1e-4, fp16 within a relative L2
error of 1e-2, with at least 90% of the MACs on LPX."""

import numpy as np
import pytest
import tvm.testing

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import lpx_tvm  # noqa: E402
from onnx_macs import cpu_mxm_macs, mxm_macs  # noqa: E402
from transformer_models import LastHiddenState, bert, gpt2  # noqa: E402

VOCAB = 1000


MODELS = {  # name: (builder, hidden, layers, heads, sequence length)
    "bert_tiny": (bert, 128, 2, 2, 64),
    "gpt2_tiny": (gpt2, 128, 2, 2, 64),
    "bert_base": (bert, 768, 12, 12, 128),
}


@pytest.fixture(scope="module", params=list(MODELS))
def exported(request, tmp_path_factory):
    make, hidden, layers, heads, seq = MODELS[request.param]
    torch.manual_seed(0)
    model = LastHiddenState(make(hidden, layers, heads)).eval()
    ids = torch.randint(0, VOCAB, (1, seq))
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.onnx"
    torch.onnx.export(model, (ids,), str(path), dynamo=True, input_names=["input_ids"],
                      output_names=["last_hidden_state"], verbose=False)
    feed = {"input_ids": ids.numpy()}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    return request.param, str(path), feed, want


def _check_macs(path, report):
    per_op = mxm_macs(onnx.load(path))
    cpu = cpu_mxm_macs(per_op, report["offload"]["cpu"])
    total = sum(map(sum, per_op.values()))
    assert report["macs"] >= total - cpu
    assert report["macs"] / (report["macs"] + cpu) >= 0.9, report["offload"]["reasons"]
    # Every matmul, the attention's included, runs on LPX; only the embedding lookup and
    # its int64 index arithmetic stay on the CPU.
    assert set(report["offload"]["cpu"]) <= {"take", "less", "add", "where", "reshape"}, report["offload"]


def test_fp32_matches_onnxruntime(exported):
    name, path, feed, want = exported
    model = lpx_tvm.compile_model(path, preset="tsp", precision="fp32")
    got = model.run(feed)["last_hidden_state"]
    tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    _check_macs(path, model.report)
    lpx = model.report["offload"]["lpx"]
    assert {"matmul", "nn.softmax", "nn.layer_norm"} <= set(lpx), lpx


def test_fp16_within_relative_l2(exported):
    name, path, feed, want = exported
    model = lpx_tvm.compile_model(path, preset="tsp", precision="fp16")
    got = model.run(feed)["last_hidden_state"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    _check_macs(path, model.report)

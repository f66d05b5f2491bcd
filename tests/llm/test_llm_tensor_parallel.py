"""Decoders over chips of a system by tensor parallelism: each chip's programs hold its
share of the heads and the MLP and sum o's and down's partial products over the links
inside the program (docs/multichip.md). In fp32 the chips generate transformers' greedy
tokens, as one chip does; every chip chooses the same token."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.errors import LPXError  # noqa: E402
from lpx_tvm.relax_passes.errors import ModelError  # noqa: E402

from decoder_models import random_decoder as _model, rel_err, torch_logits as _torch_logits  # noqa: E402


@pytest.mark.parametrize("kind, chips", [("llama", (0, 1, 2)), ("gpt2", (4, 6))])
def test_tensor_parallel_tokens_equal_transformers(kind, chips):
    model = _model(kind, 3, 2.0 if kind == "llama" else 4.0)
    ids = np.random.default_rng(1).integers(0, 320, (1, 13))
    session = lpx_tvm.compile_llm(model, precision="fp32", max_context=32, system="groqnode", chips=chips)
    tokens, logits = session.generate(ids, 10, return_logits=True)
    want = model.generate(torch.as_tensor(ids), max_new_tokens=10, do_sample=False)[:, 13:].numpy()
    np.testing.assert_array_equal(tokens, want)
    ref = _torch_logits(model, session.spec, ids, tokens)
    errs = [rel_err(logits[k], ref[k]) for k in range(len(ref))]
    assert max(errs) < 1e-5, errs  # fp32: only the sums' order differs
    rep = session.report
    assert rep["tensor_parallel"] == len(chips) and rep["chips"] == list(chips)
    # two all-reduces a layer, each moving 2 (N - 1) / N of one token's hidden state out of every chip
    assert rep["link_bytes_per_token"] > 0 and rep["decode_cycles_per_token"] > 2 * 2 * 450


def test_tensor_parallel_refusals():
    model = _model("llama", 3, 2.0)
    with pytest.raises(ModelError, match="whole key/value heads"):
        lpx_tvm.compile_llm(model, precision="fp32", max_context=32, system="groqnode", chips=(0, 1))
    with pytest.raises(LPXError, match="expected distinct chips of system groqnode"):
        lpx_tvm.compile_llm(model, precision="fp32", max_context=32, system="groqnode", chips=(0, 9, 1))
    with pytest.raises(LPXError, match="the MXM of tsp does not multiply fp8"):
        lpx_tvm.compile_llm(model, precision="fp8", max_context=32, system="groqnode", chips=(0, 1, 2))


def test_lm_head_split_by_vocabulary():
    """Each chip of 3 holds its third of the 320 tokens' head rows, and the zeros where
    the other chips' logits go, so that the all-reduce of the logits assembles them."""
    from lpx_tvm.frontends import decoders

    model = _model("llama", 3, 2.0)
    spec = decoders.spec_of(model, 32)
    full = model.lm_head.weight.detach()
    for rank, (lo, hi) in enumerate([(0, 106), (106, 213), (213, 320)]):
        step = decoders.decoder_step(model, spec, 1, shard=decoders.TensorShard(rank, 3))
        assert torch.equal(step.lm_head_weight, full[lo:hi])
        widths = [getattr(step, n).shape[1] for n in ("head_before", "head_after") if hasattr(step, n)]
        assert sum(widths) + (hi - lo) == 320 and (lo == 0) == (not hasattr(step, "head_before"))

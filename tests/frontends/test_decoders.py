"""The decoder steps of lpx_tvm.frontends.decoders against the transformers model they
are rebuilt from: the greedy tokens of their loop equal model.generate's, and each
step's logits the model's forward."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lpx_tvm.relax_passes.errors import ModelError  # noqa: E402
from lpx_tvm.frontends import decoders  # noqa: E402

SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=128)


def _model(kind, seed=0, **extra):
    torch.manual_seed(seed)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**SMALL, num_key_value_heads=2, **extra)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**SMALL, num_key_value_heads=2, **extra)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128, **extra)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.MistralConfig(**SMALL, num_key_value_heads=1, sliding_window=None, **extra)
        model = transformers.MistralForCausalLM(cfg)
    model.eval()
    # Larger weights than the initializer's: the logits then differ clearly between tokens,
    # so a wrong step picks other tokens rather than the same ones by luck.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


def _hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n, pad_token_id=0)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("kind, batch", [("llama", 1), ("llama", 2), ("qwen2", 1), ("mistral", 1), ("gpt2", 1), ("gpt2", 3)])
def test_greedy_tokens_equal_generate(kind, batch):
    model = _model(kind)
    torch.manual_seed(1)
    ids = torch.randint(0, SMALL["vocab_size"], (batch, 5))
    prefill, decode, spec = decoders.decoder_steps(model, max_context=16, prompt_len=5, batch=batch)
    got = decoders.generate(prefill, decode, spec, ids, 8)
    want = _hf_greedy(model, ids, 8)
    assert len(set(want.reshape(-1).tolist())) > 2  # the tokens vary: the check can fail
    assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("rope_scaling", [{"rope_type": "linear", "factor": 2.0},
                                          {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 32}])
def test_step_logits_equal_forward(rope_scaling):
    model = _model("llama", seed=2, rope_scaling=rope_scaling)
    torch.manual_seed(3)
    ids = torch.randint(0, SMALL["vocab_size"], (1, 7))
    prefill, decode, spec = decoders.decoder_steps(model, max_context=12, prompt_len=6)
    with torch.no_grad():
        want = model(ids).logits[0]  # [7, V]: the logits after every prefix
        _, _, *caches = decoders.example_inputs(spec, 6)
        _, logits, *caches = prefill(ids[0, :6].int(), torch.zeros(1, dtype=torch.int32), *caches)
        np.testing.assert_allclose(logits[0].numpy(), want[5].numpy(), rtol=1e-4, atol=1e-4)
        _, logits, *caches = decode(ids[0, 6:7].int(), torch.tensor([6], dtype=torch.int32), *caches)
        np.testing.assert_allclose(logits[0].numpy(), want[6].numpy(), rtol=1e-4, atol=1e-4)
    # A key cache is K^T: a column per position; a value cache a row, its pack of kv heads
    # side by side. Those past the position are untouched (zeros), the written ones are not.
    named = dict(zip(spec.cache_names, caches))
    keys, values = named["k_cache_0_0"], named["v_cache_0_0"]
    (_, pack), = spec.value_packs  # 320 lanes hold every kv head of 64 values
    assert pack == spec.kv_heads > 1 and len(caches) == spec.layers * (spec.kv_heads + 1)
    assert keys.shape == (spec.head_dim, 12) and values.shape == (12, pack * spec.head_dim)
    assert torch.count_nonzero(keys[:, 7:]) == 0 and torch.count_nonzero(values[7:]) == 0
    assert all(torch.count_nonzero(keys[:, j]) > 0 and torch.count_nonzero(values[j]) > 0 for j in range(7))


def test_a_long_context_shares_one_rope_table_and_keeps_the_logits():
    """At 2k positions or more RoPE's cos and signed sin are one table, side by side in a
    row (gathered once, cut by lane slices): the steps' logits still equal the model's."""
    torch.manual_seed(4)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{**SMALL, "max_position_embeddings": 2048}, num_key_value_heads=2)).eval()
    with torch.no_grad():  # (as _model: logits that differ clearly between tokens)
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    torch.manual_seed(5)
    ids = torch.randint(0, SMALL["vocab_size"], (1, 7))
    prefill, decode, spec = decoders.decoder_steps(model, max_context=2048, prompt_len=6)
    assert spec.rope_tables_shared and hasattr(decode, "cos_sin") and not hasattr(decode, "cos")
    with torch.no_grad():
        want = model(ids).logits[0]
        _, _, *caches = decoders.example_inputs(spec, 6)
        _, logits, *caches = prefill(ids[0, :6].int(), torch.zeros(1, dtype=torch.int32), *caches)
        np.testing.assert_allclose(logits[0].numpy(), want[5].numpy(), rtol=1e-4, atol=1e-4)
        _, logits, *caches = decode(ids[0, 6:7].int(), torch.tensor([6], dtype=torch.int32), *caches)
        np.testing.assert_allclose(logits[0].numpy(), want[6].numpy(), rtol=1e-4, atol=1e-4)


def test_steps_export():
    model = _model("qwen2", seed=4)
    prefill, decode, spec = decoders.decoder_steps(model, max_context=16, prompt_len=4)
    for step, t in ((prefill, 4), (decode, 1)):
        args = decoders.example_inputs(spec, t)
        exported = torch.export.export(step, args)
        ops = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
        assert any("index_put" in o for o in ops), ops
        dtypes = {n.meta["val"].dtype for n in exported.graph.nodes if n.op == "placeholder"}
        assert torch.int64 not in dtypes and torch.int32 in dtypes, dtypes  # int32 indices throughout


def test_refusals():
    with pytest.raises(ModelError, match="sliding_window 8 < max_context 16"):
        torch.manual_seed(0)
        cfg = transformers.MistralConfig(**SMALL, num_key_value_heads=1, sliding_window=8)
        decoders.decoder_steps(transformers.MistralForCausalLM(cfg), 16, 4)
    with pytest.raises(ModelError, match="family 'bert'"):
        cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=128,
                                      intermediate_size=128, is_decoder=True)
        decoders.decoder_steps(transformers.BertLMHeadModel(cfg), 16, 4)
    with pytest.raises(ModelError, match="max_position_embeddings"):
        decoders.decoder_steps(_model("llama"), 256, 4)
    with pytest.raises(ModelError, match="no room"):
        decoders.decoder_steps(_model("llama"), 8, 8)


@pytest.mark.parametrize("units, padded", [(2816, 2880), (3584, 3584), (640, 640), (100, 100), (200, 320)])
def test_gate_padded_to_whole_tiles_only_where_it_costs_no_tile(units, padded):
    """2 x 2,816 outputs and 2,880 + 2,816 are 18 lane tiles of 320: gate padded, so up
    starts on a tile. 2 x 3,584 are 23 tiles, 3,840 + 3,584 would be 24: not padded. The
    projection's outputs are gate's, zeros, then up's, and its bias likewise."""
    gate, up = torch.randn(units, 8), torch.randn(units, 8)
    gate_bias, up_bias = torch.randn(units), torch.randn(units)
    fused = decoders._fused(dict(gate=gate, up=up, gate_bias=gate_bias, up_bias=up_bias), 320)
    assert fused["gate_up"].shape == (padded + units, 8)
    assert torch.equal(fused["gate_up"][:units], gate) and torch.equal(fused["gate_up"][-units:], up)
    assert not fused["gate_up"][units:padded].any() and not fused["gate_up_bias"][units:padded].any()
    assert torch.equal(fused["gate_up_bias"][-units:], up_bias)

"""Published decoder configs (the config.json of Llama-3.1-8B, Llama-3.2-1B, Qwen2.5-7B,
Mistral-7B and GPT-2, every field as served) compile to steps whose greedy tokens equal
transformers' own, scaled down in sizes only; whole, they are accepted and sized as
published."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.frontends import decoders  # noqa: E402
from lpx_tvm.frontends.decoder_config import check_decoder_config  # noqa: E402
from lpx_tvm.llm.capacity import plan  # noqa: E402
from lpx_tvm.llm.session import load_decoder  # noqa: E402
from lpx_tvm.relax_passes.errors import ModelError  # noqa: E402

from published_configs import PUBLISHED, SCALED, scaled  # noqa: E402

PROMPT, NEW, CONTEXT = 13, 32, 48


def _config_file(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return str(path)


def _hf_greedy(model, ids, n):
    """transformers' greedy tokens, never stopped early: the steps do not stop at eos."""
    gen = transformers.GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, bos_token_id=None,
                                        pad_token_id=0)
    with torch.no_grad():
        out = model.generate(torch.as_tensor(ids), generation_config=gen)[:, ids.shape[1]:].numpy()
    assert out.shape == (ids.shape[0], n)
    return out


def _published_shape(config: dict) -> tuple:
    """(layers, heads, kv heads, head dim, hidden, vocab) as the config states them."""
    if config["model_type"] == "gpt2":
        h, heads = config["n_embd"], config["n_head"]
        return config["n_layer"], heads, heads, h // heads, h, config["vocab_size"]
    h, heads = config["hidden_size"], config["num_attention_heads"]
    return (config["num_hidden_layers"], heads, config.get("num_key_value_heads", heads),
            config.get("head_dim", h // heads), h, config["vocab_size"])


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_whole_published_config_is_accepted_as_published(name, tmp_path):
    """The full-size config.json, read from a file, builds (shapes only) the model it
    states: nothing refused, nothing re-sized."""
    config = PUBLISHED[name]
    check_decoder_config(config)
    with torch.device("meta"):
        model = load_decoder(_config_file(tmp_path, config))
    spec = decoders.spec_of(model, CONTEXT)
    assert (spec.layers, spec.heads, spec.kv_heads, spec.head_dim, spec.hidden, spec.vocab) == _published_shape(config)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == config.get("tie_word_embeddings", True)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_scaled_published_config_tokens_equal_transformers(name, tmp_path):
    """The published fields at a small size: the model read from a config.json (the CLI's
    route) is the one the dict builds, and LPX's fp32 greedy tokens equal transformers'
    greedy generate on it."""
    config = scaled(PUBLISHED[name], *SCALED[name])
    model = load_decoder(_config_file(tmp_path, config))
    same = load_decoder(config)
    for (key, a), (_, b) in zip(model.state_dict().items(), same.state_dict().items()):
        assert a.dtype == torch.float32 and torch.equal(a, b), key  # bfloat16 checkpoints: random fp32 weights
    if config["model_type"] != "gpt2":
        assert model.config.rope_parameters["rope_type"] == config.get("rope_scaling", {}).get("rope_type", "default")
    # Larger weights than the initializer's (as decoder_models.random_decoder): the
    # logits then differ clearly between tokens, so a wrong step picks other tokens.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    ids = np.random.default_rng(1).integers(0, config["vocab_size"], (1, PROMPT))
    session = lpx_tvm.compile_llm(model, preset="tsp", precision="fp32", max_context=CONTEXT)
    got = session.generate(ids, NEW)
    want = _hf_greedy(model, ids, NEW)
    assert len(set(want.ravel().tolist())) > 4  # the tokens vary: the check can fail
    np.testing.assert_array_equal(got, want)


def test_config_path_compiles_as_published(tmp_path):
    """compile_llm given the config.json itself, random weights as they come."""
    config = scaled(PUBLISHED["Llama-3.1-8B"], *SCALED["Llama-3.1-8B"])
    session = lpx_tvm.compile_llm(_config_file(tmp_path, config), preset="tsp", precision="fp32",
                                  max_context=CONTEXT)
    ids = np.random.default_rng(2).integers(0, config["vocab_size"], (1, PROMPT))
    got, logits = session.generate(ids, NEW, return_logits=True)
    want = _hf_greedy(session.model, ids, NEW)
    top2 = np.sort(logits[:, 0], axis=-1)[:, -2:]
    # Ties closer than fp32's error would make the comparison a coin flip: there are none.
    assert ((top2[:, 1] - top2[:, 0]) > 1e-5 * np.abs(logits).max()).all()
    assert len(set(want.ravel().tolist())) > 4
    np.testing.assert_array_equal(got, want)


def test_mistral_window_wider_than_the_context_is_accepted():
    """Mistral-7B's sliding window of 4,096: any context up to it attends to the whole
    cache, as the steps do; a longer one is refused naming the window."""
    with torch.device("meta"):
        model = load_decoder(PUBLISHED["Mistral-7B-v0.1"])
    assert decoders.spec_of(model, 4096).max_context == 4096
    with pytest.raises(ModelError, match="sliding_window 4096 < max_context 4097"):
        decoders.spec_of(model, 4097)


def test_qwen2_config_plans(tmp_path):
    """The planner samples 2- and 4-layer models of a Qwen2 config, whose layer_types
    transformers fills per layer: each sample keeps them in step (with_layers). For a
    model of 4 layers the 4-layer sample is the model itself, so the prediction is the
    whole model's simulated cycles."""
    config = dict(scaled(PUBLISHED["Qwen2.5-7B"], *SCALED["Qwen2.5-7B"]), num_hidden_layers=4)
    assert len(load_decoder(config).config.layer_types) == 4
    sized = plan(_config_file(tmp_path, config), "groqnode", precision="fp32", context=32, prompt_len=9,
                 tensor_parallel=[1], pipeline=[1, 4], simulate=False)
    assert {(m.tensor_parallel, m.pipeline_stages) for m in sized.mappings} == {(1, 1), (1, 4)}
    assert all(m.fits for m in sized.mappings)
    (m,) = plan(config, "groqnode", precision="fp32", context=32, prompt_len=9, tensor_parallel=[1],
                pipeline=[1]).mappings
    assert m.decode_cycles_per_token == lpx_tvm.compile_llm(config, preset="tsp", precision="fp32",
                                                             max_context=32).decode.cycles

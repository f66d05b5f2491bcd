"""Decoder configs checked before any model is built: each malformed or unsupported field
is refused in one ModelError line naming the key, and the fields the steps honour give
transformers' own greedy tokens."""

import json
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.frontends import decoder_config, decoders  # noqa: E402
from lpx_tvm.frontends.decoder_config import check_decoder_config, with_layers  # noqa: E402
from lpx_tvm.llm.session import load_decoder  # noqa: E402
from lpx_tvm.relax_passes.errors import ModelError  # noqa: E402

from published_configs import PUBLISHED, SCALED, scaled  # noqa: E402

LLAMA = scaled(PUBLISHED["Llama-3.1-8B"], *SCALED["Llama-3.1-8B"])
QWEN2 = scaled(PUBLISHED["Qwen2.5-7B"], *SCALED["Qwen2.5-7B"])
GPT2 = scaled(PUBLISHED["gpt2"], *SCALED["gpt2"])
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 4096}

# (id, base config, fields changed, what the message must name)
BAD = [
    ("layers-string", LLAMA, dict(num_hidden_layers="2"), "num_hidden_layers '2' is a string"),
    ("layers-zero", LLAMA, dict(num_hidden_layers=0), "num_hidden_layers 0"),
    ("layers-null", LLAMA, dict(num_hidden_layers=None), "num_hidden_layers is null"),
    ("layers-float", LLAMA, dict(num_hidden_layers=2.0), "num_hidden_layers 2.0 is a number"),
    ("hidden-list", LLAMA, dict(hidden_size=[128]), "hidden_size [128] is a list"),
    ("intermediate-zero", LLAMA, dict(intermediate_size=0), "intermediate_size 0"),
    ("kv-heads-zero", LLAMA, dict(num_key_value_heads=0), "num_key_value_heads 0"),
    ("kv-heads-bool", LLAMA, dict(num_key_value_heads=True), "num_key_value_heads True is a boolean"),
    ("kv-heads-not-a-divisor", LLAMA, dict(num_key_value_heads=3), "num_key_value_heads 3 does not divide"),
    ("heads-zero", LLAMA, dict(num_attention_heads=0), "num_attention_heads 0"),
    ("hidden-not-divisible", LLAMA, dict(hidden_size=130), "hidden_size 130 is not a multiple"),
    ("head-dim-odd", LLAMA, dict(head_dim=15), "head_dim 15 is odd"),
    ("head-dim-derived-odd", LLAMA, dict(hidden_size=72), "head_dim 9 (hidden_size 72"),
    ("head-dim-zero", LLAMA, dict(head_dim=0), "head_dim 0"),
    ("vocab-zero", LLAMA, dict(vocab_size=0), "vocab_size 0"),
    ("vocab-negative", LLAMA, dict(vocab_size=-3), "vocab_size -3"),
    ("vocab-huge", LLAMA, dict(vocab_size=10**9), "vocab_size 1,000,000,000) needs"),
    ("eps-zero", LLAMA, dict(rms_norm_eps=0), "rms_norm_eps 0"),
    ("eps-nan", LLAMA, dict(rms_norm_eps=math.nan), "rms_norm_eps nan"),
    ("theta-string", LLAMA, dict(rope_theta="1e6"), "rope_theta '1e6' is a string"),
    ("rope-unknown", LLAMA, dict(rope_scaling={"rope_type": "foo", "factor": 2.0}), "rope_type 'foo': unknown"),
    ("rope-longrope", LLAMA, dict(rope_scaling=LONGROPE), "rope_type 'longrope'"),
    ("rope-no-factor", LLAMA, dict(rope_scaling={"rope_type": "linear"}), "rope_type 'linear' needs factor"),
    ("rope-llama3-partial", LLAMA, dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
     "rope_type 'llama3' needs low_freq_factor"),
    ("rope-factor-string", LLAMA, dict(rope_scaling={"rope_type": "linear", "factor": "2"}), "factor '2'"),
    ("rope-list", LLAMA, dict(rope_scaling=["linear"]), "rope_scaling ['linear'] is a list"),
    ("partial-rotary", LLAMA, dict(partial_rotary_factor=0.5), "partial_rotary_factor 0.5"),
    ("attention-bias", LLAMA, dict(attention_bias=True), "attention_bias True"),
    ("mlp-bias", LLAMA, dict(mlp_bias=True), "mlp_bias True"),
    ("tie-string", LLAMA, dict(tie_word_embeddings="yes"), "tie_word_embeddings 'yes'"),
    ("hidden-act", LLAMA, dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    ("pad-beyond-vocab", LLAMA, dict(pad_token_id=448), "pad_token_id 448"),
    ("eos-string", LLAMA, dict(eos_token_id="</s>"), "eos_token_id '</s>'"),
    ("family", LLAMA, dict(model_type="bert"), "model_type 'bert'"),
    ("no-family", {k: v for k, v in LLAMA.items() if k != "model_type"}, {}, "model_type None"),
    ("sliding-string", QWEN2, dict(use_sliding_window="no"), "use_sliding_window 'no'"),
    ("layer-types-length", QWEN2, dict(layer_types=["full_attention"] * 3), "layer_types ['full_attention'"),
    ("layer-types-entry", QWEN2, dict(layer_types=["full_attention", "chunked_attention"]),
     "layer_types entry 'chunked_attention'"),
    ("mrope", QWEN2, dict(use_mrope=True), "use_mrope True"),
    ("gpt2-not-divisible", GPT2, dict(n_embd=66), "n_embd 66 is not a multiple of n_head 4"),
    ("gpt2-activation", GPT2, dict(activation_function="relu"), "activation_function 'relu'"),
    ("gpt2-layer-scaling", GPT2, dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    ("gpt2-cross-attention", GPT2, dict(add_cross_attention=True), "add_cross_attention"),
    ("gpt2-layers-null", GPT2, dict(n_layer=None), "n_layer is null"),
]


@pytest.fixture
def no_model_built(monkeypatch):
    """Any model built fails the test: refusals come before."""
    def built(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", built)


@pytest.mark.parametrize("base, changes, named", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_refused_by_name_before_any_model(base, changes, named, tmp_path, no_model_built):
    config = dict(base, **changes)
    with pytest.raises(ModelError) as e:
        load_decoder(config)
    assert named in str(e.value) and "\n" not in str(e.value), str(e.value)
    # The same through a config.json (the CLI's route), and compile_llm's.
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ModelError, match=f"config.json.*{named[:12]}".replace("(", r"\(").replace("[", r"\[")):
        lpx_tvm.compile_llm(str(path), precision="fp32", max_context=16)


def test_vocab_beyond_host_memory_states_the_figure(monkeypatch):
    """The refusal of a model too large for the host says how large, against what is
    available (before any weight is allocated)."""
    monkeypatch.setattr(decoder_config, "host_memory_bytes", lambda: 2 * 10**9)
    config = dict(LLAMA, vocab_size=10**7)  # 2 x 10^7 x 128 fp32 values: 10.2 GB
    with pytest.raises(ModelError, match=r"needs 10\.2 GB of host memory .* 2\.0 GB is available"):
        load_decoder(config)
    with torch.device("meta"):  # shapes only (the planner's): nothing is allocated, nothing refused
        assert load_decoder(config).config.vocab_size == 10**7


@pytest.mark.parametrize("content, named", [(b"\xff\xfe{}", "not UTF-8"), (b"[1, 2]", "is a JSON list"),
                                            (b'{"model_type": ', "is not JSON"), (b"7", "is a JSON int")])
def test_config_file_refused_by_name(content, named, tmp_path, no_model_built):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=named):
        load_decoder(str(path))


def test_a_model_object_is_checked_by_its_config():
    """A model built elsewhere with a field the steps do not honour: refused by the same
    check, naming the field, instead of silently wrong tokens."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**{k: v for k, v in LLAMA.items() if k not in ("model_type", "rope_scaling")},
                                   rope_scaling=LONGROPE)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with pytest.raises(ModelError, match="rope_type 'longrope'"):
        lpx_tvm.compile_llm(model, precision="fp32", max_context=16)
    with pytest.raises(ModelError, match="rope_type 'longrope'"):
        decoders.spec_of(model, 16)


def test_sliding_window_narrower_than_the_context_refused():
    with pytest.raises(ModelError, match="sliding_window 8 < max_context 16"):
        decoders.spec_of(load_decoder(dict(QWEN2, use_sliding_window=True, sliding_window=8, max_window_layers=1)), 16)
    # Qwen2's window applies to its sliding layers only: none here.
    model = load_decoder(dict(QWEN2, use_sliding_window=True, sliding_window=8, max_window_layers=2))
    assert decoders.spec_of(model, 16).layers == 2


def _scaled_up(model, scale=8.0):
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return model


# Fields honoured beyond the published configs' values: the steps' greedy tokens equal
# transformers'. (dynamic rescales only past max_position_embeddings; yarn's tables carry
# its attention factor.)
HONOURED = [
    ("rope-dynamic", LLAMA, dict(rope_scaling={"rope_type": "dynamic", "factor": 4.0})),
    ("rope-yarn", LLAMA, dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 8})),
    ("rope-linear", LLAMA, dict(rope_scaling={"rope_type": "linear", "factor": 3.0})),
    ("rope-legacy-type-key", LLAMA, dict(rope_scaling={"type": "linear", "factor": 3.0})),
    ("eps", LLAMA, dict(rms_norm_eps=0.5)),
    ("tied", LLAMA, dict(tie_word_embeddings=True)),
    ("qwen2-sliding-layers-window-covers-context", QWEN2,
     dict(use_sliding_window=True, sliding_window=16, max_window_layers=1)),
    ("gpt2-untied-inner-upcast", GPT2, dict(tie_word_embeddings=False, n_inner=96, reorder_and_upcast_attn=True,
                                            layer_norm_epsilon=0.1)),
]


@pytest.mark.parametrize("base, changes", [h[1:] for h in HONOURED], ids=[h[0] for h in HONOURED])
def test_honoured_field_gives_transformers_tokens(base, changes):
    model = _scaled_up(load_decoder(dict(base, **changes)))
    ids = torch.as_tensor([[3, 41, 7, 99, 12]])
    prefill, decode, spec = decoders.decoder_steps(model, max_context=16, prompt_len=5)
    got = decoders.generate(prefill, decode, spec, ids, 11)
    gen = transformers.GenerationConfig(max_new_tokens=11, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, generation_config=gen)[:, 5:]
    assert len(set(want.ravel().tolist())) > 3
    assert torch.equal(got, want), (got, want)


def test_with_layers_keeps_per_layer_lists_in_step():
    qwen = load_decoder(dict(QWEN2, num_hidden_layers=3, use_sliding_window=True, sliding_window=64,
                             max_window_layers=1)).config.to_dict()
    assert qwen["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    for n, types in ((2, ["full_attention", "sliding_attention"]),
                     (5, ["full_attention", "sliding_attention", "sliding_attention", "full_attention",
                          "sliding_attention"])):
        derived = with_layers(qwen, n)
        assert derived["num_hidden_layers"] == n and derived["layer_types"] == types
        assert qwen["num_hidden_layers"] == 3  # the config given is left as it was
        check_decoder_config(derived)
        assert transformers.AutoConfig.for_model(**derived).layer_types == types
    gpt2 = with_layers(GPT2, 3)
    assert gpt2["n_layer"] == 3 and "num_hidden_layers" not in gpt2
    # None: the planner's sample of the embedding, last norm and head alone, which the
    # checks let through only when asked (a user's decoder has a layer at least).
    assert with_layers(LLAMA, 0)["num_hidden_layers"] == 0
    check_decoder_config(with_layers(LLAMA, 0), least_layers=0)
    with pytest.raises(ModelError, match="num_hidden_layers 0"):
        check_decoder_config(with_layers(LLAMA, 0))
    with pytest.raises(ModelError, match="-1 layers"):
        with_layers(LLAMA, -1)

"""Decoder configs as published (a hub ``config.json``): checked before any model is
built, and the smaller models the planner and the benches derive from them.

:func:`check_decoder_config` reads a config dict (or a ``transformers`` config) the way
the decoder steps (:mod:`.decoders`) will use it and raises one :class:`ModelError`
line naming the first key that is malformed or that the steps do not honour: a field
either gives the ``transformers`` model's own greedy tokens (tests/llm/
test_published_configs.py) or is refused by name (tests/llm/test_config_validation.py).
:func:`with_layers` derives a config of another depth, its per-layer lists kept in step.
"""

from __future__ import annotations

import json
import math
import os

from ..relax_passes.errors import ModelError

LLAMA_FAMILIES = ("llama", "mistral", "qwen2")
FAMILIES = LLAMA_FAMILIES + ("gpt2",)

# key: (kind, least value, null allowed). Kinds: "int", "float" (finite), "bool", "ids"
# (a token id or a list of them). A key absent takes transformers' default; these are the
# keys whose value the steps read, or that change the model transformers builds.
_INT, _FLOAT, _BOOL, _IDS = "int", "float", "bool", "ids"
FIELDS = {
    "vocab_size": (_INT, 1, False),
    # Llama, Mistral, Qwen2
    "hidden_size": (_INT, 1, False),
    "intermediate_size": (_INT, 1, False),
    "num_hidden_layers": (_INT, 1, False),
    "num_attention_heads": (_INT, 1, False),
    "num_key_value_heads": (_INT, 1, True),
    "head_dim": (_INT, 2, True),
    "max_position_embeddings": (_INT, 1, False),
    "rms_norm_eps": (_FLOAT, 0.0, False),
    "rope_theta": (_FLOAT, 0.0, False),
    "partial_rotary_factor": (_FLOAT, 0.0, True),
    "sliding_window": (_INT, 1, True),
    "max_window_layers": (_INT, 0, True),
    "use_sliding_window": (_BOOL, None, False),
    "attention_bias": (_BOOL, None, False),
    "mlp_bias": (_BOOL, None, False),
    "use_mrope": (_BOOL, None, False),
    # GPT-2
    "n_embd": (_INT, 1, False),
    "n_layer": (_INT, 1, False),
    "n_head": (_INT, 1, False),
    "n_positions": (_INT, 1, False),
    "n_ctx": (_INT, 1, True),
    "n_inner": (_INT, 1, True),
    "layer_norm_epsilon": (_FLOAT, 0.0, False),
    "scale_attn_weights": (_BOOL, None, False),
    "scale_attn_by_inverse_layer_idx": (_BOOL, None, False),
    "reorder_and_upcast_attn": (_BOOL, None, False),
    "add_cross_attention": (_BOOL, None, False),
    # every family
    "tie_word_embeddings": (_BOOL, None, False),
    "bos_token_id": (_IDS, None, True),
    "eos_token_id": (_IDS, None, True),
    "pad_token_id": (_IDS, None, True),
}
_KINDS = {_INT: "an integer", _FLOAT: "a number", _BOOL: "true or false", _IDS: "a token id or a list of them"}

# Values the steps do not honour: (key, families, refused(value), why).
REFUSED = [
    ("hidden_act", LLAMA_FAMILIES, lambda v: v != "silu", "the steps' MLP is SwiGLU (silu)"),
    ("activation_function", ("gpt2",), lambda v: v not in ("gelu_new", "gelu_pytorch_tanh"),
     "the GPT-2 steps' MLP is GELU in its tanh form (gelu_new)"),
    # Mistral and Qwen2 models ignore these two keys; Llama's biases o_proj and the MLP.
    ("attention_bias", ("llama",), bool, "the steps' output projection has no bias"),
    ("mlp_bias", ("llama",), bool, "the steps' MLP has no biases"),
    ("partial_rotary_factor", LLAMA_FAMILIES, lambda v: v is not None and v != 1,
     "the steps rotate the whole head dimension"),
    ("use_mrope", ("qwen2",), bool, "multimodal RoPE (sections of the head per axis) is not supported"),
    ("scale_attn_by_inverse_layer_idx", ("gpt2",), bool, "the steps scale attention by 1/sqrt(head_dim) only"),
    ("scale_attn_weights", ("gpt2",), lambda v: not v, "the steps scale attention by 1/sqrt(head_dim)"),
    ("add_cross_attention", ("gpt2",), bool, "cross-attention needs an encoder"),
]

# rope_type: the ones whose tables the steps take from the model itself, checked
# token-identical (tests/llm/test_config_validation.py). ``dynamic`` rescales only past
# max_position_embeddings, which the context never reaches (spec_of); ``longrope``
# switches its frequencies with the sequence length, which fixed tables cannot.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
ROPE_REFUSED = {"longrope": "switches its frequencies with the sequence length; the steps' RoPE tables are fixed"}
ROPE_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor")}
ROPE_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "rope_theta",
                "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
# layer_types entries: full attention, or a sliding window as wide as the context (spec_of).
LAYER_TYPES = ("full_attention", "sliding_attention")
# Keys holding one entry per layer (with_layers).
PER_LAYER = ("layer_types", "mlp_layer_types")


_TYPES = {str: "a string", list: "a list", dict: "an object", float: "a number", int: "an integer", bool: "a boolean"}


def _kind(value) -> str:
    return _TYPES.get(type(value), type(value).__name__)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _family_of(config: dict) -> str:
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ModelError(f"model_type {_show(family)}: the LPX decoder steps support {', '.join(FAMILIES)}")
    return family


def _check_field(key: str, value, least_layers: int = 1) -> None:
    kind, least, nullable = FIELDS[key]
    least = least_layers if key in ("num_hidden_layers", "n_layer") else least
    if value is None:
        if nullable:
            return
        raise ModelError(f"{key} is null: expected {_KINDS[kind]}")
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise ModelError(f"{key} {_show(value)} is {_kind(value)}: expected true or false")
        return
    if kind == _IDS:  # the steps do not read them: any integers
        ids = value if isinstance(value, list) else [value]
        if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise ModelError(f"{key} {_show(value)}: expected a token id (an integer) or a list of them")
        return
    number = (int,) if kind == _INT else (int, float)
    if isinstance(value, bool) or not isinstance(value, number):
        raise ModelError(f"{key} {_show(value)} is {_kind(value)}: expected {_KINDS[kind]}")
    if kind == _INT and value < least:
        raise ModelError(f"{key} {value}: expected an integer >= {least}")
    if kind == _FLOAT and not (math.isfinite(value) and value > least):
        raise ModelError(f"{key} {value}: expected a finite number > {least:g}")


def _rope(config: dict) -> None:
    """Check the RoPE scaling of a config: ``rope_scaling`` (a hub config.json) or
    ``rope_parameters`` (transformers 5's own)."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise ModelError(f"{key} {_show(rope)} is {_kind(rope)}: expected an object or null")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind in ROPE_REFUSED:
            raise ModelError(f"{key} rope_type {kind!r}: {ROPE_REFUSED[kind]} (supported: {', '.join(ROPE_TYPES)})")
        if kind not in ROPE_TYPES:
            raise ModelError(f"{key} rope_type {_show(kind)}: unknown; supported: {', '.join(ROPE_TYPES)}")
        for name in ROPE_REQUIRED.get(kind, ()):
            if rope.get(name) is None:
                raise ModelError(f"{key} rope_type {kind!r} needs {name}")
        for name in ROPE_NUMBERS:
            value = rope.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                                      not math.isfinite(value) or value <= 0):
                raise ModelError(f"{key} {name} {_show(value)}: expected a finite number > 0")


def read_config(path) -> dict:
    """A ``config.json``'s object, or a ModelError naming the file and what is wrong."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelError(f"cannot read the model config {str(path)!r}: {e.strerror}") from None
    try:
        cfg = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ModelError(f"model config {str(path)!r} is not UTF-8 text (byte {e.start})") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise ModelError(f"model config {str(path)!r} is not JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"model config {str(path)!r} is a JSON {type(cfg).__name__}, not an object of "
                         "transformers config fields")
    return cfg


def check_decoder_config(config, max_context: "int | None" = None, least_layers: int = 1) -> dict:
    """Check a decoder config (a dict as read from a ``config.json``, or a
    ``transformers`` config) before any model is built: every key the steps read has a
    value of its type and range, the shapes divide, and every field is one the steps
    honour; with ``max_context``, also what depends on the context (a sliding window at
    least as wide). Raises a :class:`ModelError` naming the key and the reason; returns
    the config as a dict, transformers' defaults filled in for the keys it lacks.
    ``least_layers``: 0 for the planner's sample of a model's embedding, last norm and
    head alone (a user's decoder has a layer at least)."""
    if hasattr(config, "to_dict") and not isinstance(config, dict):
        config = config.to_dict()
    if not isinstance(config, dict):
        raise ModelError(f"a decoder config is a JSON object (a dict), not {type(config).__name__}")
    family = _family_of(config)
    for key, value in config.items():
        if key in FIELDS:
            _check_field(key, value, least_layers)
    config = _canonical(config)
    merged = {**_defaults(family), **config}
    for key, families, refused, why in REFUSED:
        if family in families and key in merged and refused(merged[key]):
            raise ModelError(f"{key} {_show(merged[key])}: {why}")
    if family == "gpt2":
        if merged["n_embd"] % merged["n_head"]:
            raise ModelError(f"n_embd {merged['n_embd']} is not a multiple of n_head {merged['n_head']}")
        if max_context is not None and max_context > merged["n_positions"]:
            raise ModelError(f"max_context {max_context} > the model's n_positions {merged['n_positions']}")
        return merged
    _rope(config)
    heads, hidden = merged["num_attention_heads"], merged["hidden_size"]
    kv = merged.get("num_key_value_heads") or heads
    if heads % kv:
        raise ModelError(f"num_key_value_heads {kv} does not divide num_attention_heads {heads}: each key/value "
                         "head serves a whole group of query heads")
    if merged.get("head_dim") is None:
        if hidden % heads:
            raise ModelError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} (and no "
                             "head_dim is given)")
        merged["head_dim"] = hidden // heads
        if merged["head_dim"] % 2:
            raise ModelError(f"head_dim {hidden // heads} (hidden_size {hidden} / num_attention_heads {heads}) is "
                             "odd: RoPE rotates the two halves of a head")
    if merged["head_dim"] % 2:
        raise ModelError(f"head_dim {merged['head_dim']} is odd: RoPE rotates the two halves of a head")
    pad, vocab = merged.get("pad_token_id"), merged["vocab_size"]
    if isinstance(pad, int) and not -vocab <= pad < vocab:  # the embedding's padding row
        raise ModelError(f"pad_token_id {pad} is outside the vocabulary (vocab_size {vocab})")
    layers = merged["num_hidden_layers"]
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ModelError(f"layer_types {_show(types)}: expected a list of one entry per layer "
                             f"(num_hidden_layers {layers})")
        for t in types:
            if t not in LAYER_TYPES:
                raise ModelError(f"layer_types entry {_show(t)}: the steps run {', '.join(LAYER_TYPES)} layers")
    if max_context is not None:
        limit = merged.get("max_position_embeddings")
        if limit is not None and max_context > limit:
            raise ModelError(f"max_context {max_context} > the model's max_position_embeddings {limit}")
        window = _window(family, merged)
        if window is not None and window < max_context:
            raise ModelError(f"sliding_window {window} < max_context {max_context}: the steps attend to the whole "
                             "cache; use max_context <= sliding_window")
    return merged


def _canonical(config: dict) -> dict:
    """``config`` with each alias transformers maps (GPT-2's ``hidden_size`` is its
    ``n_embd``) under the family's own key."""
    from transformers import CONFIG_MAPPING

    aliases = CONFIG_MAPPING[config["model_type"]].attribute_map
    out = dict(config)
    for alias, key in aliases.items():
        if alias in out:
            value = out.pop(alias)
            out.setdefault(key, value)
    return out


def _window(family: str, config: dict) -> "int | None":
    """The sliding window some layer attends through, or None: Mistral's applies to every
    layer; Qwen2's to its layers of type ``sliding_attention`` when ``use_sliding_window``."""
    window = config.get("sliding_window")
    if window is None or family == "llama":
        return None
    if family == "qwen2":
        if not config.get("use_sliding_window", False):
            return None
        types = config.get("layer_types")
        if types is None:  # as transformers derives them
            start = config.get("max_window_layers") or 0
            types = ["sliding_attention" if i >= start else "full_attention"
                     for i in range(config["num_hidden_layers"])]
        if "sliding_attention" not in types:
            return None
    return window


_DEFAULTS = {}


def _defaults(family: str) -> dict:
    """transformers' defaults of a family's config, without the keys it derives from
    others (head_dim, num_key_value_heads, layer_types)."""
    if family not in _DEFAULTS:
        import transformers

        d = transformers.AutoConfig.for_model(family).to_dict()
        for key in ("head_dim", "num_key_value_heads", "layer_types"):
            d.pop(key, None)
        _DEFAULTS[family] = d
    return dict(_DEFAULTS[family])


def parameter_count(config: dict) -> int:
    """Parameters of the model a checked config (:func:`check_decoder_config`) describes."""
    v = config["vocab_size"]
    tied = config.get("tie_word_embeddings", True)
    if config["model_type"] == "gpt2":
        h, n = config["n_embd"], config["n_layer"]
        inner = config.get("n_inner") or 4 * h
        layer = 4 * h * h + 4 * h + 2 * h * inner + inner + h + 4 * h
        return v * h * (1 if tied else 2) + config["n_positions"] * h + n * layer + 2 * h
    h, n, i = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    heads, d = config["num_attention_heads"], config["head_dim"]
    kv = config.get("num_key_value_heads") or heads
    layer = h * heads * d * 2 + h * kv * d * 2 + 3 * h * i + 2 * h + (heads + 2 * kv) * d
    return v * h * (1 if tied else 2) + n * layer + h


def host_memory_bytes() -> int:
    """Memory the host can give now (Linux's MemAvailable), else its physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 1 << 62


def check_host_memory(config: dict, value_bytes: int = 4) -> None:
    """Refuse a model whose random weights (fp32) would not fit the host's memory,
    before they are allocated."""
    need, have = parameter_count(config) * value_bytes, host_memory_bytes()
    if need > have:
        raise ModelError(f"a {config['model_type']} model of {parameter_count(config):,} parameters (vocab_size "
                         f"{config['vocab_size']:,}) needs {need / 1e9:,.1f} GB of host memory for its random fp32 "
                         f"weights; {have / 1e9:,.1f} GB is available")


def with_layers(config: dict, layers: int) -> dict:
    """``config`` with ``layers`` layers (``num_hidden_layers``, GPT-2's ``n_layer``), every
    per-layer list (``layer_types`` ...) cut to them or repeated in its pattern, so that
    transformers builds the model it describes. The planner and the benches derive their
    sampled models through it; the planner's samples of a large model's share take 0
    (the embedding, the last norm and the head alone: ``load_decoder(...,
    least_layers=0)``)."""
    if layers < 0:
        raise ModelError(f"a decoder of {layers} layers: at least 0")
    key = "n_layer" if config.get("model_type") == "gpt2" else "num_hidden_layers"
    out = dict(config)
    out[key] = layers
    for name in PER_LAYER:
        entries = config.get(name)
        if isinstance(entries, list) and entries:
            out[name] = [entries[i % len(entries)] for i in range(layers)]
    return out

"""The parts of a decoder step, as its ops are named in reports and profiles
(``layers.3.self_attn.scores``, ``layers.3.mlp.down_proj``, ``lm_head``, ``argmax``), and
the kind each part is summed under. Torch-free: the step's modules
(:mod:`.decoder_modules`) name their ops by these, and the profile groups by them."""

from __future__ import annotations

# Where each dense layer sits in a decoder layer, by its fused weight's key.
DENSE_PATHS = {"qkv": "self_attn.qkv_proj", "o": "self_attn.o_proj", "gate_up": "mlp.gate_up_proj",
               "fc": "mlp.c_fc", "down": "mlp.down_proj"}
# The parts of a layer's attention and of its MLP besides the dense layers (paths under
# ``layers.<n>``), and the step's own parts.
ATTENTION_PARTS = ("input_layernorm", "self_attn.rotary", "self_attn.kv_cache", "self_attn.scores",
                   "self_attn.softmax", "self_attn.values", "self_attn.qkv_proj", "self_attn.o_proj")
MLP_PARTS = ("post_attention_layernorm", "mlp.act_fn", "mlp.gate_up_proj", "mlp.c_fc", "mlp.down_proj")
STEP_PARTS = ("model.embed_tokens", "model.positions", "model.rotary_emb", "model.mask", "model.norm", "lm_head",
              "argmax")

# Kind -> the parts summed under it (a layer's parts without ``layers.<n>.``), in the
# order the summary lists them.
KINDS = {
    "attention": ("self_attn.qkv_proj", "self_attn.scores", "self_attn.softmax", "self_attn.values",
                  "self_attn.o_proj"),
    "MLP": ("mlp.gate_up_proj", "mlp.c_fc", "mlp.act_fn", "mlp.down_proj"),
    "norms": ("input_layernorm", "post_attention_layernorm", "model.norm"),
    "RoPE": ("self_attn.rotary", "model.rotary_emb"),
    "cache writes": ("self_attn.kv_cache",),
    "head": ("lm_head",),
    "argmax": ("argmax",),
    "embedding, positions, mask": ("model.embed_tokens", "model.positions", "model.mask"),
}
_KIND_OF = {part: kind for kind, parts in KINDS.items() for part in parts}


def part_kind(name: str) -> str:
    """The kind of the step part ``name`` (a profile row), ``other`` for a name that is
    none of the step's parts (idle time, an op outside them)."""
    head, _, rest = name.partition(".")
    if head == "layers" and "." in rest:
        name = rest.partition(".")[2]
    return _KIND_OF.get(name, "other")

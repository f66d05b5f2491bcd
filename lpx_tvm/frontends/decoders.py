"""A ``transformers`` decoder LLM as two static torch steps (docs/llm.md).

A static-shape machine cannot run ``transformers``' generation loop, so the model's
config and weights are rebuilt as plain torch modules of one signature::

    step(input_ids int32 [B, T], position int32 [1], k_cache_0, v_cache_0, ...)
        -> (next_ids int32 [B, 1], logits [B, V], k_cache_0', v_cache_0', ...)

``T`` is the prompt length for the prefill step (at position 0) and 1 for the decode
step. Each layer's caches are inputs of their own, ``[B*KVH*C, D]`` with rows ordered
(batch, kv head, position), so that a step writes only its new rows (``index_put``: a
``mem.scatter`` on LPX) and reads each layer's cache where it lies. The ops are written
in the forms the LPX back end lowers: int32 indices, the mask as arithmetic on the
position, RoPE rows gathered from constant tables, greedy argmax on chip.

The steps are checked against the model itself: their greedy loop (:func:`generate`)
must give ``model.generate(do_sample=False)``'s tokens (tests/frontends/test_decoders.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..relax_passes.errors import ModelError

# Families with the Llama layer: RMSNorm, RoPE, grouped-query attention, a SwiGLU MLP.
LLAMA_FAMILIES = ("llama", "mistral", "qwen2")
# The mask value added to a score a query may not attend to, per position of distance:
# exp(-1e4) is 0 in every float format.
MASK_SCALE = 1e4


@dataclass(frozen=True)
class DecoderSpec:
    """The shape of a decoder and of the steps built for it."""

    family: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    max_context: int
    batch: int = 1

    @property
    def cache_rows(self) -> int:
        """Rows of one layer's key (or value) cache: (batch, kv head, position)."""
        return self.batch * self.kv_heads * self.max_context

    @property
    def cache_names(self) -> list:
        return [f"{kind}_cache_{i}" for i in range(self.layers) for kind in ("k", "v")]

    @property
    def cache_bytes_per_value(self) -> int:
        """Bytes of all layers' caches per byte of one stored value."""
        return 2 * self.layers * self.cache_rows * self.head_dim


def spec_of(model, max_context: int, batch: int = 1) -> DecoderSpec:
    """The :class:`DecoderSpec` of a ``transformers`` causal LM, or a ModelError naming
    what the steps do not support."""
    cfg = model.config
    family = getattr(cfg, "model_type", None)
    if family not in LLAMA_FAMILIES:
        raise ModelError(f"decoder family {family!r}: the LPX decoder steps support {', '.join(LLAMA_FAMILIES)}")
    heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    if heads % kv_heads:
        raise ModelError(f"{heads} attention heads over {kv_heads} key/value heads: not a whole group each")
    if head_dim % 2:
        raise ModelError(f"head_dim {head_dim}: RoPE rotates halves of an even head dimension")
    window = getattr(cfg, "sliding_window", None)
    if window is not None and getattr(cfg, "use_sliding_window", True) and window < max_context:
        raise ModelError(f"sliding_window {window} < max_context {max_context}: the steps attend to the whole "
                         "cache; use max_context <= sliding_window")
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise ModelError(f"hidden_act {act!r}: the steps' MLP is SwiGLU (silu)")
    if getattr(cfg, "mlp_bias", False):
        raise ModelError("mlp_bias=True: the steps' MLP has no biases")
    limit = getattr(cfg, "max_position_embeddings", None)
    if limit is not None and max_context > limit:
        raise ModelError(f"max_context {max_context} > the model's max_position_embeddings {limit}")
    if max_context < 1 or batch < 1:
        raise ModelError(f"max_context {max_context} and batch {batch} must be at least 1")
    return DecoderSpec(family, cfg.num_hidden_layers, heads, kv_heads, head_dim, hidden, cfg.vocab_size,
                       max_context, batch)


def _torch():
    from .torch import require_torch

    return require_torch()


def decoder_step(model, spec: DecoderSpec, steps: int):
    """The step of ``steps`` tokens (the prompt length for prefill, 1 for decode) of
    ``model``, a torch module with the weights of ``model`` as constants."""
    torch = _torch()
    if not 1 <= steps <= spec.max_context:
        raise ModelError(f"a step of {steps} tokens in a context of {spec.max_context}")

    class DecoderStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            inner = model.model
            self.spec, self.steps = spec, steps
            # Buffers, so that torch.export keeps the weights as the module's constants.
            self.register_buffer("embed", inner.embed_tokens.weight.detach())
            self.layers = []
            for i, layer in enumerate(inner.layers):
                names = {}
                for key, t in _layer_weights(layer).items():
                    if isinstance(t, float) or t is None:
                        names[key] = t
                    else:
                        self.register_buffer(f"layer{i}_{key}", t)
                        names[key] = f"layer{i}_{key}"
                self.layers.append(names)
            self.register_buffer("norm_w", inner.norm.weight.detach())
            self.eps = inner.norm.variance_epsilon
            self.register_buffer("lm_head", model.lm_head.weight.detach())
            # The model's own rotary embedding (its rope_scaling included), at every position.
            positions = torch.arange(spec.max_context)[None]
            probe = torch.zeros(1, 1, spec.head_dim, dtype=self.embed.dtype)
            cos, sin = inner.rotary_emb(probe, positions)
            self.register_buffer("cos", cos[0].detach())  # [C, D]
            self.register_buffer("sin", sin[0].detach())
            i32 = torch.int32
            b, h, t = (torch.arange(n, dtype=i32) for n in (spec.batch, spec.kv_heads, steps))
            rows = (b[:, None, None] * spec.kv_heads + h[None, :, None]) * spec.max_context + t[None, None, :]
            # (batch, kv head, token) -> its cache row at position 0
            self.register_buffer("row_offsets", rows.reshape(-1, 1))
            self.register_buffer("cols", torch.arange(spec.head_dim, dtype=i32)[None, :])
            self.register_buffer("token_offsets", t)
            self.register_buffer("t_col", t.to(self.embed.dtype)[:, None])  # [T, 1]
            self.register_buffer("j_row", torch.arange(spec.max_context, dtype=self.embed.dtype)[None, :])  # [1, C]

        def forward(self, input_ids, position, *caches):
            s, T = self.spec, self.steps
            B, H, NH, KVH, D, C = s.batch, s.hidden, s.heads, s.kv_heads, s.head_dim, s.max_context
            rep = NH // KVH
            x = self.embed.index_select(0, input_ids.reshape(-1))  # [B*T, H]
            pos_rows = position + self.token_offsets  # [T] int32
            cos, sin = self.cos.index_select(0, pos_rows), self.sin.index_select(0, pos_rows)  # [T, D]
            # 0 where key position j may be seen by token t (j <= position + t), <= -1e4 elsewhere.
            delta = position.to(x.dtype).reshape(1, 1) + self.t_col - self.j_row  # [T, C]
            mask = torch.clamp(delta, max=0.0) * MASK_SCALE
            mask = mask.repeat(rep, 1)  # [rep*T, C]: the rows of a kv head's group
            rows = position.reshape(1, 1) + self.row_offsets  # [B*KVH*T, 1]
            new_caches = []
            for i, names in enumerate(self.layers):
                w = {key: getattr(self, n) if isinstance(n, str) else n for key, n in names.items()}
                k_cache, v_cache = caches[2 * i], caches[2 * i + 1]
                h = _rms_norm(x, w["input_norm"], w["eps"])
                q = _linear(h, w["q"], w["q_bias"]).reshape(B, T, NH, D).permute(0, 2, 1, 3)
                k = _linear(h, w["k"], w["k_bias"]).reshape(B, T, KVH, D).permute(0, 2, 1, 3)
                v = _linear(h, w["v"], w["v_bias"]).reshape(B, T, KVH, D).permute(0, 2, 1, 3)
                q, k = _rope(q, cos, sin), _rope(k, cos, sin)
                k_cache = torch.ops.aten.index_put(k_cache, [rows, self.cols], k.reshape(B * KVH * T, D))
                v_cache = torch.ops.aten.index_put(v_cache, [rows, self.cols], v.reshape(B * KVH * T, D))
                new_caches += [k_cache, v_cache]
                keys, values = k_cache.reshape(B, KVH, C, D), v_cache.reshape(B, KVH, C, D)
                qg = q.reshape(B, KVH, rep * T, D)  # a kv head's query heads share its keys
                scores = torch.matmul(qg, keys.transpose(2, 3)) * (D ** -0.5) + mask
                p = torch.softmax(scores, dim=-1)
                a = torch.matmul(p, values).reshape(B, NH, T, D).permute(0, 2, 1, 3).reshape(B * T, NH * D)
                x = x + _linear(a, w["o"], None)
                h = _rms_norm(x, w["post_norm"], w["eps"])
                x = x + _linear(torch.nn.functional.silu(_linear(h, w["gate"], None)) * _linear(h, w["up"], None),
                                w["down"], None)
            last = _rms_norm(x, self.norm_w, self.eps).reshape(B, T, H)[:, T - 1]  # [B, H]
            logits = last @ self.lm_head.T
            next_ids = logits.argmax(-1, keepdim=True).to(torch.int32)
            return (next_ids, logits, *new_caches)

    return DecoderStep().eval()


def _layer_weights(layer) -> dict:
    att, mlp = layer.self_attn, layer.mlp

    def bias(lin):
        return None if lin.bias is None else lin.bias.detach()

    return dict(q=att.q_proj.weight.detach(), q_bias=bias(att.q_proj), k=att.k_proj.weight.detach(),
                k_bias=bias(att.k_proj), v=att.v_proj.weight.detach(), v_bias=bias(att.v_proj),
                o=att.o_proj.weight.detach(), gate=mlp.gate_proj.weight.detach(), up=mlp.up_proj.weight.detach(),
                down=mlp.down_proj.weight.detach(), input_norm=layer.input_layernorm.weight.detach(),
                post_norm=layer.post_attention_layernorm.weight.detach(),
                eps=layer.input_layernorm.variance_epsilon)


def _linear(x, w, b):
    y = x @ w.T
    return y if b is None else y + b


def _rms_norm(x, w, eps):
    torch = _torch()
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope(x, cos, sin):
    """x [..., T, D] rotated by the rows of the position's tables (cos, sin [T, D])."""
    torch = _torch()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def decoder_steps(model, max_context: int, prompt_len: int, batch: int = 1):
    """``(prefill, decode, spec)``: the step of ``prompt_len`` tokens and the step of one."""
    spec = spec_of(model, max_context, batch)
    if prompt_len >= max_context:
        raise ModelError(f"a prompt of {prompt_len} tokens leaves no room in a context of {max_context}")
    return decoder_step(model, spec, prompt_len), decoder_step(model, spec, 1), spec


def example_inputs(spec: DecoderSpec, steps: int, dtype=None) -> tuple:
    """Inputs of a step: token ids (zeros), position 0, empty caches."""
    torch = _torch()
    caches = [torch.zeros(spec.cache_rows, spec.head_dim, dtype=dtype or torch.float32) for _ in spec.cache_names]
    return (torch.zeros(spec.batch, steps, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), *caches)


def generate(prefill, decode, spec: DecoderSpec, input_ids, max_new_tokens: int, dtype=None):
    """Greedy tokens after ``input_ids`` [B, P], the steps run in torch, the caches
    threaded from step to step. Returns int64 ids [B, max_new_tokens]."""
    torch = _torch()
    ids = torch.as_tensor(input_ids).to(torch.int32)
    prompt = ids.shape[1]
    if prompt + max_new_tokens - 1 > spec.max_context:
        raise ModelError(f"{prompt} prompt tokens and {max_new_tokens} new ones exceed the context of "
                         f"{spec.max_context}")
    _, _, *caches = example_inputs(spec, prompt, dtype)
    out = []
    with torch.no_grad():
        next_ids, _, *caches = prefill(ids, torch.zeros(1, dtype=torch.int32), *caches)
        out.append(next_ids)
        for k in range(1, max_new_tokens):
            position = torch.tensor([prompt + k - 1], dtype=torch.int32)
            next_ids, _, *caches = decode(next_ids, position, *caches)
            out.append(next_ids)
    return torch.cat(out, dim=1).to(torch.int64)

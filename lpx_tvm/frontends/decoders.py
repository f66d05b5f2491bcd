"""A ``transformers`` decoder LLM as two static torch steps (docs/llm.md).

A static-shape machine cannot run ``transformers``' generation loop, so the model's
config and weights are rebuilt as plain torch modules of one signature::

    step(input_ids int32 [B*T], position int32 [1], v_cache_0_0, ..., k_cache_0_0, k_cache_0_1, ...)
        -> (next_ids int32 [B, 1], logits [B, V], v_cache_0_0', ..., k_cache_0_0', ...)

``T`` is the prompt length for the prefill step (at position 0) and 1 for the decode
step. Each (layer, kv head, sequence of the batch) has a key and a value cache of its
own, ``C`` positions (``DecoderSpec.cache_shape``), so that a step writes only its new
rows (``index_put``: a ``mem.scatter`` on LPX) and reads each cache where it lies. The
ops are written in 2-D forms the LPX back end lowers (rows of tokens, lanes of
features): heads are lane slices of the projections, a kv head's query heads are stacked
as rows and share one pass over its keys, each sequence attends to its own caches,
indices are int32, the mask is arithmetic on the position, RoPE rows are gathered from
constant tables, and the greedy argmax runs on chip.

The steps are checked against the model itself: their greedy loop (:func:`generate`)
must give ``model.generate(do_sample=False)``'s tokens (tests/frontends/test_decoders.py).

With :class:`QuantizedLinears` the dense layers are W8A8, in int8 or fp8 e4m3: each
layer's input is quantized by a static per-tensor scale (:func:`calibrate`) to 8-bit
values, multiplied by 8-bit weights (one scale per output channel) — int8 in exact
integer sums, fp8 in fp32 sums of exact products — and scaled back to float
(``lpx.act_quant`` / ``lpx.fp8_quant`` and ``lpx.qlinear`` on LPX). The same module run
by torch is the reference of the 8-bit paths.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..machine.isa import FP8_MAX
from ..relax_passes.errors import ModelError
from .decoder_config import check_decoder_config
# Families with the Llama layer: RMSNorm, RoPE, grouped-query attention, a SwiGLU MLP;
# GPT-2: LayerNorm, learned positions, multi-head attention, a GELU MLP, biases.
from .decoder_config import FAMILIES, LLAMA_FAMILIES  # noqa: F401


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
    parameters: int = 0  # weights of the model (a tied embedding counted once)
    lanes: int = 320  # the machine's vector width, which the value caches pack heads to

    @property
    def cache_rows(self) -> int:
        """Rows of one key (or value) cache: a sequence's positions (a batch has a cache
        per sequence, ``cache_names``)."""
        return self.max_context

    @property
    def rope_tables_shared(self) -> bool:
        """Whether RoPE's cosine and signed sine tables are one, side by side in a row: when
        a vector holds both and the context is long (2k positions or more: 2.6 MiB a
        table at 4k in fp16, saved), the rows stored once; a shorter context keeps the two
        apart, which spares a step the lane slices that cut them apart (2% of the profile
        model's step at 256)."""
        return 2 * self.head_dim <= self.lanes and self.max_context >= 2048

    @property
    def value_packs(self) -> list:
        """(first kv head, kv heads) of each value cache of a layer: as many heads as fit a
        vector of ``lanes`` side by side in a row (docs/llm.md), at least one."""
        per = max(1, min(self.kv_heads, self.lanes // self.head_dim))
        return [(g, min(per, self.kv_heads - g)) for g in range(0, self.kv_heads, per)]

    def cache_shape(self, name: str) -> tuple:
        """The shape of cache ``name``: a key cache (one kv head's) is stored transposed,
        ``head_dim`` rows of (batch, position) columns (the scores' installed weights,
        written a column per token); a value cache (a pack of kv heads') is (batch,
        position) rows of the pack's heads side by side."""
        if name.startswith("k_"):
            return (self.head_dim, self.cache_rows)
        return (self.cache_rows, self.value_packs[int(name.split("_")[3])][1] * self.head_dim)

    @property
    def sequences(self) -> list:
        """The suffix of each sequence's caches in a batch: none for one sequence, ``_s{b}``
        for sequence ``b`` of several (each its own caches: attention meets only its own
        sequence's positions, docs/llm.md)."""
        return [""] if self.batch == 1 else [f"_s{b}" for b in range(self.batch)]

    @property
    def cache_names(self) -> list:
        """The caches in step-argument order: every layer's value caches (a pack's each,
        a sequence's each), then every layer's key caches (a kv head's each, a sequence's
        each). The compiler places a step's inputs in this order: the value caches spread
        over slices before the key caches' small tiles."""
        return [f"v_cache_{i}_{k}{q}" for i in range(self.layers) for k in range(len(self.value_packs))
                for q in self.sequences] + \
            [f"k_cache_{i}_{g}{q}" for i in range(self.layers) for g in range(self.kv_heads) for q in self.sequences]

    def zero_caches(self, inputs) -> dict:
        """Empty caches for a program's cache inputs ``inputs`` (in ``cache_names`` order):
        a new request's prefill starts from them."""
        return {n: np.zeros(self.cache_shape(name), np.float32) for n, name in zip(inputs, self.cache_names)}

    def with_caches(self, count: int) -> "DecoderSpec":
        """This spec for a step of ``count`` caches (a pipeline stage's attending layers)."""
        return replace(self, layers=count // ((self.kv_heads + len(self.value_packs)) * self.batch))

    @property
    def cache_values(self) -> int:
        """Values held by all the caches."""
        return 2 * self.layers * self.kv_heads * self.batch * self.cache_rows * self.head_dim



@dataclass(frozen=True)
class TensorShard:
    """Chip ``rank`` of ``size`` in tensor parallelism (docs/multichip.md): its share of
    the kv heads with their query heads and caches, of the q, k and v projections' rows,
    of the MLP's hidden units (gate and up rows, or GPT-2's fc), and the matching columns
    of o and down, whose partial products the chips sum
    (``all_reduce``); rank 0 alone adds o's and down's biases. The LM head is split by
    vocabulary: each chip computes its rows' logits, placed among zeros where the other
    chips' go and summed over the chips (adding zeros is exact), so every chip has every
    logit and computes the same token. Norms and the embedding are on every chip."""

    rank: int
    size: int


@dataclass(frozen=True)
class PipelineStage:
    """Layers ``start .. stop - 1`` of the model, one stage of a pipeline
    (docs/multichip.md): the first stage embeds the tokens, the last applies the final
    norm, the LM head and the argmax; every other stage's step takes the hidden rows
    ``[B*T, H]`` the stage before it computed (its first input, received over a link) and
    returns its own instead of the next ids and logits. Its caches are its layers'.

    A stage may cut a layer where its residual stream is one tensor, between the
    attention and the MLP: ``from_mlp``, it begins at layer ``start``'s MLP (that layer's
    attention, and its caches, on the stage before); ``to_attention``, it ends after
    layer ``stop - 1``'s attention (its MLP on the stage after)."""

    start: int
    stop: int
    layers: int  # of the whole model
    from_mlp: bool = False
    to_attention: bool = False

    def __post_init__(self):
        if not 0 <= self.start < self.stop <= self.layers or \
                self.stop - self.start == 1 and self.from_mlp and self.to_attention:
            raise ModelError(f"a pipeline stage of layers {self.start}..{self.stop - 1} of a model of {self.layers}"
                             f"{' from the MLP' if self.from_mlp else ''}"
                             f"{' to the attention' if self.to_attention else ''}")

    @property
    def first(self) -> bool:
        return self.start == 0 and not self.from_mlp

    @property
    def last(self) -> bool:
        return self.stop == self.layers and not self.to_attention

    @property
    def attention_layers(self) -> int:
        """The layers whose attention (and caches) the stage holds."""
        return self.stop - self.start - self.from_mlp

    @property
    def mlp_layers(self) -> int:
        return self.stop - self.start - self.to_attention

    def holds(self, i: int) -> tuple:
        """(attention, MLP): which halves of the stage's ``i``-th layer (from ``start``) it runs."""
        return not (i == 0 and self.from_mlp), not (i == self.stop - self.start - 1 and self.to_attention)


def stages_of(layers: int, count: int) -> list:
    """``count`` :class:`PipelineStage` of contiguous layers, as even as they go (the
    first stages take one more where they do not divide)."""
    if not 1 <= count <= layers:
        raise ModelError(f"{count} pipeline stages of a model of {layers} layers: a stage holds at least one layer")
    out, start = [], 0
    for k in range(count):
        n = layers // count + (k < layers % count)
        out.append(PipelineStage(start, start + n, layers))
        start += n
    return out


def split_stages_of(layers: int, count: int, attention: int, mlp: int) -> list:
    """``count`` :class:`PipelineStage` cut at half layers (attention, MLP: units of
    weight ``attention`` and ``mlp``, e.g. a chip's bytes of each), the heaviest stage as
    light as contiguous stages allow: the least capacity that ``count`` stages packed
    greedily hold (a binary search), then the heaviest split until there are ``count``."""
    units = [attention, mlp] * layers
    if not 1 <= count <= len(units):
        raise ModelError(f"{count} pipeline stages of a model of {layers} layers cut at half layers: a stage "
                         f"holds at least an attention or an MLP ({len(units)} of them)")

    def packed(cap):
        groups, load = [[]], 0
        for u, w in enumerate(units):
            if groups[-1] and load + w > cap:
                groups.append([])
                load = 0
            groups[-1].append(u)
            load += w
        return groups

    lo, hi = max(units), sum(units)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(packed(mid)) <= count else (mid + 1, hi)
    groups = packed(lo)
    while len(groups) < count:
        k = max((k for k, g in enumerate(groups) if len(g) > 1), key=lambda k: sum(units[u] for u in groups[k]))
        g = groups[k]
        groups[k:k + 1] = [g[:len(g) // 2], g[len(g) // 2:]]
    return [PipelineStage(g[0] // 2, g[-1] // 2 + 1, layers, from_mlp=g[0] % 2 == 1, to_attention=g[-1] % 2 == 0)
            for g in groups]


def stage_spec(spec: DecoderSpec, stage: "PipelineStage | None") -> DecoderSpec:
    """The spec of a stage's step: its layers (and so its caches) only."""
    return spec if stage is None else replace(spec, layers=stage.attention_layers)


def half_layer_values(model, spec: DecoderSpec) -> tuple:
    """(attention, MLP): the values of a layer's dense weights in each half, the weights
    :func:`split_stages_of` balances."""
    layer = model.transformer.h[0] if spec.family == "gpt2" else model.model.layers[0]
    attention = layer.attn if spec.family == "gpt2" else layer.self_attn
    return tuple(sum(p.numel() for p in m.parameters() if p.dim() == 2) for m in (attention, layer.mlp))


def layer_matrix_shapes(model, spec: DecoderSpec) -> dict:
    """{q, k, v, o, gate, up or fc, down: (out, in)} of a layer's dense weights (a linear's
    orientation; GPT-2's fused qkv cut into q, k and v)."""
    if spec.family == "gpt2":
        block = model.transformer.h[0]
        (h, three), (_, units) = block.attn.c_attn.weight.shape, block.mlp.c_fc.weight.shape
        return dict(q=(three // 3, h), k=(three // 3, h), v=(three // 3, h), o=(h, three // 3), fc=(units, h),
                    down=(h, units))
    att, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    return {key: tuple(lin.weight.shape) for key, lin in (("q", att.q_proj), ("k", att.k_proj), ("v", att.v_proj),
                                                          ("o", att.o_proj), ("gate", mlp.gate_proj),
                                                          ("up", mlp.up_proj), ("down", mlp.down_proj))}


def shard_spec(spec: DecoderSpec, size: int) -> DecoderSpec:
    """The spec of one chip's step: ``spec`` with its heads and kv heads over ``size``."""
    if size < 1 or spec.kv_heads % size or spec.heads % size:
        raise ModelError(f"{spec.heads} heads over {spec.kv_heads} key/value heads on {size} chips: tensor "
                         "parallelism gives each chip whole key/value heads (a divisor of the kv heads)")
    return replace(spec, heads=spec.heads // size, kv_heads=spec.kv_heads // size)


def _shard_weights(weights: dict, spec: DecoderSpec, shard: TensorShard) -> dict:
    """Chip ``shard.rank``'s share of the layers' weights (:class:`TensorShard`)."""
    k, n, d = shard.rank, shard.size, spec.head_dim
    q_rows = slice(k * spec.heads // n * d, (k + 1) * spec.heads // n * d)
    kv_rows = slice(k * spec.kv_heads // n * d, (k + 1) * spec.kv_heads // n * d)
    layers = []
    for layer in weights["layers"]:
        hidden_key = "fc" if "fc" in layer else "gate"
        units = layer[hidden_key].shape[0]
        mlp_rows = slice(k * units // n, (k + 1) * units // n)
        out = dict(layer)
        for key, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows), ("gate", mlp_rows), ("up", mlp_rows),
                          ("fc", mlp_rows)):
            for name in (key, f"{key}_bias"):
                if out.get(name) is not None:
                    out[name] = out[name][rows].contiguous()
        out["o"] = layer["o"][:, q_rows].contiguous()
        out["down"] = layer["down"][:, mlp_rows].contiguous()
        for name in ("o_bias", "down_bias"):
            if out.get(name) is not None and k:
                out[name] = out[name].new_zeros(out[name].shape)  # summed once, from rank 0
        layers.append(out)
    return dict(weights, layers=layers, lm_head=weights["lm_head"][vocab_slice(spec.vocab, shard)].contiguous())


def vocab_slice(vocab: int, shard: TensorShard) -> slice:
    """The LM head's rows (tokens) chip ``shard.rank`` computes the logits of."""
    return slice(shard.rank * vocab // shard.size, (shard.rank + 1) * vocab // shard.size)


def spec_of(model, max_context: int, batch: int = 1, lanes: int = 320) -> DecoderSpec:
    """The :class:`DecoderSpec` of a ``transformers`` causal LM, or a ModelError naming
    what the steps do not support (its config checked by
    :func:`~lpx_tvm.frontends.decoder_config.check_decoder_config`). ``lanes``: the
    machine's vector width, which the value caches pack heads to."""
    family = getattr(model.config, "model_type", None)
    if family not in FAMILIES:
        raise ModelError(f"decoder family {family!r}: the LPX decoder steps support {', '.join(FAMILIES)}")
    if isinstance(max_context, bool) or not isinstance(max_context, (int, np.integer)) or \
            isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or max_context < 1 or batch < 1:
        raise ModelError(f"max_context {max_context!r} and batch {batch!r} must be integers of at least 1")
    # A model already built: its config was checked when it was (a planner's sample may
    # have no layers, only the embedding, the last norm and the head).
    cfg = check_decoder_config(model.config, int(max_context), least_layers=0)
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    if family == "gpt2":
        heads = cfg["n_head"]
        return DecoderSpec(family, cfg["n_layer"], heads, heads, cfg["n_embd"] // heads, cfg["n_embd"],
                           cfg["vocab_size"], int(max_context), int(batch), params, lanes)
    if family == "llama" and len(model.model.layers) and model.model.layers[0].self_attn.o_proj.bias is not None:
        raise ModelError("attention_bias=True on the output projection is not supported")
    heads = cfg["num_attention_heads"]
    return DecoderSpec(family, cfg["num_hidden_layers"], heads, cfg.get("num_key_value_heads") or heads,
                       cfg["head_dim"], cfg["hidden_size"], cfg["vocab_size"], int(max_context), int(batch), params,
                       lanes)


# The dense layers' inputs a quantized step scales, each shared by the layers that read it:
# per decoder layer, the attention input (q, k and v), the attention
# output (o), the MLP input (gate and up, or GPT-2's fc) and the MLP's hidden values
# (down); and the final norm's output (the LM head).
# A layer's weights before the residual stream's mid-layer point (the rest are the MLP's).
ATTENTION_KEYS = {"q", "q_bias", "k", "k_bias", "v", "v_bias", "o", "o_bias", "input_norm", "input_norm_b"}
LAYER_DENSE = {"qkv": "attn", "o": "o", "gate_up": "mlp", "fc": "mlp", "down": "down"}
# The steps' fused matrices (:func:`_fused`): one projection whose outputs are its parts'.
FUSED = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


# The largest magnitude of each 8-bit format: a scale maps a calibrated peak there.
FORMAT_MAX = {"int8": 127.0, "fp8": FP8_MAX}


@dataclass(frozen=True)
class QuantizedLinears:
    """W8A8 for a decoder's dense layers in ``fmt`` (``int8`` or ``fp8``, e4m3):
    ``act_scales`` maps each input site (``"{layer}.attn"``, ``"{layer}.o"``,
    ``"{layer}.mlp"``, ``"{layer}.down"``, ``"head"``) to its static scale ``s_x``
    (activations become ``clip(round(x / s_x), -128, 127)`` in int8, the fp8 value of
    ``clip(x / s_x, -448, 448)`` in fp8); the weights' scales are per output channel,
    ``max |w[c, :]| / FORMAT_MAX[fmt]``."""

    act_scales: dict
    fmt: str = "int8"

    def __post_init__(self):
        if self.fmt not in FORMAT_MAX:
            raise ModelError(f"8-bit format {self.fmt!r}: expected one of {', '.join(FORMAT_MAX)}")

    @property
    def top(self) -> float:
        """The format's largest magnitude (a scale maps a calibrated peak there)."""
        return FORMAT_MAX[self.fmt]

    def inverse(self, site: str) -> float:
        """``1 / s_x`` of a site, as the fp32 immediate the VXM multiplies by."""
        return float(np.float32(1.0 / self.act_scales[site]))


def _torch():
    from .torch import require_torch

    return require_torch()


def decoder_step(model, spec: DecoderSpec, steps: int, embed_in_step: bool = True,
                 quant: "QuantizedLinears | None" = None, record: "dict | None" = None,
                 shard: "TensorShard | None" = None, stage: "PipelineStage | None" = None):
    """The step of ``steps`` tokens (the prompt length for prefill, 1 for decode) of
    ``model``, a torch module with the weights of ``model`` as constants. Without
    ``embed_in_step`` its first input is the tokens' embedding rows ``[B*T, H]`` (looked
    up by the caller: a table too large to gather from on chip) instead of their ids.
    ``quant``: its dense layers W8A8 (int8 or fp8). ``record``: a dict that every run of the (float)
    step updates with the largest magnitude seen at each input site (:func:`calibrate`).
    ``shard``: the step of one chip of a tensor-parallel group (:class:`TensorShard`; its
    caches those of :func:`shard_spec`'s spec); with ``quant`` its share of each weight
    is quantized on its own (the same per-channel scales for row-split layers, o's and
    down's from the chip's columns), and its activation scales are the whole model's. ``stage``: the step of one pipeline stage
    (:class:`PipelineStage`; its caches those of :func:`stage_spec`'s spec).

    The module is built from parts (:mod:`.decoder_modules`): the family's layers, a
    linear strategy (float or 8-bit, calibration as a hook), the tensor shard's sums."""
    _torch()  # a clear error without torch, before the weights are read
    if not 1 <= steps <= spec.max_context:
        raise ModelError(f"a step of {steps} tokens in a context of {spec.max_context}")
    weights = _gpt2_weights(model) if spec.family == "gpt2" else _llama_weights(model, spec)
    if shard is not None:
        if record is not None:
            raise ModelError("calibration records the whole model's step, not a chip's share")
        weights = _shard_weights(weights, spec, shard)
        spec = shard_spec(spec, shard.size)
    if stage is not None:
        if stage.layers != spec.layers:
            raise ModelError(f"a pipeline stage of a model of {stage.layers} layers for one of {spec.layers}")
        # Its layers, of a layer cut between stages only the half it runs.
        halves = [stage.holds(i) for i in range(stage.stop - stage.start)]
        weights = dict(weights, layers=[{k: t for k, t in layer.items() if k == "eps" or (att if k in ATTENTION_KEYS
                                                                                         else mlp)}
                                        for layer, (att, mlp) in zip(weights["layers"][stage.start:stage.stop],
                                                                     halves)])
        spec = stage_spec(spec, stage)
    else:
        halves = [(True, True)] * len(weights["layers"])
    weights = dict(weights, layers=[_fused(layer, spec.lanes) for layer in weights["layers"]])
    from . import decoder_modules as parts  # torch, imported when a step is built

    linears = parts.FloatLinears() if quant is None else parts.EightBitLinears(quant)
    if record is not None:
        linears = parts.Calibrating(linears, record)
    layers = parts.step_layers(halves, 0 if stage is None else stage.start)
    # Each dense layer's weight buffer and the input site its activation scale is for.
    dense = [(f"layer{i}_{key}", f"{layer.index}.{site}") for i, (layer, w) in enumerate(zip(layers, weights["layers"]))
             for key, site in LAYER_DENSE.items() if w.get(key) is not None]
    last = stage is None or stage.last
    return parts.DecoderStep(weights, spec, steps, layers, linears, dense + ([("lm_head_weight", "head")] if last else []),
                             shard=shard, head_rows=vocab_slice(spec.vocab, shard) if shard is not None else None,
                             first=stage is None or stage.first, last=last, embed_in_step=embed_in_step).eval()


def _llama_weights(model, spec: DecoderSpec) -> dict:
    torch = _torch()
    inner = model.model

    def bias(lin):
        return None if lin.bias is None else lin.bias.detach()

    layers = []
    for layer in inner.layers:
        att, mlp = layer.self_attn, layer.mlp
        layers.append(dict(q=att.q_proj.weight.detach(), q_bias=bias(att.q_proj), k=att.k_proj.weight.detach(),
                           k_bias=bias(att.k_proj), v=att.v_proj.weight.detach(), v_bias=bias(att.v_proj),
                           o=att.o_proj.weight.detach(), gate=mlp.gate_proj.weight.detach(),
                           up=mlp.up_proj.weight.detach(), down=mlp.down_proj.weight.detach(),
                           input_norm=layer.input_layernorm.weight.detach(),
                           post_norm=layer.post_attention_layernorm.weight.detach(),
                           eps=layer.input_layernorm.variance_epsilon))
    embed = inner.embed_tokens.weight.detach()
    # The model's own rotary embedding (its rope_scaling included), at every position.
    positions = torch.arange(spec.max_context)[None]
    probe = torch.zeros(1, 1, spec.head_dim, dtype=embed.dtype)
    cos, sin = inner.rotary_emb(probe, positions)
    return dict(layers=layers, embed=embed, lm_head=model.lm_head.weight.detach(), norm_w=inner.norm.weight.detach(),
                eps=inner.norm.variance_epsilon, cos=cos[0].detach(), sin=sin[0].detach())


def _gpt2_weights(model) -> dict:
    """GPT-2's Conv1D weights are (in, out): transposed here to the (out, in) of a linear."""
    tr = model.transformer
    hidden = model.config.n_embd
    layers = []
    for block in tr.h:
        qkv_w, qkv_b = block.attn.c_attn.weight.detach().T, block.attn.c_attn.bias.detach()
        layers.append(dict(q=qkv_w[:hidden], q_bias=qkv_b[:hidden], k=qkv_w[hidden:2 * hidden],
                           k_bias=qkv_b[hidden:2 * hidden], v=qkv_w[2 * hidden:], v_bias=qkv_b[2 * hidden:],
                           o=block.attn.c_proj.weight.detach().T, o_bias=block.attn.c_proj.bias.detach(),
                           fc=block.mlp.c_fc.weight.detach().T, fc_bias=block.mlp.c_fc.bias.detach(),
                           down=block.mlp.c_proj.weight.detach().T, down_bias=block.mlp.c_proj.bias.detach(),
                           input_norm=block.ln_1.weight.detach(), input_norm_b=block.ln_1.bias.detach(),
                           post_norm=block.ln_2.weight.detach(), post_norm_b=block.ln_2.bias.detach(),
                           eps=block.ln_1.eps))
    return dict(layers=[{k: (v.contiguous() if hasattr(v, "contiguous") else v) for k, v in lay.items()}
                        for lay in layers],
                embed=tr.wte.weight.detach(), positions=tr.wpe.weight.detach(), lm_head=model.lm_head.weight.detach(),
                norm_w=tr.ln_f.weight.detach(), norm_b=tr.ln_f.bias.detach(), eps=tr.ln_f.eps)


def _fused(layer: dict, lanes: int) -> dict:
    """A layer's q, k and v as one matrix ``qkv``, its rows theirs stacked (and gate with
    up as ``gate_up``): one projection, sliced after. Wider matrices waste less of their
    last lane tile: a chip's eighth of Llama-2-70B has q, k and v of 1,024, 128 and 128
    outputs, 1,280 + 320 + 320 lanes a row stored apart and 1,280 together. Gate's
    outputs are padded with zero rows to whole lane tiles where that costs the matrix no
    tile (2 x 2,816 outputs and 2,880 + 2,816 are 18 tiles): gate and up then start on a
    tile, and the SwiGLU takes them as they lie (a slice from a tile's first lane moves
    nothing)."""
    torch = _torch()
    out = dict(layer)
    if out.get("gate") is not None and out.get("up") is not None:
        units = out["gate"].shape[0]
        pad = -units % lanes  # gate's zero rows up to its last tile's end
        if pad and -(-(2 * units + pad) // lanes) == -(-2 * units // lanes):
            pad_rows = torch.nn.functional.pad
            out["gate"] = pad_rows(out["gate"], (0, 0, 0, pad))
            if out.get("gate_bias") is not None:
                out["gate_bias"] = pad_rows(out["gate_bias"], (0, pad))
    for fused, keys in FUSED.items():
        if not all(out.get(k) is not None for k in keys):
            continue
        parts = [out.pop(k) for k in keys]
        biases = [out.pop(f"{k}_bias", None) for k in keys]
        out[fused] = torch.cat(parts, 0).contiguous()
        out[f"{fused}_bias"] = None if all(b is None for b in biases) else \
            torch.cat([p.new_zeros(p.shape[0]) if b is None else b for p, b in zip(parts, biases)]).contiguous()
    return out


def decoder_steps(model, max_context: int, prompt_len: int, batch: int = 1, quant: "QuantizedLinears | None" = None):
    """``(prefill, decode, spec)``: the step of ``prompt_len`` tokens and the step of one."""
    spec = spec_of(model, max_context, batch)
    if prompt_len >= max_context:
        raise ModelError(f"a prompt of {prompt_len} tokens leaves no room in a context of {max_context}")
    return decoder_step(model, spec, prompt_len, quant=quant), decoder_step(model, spec, 1, quant=quant), spec


def calibrate(model, spec: DecoderSpec, input_ids, new_tokens: int = 8, fmt: str = "int8") -> QuantizedLinears:
    """Static activation scales for W8A8 in ``fmt``: the float steps generate
    ``new_tokens`` after ``input_ids`` ([B, P] token ids), and each site's scale is the
    largest magnitude its inputs reached, over the format's largest value (127, or 448
    for fp8; values beyond a calibrated range saturate)."""
    torch = _torch()
    ids = torch.as_tensor(input_ids).to(torch.int32)
    record = {}
    prefill = decoder_step(model, spec, ids.shape[1], record=record)
    decode = decoder_step(model, spec, 1, record=record)
    generate(prefill, decode, spec, ids, min(new_tokens, spec.max_context - ids.shape[1] + 1))
    top = FORMAT_MAX[fmt]
    return QuantizedLinears({site: (peak if peak > 0 else 1.0) / top for site, peak in sorted(record.items())}, fmt)


def example_inputs(spec: DecoderSpec, steps: int, dtype=None, embed_in_step: bool = True) -> tuple:
    """Inputs of a step: token ids (zeros; or their embedding rows), position 0, empty caches."""
    torch = _torch()
    dtype = dtype or torch.float32
    caches = [torch.zeros(spec.cache_shape(n), dtype=dtype) for n in spec.cache_names]
    tokens = torch.zeros(spec.batch * steps, dtype=torch.int32) if embed_in_step else \
        torch.zeros(spec.batch * steps, spec.hidden, dtype=dtype)
    return (tokens, torch.zeros(1, dtype=torch.int32), *caches)


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
        next_ids, _, *caches = prefill(ids.reshape(-1), torch.zeros(1, dtype=torch.int32), *caches)
        out.append(next_ids)
        for k in range(1, max_new_tokens):
            position = torch.tensor([prompt + k - 1], dtype=torch.int32)
            next_ids, _, *caches = decode(next_ids.reshape(-1), position, *caches)
            out.append(next_ids)
    return torch.cat(out, dim=1).to(torch.int64)

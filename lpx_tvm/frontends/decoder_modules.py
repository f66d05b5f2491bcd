"""The torch module of one decoder step, built from parts (docs/llm.md):

- a **family table** (:data:`FAMILY_LAYERS`): the norm, the MLP's activation and how
  positions enter (RoPE tables or learned rows) of Llama, Qwen2, Mistral and GPT-2;
- **layers**, each an :class:`Attention` and an :class:`MLP` (a pipeline stage may hold
  one half of a layer cut between them);
- a **linear strategy**: how a dense layer multiplies (:class:`FloatLinears`, or
  :class:`EightBitLinears` in int8 or fp8), with calibration as a hook around it
  (:class:`Calibrating`), and, on a chip of a tensor-parallel group, its partial
  products summed over the chips (:meth:`DecoderStep.summed`).

A new kind of layer (a mixture of experts' MLP) or step (a speculative verify step of
several tokens) is another part, not another switch. :func:`~.decoders.decoder_step`
prepares the weights (sharded, staged, fused) and builds the module; torch is imported
here, so only building a step needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from ..machine.isa import FP8_MAX
from .decoder_parts import ATTENTION_PARTS, DENSE_PATHS, MLP_PARTS, STEP_PARTS
from .torch_collectives import all_reduce  # the sum of the chips' partial products (identity in torch)

# The mask value added to a score a query may not attend to, per position of distance:
# exp(-1e4) is 0 in every float format.
MASK_SCALE = 1e4


def linear(x, w, b):
    y = x @ w.T
    return y if b is None else y + b


def rms_norm(x, w, b, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def layer_norm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def rotary(x, cos, sin_signed, lanes=None):
    """RoPE of rows ``x`` ([rows, head_dim]): ``x * cos + rotate_half(x) * sin``, the
    halves swapped and the sine's first half negated (the tables' rows, x's). With
    ``lanes`` (a slice of the last axis), of ``x[:, lanes]``, its halves swapped straight
    from ``x``: one lane permute beside the slice, not after it."""
    if lanes is None:
        lanes = slice(0, x.shape[1])
    a, b = lanes.start, lanes.stop
    half = (b - a) // 2
    return x[:, a:b] * cos + torch.cat([x[:, a + half:b], x[:, a:a + half]], dim=1) * sin_signed


def swiglu(dense, h_in, units):
    # [B*T, 2 I]: gate's outputs, then up's; gate's padded to whole lane tiles where that
    # costs no tile (decoders._fused), so up is the last I.
    gate_up = dense(h_in, "gate_up")
    return torch.nn.functional.silu(gate_up[:, :units]) * gate_up[:, -units:]


def gelu_tanh(dense, h_in, units):
    return torch.nn.functional.gelu(dense(h_in, "fc"), approximate="tanh")


@dataclass(frozen=True)
class FamilyLayer:
    """What a family's layers are made of."""

    norm: Callable  # (x, w, b, eps)
    mlp: Callable  # (dense, its input, the number of hidden units) -> the hidden units, before down
    rope: bool  # positions by rotary tables (else learned rows added to the embedding)


LLAMA_LAYER = FamilyLayer(rms_norm, swiglu, rope=True)
FAMILY_LAYERS = {"llama": LLAMA_LAYER, "mistral": LLAMA_LAYER, "qwen2": LLAMA_LAYER,
                 "gpt2": FamilyLayer(layer_norm, gelu_tanh, rope=False)}


# ---- the linear strategy ----------------------------------------------------------

class FloatLinears:
    """Dense layers in the model's float dtype."""

    def add_buffers(self, step, dense: list):
        pass

    def input(self, x, site: str):
        return x

    def apply(self, step, x_in, name: str, bias):
        return linear(x_in, getattr(step, name), bias)


def quantize_weight(w, quant):
    """(8-bit values [K, N], fp32 scales [N]) of a (N, K) weight in ``quant``'s format,
    symmetric per output channel. The values are int8 ones as int32, or fp8 e4m3 ones as
    float32 (what the Relax graph carries: the MXM stores and multiplies them at 8 bits)."""
    w = w.detach().float()
    top = quant.top
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / top
    if quant.fmt == "fp8":
        q = torch.clamp(w / scale[:, None], -top, top).to(torch.float8_e4m3fn).to(torch.float32)
        return q.T.contiguous(), scale
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127)
    return q.to(torch.int32).T.contiguous(), scale


class EightBitLinears:
    """W8A8 (:class:`~.decoders.QuantizedLinears`): each dense layer's input quantized by
    its site's static scale, 8-bit weights with per-channel scales; int8 in exact integer
    sums, fp8 in fp32 sums, scaled back by s_x * s_w."""

    def __init__(self, quant):
        self.quant = quant

    def add_buffers(self, step, dense: list):
        """Each dense layer's 8-bit values ([K, N]) and s_x * s_w per channel; ``dense``:
        [(weight buffer name, input site)]."""
        for name, site in dense:
            q, s_w = quantize_weight(getattr(step, name), self.quant)
            step.register_buffer(f"{name}_q", q)
            step.register_buffer(f"{name}_scale", (s_w * self.quant.act_scales[site]).float())

    def input(self, x, site: str):
        if self.quant.fmt == "fp8":
            return torch.clamp(x * self.quant.inverse(site), -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return torch.clamp(torch.round(x * self.quant.inverse(site)), -128, 127).to(torch.int8)

    def apply(self, step, x_in, name: str, bias):
        wide = torch.float32 if self.quant.fmt == "fp8" else torch.int32
        y = (x_in.to(wide) @ getattr(step, f"{name}_q")).to(torch.float32) * getattr(step, f"{name}_scale")
        return y if bias is None else y + bias


class Calibrating:
    """A hook around a linear strategy: every run records the largest magnitude seen at
    each input site in ``record`` (:func:`~.decoders.calibrate`)."""

    def __init__(self, inner, record: dict):
        self.inner, self.record = inner, record

    def add_buffers(self, step, dense: list):
        self.inner.add_buffers(step, dense)

    def input(self, x, site: str):
        self.record[site] = max(self.record.get(site, 0.0), float(x.detach().abs().max()))
        return self.inner.input(x, site)

    def apply(self, step, x_in, name: str, bias):
        return self.inner.apply(step, x_in, name, bias)


# ---- the step's structure, as the report names it ----------------------------------------

class Scope(torch.nn.Module):
    """A named place in the decoder's structure (``layers.3.mlp.down_proj``). Calling it
    runs ``fn(*args)`` as that module, so torch.export records its path in each op's
    module stack, and the profile and report name the op's layer by it
    (:func:`~.torch.layer_name`). It holds nothing and computes nothing of its own."""

    def forward(self, fn, *args):
        return fn(*args)


def add_scopes(root: torch.nn.Module, paths) -> None:
    """Make a :class:`Scope` at each dotted path under ``root`` (and its parents)."""
    for path in paths:
        m = root
        for part in path.split("."):
            if part not in m._modules:
                m.add_module(part, Scope())
            m = m._modules[part]


# ---- the layers ----------------------------------------------------------------------

class CachePlaces(NamedTuple):
    """Where a sequence's ``T`` new tokens go in its caches (every sequence of a batch is
    at the same position): ``rows`` [T, 1] int32, their value cache rows (position + t);
    ``columns`` [T, C], one-hot, their key cache columns; ``keep`` [1, C], 0 at the
    columns written, 1 elsewhere; with one new token (a decode step) ``new_columns``
    [D, C], 1 - keep in every row."""

    rows: object
    columns: object
    keep: object
    new_columns: object = None


@dataclass(frozen=True)
class Attention:
    """The attention of model layer ``layer``, its caches the step's ``cache``-th
    attending layer's."""

    layer: int
    cache: int

    def __call__(self, step, x, w, dense, caches, new_caches, mask, places, rope):
        """``x`` plus the attention; ``caches`` and ``new_caches`` by name
        (``DecoderSpec.cache_names``), the updated ones put in ``new_caches``. Each
        sequence of a batch attends to its own caches (``DecoderSpec.sequences``): its
        scores are T rows of C positions, not B*T rows of B*C, most of them masked."""
        s, T = step.spec, step.steps
        B, NH, KVH, D = s.batch, s.heads, s.kv_heads, s.head_dim
        rep = NH // KVH
        at = step.scope(f"layers.{self.layer}")
        h = at("input_layernorm")(step.family.norm, x, w["input_norm"], w.get("input_norm_b"), w["eps"])
        qkv = dense(h, "qkv")  # [B*T, (NH + 2 KVH) * D]: the query heads, the keys, the values
        k0, v0 = NH * D, (NH + KVH) * D
        packs = s.value_packs
        c = self.cache
        # Each sequence's rows of q, k and v (the rows of one sequence, when it is alone).
        rows = [qkv] if B == 1 else \
            [at("self_attn.qkv_proj")(lambda t, b=b: t[b * T:(b + 1) * T], qkv) for b in range(B)]

        def write_values(t, q):  # the new value rows into each pack's cache
            return tuple(torch.ops.aten.index_put(caches[f"v_cache_{c}_{i}{q}"],
                                                  [places.rows, getattr(step, f"cols_{n * D}")],
                                                  t[:, v0 + g0 * D:v0 + (g0 + n) * D]) for i, (g0, n) in enumerate(packs))

        # Each op in its part of the layer (the program does not change with the names).
        v_caches = [at("self_attn.kv_cache")(write_values, t, q) for t, q in zip(rows, s.sequences)]
        def keys(t, g):  # group g's key rows, rotated
            lanes = slice(k0 + g * D, k0 + (g + 1) * D)
            return t[:, lanes] if rope is None else rotary(t, rope[2], rope[3], lanes)

        def write_keys(k, g, q):  # the new keys into group g's key cache, stored K^T
            # The new keys' columns placed by a product with the one-hot columns
            # (exact: one term), the old ones kept elsewhere.
            return caches[f"k_cache_{c}_{g}{q}"] * places.keep + k.T @ places.columns

        def queries(t, g):  # group g's query rows (r, t), rotated
            # Each head rotated straight from the q/k/v rows, as a key is, then the heads
            # stacked; scaled by 1/sqrt(D) here rather than as a pass over the scores
            # after them (with RoPE, by the queries' tables, scaled beside the chain).
            heads = range(g * rep, (g + 1) * rep)
            qs = [t[:, n * D:(n + 1) * D] * step.scale if rope is None else
                  rotary(t, rope[0], rope[1], slice(n * D, (n + 1) * D)) for n in heads]
            return torch.cat(qs, dim=0) if rep > 1 else qs[0]  # [rep*T, D]

        def masked(s):  # [rep*T, C]: each query head's rows meet the mask's t rows
            return s + mask if rep == 1 else (s.reshape(rep, T, -1) + mask).reshape(rep * T, -1)

        def scores_of(q, k):
            return masked(q @ k)  # q carries the scale

        def decode_scores(q, old, k):  # two terms whose sum is scores_of(q, the cache with the new keys)
            # The old cache's new columns are zero (a request's caches start empty and a
            # step writes only its own columns), so q @ old is 0 there; (q * k) @
            # new_columns puts each query row's product with its key in every new column
            # (the mask hides the others), beside q @ old, not after it. The mask goes on q @
            # old, which does not wait for the product q * k, and the softmax adds the two
            # as it reads them (``lpx.softmax_of_sum``): no pass after the last product.
            qk = q * k if rep == 1 else (q.reshape(rep, T, D) * k).reshape(rep * T, D)
            return masked(q @ old), qk @ places.new_columns

        def softmax_of_sum(a, b):
            return torch.softmax(a + b, -1)

        # The group's query heads share one pass over its keys: rows (r, t). The key
        # cache, stored as K^T, is installed as it lies and the few query rows stream
        # through; streaming the C key rows past installed queries cost C vectors at the
        # 16-bit rate and a transpose of the scores (-33% cycles of a decode step at C = 256).
        # A program's order is its schedule's (the placer takes groups in order).
        rotated_keys = at("self_attn.rotary" if rope is not None else "self_attn.kv_cache")
        rotated_queries = at("self_attn.rotary" if rope is not None else "self_attn.scores")
        scores, softmax, cache = at("self_attn.scores"), at("self_attn.softmax"), at("self_attn.kv_cache")
        if T == 1:
            # Every group's keys and queries first, then the scores, so that a group's
            # rows are not held up behind the scores before them. A decode step meets each
            # cache as it was, the new keys' products added: the keys' way into the caches
            # (a transpose, a blend) is off the chain. Each group's softmax follows its
            # scores in the program, before the next group's.
            ks = [[rotated_keys(keys, t, g) for g in range(KVH)] for t in rows]
            qgs = [[rotated_queries(queries, t, g) for g in range(KVH)] for t in rows]
            seqs = list(zip(s.sequences, qgs, ks))
            probs = [[softmax(softmax_of_sum, *scores(decode_scores, qg, caches[f"k_cache_{c}_{g}{q}"], k))
                      for g, (qg, k) in enumerate(zip(qs, kg))] for q, qs, kg in seqs]
            k_caches = [[cache(write_keys, k, g, q) for g, k in enumerate(kg)] for q, _, kg in seqs]
        else:
            # A prompt goes group by group: a group's keys and queries, its key cache, its
            # scores and softmax, then the next group's. At T rows a group's lane moves on
            # the SXM (RoPE's, the keys' transpose) take hundreds of cycles; the next
            # group's then run beside this group's products rather than all of them
            # before the first (BENCHMARKS.md, "Prefill group by group").
            k_caches, probs = [], []
            for t, q in zip(rows, s.sequences):
                kcs, ps = [], []
                for g in range(KVH):
                    k, qg = rotated_keys(keys, t, g), rotated_queries(queries, t, g)
                    kcs.append(cache(write_keys, k, g, q))
                    ps.append(softmax(torch.softmax, scores(scores_of, qg, kcs[-1]), -1))
                k_caches.append(kcs)
                probs.append(ps)

        def values(v, *ps):  # p @ V of a pack's groups at once, cut into their heads
            # The groups' rows stacked, so the pack's value rows are installed once; group
            # i's heads are its rows' lanes i*D.. (the other lanes meet other heads' values).
            a = (torch.cat(ps, dim=0) if len(ps) > 1 else ps[0]) @ v  # [n*rep*T, n*D]
            return tuple(a[(i * rep + r) * T:(i * rep + r + 1) * T, i * D:(i + 1) * D] if len(ps) > 1 else
                         a[r * T:(r + 1) * T] if rep > 1 else a
                         for i in range(len(ps)) for r in range(rep))

        heads = [[None] * NH for _ in rows]  # each sequence's [T, D] of each head
        for b, (vcs, ps) in enumerate(zip(v_caches, probs)):
            for (g0, n), v_cache in zip(packs, vcs):
                heads[b][g0 * rep:(g0 + n) * rep] = at("self_attn.values")(values, v_cache, *ps[g0:g0 + n])
        for q, kcs, vcs in zip(s.sequences, k_caches, v_caches):
            new_caches.update({f"k_cache_{c}_{g}{q}": k for g, k in enumerate(kcs)})
            new_caches.update({f"v_cache_{c}_{i}{q}": v for i, v in enumerate(vcs)})

        def project(x, *heads):  # the heads side by side [B*T, NH*D], o, the residual
            if B > 1:  # each head's rows of every sequence, in (b, t) order
                heads = [torch.cat(heads[n::NH], dim=0) for n in range(NH)]
            attn = torch.cat(heads, dim=1) if NH > 1 else heads[0]
            return x + step.summed(dense(attn, "o"))

        return at("self_attn.o_proj")(project, x, *(hd for per in heads for hd in per))


@dataclass(frozen=True)
class MLP:
    """The MLP of model layer ``layer``: its family's activation between the up
    projections and down."""

    layer: int

    def __call__(self, step, x, w, dense):
        at = step.scope(f"layers.{self.layer}")
        h = at("post_attention_layernorm")(step.family.norm, x, w["post_norm"], w.get("post_norm_b"), w["eps"])
        m = at("mlp.act_fn")(step.family.mlp, dense, h, w["down"].shape[1])
        return at("mlp.down_proj")(lambda x, m: x + step.summed(dense(m, "down")), x, m)


@dataclass(frozen=True)
class Layer:
    """Model layer ``index`` in a step: its attention and its MLP (either None where a
    pipeline stage holds only the other half)."""

    index: int
    attention: "Attention | None"
    mlp: "MLP | None"


def step_layers(halves: list, first_layer: int) -> list:
    """[Layer] of a step whose ``i``-th layer (model layer ``first_layer + i``) holds the
    halves ``halves[i]`` = (attention, MLP); the caches numbered by attending layer."""
    layers, c = [], 0
    for i, (att, mlp) in enumerate(halves):
        n = first_layer + i
        layers.append(Layer(n, Attention(n, c) if att else None, MLP(n) if mlp else None))
        c += bool(att)
    return layers


# ---- the step ------------------------------------------------------------------------

class DecoderStep(torch.nn.Module):
    """The step of ``steps`` tokens: its weights (prepared by
    :func:`~.decoders.decoder_step`) as buffers, so that torch.export keeps them as the
    module's constants.

    ``layers``: the step's :class:`Layer`s; ``linears``: the linear strategy; ``dense``:
    [(weight buffer name, input site)] of its dense layers; ``shard``: the
    :class:`~.decoders.TensorShard` of a tensor-parallel chip (None: one chip), whose
    logits are vocabulary rows ``head_rows``;
    ``first``/``last``: whether the step embeds the tokens and whether it ends in the
    head (a pipeline's first and last stages); ``embed_in_step``: the first input is
    token ids (else embedding rows the host looked up)."""

    def __init__(self, weights: dict, spec, steps: int, layers: list, linears, dense: list, shard=None,
                 head_rows: "slice | None" = None, first: bool = True, last: bool = True, embed_in_step: bool = True):
        super().__init__()
        self.spec, self.steps = spec, steps
        self.family = FAMILY_LAYERS[spec.family]
        self.blocks, self.linears, self.shard = layers, linears, shard
        self.first, self.last, self.embed_in_step = first, last, embed_in_step
        self.layer_buffers = []  # per layer: {key: buffer name, or a float / None kept as is}
        for i, layer in enumerate(weights["layers"]):
            names = {}
            for key, t in layer.items():
                if isinstance(t, float) or t is None:
                    names[key] = t
                else:
                    self.register_buffer(f"layer{i}_{key}", t)
                    names[key] = f"layer{i}_{key}"
            self.layer_buffers.append(names)
        if self.family.rope and any(b.attention for b in layers):
            # RoPE: x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] head by
            # head, is x's halves swapped (lanes moved on the SXM) times a sine whose
            # first half is negated: one row of each table per position, gathered for
            # a sequence's query rows (r, t) and key rows t (every sequence's, all at one position).
            # Both in one table, side by side, when a vector holds both rows (head_dim
            # <= lanes / 2): one gather, and a table of 4k rows stored once, not twice (a
            # row of 128 values takes a whole vector; 2.6 MiB a table at 4k in fp16).
            half = spec.head_dim // 2
            sin_signed = torch.cat([-weights["sin"][:, :half], weights["sin"][:, half:]], 1)
            if spec.rope_tables_shared:
                self.register_buffer("cos_sin", torch.cat([weights["cos"], sin_signed], 1))
            else:
                self.register_buffer("cos", weights["cos"])
                self.register_buffer("sin_signed", sin_signed)
        for key in ("embed", "lm_head", "norm_w", "norm_b", "positions"):
            if key == "embed" and not embed_in_step or not first and key in ("embed", "positions") or \
                    not last and key in ("lm_head", "norm_w", "norm_b"):
                continue
            if weights.get(key) is not None:  # (the head's weight beside its scope, lm_head)
                self.register_buffer("lm_head_weight" if key == "lm_head" else key, weights[key])
        linears.add_buffers(self, dense)
        self.sites = dict(dense)  # a dense layer's weight buffer -> the input site of its scale
        add_scopes(self, [f"layers.{b.index}.{part}" for b in layers
                          for part in (ATTENTION_PARTS if b.attention else ()) + (MLP_PARTS if b.mlp else ())]
                   + list(STEP_PARTS))
        self.eps = weights["eps"]
        dtype = weights["embed"].dtype
        if shard is not None and last:  # zeros where the other chips' logits go (constants)
            for name, width in (("head_before", head_rows.start), ("head_after", spec.vocab - head_rows.stop)):
                if width:
                    self.register_buffer(name, torch.zeros(spec.batch, width, dtype=dtype))
        self._register_positions(spec, steps, dtype)
        self.scale = spec.head_dim ** -0.5

    def _register_positions(self, spec, steps: int, dtype):
        """The index and mask tables of the step's rows."""
        i32 = torch.int32
        B, T, C = spec.batch, steps, spec.max_context
        t = torch.arange(T, dtype=i32)
        # The rows a step looks positions up for -> their position, less the step's first:
        # every token row (b, t) for learned positions, which are added to each row; one
        # sequence's rows t for RoPE, whose table rows every sequence shares (all are at
        # the same position).
        self.register_buffer("token_offsets", t if self.family.rope else t.repeat(B))  # [T] or [B*T]
        # Each sequence has caches of its own, all at the same position: row t of one
        # -> its cache row at position 0.
        self.register_buffer("row_offsets", t[:, None])  # [T, 1]
        for _, n in spec.value_packs:  # a value cache's columns (index_put takes an index per axis)
            self.register_buffer(f"cols_{n * spec.head_dim}", torch.arange(n * spec.head_dim, dtype=i32)[None, :])
        # The mask before the position is added: query row (r, t) of a group may see
        # cache row j iff j <= position + t, i.e. position + base >= 0 with base = t - j.
        # Int32, added to the position before any float: a float16 position is exact only
        # to 2,048 (position 2,051 would read 2,052 and see one future row). One block of
        # rows t, which the scores' rows (r, t) meet again for each query head r of a
        # group: stored rep times over (rep x 128 x 4,096 int32 for a 4k prompt) it
        # crowded out of the SRAM the whole slices a 4k value cache needs (Llama-3-70B's
        # eighth on LP30); a decode step pays about 1% for the repeat.
        j = torch.arange(C, dtype=i32)
        self.register_buffer("mask_base", t[:, None] - j[None, :])  # [T, C]
        # The new keys' columns of a key cache (stored K^T): row t is column position + t,
        # where position + column_base is 0 ...
        self.register_buffer("column_base", self.row_offsets - j[None, :])  # [T, C]
        # ... and column j is written by the step iff position <= j < position + T:
        # clamp(position - j + T, 0, 1) - clamp(position - j, 0, 1) is 1 there, else 0.
        self.register_buffer("column_from_last", -j[None, :])  # [1, C]
        self.register_buffer("column_after_first", T - j[None, :])

    def forward(self, input_ids, position, *caches):
        s, T, B = self.spec, self.steps, self.spec.batch
        attends = any(b.attention for b in self.blocks)
        # [B*T, H]: the ids' rows, or the rows themselves (a later pipeline stage's: the
        # hidden rows of the stage before)
        model = self.scope("model")  # each op in its part of the step (the report's rows)
        x = model("embed_tokens")(self.embed.index_select, 0, input_ids) if self.embed_in_step and self.first \
            else input_ids
        pos_rows = model("positions")(torch.add, position, self.token_offsets)  # int32 (_register_positions)
        rope = None
        if not self.family.rope:
            if self.first:
                x = model("embed_tokens")(lambda x, p: x + self.positions.index_select(0, p), x, pos_rows)
        elif attends:  # the tables' rows for a sequence's rows t, the queries' scaled
            def tables(pos_rows):  # the queries' scaled by 1/sqrt(D) (Attention.queries)
                if s.rope_tables_shared:
                    both, D = self.cos_sin.index_select(0, pos_rows), s.head_dim
                    cos, sin = both[:, :D], both[:, D:]
                else:
                    cos, sin = self.cos.index_select(0, pos_rows), self.sin_signed.index_select(0, pos_rows)
                return cos * self.scale, sin * self.scale, cos, sin
            rope = model("rotary_emb")(tables, pos_rows)
        mask = places = None
        if attends:
            # 0 where a query row may see a cache row, -1e4 elsewhere (exp(-1e4) is 0 in
            # every float format, and -1e4 fits fp16).
            mask = model("mask")(lambda p: torch.clamp((p + self.mask_base).to(x.dtype), -1.0, 0.0) * MASK_SCALE,
                                 position)
            places = model("positions")(self._cache_places, position, x.dtype)
        caches, new_caches = dict(zip(s.cache_names, caches)), {}
        for i, (names, block) in enumerate(zip(self.layer_buffers, self.blocks)):
            w = {key: getattr(self, n) if isinstance(n, str) else n for key, n in names.items()}

            def dense(x, key, i=i, w=w, n=block.index):
                """Dense layer ``key`` of the ``i``-th layer: its input quantized (8-bit
                linears), multiplied, its bias added; as the layer's part."""
                name = f"layer{i}_{key}"
                return self.scope(f"layers.{n}")(DENSE_PATHS[key])(
                    lambda x: self.linears.apply(self, self.linears.input(x, self.sites[name]), name,
                                                 w.get(f"{key}_bias")), x)

            if block.attention is not None:
                x = block.attention(self, x, w, dense, caches, new_caches, mask, places, rope)
            if block.mlp is not None:
                x = block.mlp(self, x, w, dense)
        if not self.last:  # the hidden rows, every token's, to the next stage
            return (x, *(new_caches[n] for n in s.cache_names))
        def last_norm(x):  # [B, H]: the last token's rows, normalized
            if T > 1:
                x = x.reshape(B, T, s.hidden)[:, T - 1:T].reshape(B, s.hidden)
            return self.family.norm(x, self.norm_w, getattr(self, "norm_b", None), self.eps)

        def head(h):
            logits = self.linears.apply(self, self.linears.input(h, "head"), "lm_head_weight", None)
            if self.shard is None:
                return logits
            # This chip's tokens' logits among zeros, summed over the chips (zeros times
            # the position: values of the step, as the concat of a value and a constant is
            # not an LPX op; the product is exactly 0).
            parts = [getattr(self, "head_before", None), logits, getattr(self, "head_after", None)]
            return all_reduce(torch.cat([t if t is logits else t * position.to(t.dtype) for t in parts
                                         if t is not None], dim=1))

        at = self.scope()
        logits = at("lm_head")(head, model("norm")(last_norm, x))
        next_ids = at("argmax")(lambda t: t.argmax(-1, keepdim=True).to(torch.int32), logits)
        return (next_ids, logits, *(new_caches[n] for n in s.cache_names))

    def _cache_places(self, position, dtype) -> "CachePlaces":
        """Where the step's new tokens go in the caches (arithmetic on the position)."""
        def near(base):  # position + base, exact in int32, then float: 0 where it is 0
            return (position + base).to(dtype)
        one_hot = torch.clamp(1.0 - torch.abs(near(self.column_base)), 0.0, 1.0)
        written = torch.clamp(near(self.column_after_first), 0.0, 1.0) - torch.clamp(near(self.column_from_last), 0.0, 1.0)
        # A decode step's new key columns, one row per head dimension (decode_scores' product).
        fresh = written.expand(self.spec.head_dim, -1) if self.steps == 1 else None
        return CachePlaces(position.reshape(1, 1) + self.row_offsets, one_hot, 1.0 - written, fresh)

    def scope(self, prefix: str = ""):
        """``at(part)``: the :class:`Scope` at ``prefix.part`` (made in ``__init__``)."""
        base = self.get_submodule(prefix) if prefix else self
        return base.get_submodule

    def summed(self, partial):
        """o's or down's output: with tensor parallelism, the chips' partial products summed."""
        return partial if self.shard is None else all_reduce(partial)

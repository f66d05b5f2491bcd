"""Random valid decoder configs, prompts and chip mappings, for the decoder fuzzer (docs/fuzz.md).

Four families, those of ``lpx_tvm.frontends.decoders.FAMILIES``:

- ``llama``, ``qwen2``, ``mistral``: grouped-query attention of any ratio (MHA and MQA
  included), even head dims, sometimes an explicit ``head_dim`` unlike hidden / heads,
  tied or untied embeddings, RoPE ``default``, ``linear`` or ``llama3`` scaling with a
  random ``rope_theta``, a random ``rms_norm_eps``; Qwen2 with its q, k and v biases
  and sometimes ``use_sliding_window`` with a window no shorter than the context;
  Mistral with no window or one no shorter than the context;
- ``gpt2``: any head count dividing ``n_embd``, ``n_inner`` drawn or default, the GELU
  (tanh form) activations the steps implement, tied or untied.

All small (hidden <= 256, vocab <= 700, 1 to 4 layers) so that a case compiles in seconds.
A case also draws a prompt (1 to 16 ids), 3 to 8 new tokens, a context and a mapping:
one chip (``tsp`` or ``lp30``), or chips of a system by tensor and pipeline parallelism
(``groqnode`` with random chips, or a small random system whose links fit the mapping:
all-to-all, or tensor groups pairwise linked with rank-matched links between stages, on
random ports).

Case ``index`` of ``family`` and ``seed`` is always the same: it draws from
``numpy.random.default_rng([seed, family, index, 0])`` (the config, weights' seed and
scale), stream 1 (the prompt) and stream 2 (the mapping), so that a mapping change does
not change the model. Public API: :data:`FAMILIES`, :func:`config`, :func:`case`,
:func:`build_model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")
MAPPINGS = ("chip", "tp", "pp", "tp-pp")  # the kinds of mapping, for the bench's table

MAX_HIDDEN = 256
MAX_VOCAB = 700


@dataclass(frozen=True)
class Mapping:
    """Where a case compiles: one chip of ``preset``, or ``system`` (a preset name or a
    system dict) with ``compile_llm``'s mapping arguments in ``args``."""

    kind: str  # one of MAPPINGS
    preset: str = "tsp"
    system: "str | dict | None" = None
    args: dict = field(default_factory=dict)  # chips, tensor_parallel, pipeline_stages, split_layers

    def describe(self) -> str:
        if self.system is None:
            return f"one {self.preset} chip"
        name = self.system if isinstance(self.system, str) else self.system["name"]
        return f"{name} {' '.join(f'{k}={v}' for k, v in self.args.items())}"

    def to_json(self) -> dict:
        return dict(kind=self.kind, preset=self.preset, system=self.system, args=self.args)


@dataclass(frozen=True)
class Case:
    """One fuzz case: a config dict (``config.json`` keys), the weights' seed and scale,
    a prompt, how many tokens to generate, the context and the mapping."""

    family: str
    index: int
    seed: int
    config: dict
    weight_seed: int
    weight_scale: float
    prompt: np.ndarray = field(repr=False)  # int64 [1, P]
    new_tokens: int
    max_context: int
    mapping: Mapping

    @property
    def name(self) -> str:
        return f"{self.family}-{self.index}-s{self.seed}"

    def describe(self) -> str:
        c = self.config
        if self.family == "gpt2":
            shape = (f"{c['n_layer']} layers, {c['n_head']} heads of {c['n_embd'] // c['n_head']}, "
                     f"hidden {c['n_embd']}, mlp {c.get('n_inner') or 4 * c['n_embd']}")
        else:
            hd = c.get("head_dim")
            shape = (f"{c['num_hidden_layers']} layers, {c['num_attention_heads']} heads / "
                     f"{c['num_key_value_heads']} kv of {hd or c['hidden_size'] // c['num_attention_heads']}"
                     f"{' (explicit)' if hd else ''}, hidden {c['hidden_size']}, mlp {c['intermediate_size']}, "
                     f"rope {(c.get('rope_scaling') or {}).get('rope_type', 'default')} theta {c['rope_theta']:g}")
        tied = "tied" if c.get("tie_word_embeddings", self.family == "gpt2") else "untied"
        return (f"{self.name}: {self.family} {shape}, vocab {c['vocab_size']}, {tied}; prompt {self.prompt.shape[1]} "
                f"+ {self.new_tokens} new in {self.max_context}; {self.mapping.describe()}")

    def to_json(self) -> dict:
        """Everything a reproducer needs (with :func:`build_model`)."""
        return dict(family=self.family, index=self.index, seed=self.seed, config=self.config,
                    weight_seed=self.weight_seed, weight_scale=self.weight_scale,
                    prompt=self.prompt.tolist(), new_tokens=self.new_tokens, max_context=self.max_context,
                    mapping=self.mapping.to_json())


def _rng(family: str, index: int, seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, FAMILIES.index(family), index, stream])


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def _eps(rng) -> float:
    return float(rng.choice([1e-6, 1e-5, 1e-12, float(10 ** rng.uniform(-8, -4))]))


def _rope(rng, cfg: dict) -> None:
    """RoPE keys of a Llama-like config: theta, and default, linear or llama3 scaling."""
    cfg["rope_theta"] = float(rng.choice([10000.0, 500000.0, 1000000.0, float(round(10 ** rng.uniform(2, 6)))]))
    kind = rng.choice(["default", "linear", "llama3"], p=[0.4, 0.3, 0.3])
    if kind == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(rng.choice([1.5, 2.0, 4.0, 8.0]))}
    elif kind == "llama3":
        # A small original_max_position_embeddings: the wavelengths it splits into three
        # bands (kept, interpolated, divided by the factor) occur at small head dims.
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": float(rng.choice([2.0, 8.0, 32.0])),
                               "low_freq_factor": float(rng.choice([1.0, 0.5])),
                               "high_freq_factor": float(rng.choice([2.0, 4.0])),
                               "original_max_position_embeddings": int(rng.choice([8, 16, 32]))}


def config(family: str, index: int, seed: int = 0) -> dict:
    """Config ``index`` of ``family`` for ``seed`` as ``config.json`` keys (with
    ``model_type``): always the same valid, small config."""
    return _draw(family, index, seed)[0]


def _draw(family: str, index: int, seed: int):
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    if index < 0 or seed < 0:
        raise ValueError("index and seed are non-negative")
    rng = _rng(family, index, seed, 0)
    vocab = int(rng.integers(17, MAX_VOCAB + 1))
    layers = int(rng.integers(1, 5))
    tied = bool(rng.random() < 0.5)
    if family == "gpt2":
        heads = int(rng.choice([1, 2, 3, 4, 5, 6, 8]))
        head_dim = int(rng.integers(4, MAX_HIDDEN // heads + 1))
        hidden = heads * head_dim
        cfg = dict(model_type="gpt2", vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                   n_positions=int(rng.choice([64, 128, 1024])),
                   n_inner=None if rng.random() < 0.4 else int(rng.integers(8, 513)),
                   activation_function=str(rng.choice(["gelu_new", "gelu_pytorch_tanh"])),
                   layer_norm_epsilon=_eps(rng), tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0)
    else:
        heads = int(rng.choice([1, 2, 3, 4, 6, 8, 12]))
        ratio = rng.random()
        kv = heads if ratio < 0.25 else 1 if ratio < 0.45 else int(rng.choice(_divisors(heads)))
        explicit = rng.random() < 0.35
        head_dim = 2 * int(rng.integers(2, MAX_HIDDEN // (2 * heads) + 1)) if heads <= 32 else 8
        if explicit:  # transformers still asks hidden to be a multiple of the heads
            hidden = heads * int(rng.integers(max(1, 16 // heads), MAX_HIDDEN // heads + 1))
        else:
            hidden = heads * head_dim
        cfg = dict(model_type=family, vocab_size=vocab, hidden_size=hidden,
                   intermediate_size=int(rng.integers(8, 513)), num_hidden_layers=layers,
                   num_attention_heads=heads, num_key_value_heads=kv, hidden_act="silu",
                   max_position_embeddings=int(rng.choice([64, 128, 4096])), rms_norm_eps=_eps(rng),
                   tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)
        if explicit:
            cfg["head_dim"] = head_dim
        _rope(rng, cfg)
        if family == "llama":
            cfg.update(attention_bias=False, mlp_bias=False)
        elif family == "qwen2":
            window = rng.random() < 0.3
            cfg.update(use_sliding_window=bool(window), sliding_window=int(rng.choice([64, 128, 4096])) if window
                       else None, max_window_layers=int(rng.integers(0, layers + 1)))
        else:  # mistral
            cfg["sliding_window"] = None if rng.random() < 0.5 else int(rng.choice([64, 128, 4096]))
            if "head_dim" not in cfg:
                cfg["head_dim"] = head_dim  # Mistral's configs always carry it
    weight_seed = int(rng.integers(0, 2**31))
    weight_scale = float(rng.uniform(2.0, 4.0))
    return cfg, weight_seed, weight_scale


def _kv_heads(cfg: dict) -> int:
    return cfg["n_head"] if cfg["model_type"] == "gpt2" else cfg["num_key_value_heads"]


def _layers(cfg: dict) -> int:
    return cfg["n_layer"] if cfg["model_type"] == "gpt2" else cfg["num_hidden_layers"]


def _mapping(rng, cfg: dict) -> Mapping:
    """One chip half the time; else tensor x pipeline parallelism on a system that has the
    links it needs: a tensor degree dividing the kv heads, at most as many stages as
    layers (or half layers with ``split_layers``), at most 4 chips."""
    if rng.random() < 0.5:
        return Mapping("chip", preset=str(rng.choice(["tsp", "lp30"], p=[0.8, 0.2])))
    layers = _layers(cfg)
    tps = [d for d in _divisors(_kv_heads(cfg)) if 1 < d <= 4]
    split = layers < 4 and rng.random() < 0.25
    most = 2 * layers if split else layers  # stages
    kinds = ["pp"] + (["tp"] if tps else []) + (["tp-pp"] if [t for t in tps if 2 * t <= 4] else [])
    kind = str(rng.choice(kinds))
    if kind != "tp" and most == 1:
        split, most = True, 2
    tp = 1 if kind == "pp" else int(rng.choice([t for t in tps if kind == "tp" or 2 * t <= 4]))
    stages = 1 if kind == "tp" else int(rng.integers(2, max(2, min(most, 4 // tp)) + 1))
    split = split and stages > 1
    args = {}
    how = rng.random()
    if how < 0.35:  # GroqNode (all-to-all): any chips, in any order
        chips = [int(c) for c in rng.permutation(8)[:tp * stages]]
        system = "groqnode"
        args.update(chips=chips, tensor_parallel=tp)
    else:
        extra = int(rng.integers(0, 2))
        n = tp * stages + extra
        ports = 16  # tsp's C2C links
        if how < 0.6:
            system = {"name": f"a2a-{n}", "preset": "tsp", "chips": n, "topology": "all_to_all",
                      "links_per_pair": int(rng.integers(1, 3))}
        else:
            # Stage groups of tp chips, pairwise linked; rank r of a stage linked to rank r
            # of the next; an extra chip hung off the last; each chip's ports in random order.
            free = [list(rng.permutation(ports)) for _ in range(n)]
            links = []

            def link(a, b):
                links.append([a, int(free[a].pop()), b, int(free[b].pop())])

            for s in range(stages):
                for i in range(tp):
                    for j in range(i + 1, tp):
                        link(s * tp + i, s * tp + j)
                    if s + 1 < stages:
                        link(s * tp + i, (s + 1) * tp + i)
            for e in range(extra):
                link(tp * stages - 1, tp * stages + e)
            system = {"name": f"groups-{tp}x{stages}", "preset": "tsp", "chips": n, "links": links}
        if rng.random() < 0.5 or extra:
            args.update(pipeline_stages=stages, tensor_parallel=tp)  # chips from stage_groups
        else:
            args.update(chips=list(range(n)), tensor_parallel=tp)
    if split:
        args["split_layers"] = True
    return Mapping(kind, system=system, args=args)


def case(family: str, index: int, seed: int = 0) -> Case:
    """Case ``index`` of ``family`` for ``seed``: the config, a prompt, the new tokens,
    the context and the mapping."""
    cfg, weight_seed, weight_scale = _draw(family, index, seed)
    rng = _rng(family, index, seed, 1)
    prompt_len = int(rng.integers(1, 17))
    new = int(rng.integers(3, 9))
    # Room for the prompt and new - 1 fed-back tokens; sometimes exactly that.
    context = prompt_len + new - 1 + (0 if rng.random() < 0.2 else int(rng.integers(1, 9)))
    context = max(context, prompt_len + 1)
    prompt = rng.integers(0, cfg["vocab_size"], (1, prompt_len)).astype(np.int64)
    mapping = _mapping(_rng(family, index, seed, 2), cfg)
    return Case(family, index, seed, cfg, weight_seed, weight_scale, prompt, new, context, mapping)


def build_model(c: Case):
    """The case's ``transformers`` model: built from its config with seeded random weights,
    the matrices scaled by ``weight_scale`` so that the logits of different tokens
    differ clearly (a wrong step then picks other tokens rather than the same by luck)."""
    import torch
    import transformers

    cfg = dict(c.config)
    kind = cfg.pop("model_type")
    conf = transformers.AutoConfig.for_model(kind, **cfg)
    torch.manual_seed(c.weight_seed)
    model = transformers.AutoModelForCausalLM.from_config(conf).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(c.weight_scale)
    # Greedy generation with no end token: every case generates all its tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model

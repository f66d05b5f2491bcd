"""Capacity planning: how a decoder maps onto a system, predicted from simulation
(docs/multichip.md, "Planning").

For each tensor-parallel degree ``t`` (a divisor of the kv heads, ``t`` pairwise linked
chips) and batch, the decoder's step is compiled and simulated, on ``t`` chips of the
system with its in-program all-reduces, with two layers and with three: a decode step of
``L`` layers then takes ``D(3) + (L - 3) (D(3) - D(2))`` cycles (its layers are the same
program, each with its two all-reduces; the first layer overlaps the embedding's work
and is not a steady one, so the increment is taken past it), and the prefill likewise. Nothing is a roofline guess: every
cycle is the simulator's. The planner's prediction is checked against the whole model
simulated (tests/llm/test_plan.py, bench/multichip.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import LPXError
from ..frontends import decoders
from ..machine.system import load_system
from .session import compile_llm, load_decoder, matrix_parameters, matrix_value_bytes
from .steps import WEIGHT_BUDGET, cache_bytes_as_stored, float_bytes

SAMPLED = (2, 3)  # the layer counts simulated; a model of no more layers is simulated whole


@dataclass
class Mapping:
    """One tensor-parallel degree and batch, predicted."""

    tensor_parallel: int
    batch: int
    chips: int
    sram_fill: float  # the fullest chip's weights and caches over its SRAM
    fits: bool
    ttft_cycles: "int | None" = None
    decode_cycles_per_token: "int | None" = None
    tokens_per_s_per_user: "float | None" = None
    tokens_per_s_per_chip: "float | None" = None
    tokens_per_s_per_system: "float | None" = None
    link_utilization: "float | None" = None  # link bytes a token over what its links carry meanwhile
    layer_cycles: "int | None" = None  # one layer of the decode step, its all-reduces included
    why: str = ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Plan:
    model: str
    system: str
    precision: str
    context: int
    layers: int
    mappings: list = field(default_factory=list)

    def best(self, slo_tokens_per_s_per_user: float = 0.0) -> "Mapping | None":
        """The mapping with the most tokens/s per chip among those meeting the SLO."""
        ok = [m for m in self.mappings if m.fits and m.tokens_per_s_per_user and
              m.tokens_per_s_per_user >= slo_tokens_per_s_per_user]
        return max(ok, key=lambda m: (m.tokens_per_s_per_chip, m.tokens_per_s_per_user), default=None)

    def pareto(self) -> list:
        """Mappings no other beats on both tokens/s per user and per chip."""
        ok = [m for m in self.mappings if m.fits and m.tokens_per_s_per_user]
        return [m for m in ok if not any(o.tokens_per_s_per_user >= m.tokens_per_s_per_user and
                                         o.tokens_per_s_per_chip >= m.tokens_per_s_per_chip and o is not m and
                                         (o.tokens_per_s_per_user, o.tokens_per_s_per_chip) !=
                                         (m.tokens_per_s_per_user, m.tokens_per_s_per_chip) for o in ok)]

    def to_json(self) -> dict:
        return dict(model=self.model, system=self.system, precision=self.precision, context=self.context,
                    layers=self.layers, mappings=[m.to_json() for m in self.mappings])


def _with_layers(model, layers: int, seed: int):
    """The model's config with ``layers`` layers, random weights (seeded)."""
    cfg = model.config.to_dict()
    key = "n_layer" if cfg.get("model_type") == "gpt2" else "num_hidden_layers"
    cfg[key] = layers
    return load_decoder(cfg, seed)


def plan(model_or_config, system, precision: str = "fp16", context: int = 256, prompt_len: int = 128,
         batches=(1,), tensor_parallel=None, max_chips: "int | None" = None, seed: int = 0) -> Plan:
    """Predict every tensor-parallel degree x batch of a decoder on ``system``.

    ``tensor_parallel``: the degrees to try (default: the divisors of the kv heads that
    fit a pairwise linked group of the system, up to ``max_chips``)."""
    system = load_system(system)
    model = load_decoder(model_or_config, seed)
    spec = decoders.spec_of(model, context)
    if not 1 <= prompt_len < context:
        raise LPXError(f"a prompt of {prompt_len} tokens in a context of {context}")
    group = _linked_group(system)
    limit = min(len(group), max_chips or system.chips)
    degrees = tensor_parallel or [t for t in range(1, limit + 1) if spec.kv_heads % t == 0]
    out = Plan(getattr(model.config, "_name_or_path", "") or spec.family, system.name, precision, context,
               spec.layers)
    small = {n: _with_layers(model, n, seed) for n in SAMPLED if n < spec.layers} if spec.layers > SAMPLED[-1] \
        else {}
    for t in degrees:
        if t > len(group):
            raise LPXError(f"tensor parallelism over {t} chips: system {system.name}'s largest pairwise linked "
                           f"group starting at chip 0 has {len(group)}")
        for batch in batches:
            out.mappings.append(_predict(model, spec, small, system, group[:t], precision, context, prompt_len,
                                         batch))
    return out


def _linked_group(system) -> list:
    """Chips 0, 1, ... as long as each is linked to all before it."""
    group = [0]
    for c in range(1, system.chips):
        if all(system.links_between(c, d) for d in group):
            group.append(c)
        else:
            break
    return group


def _predict(model, spec, small: dict, system, chips, precision, context, prompt_len, batch) -> Mapping:
    cfg, t = system.config, len(chips)
    matrices = matrix_parameters(model)
    # A chip's share of the matrices, the tables and norms whole, its kv heads' caches.
    per_chip = (matrices / t * matrix_value_bytes(precision) + (spec.parameters - matrices) * float_bytes(precision)
                + cache_bytes_as_stored(decoders.shard_spec(replace(spec, batch=batch), t), cfg, precision))
    fill = per_chip / cfg.sram_bytes
    m = Mapping(t, batch, t, fill, fill <= WEIGHT_BUDGET)
    if not m.fits:
        m.why = f"{per_chip / 2**20:,.0f} MiB a chip of {cfg.sram_bytes / 2**20:,.0f}"
        return m
    runs = {}
    for n, layer_model in (small or {spec.layers: model}).items():
        kw = dict(precision=precision, max_context=context, batch=batch, prompt_len=prompt_len)
        s = compile_llm(layer_model, system=system, chips=chips, **kw) if t > 1 else \
            compile_llm(layer_model, preset=cfg, **kw)
        if t > 1:
            runs[n] = (s.decode_cycles, s.prefill_cycles(prompt_len), s.decode_link_bytes)
        else:
            runs[n] = (s.decode.cycles, s.prefill_step(prompt_len).cycles, 0)
    L = spec.layers
    if len(runs) == 1:  # simulated whole
        (d, p, link_bytes), = runs.values()
        m.layer_cycles, m.decode_cycles_per_token, m.ttft_cycles = None, d, p
    else:
        (d2, p2, l2), (d3, p3, l3) = (runs[n] for n in SAMPLED)
        m.layer_cycles = d3 - d2
        m.decode_cycles_per_token = d3 + (L - 3) * (d3 - d2)
        m.ttft_cycles = p3 + (L - 3) * (p3 - p2)
        link_bytes = l3 + (L - 3) * (l3 - l2)
    per_user = cfg.clock_hz / m.decode_cycles_per_token
    m.tokens_per_s_per_user = per_user
    m.tokens_per_s_per_system = per_user * batch
    m.tokens_per_s_per_chip = per_user * batch / t
    directed = t * (t - 1)  # links in use, each direction
    m.link_utilization = link_bytes / (directed * cfg.c2c_bytes_per_cycle * m.decode_cycles_per_token) \
        if directed else 0.0
    return m


def plan_table(p: Plan) -> list:
    """Rows of strings for printing a plan."""
    rows = []
    for m in p.mappings:
        if not m.fits:
            rows.append([str(m.tensor_parallel), str(m.batch), str(m.chips), f"{m.sram_fill:.0%}", "does not fit",
                         "", "", "", "", ""])
            continue
        rows.append([str(m.tensor_parallel), str(m.batch), str(m.chips), f"{m.sram_fill:.0%}",
                     f"{m.ttft_cycles:,}", f"{m.decode_cycles_per_token:,}", f"{m.tokens_per_s_per_user:,.0f}",
                     f"{m.tokens_per_s_per_chip:,.0f}", f"{m.tokens_per_s_per_system:,.0f}",
                     f"{m.link_utilization:.1%}"])
    return rows


PLAN_COLUMNS = ["TP", "batch", "chips", "SRAM fill", "TTFT cycles", "decode cycles/token", "tokens/s/user",
                "tokens/s/chip", "tokens/s/system", "link use"]


def save_pareto(p: Plan, path: str) -> None:
    """A PNG of tokens/s per user against tokens/s per chip, the Pareto front marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LPXError("the Pareto figure needs matplotlib: pip install 'lpx-tvm[profile]'") from None
    ok = [m for m in p.mappings if m.fits and m.tokens_per_s_per_user]
    front = p.pareto()
    fig, ax = plt.subplots(figsize=(6.5, 4.5), constrained_layout=True)
    ax.scatter([m.tokens_per_s_per_chip for m in ok], [m.tokens_per_s_per_user for m in ok], c="0.6")
    front.sort(key=lambda m: m.tokens_per_s_per_chip)
    ax.plot([m.tokens_per_s_per_chip for m in front], [m.tokens_per_s_per_user for m in front], "o-", c="C0")
    for m in ok:
        ax.annotate(f"TP{m.tensor_parallel} b{m.batch}", (m.tokens_per_s_per_chip, m.tokens_per_s_per_user),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("tokens/s per chip")
    ax.set_ylabel("tokens/s per user")
    ax.set_title(f"{p.model} on {p.system} ({p.precision}, context {p.context})")
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""Capacity planning: how a decoder maps onto a system, predicted from simulation
(docs/multichip.md, "Planning").

A mapping is ``t`` chips of tensor parallelism per pipeline stage (``t`` a divisor of the
kv heads, pairwise linked chips), ``S`` pipeline stages of contiguous layers (the chips
:meth:`~lpx_tvm.machine.system.System.stage_groups` picks) and a batch. For each ``t``
and batch the decoder's step is compiled and simulated on ``t`` chips with two layers
and with four: a step of ``L`` layers on one stage takes ``D(4) + (L - 4) l`` cycles,
``l = (D(4) - D(2)) / 2`` (its layers are the same program, each with its two
all-reduces; the first layer overlaps the embedding's work and the last the head's, so
the increment is that of the two inner layers, averaged: a schedule placed greedily does
not add one layer's cycles exactly). For ``S > 1`` a model of ``2k`` layers is also simulated as ``k``
stages of two layers (``k`` = 3, or 2 for a mapping of two stages): the cycle
each stage ends gives the span of a first stage (embedding, its layers, the hand-off
out), of a middle one (from its rows' arrival) and of the last (to the argmax), each
with two layers; a stage of ``n`` layers adds ``(n - 2) l``, and a boundary the topology
puts more than one link apart adds what the longer path adds to a point-to-point
transfer of the hidden rows (:func:`~lpx_tvm.target.system_programs.point_to_point`,
simulated). Prefill likewise. Nothing is a roofline guess: every cycle is the
simulator's.

Throughput: a pipeline of ``S`` stages keeps one micro-batch of ``batch`` users in flight
(the lowest latency: each stage idle while the others work), or ``S``, each stage on a
different one; a user's next token waits for its previous one (``D`` cycles) and for the
first stage to come round (``m`` stage intervals, the slowest stage's span). Each stage
holds every micro-batch's caches, which the SRAM fill counts. The planner's prediction is
checked against the whole mapping simulated (tests/llm/test_plan.py, bench/multichip.py);
micro-batching itself is planned, not compiled (a session runs one micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConfigError, LPXError
from ..frontends import decoder_config, decoders
from ..machine.system import load_system
from ..target.system_programs import collective, handoff, handoff_sharded, point_to_point
from .session import compile_llm, fit_problem, host_table_values, load_decoder, matrix_parameters
from .sizing import (FLOAT_OF, cache_bytes_as_stored, float_bytes, half_layer_stored, matrix_value_bytes, matrix_values,
                     rope_table_values)
from .step_program import WEIGHT_BUDGET, embeds_on_chip

SAMPLED = (2, 4)  # the layer counts simulated: the increment between them is a steady layer's
# samples="chip": one chip's share of one and two layers (two fit an LP30 chip beside a
# 128k-token head's eighth where four do not); of none and one where two do not fit (an
# eighth of a Llama-2-70B layer on a TSP).
CHIP_SAMPLED, CHIP_SAMPLED_LARGE = (1, 2), (0, 1)
SAMPLES = ("system", "chip")


@dataclass
class Mapping:
    """One tensor-parallel degree, pipeline depth and batch, predicted."""

    tensor_parallel: int
    batch: int
    chips: int
    sram_fill: float  # the fullest chip's weights and caches over its SRAM
    fits: bool
    pipeline_stages: int = 1
    micro_batches: int = 1  # in flight, each of ``batch`` users: 1, or one per stage
    ttft_cycles: "int | None" = None
    decode_cycles_per_token: "int | None" = None
    tokens_per_s_per_user: "float | None" = None
    tokens_per_s_per_chip: "float | None" = None
    tokens_per_s_per_system: "float | None" = None
    link_utilization: "float | None" = None  # link bytes a token over what its links carry meanwhile
    layer_cycles: "int | None" = None  # one layer of the decode step, its all-reduces included
    handoff_cycles: "int | None" = None  # what a stage boundary adds to the decode step, against one stage
    stage_interval_cycles: "int | None" = None  # the slowest stage's share of a decode step
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


def _shape_only(model_or_config, seed: int):
    """The model, or for a config one with its shapes and no weights (on torch's meta
    device: a 70B config plans without 280 GB of random weights); the sampled models get
    real ones."""
    import torch

    if isinstance(model_or_config, torch.nn.Module):
        return load_decoder(model_or_config, seed)
    with torch.device("meta"):
        return load_decoder(model_or_config, seed)


def plan(model_or_config, system, precision: str = "fp16", context: int = 256, prompt_len: int = 128,
         batches=(1,), tensor_parallel=None, pipeline=None, max_chips: "int | None" = None, seed: int = 0,
         workers: int = 0, ray_address: "str | None" = None, simulate: bool = True,
         samples: str = "system", split_layers: bool = False, sram_budget: float = WEIGHT_BUDGET) -> Plan:
    """Predict every tensor-parallel degree x pipeline depth x batch of a decoder on
    ``system``.

    ``tensor_parallel``: the degrees to try (default: the divisors of the kv heads that
    fit an aligned pairwise linked group of the system). ``pipeline``: the depths
    (default: 1, 2, 4, ... up to the layers, and the layers). Mappings of more than
    ``max_chips`` chips (default: the system's) are left out. The sampled models are
    compiled and simulated in ``workers`` processes, or on Ray at ``ray_address`` (the
    pools tuning uses, ``sim/workers.py``); 0: in this process. ``simulate=False`` only
    sizes the mappings (chips, SRAM fill, whether they fit): nothing is compiled.

    ``samples``: ``"system"`` simulates the sampled models on the system's chips, whole
    (tensor-parallel groups, pipeline stages); ``"chip"`` simulates one chip's share of a
    layer alone and adds the collectives' simulated cycles (a model too large to compile
    whole on this machine, docs/multichip.md, "Sampling one chip"). ``split_layers``:
    pipeline stages may cut a layer between its attention and its MLP, the chips'
    weights balanced (:func:`~lpx_tvm.frontends.decoders.split_stages_of`; with
    ``samples="chip"``). ``sram_budget``: the share of a chip's SRAM a mapping's weights
    and caches may fill (the rest is working space; default the compiler's 90%)."""
    if samples not in SAMPLES:
        raise LPXError(f"samples={samples!r}: expected one of {', '.join(SAMPLES)}")
    if split_layers and samples != "chip":
        raise LPXError("split_layers plans from one chip's samples: give samples='chip'")
    system = load_system(system)
    model = _shape_only(model_or_config, seed)
    spec = decoders.spec_of(model, context, lanes=system.config.lanes)
    if not 1 <= prompt_len < context:
        raise LPXError(f"a prompt of {prompt_len} tokens in a context of {context}")
    limit = min(system.chips, max_chips or system.chips)
    degrees = tensor_parallel or [t for t in range(1, limit + 1) if spec.kv_heads % t == 0 and _groups(system, t, 1)]
    depths = pipeline or sorted({2 ** k for k in range(spec.layers.bit_length()) if 2 ** k <= spec.layers} |
                                {spec.layers})
    out = Plan(getattr(model.config, "_name_or_path", "") or spec.family, system.name, precision, context,
               spec.layers)
    runs = _Runs(model, system, precision, context, prompt_len, seed, samples, split_layers, sram_budget)
    sized = []
    for t in degrees:
        if not _groups(system, t, 1):
            raise LPXError(f"tensor parallelism over {t} chips: system {system.name} has no aligned group of {t} "
                           "pairwise linked chips")
        for stages in depths:
            if t * stages > limit:
                continue
            for micro in sorted({1, stages}):
                for batch in batches:
                    sized.append(_sized(spec, runs, t, stages, batch, micro))
    if simulate:
        runs.prefetch([job for m, _ in sized if m.fits for job in runs.jobs(m)], workers, ray_address)
    compose = _composed if samples == "system" else _composed_from_chip
    for m, groups in sized:
        if m.fits and simulate:
            try:
                m = compose(m, spec, runs, groups)
            except LPXError as e:  # a sampled step the compiler refused: the row says why
                m.why = f"not compiled: {e}"
        out.mappings.append(m)
    return out


def _sample(config: dict, seed: int, system, t: int, stages: int, batch: int, kw: dict, prompt_len: int) -> tuple:
    """(decode cycles, prefill cycles, link bytes a token, decode stage ends, prefill stage
    ends) of the decoder of ``config`` (random weights, seeded) on ``stages`` stages of
    ``t`` chips of ``system``: a job a worker runs."""
    model = load_decoder(config, seed)
    kw = dict(kw, batch=batch, prompt_len=prompt_len)
    if t == 1 and stages == 1:
        s = compile_llm(model, preset=system.config, **kw)
        d, p = s.decode.cycles, s.prefill_step(prompt_len).cycles
        return d, p, 0, [d], [p]
    s = compile_llm(model, system=system, tensor_parallel=t, pipeline_stages=stages, **kw)
    return (s.decode_cycles, s.prefill_cycles(prompt_len), s.decode_link_bytes, s.decode_stage_ends,
            s.prefill_stage_ends(prompt_len))


def _chip_sample(config: dict, seed: int, cfg, batch: int, kw: dict, prompt_len: int, embeds: bool) -> tuple:
    """(decode cycles, prefill cycles) of the decoder of ``config`` on one chip of preset
    ``cfg``, its embedding gathered on chip or (``embeds`` False, as the whole model's
    too large a table) sent by the host: a job a worker runs."""
    s = compile_llm(load_decoder(config, seed, least_layers=0), preset=cfg, batch=batch, prompt_len=prompt_len,
                    embed_on_chip=embeds, **kw)
    return s.decode.cycles, s.prefill_step(prompt_len).cycles


def _split_sample(config: dict, seed: int, system, batch: int, kw: dict, prompt_len: int) -> tuple:
    """(decode, prefill) cycles at which the attention ends of the one-layer decoder of
    ``config`` run as two pipeline stages of one chip, [attention | MLP and head], on
    linked chips of ``system``: a job a worker runs."""
    s = compile_llm(load_decoder(config, seed), system=system, pipeline_stages=2, split_layers=True, batch=batch,
                    prompt_len=prompt_len, **kw)
    return s.decode_stage_ends[0], s.prefill_stage_ends(prompt_len)[0]


def shard_config(config: dict, t: int) -> dict:
    """The config of the decoder one chip of a tensor-parallel group of ``t`` runs, as a
    model of its own: its ``1/t`` of the query and key/value heads (each of the whole
    model's head size), of the MLP's hidden units and of the vocabulary (the LM head
    split by rows); the hidden size, layers and everything else the model's. Its step is
    the chip's without the all-reduces."""
    if config.get("model_type") not in ("llama", "mistral", "qwen2"):
        raise LPXError(f"samples='chip' shards Llama, Mistral and Qwen2 configs, not {config.get('model_type')!r}")
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    if kv % t:
        raise LPXError(f"{kv} key/value heads over {t} chips: tensor parallelism gives each chip whole kv heads")
    # The share's step reads no token ids: the model's may lie past its share of the vocabulary.
    return dict(config, num_attention_heads=heads // t, num_key_value_heads=kv // t,
                head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                intermediate_size=-(-config["intermediate_size"] // t), vocab_size=-(-config["vocab_size"] // t),
                bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _groups(system, t: int, stages: int) -> "list | None":
    try:
        return system.stage_groups(t, stages)
    except ConfigError:
        return None


class _Runs:
    """The simulations a plan composes, each run once: the sampled steps on one stage of
    ``t`` chips, the two-stage hand-off, and point-to-point transfers."""

    def __init__(self, model, system, precision, context, prompt_len, seed, samples="system", split=False,
                 budget=WEIGHT_BUDGET):
        self.model, self.system, self.samples, self.split, self.budget = model, system, samples, split, budget
        self._chip_layers = {}  # (t, batch) -> the layer counts one chip's share is sampled at
        spec = decoders.spec_of(model, context, lanes=system.config.lanes)
        self.halves = decoders.half_layer_values(model, spec)
        # The whole model's embedding on chip or on the host: one chip's share samples alike.
        self.embeds = embeds_on_chip(spec, system.config, precision)
        self.kw = dict(precision=precision, max_context=context)
        self.prompt_len, self.matrices = prompt_len, matrix_parameters(model)
        self.seed = seed
        self._done, self._p2p, self._collectives = {}, {}, {}  # sampled simulations, point-to-point extras

    def prefetch(self, jobs, workers: int = 0, ray_address: "str | None" = None):
        """Run the sampled simulations ``jobs`` ((t, batch, layers, stages)) not run yet,
        through a pool (:func:`~lpx_tvm.sim.workers.make_pool`)."""
        todo = sorted({j for j in jobs if j not in self._done}, key=str)
        if not todo:
            return
        from ..sim.workers import make_pool

        pool = make_pool(workers if len(todo) > 1 else 0, ray_address)
        try:
            futures = {j: pool.submit(*self._job(j)) for j in todo}
            for j, f in futures.items():
                try:
                    self._done[j] = f.result()
                except LPXError as e:  # the mappings that need it say why (plan)
                    self._done[j] = e
        finally:
            pool.shutdown()

    def _job(self, key) -> tuple:
        if key[0] in ("chip", "split"):
            t, batch, layers = key[1], key[2], (key[3] if key[0] == "chip" else 1)
            config = self._config(layers) if t == 1 else shard_config(self._config(layers), t)
            if key[0] == "split":
                return _split_sample, config, self.seed, self.system, batch, self.kw, self.prompt_len
            return (_chip_sample, config, self.seed, self.system.config, batch, self.kw, self.prompt_len,
                    self.embeds)
        t, batch, layers, stages = key
        return (_sample, self._config(layers), self.seed, self.system, t, stages, batch, self.kw, self.prompt_len)

    def _config(self, layers: int) -> dict:
        """The model's config with ``layers`` layers, its per-layer lists kept in step."""
        return decoder_config.with_layers(self.model.config.to_dict(), layers)

    def result(self, key) -> tuple:
        if key not in self._done:
            fn, *args = self._job(key)
            try:
                self._done[key] = fn(*args)
            except LPXError as e:
                self._done[key] = e
        if isinstance(self._done[key], LPXError):
            raise self._done[key]
        return self._done[key]

    def stage(self, t: int, batch: int) -> dict:
        """{layers: (decode cycles, prefill cycles, link bytes)} of the sampled steps on one stage."""
        return {n: self.result((t, batch, n, 1))[:3] for n in SAMPLED}

    def pipeline(self, t: int, batch: int, stages: int) -> tuple:
        """(decode spans, prefill spans, link bytes of a hand-off): a model of two layers a
        stage over ``min(3, stages)`` stages simulated whole, the span of its first,
        middle (with three) and last stage."""
        k = min(3, stages)
        _, _, link_bytes, decode_ends, prefill_ends = self.result((t, batch, 2 * k, k))
        spans = [[b - a for a, b in zip([0] + ends, ends)] for ends in (decode_ends, prefill_ends)]
        (a, (_, _, la)), (b, (_, _, lb)) = ((n, v) for n, v in self.stage(t, batch).items())
        two = la - (a - 2) * (lb - la) / (b - a)  # a stage of two layers' all-reduce bytes
        handoff = (link_bytes - two * k) / (k - 1)  # a boundary's, all ranks
        return (*spans, handoff)

    def jobs(self, m: Mapping) -> list:
        """The sampled simulations a fitting mapping composes: (t, batch, layers, stages), or
        for ``samples="chip"`` ("chip", t, batch, layers) (and ("split", t, batch))."""
        t, batch = m.tensor_parallel, m.batch
        if self.samples == "chip":
            return [("chip", t, batch, n) for n in self.chip_layers(t, batch)] + \
                ([("split", t, batch)] if self.split else [])
        jobs = [(t, batch, n, 1) for n in SAMPLED]
        if m.pipeline_stages > 1:
            k = min(3, m.pipeline_stages)
            jobs.append((t, batch, 2 * k, k))
        return jobs

    def chip_layers(self, t: int, batch: int) -> tuple:
        """The layer counts one chip's share is sampled at: :data:`CHIP_SAMPLED`, or
        :data:`CHIP_SAMPLED_LARGE` where two layers of it do not fit a chip."""
        if (t, batch) in self._chip_layers:
            return self._chip_layers[t, batch]
        import torch

        config = self._config(2) if t == 1 else shard_config(self._config(2), t)
        with torch.device("meta"):
            two = load_decoder(config, self.seed)
        cfg, precision = self.system.config, self.kw["precision"]
        spec = decoders.spec_of(two, self.kw["max_context"], batch, cfg.lanes)
        problem = fit_problem(spec, cfg, precision, matrix_parameters(two),
                              host_table_values(two, spec, cfg, precision, self.embeds))
        self._chip_layers[t, batch] = CHIP_SAMPLED_LARGE if problem else CHIP_SAMPLED
        return self._chip_layers[t, batch]

    def stages(self, layers: int, count: int) -> list:
        """The pipeline stages of a mapping: whole layers, or cut at half layers."""
        return decoders.split_stages_of(layers, count, *self.halves) if self.split else \
            decoders.stages_of(layers, count)

    def chip(self, t: int, batch: int) -> dict:
        """{layers: (decode cycles, prefill cycles)} of one chip's share sampled alone."""
        return {n: self.result(("chip", t, batch, n)) for n in self.chip_layers(t, batch)}

    def collective(self, kind: str, chips, vectors: int, dtype: str):
        """The simulated :func:`~lpx_tvm.target.system_programs.collective` (``kind``
        ``"send"``: the point-to-point transfer from ``chips[0]`` to ``chips[1]``) of
        ``vectors`` rows of lanes."""
        key = (kind, tuple(chips), vectors, dtype)
        if key not in self._collectives:
            self._collectives[key] = point_to_point(self.system, *chips, vectors, dtype) if kind == "send" else \
                collective(kind, self.system, chips, vectors, dtype)
        return self._collectives[key]

    def handoff(self, g, h, vectors: int, dtype: str) -> tuple:
        """(cycles, link bytes) of a stage boundary's hand-off of ``vectors`` rows of lanes
        from group ``g`` to group ``h``: the simulated
        :func:`~lpx_tvm.target.system_programs.handoff` where each rank's two chips are
        linked (built once a group size: a system's links are alike), else the whole rows
        from each chip point to point along the longest rank's path."""
        if all(self.system.links_between(a, b) for a, b in zip(g, h)):
            key = ("handoff", len(g), vectors, dtype)
            if key not in self._collectives:
                self._collectives[key] = handoff(self.system, g, h, vectors, dtype)
            c = self._collectives[key]
            return c.cycles, c.bytes_moved
        a, b = max(zip(g, h), key=lambda ab: self.system.hops(*ab))
        c = self.collective("send", (a, b), vectors, dtype)
        return c.cycles, c.bytes_moved * len(g)

    def path_extra(self, a: int, b: int, vectors: int, dtype: str) -> int:
        """Cycles a point-to-point transfer of ``vectors`` rows from chip ``a`` to chip
        ``b`` takes past one between linked chips."""
        hops = self.system.hops(a, b)
        if hops <= 1:
            return 0
        key = (hops, vectors, dtype)
        if key not in self._p2p:
            near = self.system.neighbours(a)[0]
            self._p2p[key] = point_to_point(self.system, a, b, vectors, dtype).cycles - \
                point_to_point(self.system, a, near, vectors, dtype).cycles
        return self._p2p[key]


def _sized(spec, runs: _Runs, t: int, stages: int, batch: int, micro: int) -> tuple:
    """(Mapping with its chips, SRAM fill and whether it fits, its stage groups)."""
    system = runs.system
    cfg, precision = system.config, runs.kw["precision"]
    chips = t * stages
    m = Mapping(t, batch, chips, 0.0, False, pipeline_stages=stages, micro_batches=micro)
    L = spec.layers
    if stages > L * (2 if runs.split else 1):
        m.why = f"{stages} stages of {L} layers"
        return m, None
    groups = _groups(system, t, stages)
    if groups is None:
        m.why = f"no {stages} aligned groups of {t} pairwise linked chips"
        return m, None
    parts = runs.stages(L, stages)
    # The fullest chip: its stage's share of the layers' matrices (and on the last stage
    # its share of the LM head's rows; the tables and norms counted on the first), RoPE's
    # tables where it attends, and the caches of every micro-batch in flight; matrices and
    # tables as stored, each row whole lane tiles.
    lanes, mb, fb = cfg.lanes, matrix_value_bytes(precision), float_bytes(precision)
    attention, mlp = (v * mb for v in half_layer_stored(runs.model, spec, t, lanes))
    head = matrix_values(spec.hidden, -(-spec.vocab // t), lanes) * mb
    # The tables (and norms) on the first stage when the embedding is gathered on chip (a
    # lane tile of it fits a slice), else the host looks its rows up.
    tables = (spec.parameters - runs.matrices) * fb if runs.embeds else 0
    rope = rope_table_values(spec, lanes) * fb
    local = decoders.shard_spec(replace(spec, batch=batch * micro), t)
    per_chip = []
    for st in parts:
        per_chip.append(st.attention_layers * attention + st.mlp_layers * mlp + tables * st.first + head * st.last +
                        rope * bool(st.attention_layers) +
                        cache_bytes_as_stored(replace(local, layers=st.attention_layers), cfg, precision))
    m.sram_fill = max(per_chip) / cfg.sram_bytes
    m.fits = m.sram_fill <= runs.budget
    if not m.fits:
        m.why = f"{max(per_chip) / 2**20:,.0f} MiB a chip of {cfg.sram_bytes / 2**20:,.0f}"
        if head > runs.budget * cfg.sram_bytes:
            m.why += f" (a chip's share of the LM head alone {head / 2**20:,.0f} MiB)"
    return m, groups


def _composed(m: Mapping, spec, runs: _Runs, groups) -> Mapping:
    """``m`` with its cycles and rates, composed from the sampled simulations."""
    system, t, stages, batch = runs.system, m.tensor_parallel, m.pipeline_stages, m.batch
    cfg, precision, L = system.config, runs.kw["precision"], spec.layers
    parts = decoders.stages_of(L, stages)
    sampled = runs.stage(t, batch)
    (a, (da, pa, la)), (b, (db, pb, lb)) = ((n, sampled[n]) for n in SAMPLED)
    layer = (db - da) // (b - a)
    m.layer_cycles = layer
    ttft_layer = (pb - pa) // (b - a)
    one_stage = decode = db + (L - b) * layer
    ttft = pb + (L - b) * ttft_layer
    link_bytes = lb + (L - b) * (lb - la) / (b - a)
    directed = stages * t * (t - 1)  # links in use, each direction
    interval = decode
    if stages > 1:
        dspans, pspans, handoff_bytes = runs.pipeline(t, batch, stages)
        sizes = [st.stop - st.start for st in parts]
        middle_d, middle_p = (dspans[1], pspans[1]) if len(dspans) == 3 else (None, None)
        spans_d = [dspans[0]] + [middle_d] * (stages - 2) + [dspans[-1]]
        spans_p = [pspans[0]] + [middle_p] * (stages - 2) + [pspans[-1]]
        stage_d = [sp + (n - 2) * layer for sp, n in zip(spans_d, sizes)]
        decode = sum(stage_d)
        ttft = sum(sp + (n - 2) * ttft_layer for sp, n in zip(spans_p, sizes))
        tiles = -(-spec.hidden // cfg.lanes)
        dtype = "fp32" if precision == "fp32" else "fp16"
        for g, h in zip(groups, groups[1:]):
            a, b = max(zip(g, h), key=lambda ab: system.hops(*ab))
            hops = system.hops(a, b)
            decode += runs.path_extra(a, b, _link_vectors(cfg, t, batch * tiles, dtype), dtype)
            ttft += runs.path_extra(a, b, _link_vectors(cfg, t, batch * runs.prompt_len * tiles, dtype), dtype)
            link_bytes += handoff_bytes * hops
            directed += t * hops
        m.handoff_cycles = round((decode - one_stage) / (stages - 1))  # against one stage
        interval = max(stage_d)
    return _rates(m, cfg, decode, ttft, interval, link_bytes, directed)


def _link_vectors(cfg, t: int, vectors: int, dtype: str) -> int:
    """Vectors of a hand-off of ``vectors`` that one rank's link between two stages of
    ``t`` chips carries: a shard when the hand-off is sharded, else all of them."""
    return -(-vectors // t) if handoff_sharded(cfg, t, vectors, dtype) else vectors


def _rates(m: Mapping, cfg, decode: int, ttft: int, interval: int, link_bytes: float, directed: int) -> Mapping:
    """``m`` with its cycles and what they give: a user's next token waits for its last
    and for the first stage to come round (``micro_batches`` slowest-stage intervals)."""
    m.stage_interval_cycles = interval
    m.decode_cycles_per_token, m.ttft_cycles = decode, ttft
    per_user = cfg.clock_hz / max(decode, m.micro_batches * interval)
    m.tokens_per_s_per_user = per_user
    m.tokens_per_s_per_system = per_user * m.batch * m.micro_batches
    m.tokens_per_s_per_chip = m.tokens_per_s_per_system / m.chips
    m.link_utilization = link_bytes / (directed * cfg.c2c_bytes_per_cycle * decode) if directed else 0.0
    return m


def _composed_from_chip(m: Mapping, spec, runs: _Runs, groups) -> Mapping:
    """``m`` composed from one chip's share sampled alone (``samples="chip"``): a layer
    is the chip's increment between its two sampled layer counts plus its two
    all-reduces of the hidden rows; the rest of the chip's step (the embedding's rows in, the final norm, its rows
    of the LM head, the argmax) plus the logits' all-reduce sits on the last stage; each
    stage boundary adds the hand-off of the hidden rows between the chips the topology
    placed there. Every collective is simulated on the system; what it overlaps inside
    the whole program (weights installed while the sums travel) is not, so the sum is
    an upper bound the validation measures (bench/multichip.py)."""
    system, t, stages, batch = runs.system, m.tensor_parallel, m.pipeline_stages, m.batch
    cfg, precision, L = system.config, runs.kw["precision"], spec.layers
    dtype = FLOAT_OF.get(precision, precision)
    (a, (da, pa)), (b, (db, pb)) = runs.chip(t, batch).items()
    hidden, vocab = -(-spec.hidden // cfg.lanes), -(-spec.vocab // cfg.lanes)
    group = groups[0]

    def reduce(vectors):  # (cycles, bytes) of an all-reduce over a stage's chips
        if t == 1:
            return 0, 0
        c = runs.collective("all_reduce", group, vectors, dtype)
        return c.cycles, c.bytes_moved

    (ar_d, bytes_d), (ar_p, _) = reduce(batch * hidden), reduce(batch * runs.prompt_len * hidden)
    logits, lbytes = reduce(batch * vocab)  # the last token's, decode and prefill alike
    layer_d, layer_p = (db - da) // (b - a) + 2 * ar_d, (pb - pa) // (b - a) + 2 * ar_p
    rest_d, rest_p = da - a * (layer_d - 2 * ar_d) + logits, pa - a * (layer_p - 2 * ar_p) + logits
    m.layer_cycles = layer_d
    parts = runs.stages(L, stages)
    if runs.split:
        # A layer's halves: the attention as the first of two one-chip stages of a
        # one-layer model ends (its hand-off sent), each with its all-reduce; the MLP the rest.
        att_d, att_p = runs.result(("split", t, batch))
        att_d, att_p = att_d + ar_d, att_p + ar_p
        halves = [(att_d, layer_d - att_d), (att_p, layer_p - att_p)]
    else:  # whole layers: each counted with its attention
        halves = [(layer_d, 0), (layer_p, 0)]
    span_d, span_p = ([st.attention_layers * att + st.mlp_layers * mlp for st in parts] for att, mlp in halves)
    span_d[-1] += rest_d
    span_p[-1] += rest_p
    link_bytes = 2 * L * bytes_d + lbytes
    directed = stages * t * (t - 1)
    for k, (g, h) in enumerate(zip(groups, groups[1:])):
        send_d, bytes_sent = runs.handoff(g, h, batch * hidden, dtype)
        span_d[k] += send_d
        span_p[k] += runs.handoff(g, h, batch * runs.prompt_len * hidden, dtype)[0]
        link_bytes += bytes_sent
        directed += t * max(system.hops(a_, b_) for a_, b_ in zip(g, h))
    decode, ttft = sum(span_d), sum(span_p)
    if stages > 1:
        m.handoff_cycles = round((decode - (rest_d + L * layer_d)) / (stages - 1))
    interval = max(span_d)
    return _rates(m, cfg, decode, ttft, interval, link_bytes, directed)


def plan_table(p: Plan) -> list:
    """Rows of strings for printing a plan."""
    rows = []
    for m in p.mappings:
        if not m.fits or m.decode_cycles_per_token is None:
            rows.append([str(m.tensor_parallel), str(m.pipeline_stages), str(m.micro_batches), str(m.batch),
                         str(m.chips), f"{m.sram_fill:.0%}", m.why or ("fits (not simulated)" if m.fits else
                                                                        "does not fit"), "", "", "", "", ""])
            continue
        rows.append([str(m.tensor_parallel), str(m.pipeline_stages), str(m.micro_batches), str(m.batch), str(m.chips),
                     f"{m.sram_fill:.0%}",
                     f"{m.ttft_cycles:,}", f"{m.decode_cycles_per_token:,}", f"{m.tokens_per_s_per_user:,.0f}",
                     f"{m.tokens_per_s_per_chip:,.0f}", f"{m.tokens_per_s_per_system:,.0f}",
                     f"{m.link_utilization:.1%}"])
    return rows


PLAN_COLUMNS = ["TP", "PP", "micro-batches", "batch", "chips", "SRAM fill", "TTFT cycles", "decode cycles/token", "tokens/s/user",
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
        ax.annotate(f"TP{m.tensor_parallel} PP{m.pipeline_stages}x{m.micro_batches} b{m.batch}", (m.tokens_per_s_per_chip, m.tokens_per_s_per_user),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("tokens/s per chip")
    ax.set_ylabel("tokens/s per user")
    ax.set_title(f"{p.model} on {p.system} ({p.precision}, context {p.context})")
    fig.savefig(path, dpi=120)
    plt.close(fig)

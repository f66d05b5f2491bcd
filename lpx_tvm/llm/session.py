"""A decoder LLM on one simulated LPX chip: two programs, one SRAM (docs/llm.md).

:func:`compile_llm` rebuilds a ``transformers`` decoder as its two static steps
(:mod:`lpx_tvm.frontends.decoders`), compiles the decode step once, and then each
prefill step (one per prompt length) against the decode program's SRAM: the KV caches
pinned to the same lines, the resident weights found in place. An :class:`LLMSession`
runs both on one :class:`~lpx_tvm.sim.Simulator` that keeps the caches between runs:
the host sends token ids and the position, and reads back the next token ids (and, when
asked, the logits); the caches never leave the chip.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import time
from collections.abc import Iterable

import numpy as np

from ..errors import LPXError
from ..frontends import decoders
from ..frontends.torch import import_torch, require_torch
from ..machine.config import LPXConfig, load_config
from ..relax_passes.errors import ModelError
from ..relax_passes.tvm_output import quiet_tvm
from ..runtime.floors import floors_of
from ..sim import Simulator
from ..target.builder import SharedSram, chunk_lines
from ..target.sram_plan import SPREAD_MARGIN, spread_chunks
from ..target.codegen.interface import ProgramInterface
from .latency_floor import decode_latency_floor, layer_matrices
from .sizing import (EIGHT_BIT, FLOAT_OF, cache_bytes_as_stored, float_bytes, matrix_value_bytes, rope_table_values,
                     weight_bytes)
from .step_program import (WEIGHT_BUDGET, DoesNotFit, StepProgram, embed_choice, embeds_on_chip, generation_arguments,
                           shared_with, step_program, token_ids)

# The precisions a decoder compiles at: float, or an 8-bit path (W8A8 dense layers in
# int8, or in fp8 e4m3 on a machine whose MXM multiplies fp8; the rest fp16).
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
# Tokens the float model generates to calibrate an 8-bit path's activation scales, after
# a prompt of random ids (seeded).
CALIBRATION_PROMPT, CALIBRATION_TOKENS = 16, 8


@contextlib.contextmanager
def quiet_transformers():
    """transformers' notes on a config it builds (a bos or eos id outside a scaled-down
    vocabulary) held back for the block: the results and errors are ours to print."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def load_decoder(model_or_config, seed: int = 0, least_layers: int = 1):
    """A ``transformers`` causal LM in eval mode: the model itself, or one built with
    random fp32 weights (seeded; nothing is downloaded) from a config object, a dict, or
    the path of a ``config.json``. A config is checked before the model is built
    (:func:`~lpx_tvm.frontends.decoder_config.check_decoder_config`): a field the steps
    do not honour, or a model whose weights would not fit the host's memory, is refused
    by name. ``least_layers``: 0 for the planner's sample without layers."""
    from ..frontends import decoder_config

    torch = require_torch()
    try:
        import transformers
    except ImportError:
        raise ModelError("transformers is not installed; install the extra with: pip install 'lpx-tvm[torch]'") \
            from None
    if isinstance(model_or_config, torch.nn.Module):
        return model_or_config.eval()
    cfg, where = model_or_config, "model config"
    if isinstance(cfg, (str, os.PathLike)):
        where = f"model config {str(cfg)!r}"
        cfg = decoder_config.read_config(cfg)
    if not isinstance(cfg, (dict, transformers.PretrainedConfig)):
        raise ModelError(f"compile_llm expects a transformers model, a config or a config.json path, got "
                         f"{type(model_or_config).__name__}")
    try:
        checked = decoder_config.check_decoder_config(cfg, least_layers=least_layers)
        if torch.get_default_device().type != "meta":  # a model of shapes only allocates nothing
            decoder_config.check_host_memory(checked)
    except ModelError as e:
        raise ModelError(f"{where}: {e}") from None
    if isinstance(cfg, dict):
        try:
            with quiet_transformers():
                cfg = transformers.AutoConfig.for_model(**cfg)
        except Exception as e:  # what the checks did not foresee: transformers' own words, one line
            raise ModelError(f"{where}: transformers refuses it: {str(e).strip().splitlines()[-1]}") from None
    torch.manual_seed(seed)
    # The checkpoint's dtype (torch_dtype) does not apply to random weights: fp32, and
    # compile_llm's precision decides the chip's.
    with quiet_transformers():
        return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def compile_llm(model_or_config, preset="tsp", precision="fp16", max_context: int = 128, batch: int = 1,
                prompt_len: "int | None" = None, seed: int = 0, calibration_ids=None, system=None,
                chips=None, tensor_parallel: "int | None" = None,
                pipeline_stages: "int | None" = None, split_layers: bool = False,
                embed_on_chip: "bool | None" = None) -> "LLMSession":
    """Compile a decoder LLM for one LPX chip, or for chips of a system.

    Parameters
    ----------
    model_or_config : transformers model, PretrainedConfig, dict or path
        Llama, Qwen2, Mistral or GPT-2; a config gets random weights (``seed``).
    preset : str or LPXConfig
    precision : str
        ``fp32``, ``fp16``, ``bf16``; or ``int8`` / ``fp8``: the dense layers W8A8 in
        int8 or fp8 e4m3 (8-bit weights with per-channel scales, activations quantized
        on the VXM by static per-tensor scales), everything else in fp16 (docs/llm.md).
        fp8 needs a machine whose MXM multiplies it (``lp30``).
    max_context : int
        Positions the KV cache holds (prompt and generated tokens).
    batch : int
        Sequences decoded together (users sharing one chip).
    prompt_len : int, optional
        Compile the prefill step of this prompt length now (else at the first
        :meth:`LLMSession.generate` of each length).
    calibration_ids : array of token ids [batch, P], optional
        ``int8`` / ``fp8``: the prompt whose float generation sets the activation
        scales (default: random ids, seeded).
    system : str, path or System, optional
        Map the decoder over chips of this system by tensor and pipeline parallelism
        (its preset replaces ``preset``; docs/multichip.md). Returns a
        :class:`~lpx_tvm.llm.system_session.SystemLLMSession`.
    chips : sequence of int, optional
        The system's chips to use (default: all of them), in pipeline stages of
        ``tensor_parallel`` chips, in order.
    tensor_parallel : int, optional
        Chips per pipeline stage, pairwise linked (default: all ``chips``, one stage);
        each stage's chip of rank ``r`` is linked to the next stage's.
    pipeline_stages : int, optional
        Without ``chips``: the stages (of ``tensor_parallel`` chips, default 1), on the
        chips :meth:`System.stage_groups` picks.
    embed_on_chip : bool, optional
        One chip: gather the embedding on chip (default: when a lane tile of its table
        fits a slice), or (False) keep it on the host, which sends the rows.
    split_layers : bool
        Pipeline stages may cut a layer between its attention and its MLP, the stages'
        weights balanced (:func:`~lpx_tvm.frontends.decoders.split_stages_of`): a model
        whose whole layers do not share out over the stages' SRAM.

    Returns
    -------
    LLMSession
    """
    cfg, system = llm_machine(precision, preset, system)
    precision = str(precision)
    max_context = whole_number("max_context", max_context, 2)  # a prompt token and a generated one
    batch = whole_number("batch", batch, 1)
    seed = whole_number("seed", seed, 0)
    if prompt_len is not None:
        prompt_len = whole_number("prompt_len", prompt_len, 1)
        if prompt_len >= max_context:
            raise LPXError(f"prompt_len={prompt_len}: a prompt takes 1 to {max_context - 1} tokens in a context of "
                           f"{max_context}")
    chips, tensor_parallel, pipeline_stages = _mapping_arguments(system, chips, tensor_parallel, pipeline_stages,
                                                                 split_layers)
    if embed_on_chip not in (None, True, False):
        raise LPXError(f"embed_on_chip={embed_on_chip!r}: expected None, True or False")
    if calibration_ids is not None and precision not in EIGHT_BIT:
        raise LPXError(f"calibration_ids: they set an 8-bit path's activation scales; precision {precision} has "
                       "none (int8 or fp8 take them)")
    model = load_decoder(model_or_config, seed)
    spec = decoders.spec_of(model, max_context, batch, cfg.lanes)
    problem = None if system is not None else fit_problem(
        spec, cfg, precision, matrix_parameters(model), host_table_values(model, spec, cfg, precision, embed_on_chip))
    if problem:  # before calibrating or compiling
        raise DoesNotFit(problem)
    check_cache_rows(cfg, precision, max_context)
    quant = None
    if precision in EIGHT_BIT:
        if calibration_ids is None:
            prompt = min(CALIBRATION_PROMPT, max_context - 1)
            calibration_ids = np.random.default_rng(seed).integers(0, spec.vocab, (batch, prompt))
        else:
            calibration_ids = token_ids("calibration_ids", calibration_ids, spec)
            if calibration_ids.shape[1] >= max_context:
                raise ModelError(f"calibration_ids: a prompt of {calibration_ids.shape[1]} tokens in a context of "
                                 f"{max_context}: it takes 1 to {max_context - 1} tokens")
        quant = decoders.calibrate(model, spec, calibration_ids, CALIBRATION_TOKENS, precision)
    if system is not None:
        from .system_session import SystemLLMSession

        if pipeline_stages is not None:
            if chips is not None:
                raise LPXError("give chips or pipeline_stages, not both")
            tensor_parallel = tensor_parallel or 1  # stages of one chip unless asked
            chips = [c for g in system.stage_groups(tensor_parallel, pipeline_stages) for c in g]
        elif chips is None:
            chips = range(system.chips)
        session = SystemLLMSession(model, spec, system, chips, precision, tensor_parallel, quant,
                                   split_layers=split_layers, embed_on_chip=embed_on_chip)
        if prompt_len is not None:
            session.prefill_step(prompt_len)
        return session
    session = LLMSession(model, spec, cfg, precision, quant, embed_on_chip=embed_on_chip)
    if prompt_len is not None:
        session.prefill_step(prompt_len)
    return session


def llm_machine(precision, preset="tsp", system=None, name: str = "precision") -> tuple:
    """(the machine config, the loaded system or None) a decoder compiles for at
    ``precision``: an LPXError, before any model is built, for a precision decoders do not
    compile at or one the machine's MXM does not multiply (``name``: the argument's, or
    the flag's)."""
    precision = str(precision)
    if precision not in PRECISIONS:
        raise LPXError(f"{name} {precision!r}: decoder LLMs compile at {', '.join(PRECISIONS)}")
    if system is not None:
        from ..machine.system import load_system

        system = load_system(system)
        cfg = system.config
    else:
        cfg = preset if isinstance(preset, LPXConfig) else load_config(preset)
    if precision not in cfg.mxm_cycles_per_vector:
        raise LPXError(f"{name} {precision}: the MXM of {cfg.name} does not multiply {precision} "
                       f"(its rates: {', '.join(cfg.mxm_cycles_per_vector)}); fp8 runs on lp30")
    return cfg, system


def whole_number(name: str, value, low: int) -> int:
    """``value`` as an int of at least ``low``, or an LPXError naming the argument (a bool,
    a float such as 2.5 or a string is no count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise LPXError(f"{name}={value!r}: expected an integer of at least {low}")
    if value < low:
        raise LPXError(f"{name}={value}: expected an integer of at least {low}")
    return int(value)


def _mapping_arguments(system, chips, tensor_parallel, pipeline_stages, split_layers) -> tuple:
    """``chips``, ``tensor_parallel`` and ``pipeline_stages`` checked: they map a decoder over
    chips of a system, and without one are refused rather than ignored."""
    if system is None:
        given = [name for name, v in (("chips", chips), ("tensor_parallel", tensor_parallel),
                                      ("pipeline_stages", pipeline_stages)) if v is not None]
        if given:
            raise LPXError(f"{', '.join(given)}: map a decoder over chips of a system; give system= (one chip "
                           "takes none of them)")
        if split_layers:
            raise LPXError("split_layers cuts pipeline stages: give a system")
    if tensor_parallel is not None:
        tensor_parallel = whole_number("tensor_parallel", tensor_parallel, 1)
    if pipeline_stages is not None:
        pipeline_stages = whole_number("pipeline_stages", pipeline_stages, 1)
    if chips is not None:
        if isinstance(chips, (str, bytes)) or not isinstance(chips, Iterable):
            raise LPXError(f"chips={chips!r}: expected a sequence of chip numbers")
        chips = list(chips)
        bad = [c for c in chips if isinstance(c, bool) or not isinstance(c, numbers.Integral)]
        if bad:
            raise LPXError(f"chips={chips!r}: chip numbers are integers, got {bad[0]!r}")
        chips = [int(c) for c in chips]
    return chips, tensor_parallel, pipeline_stages


def check_cache_rows(cfg: LPXConfig, precision: str, max_context: int) -> None:
    """A DoesNotFit error when a value cache's rows (a sequence's positions: each sequence
    of a batch has caches of its own) overflow the slices they are spread over: as many
    as a plane has install lanes (or a multiple, up to every slice), in chunks of a lane's
    share of a weight tile, each with a spare row either side (docs/llm.md); found from
    the sizes, before any compile. The caches of a whole batch beside the weights are
    :func:`fit_problem`'s."""
    w = float_bytes(precision)
    spread = spread_chunks(cfg, max_context, w)
    if spread.fullest > cfg.lines_per_slice:
        fit = cfg.lines_per_slice // ((spread.per + 2 * SPREAD_MARGIN) * w) * spread.slices * spread.per
        raise DoesNotFit(f"context {max_context:,}: a value cache's rows are spread over {spread.slices} slices, "
                         f"which hold about {fit:,} rows of {FLOAT_OF.get(precision, precision)} on {cfg.name}: "
                         "use a smaller context")


def matrix_parameters(model) -> int:
    """Values of the model's matrices the MXM multiplies by (the projections, the MLP,
    the LM head): its 2-D parameters less the tables rows are gathered from (the token
    embedding unless the LM head shares it, GPT-2's positions)."""
    tables = {id(model.get_input_embeddings().weight)}
    positions = getattr(getattr(model, "transformer", None), "wpe", None)
    if positions is not None:
        tables.add(id(positions.weight))
    head = model.get_output_embeddings()
    used = {id(head.weight)} if head is not None else set()
    mats = {id(p): p for p in model.parameters() if p.dim() == 2 and (id(p) not in tables or id(p) in used)}
    return sum(p.numel() for p in mats.values())


def host_table_values(model, spec: decoders.DecoderSpec, cfg: LPXConfig, precision: str,
                      on_chip: "bool | None" = None) -> int:
    """Values of the token embedding the host keeps and looks rows up in (a vocabulary
    wider than a slice's lines: docs/llm.md; or ``on_chip=False``), which take no SRAM;
    0 when it is on chip or is the LM head's matrix too."""
    table, head = model.get_input_embeddings().weight, model.get_output_embeddings()
    if on_chip is None:
        on_chip = embeds_on_chip(spec, cfg, precision)
    if head is not None and head.weight is table or on_chip:
        return 0
    return table.numel()


def fit_problem(spec: decoders.DecoderSpec, cfg: LPXConfig, precision: str, matrices: int = 0,
                host_table: int = 0) -> "str | None":
    """Why the decoder's weights and KV cache cannot be resident in one chip's SRAM, or None.
    The cache counts as stored: each row of ``head_dim`` values takes whole vectors of
    lanes (docs/llm.md). ``matrices``: values of the dense layers' weights (stored at an
    8-bit path's size; the other weights are float); ``host_table``: values of the
    embedding the host keeps (:func:`host_table_values`)."""
    weights = weight_bytes(spec, precision, matrices) + (rope_table_values(spec) - host_table) * \
        float_bytes(precision)
    kv = cache_bytes_as_stored(spec, cfg, precision)
    need = weights + kv
    budget = int(WEIGHT_BUDGET * cfg.sram_bytes)
    if need <= budget:
        return None
    chips = math.ceil(need / budget)
    return (f"the model needs {need / 2**20:,.1f} MiB of SRAM ({weights / 2**20:,.1f} MiB of {precision} weights, "
            f"{kv / 2**20:,.1f} MiB of KV cache as stored for batch {spec.batch} x context {spec.max_context}) but "
            f"one {cfg.name} chip holds {cfg.sram_bytes / 2**20:,.1f} MiB ({budget / 2**20:,.1f} MiB for weights and "
            f"state); {chips} chips would hold it resident (multi-chip mapping: docs/llm.md), or use a smaller "
            "batch or context")


class LLMSession:
    """A decoder compiled for one chip, with its KV cache resident in the chip's SRAM.

    ``generate(input_ids, max_new_tokens)`` returns the greedy continuation, as
    ``transformers``' ``generate(do_sample=False)`` returns it without the prompt; ``report``
    holds the figures of the last generation (docs/llm.md, "The report").
    """

    def __init__(self, model, spec: decoders.DecoderSpec, cfg: LPXConfig, precision: str,
                 quantization: "decoders.QuantizedLinears | None" = None, float_precision: "str | None" = None,
                 embed_on_chip: "bool | None" = None):
        self.matrix_parameters = matrix_parameters(model)
        # The embedding gathered on chip where it can be (or, embed_on_chip=False, looked up
        # by the host, which sends the rows).
        self.embed_on_chip = embed_choice(spec, cfg, precision, embed_on_chip)
        problem = fit_problem(spec, cfg, precision, self.matrix_parameters,
                              host_table_values(model, spec, cfg, precision, self.embed_on_chip))
        if problem:
            raise DoesNotFit(problem)
        if (precision in EIGHT_BIT) != (quantization is not None) or \
                (quantization is not None and quantization.fmt != precision):
            raise LPXError(f"precision {precision} with {'no' if quantization is None else quantization.fmt} "
                           "activation scales")
        self.model, self.spec, self.config, self.precision = model, spec, cfg, precision
        # int8 / fp8: the steps' dense layers are W8A8 with these scales (the torch steps
        # built with them are the reference); the rest compiles at the float precision.
        self.quantization = quantization
        # ``float_precision`` overrides it (fp32 around 8-bit layers: the 8-bit arithmetic
        # alone against its torch reference, tests/llm).
        self.float_precision = float_precision or FLOAT_OF.get(precision, precision)
        self._embed_rows = None if self.embed_on_chip else \
            model.get_input_embeddings().weight.detach().float().numpy()
        self._prefill = {}  # prompt length -> StepProgram
        self.decode = self._compile(1, None)
        self.chip = Simulator(cfg)
        self.decode.counters = self.chip.verify(self.decode.program).counters
        self.chip.load(self.decode.program)
        self._loaded = self.decode
        self._last = {}

    # ---- compiling -------------------------------------------------------------------
    @quiet_tvm()
    def _compile(self, tokens: int, shared: "SharedSram | None") -> StepProgram:
        from ..pipeline import lower

        spec = self.spec
        step = decoders.decoder_step(self.model, spec, tokens, self.embed_on_chip, quant=self.quantization)
        imported = import_torch(step, decoders.example_inputs(spec, tokens, embed_in_step=self.embed_on_chip))
        # A step is one program on chip (its state and weights stay there): SharedSram()
        # for the decode step too, which keeps the compile from spilling activations.
        _, regions, offload = lower(imported.mod, self.config, self.float_precision,
                                    interface=ProgramInterface(shared=shared or SharedSram()))
        return step_program(regions, offload, spec, tokens, self.config, self.precision)


    def prefill_step(self, prompt_len: int) -> StepProgram:
        """The prefill program of ``prompt_len`` tokens, compiled against the decode
        program's SRAM (once per length)."""
        if not 1 <= prompt_len < self.spec.max_context:
            raise ModelError(f"a prompt of {prompt_len} tokens in a context of {self.spec.max_context}: "
                             f"prompts take 1 to {self.spec.max_context - 1} tokens")
        step = self._prefill.get(prompt_len)
        if step is None:
            step = self._compile(prompt_len, shared_with(self.decode))
            step.counters = self.chip.verify(step.program).counters
            self._prefill[prompt_len] = step
        return step

    # ---- running ---------------------------------------------------------------------
    def _run(self, step: StepProgram, ids: np.ndarray, position: int, fresh: bool, logits: bool):
        if self._loaded is not step:
            self.chip.load(step.program, keep=step.caches)
            self._loaded = step
        ids = ids.astype(np.int32).reshape(-1)
        tokens = ids if self._embed_rows is None else self._embed_rows[ids]
        feed = {step.ids: tokens, step.position: np.array([position], np.int32)}
        keep = step.caches
        if fresh:  # a new request: its prefill starts from empty caches
            feed.update(self.spec.zero_caches(step.caches))
            keep = ()
        wanted = [step.next_ids] + ([step.logits] if logits else [])
        return self.chip.run(step.program, feed, keep=keep, outputs=wanted)

    def generate(self, input_ids, max_new_tokens: int, return_logits: bool = False):
        """Greedy tokens after ``input_ids`` ([batch, P] ints, or [P] for a batch of one).

        Returns int64 ids [batch, max_new_tokens]; with ``return_logits`` also the logits
        of every step, [max_new_tokens, batch, vocab] (float32)."""
        spec = self.spec
        ids = generation_arguments(spec, input_ids, max_new_tokens)
        prompt = ids.shape[1]
        prefill = self.prefill_step(prompt)
        out, all_logits = [], []
        t = time.perf_counter()
        r = self._run(prefill, ids, 0, True, return_logits)
        ttft = r.cycles
        sim_prefill_s = time.perf_counter() - t
        for k in range(max_new_tokens):
            next_ids = r.outputs[self._loaded.next_ids].reshape(spec.batch, 1)
            out.append(next_ids)
            if return_logits:
                all_logits.append(r.outputs[self._loaded.logits].astype(np.float32).reshape(spec.batch, -1))
            if k + 1 < max_new_tokens:
                r = self._run(self.decode, next_ids, prompt + k, False, return_logits)
        self._last = dict(prompt_len=prompt, new_tokens=max_new_tokens, ttft_cycles=ttft,
                          sim_wall_s=time.perf_counter() - t,
                          sim_prefill_wall_s=sim_prefill_s)
        tokens = np.concatenate(out, axis=1).astype(np.int64)
        return (tokens, np.stack(all_logits)) if return_logits else tokens

    def cache(self, name: str) -> np.ndarray:
        """The current contents of cache ``name`` (one of ``spec.cache_names``), read from
        the chip's SRAM (a debugging view: generation never reads it back)."""
        if name not in self.spec.cache_names:
            raise ModelError(f"no cache {name!r}; the caches are {self.spec.cache_names[:4]} ...")
        step = self._loaded
        return self.chip.read(step.program, step.caches[self.spec.cache_names.index(name)])

    # ---- figures ---------------------------------------------------------------------
    def profile(self):
        """The decode program's :class:`~lpx_tvm.runtime.profile.Profile` (docs/profile.md):
        its timeline, each layer's cycles beside its floors. The schedule is static, so the
        counters of its check are those of every run."""
        from types import SimpleNamespace

        from ..frontends.decoder_parts import part_kind
        from ..runtime.executable import RunStats
        from ..runtime.profile import Call, build_profile
        from ..runtime.report import layer_of

        region = self.decode.region
        stats = RunStats()
        for tag, t in self.decode.counters.by_tag.items():
            if t.macs:
                stats.layer_macs[region.name, layer_of(tag)] += t.macs
        step = SimpleNamespace(config=self.config, regions={region.name: region}, stats=stats,
                               precision=self.precision)
        return build_profile(step, [Call(region=region.name)], kind_of=part_kind)

    @property
    def report(self) -> dict:
        """Figures of the decode program and of the last generation (docs/llm.md)."""
        return llm_report(self)


def _binding_bytes(cfg: LPXConfig, layout) -> int:
    return sum(lines for _, _, lines in chunk_lines(layout)) * cfg.lanes


def ttft_floors(spec, matrix_parameters: int, prompt: "int | None", peak_macs: float,
                install_floor: float) -> "dict | None":
    """The floors of a ``prompt``-token prefill (None before a generation): every matrix
    installed once (``install_floor``, as a decode step's), and the multiplies no prefill
    avoids over the MXM's peak: each of the batch's ``prompt`` rows through every matrix
    but the LM head, which only the last token's row needs, and attention over the
    positions each token sees (q k^T and p V: ``t + 1`` positions of ``head_dim`` for
    token ``t``, each query head, each layer)."""
    if not prompt:
        return None
    head = spec.vocab * spec.hidden
    rows = spec.batch * prompt
    attention = 2 * spec.layers * spec.heads * spec.head_dim * spec.batch * prompt * (prompt + 1) // 2
    macs = (matrix_parameters - head) * rows + head * spec.batch + attention
    multiply = macs / peak_macs
    kind, floor = max((("install", install_floor), ("multiply", multiply)), key=lambda kv: kv[1])
    return dict(macs=macs, multiply=multiply, install=install_floor, floor_kind=kind, floor_cycles=floor)


def llm_report(session: LLMSession) -> dict:
    cfg, spec, dec = session.config, session.spec, session.decode
    prog = dec.program
    decode_cycles = dec.cycles  # static: the same at every position
    layouts = {b.name: b.layout for b in prog.bindings}
    # The caches as stored (a row of D values takes whole vectors of lanes), and the
    # values they hold: the floor counts the values, what no layout can beat.
    kv_bytes = sum(_binding_bytes(cfg, layouts[n]) for n in dec.caches)
    kv_values_bytes = spec.cache_values * float_bytes(session.precision)
    image_bytes = sum(len(m.data) for m in prog.sram_init)
    common = {(m.slice, m.addr) for m in prog.sram_init}
    prefill_extra = sum(len(m.data) for p in session._prefill.values() for m in p.program.sram_init
                        if (m.slice, m.addr) not in common)
    # The model's matrices, each installed once per token: what no schedule avoids. The
    # program may install more (the caches' keys and values): that shows in its own
    # install floor.
    matrix_bytes = session.matrix_parameters * matrix_value_bytes(session.precision)
    install_bw, read_bw = cfg.install_bytes_per_cycle, cfg.sram_read_bytes_per_cycle
    floor_install = matrix_bytes / install_bw
    floor_kv = kv_values_bytes / read_bw
    floor_kind, floor = max((("install", floor_install), ("kv_read", floor_kv)), key=lambda kv: kv[1])
    own = floors_of(cfg, prog.instrs)
    peak = cfg.peak_macs_per_cycle_for(session.precision)  # int8 / fp8: the MXM's 8-bit rate
    macs = dec.region.macs
    per_user = cfg.clock_hz / decode_cycles
    last = session._last
    ttft = ttft_floors(spec, session.matrix_parameters, last.get("prompt_len"), peak, floor_install)
    latency = decode_latency_floor(cfg, spec.family, spec.layers,
                                   layer_matrices(decoders.layer_matrix_shapes(session.model, spec)),
                                   spec.vocab * spec.hidden, session.precision, session.float_precision, spec.batch)
    report = dict(
        preset=cfg.name, precision=session.precision, family=spec.family, parameters=spec.parameters,
        layers=spec.layers, batch=spec.batch, max_context=spec.max_context,
        prompt_len=last.get("prompt_len"), new_tokens=last.get("new_tokens"),
        ttft_cycles=last.get("ttft_cycles"),
        ttft_s=cfg.seconds(last["ttft_cycles"]) if last.get("ttft_cycles") else None,
        decode_cycles_per_token=decode_cycles,
        ttft_floor_cycles=ttft and ttft["floor_cycles"], ttft_floor_kind=ttft and ttft["floor_kind"],
        ttft_over_floor=last["ttft_cycles"] / ttft["floor_cycles"] if ttft and last.get("ttft_cycles") else None,
        decode_s_per_token=cfg.seconds(decode_cycles),
        tokens_per_s_per_user=per_user,
        tokens_per_s_per_chip=per_user * spec.batch,
        decode_floor_cycles=floor, decode_floor_kind=floor_kind,
        decode_over_floor=decode_cycles / floor if floor else None,
        decode_dependency_cycles=dec.region.dependency_cycles,
        decode_latency_floor_cycles=latency.cycles,
        decode_over_latency_floor=decode_cycles / latency.cycles,
        floors=dict(weights_over_install=floor_install, kv_over_sram_read=floor_kv, latency=latency.to_json(),
                    program=own.to_json(), program_binding=own.largest()[0],
                    program_dependency=dec.region.dependency_cycles, ttft=ttft),
        sram=dict(capacity_bytes=cfg.sram_bytes, weights_bytes=image_bytes, kv_cache_bytes=kv_bytes,
                  kv_cache_values_bytes=kv_values_bytes,
                  prefill_constants_bytes=prefill_extra,
                  working_bytes=max(0, dec.region.sram_lines * cfg.lanes - image_bytes - kv_bytes)),
        mxm_weight_bytes=matrix_bytes, program_weight_bytes=dec.region.weight_bytes,
        mxm_utilization=macs / (peak * decode_cycles),
        install_utilization=own.install / decode_cycles,
        on_chip=dict(embedding="lpx (mem.gather)" if session.embed_on_chip else
                     f"host (a table of {spec.vocab} rows: a lane tile does not fit one slice of "
                     f"{cfg.lines_per_slice} lines; the rows are sent in place of the ids)",
                     sampling="lpx (argmax)", kv_cache="lpx SRAM, kept across runs",
                     dense_layers=f"{session.precision} W8A8 (activations quantized on the VXM by static "
                     "per-tensor scales, weights per output channel), the rest "
                     f"{session.float_precision}" if session.quantization else session.precision),
        sim_wall_s=last.get("sim_wall_s"),
    )
    return report

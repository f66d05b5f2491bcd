"""What the decoder sessions share: a compiled step and the names of its bindings, the
float precision an 8-bit path leaves around its dense layers, the caches' stored size,
and the refusal of what does not fit."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..errors import LPXError
from ..frontends import decoders
from ..machine.config import LPXConfig
from ..relax_passes.errors import ModelError
from ..target.builder import SharedSram
from .sizing import cache_bytes_as_stored, float_bytes
from ..target.codegen.options import CodegenOptions


# The share of a chip's SRAM a decoder's weights and caches may take; working space and
# the tiling's padding take the rest: codegen's weight budget (docs/compiler.md).
WEIGHT_BUDGET = CodegenOptions().weight_budget


class DoesNotFit(LPXError):
    """A decoder whose weights and KV cache do not fit one chip's SRAM."""


@dataclass
class StepProgram:
    """One compiled step (prefill of ``tokens`` tokens, or decode: 1) and the names of its
    bindings: the token ids and position it reads, the caches it keeps in SRAM, and the
    next ids and logits it returns (or, a pipeline stage before the last, the ``hidden``
    rows it also sends on)."""

    tokens: int
    region: object  # CompiledRegion
    ids: str
    position: "str | None"  # None: a pipeline stage of MLPs only, which reads none
    caches: list  # cache input names, in the steps' order (decoders.DecoderSpec.cache_names)
    next_ids: "str | None"
    logits: "str | None"
    counters: object = None  # of the schedule check (static: every run has these)
    hidden: "str | None" = None

    @property
    def program(self):
        return self.region.program

    @property
    def cycles(self) -> int:
        return self.counters.cycles


def embeds_on_chip(spec: decoders.DecoderSpec, cfg: LPXConfig, precision: str) -> bool:
    """Whether the step gathers the embedding on chip: a lane tile of its table fits one
    slice (as mem.gather needs, docs/ops.md); else the host looks the rows up and sends
    them in place of the ids (B*T rows of H values per step)."""
    return spec.vocab * float_bytes(precision) <= cfg.lines_per_slice


def embed_choice(spec: decoders.DecoderSpec, cfg: LPXConfig, precision: str, asked: "bool | None") -> bool:
    """Whether a session gathers the embedding on chip: where it can (:func:`embeds_on_chip`),
    unless ``asked`` is False (the host looks the rows up); an LPXError if ``asked`` is
    True where it cannot."""
    can = embeds_on_chip(spec, cfg, precision)
    if asked and not can:
        raise LPXError(f"an embedding table of {spec.vocab} rows is not gathered on chip: a lane tile of it "
                       f"takes more than a slice's {cfg.lines_per_slice} lines")
    return can if asked is None else asked


def step_program(regions: dict, offload, spec: decoders.DecoderSpec, tokens: int, cfg: LPXConfig,
                 precision: str, last: bool = True) -> StepProgram:
    """The :class:`StepProgram` of a compiled step (``lower``'s regions and offload), or
    the error saying why the step is not one LPX program. ``last=False``: a pipeline
    stage before the last, which returns hidden rows instead of next ids and logits."""
    cpu = dict(offload.cpu) if offload is not None else {}
    if len(regions) > 1 and not cpu:
        raise DoesNotFit(f"the {'decode' if tokens == 1 else 'prefill'} step's weights, KV cache and working "
                         f"space do not fit one {cfg.name} chip's SRAM together (batch {spec.batch}, "
                         f"context {spec.max_context}; the caches take "
                         f"{cache_bytes_as_stored(spec, cfg, precision) / 2**20:,.1f} MiB as "
                         "stored): use a smaller batch or "
                         "context")
    if len(regions) != 1 or cpu:
        raise LPXError(f"the {'decode' if tokens == 1 else 'prefill'} step compiled to {len(regions)} LPX "
                       f"regions with {cpu or 'no ops'} on the CPU; a step must be one LPX program")
    (region,) = regions.values()
    # The region's inputs are the step's (torch.export names them after forward's
    # arguments: input_ids, position, caches_0, ...), in whatever order it uses them.
    names = {n for n, _ in region.inputs}
    ids, position = "input_ids", "position"
    caches = [f"caches_{i}" for i in range(len(spec.cache_names))]
    if position not in names and not caches:  # a stage of MLPs only: no position is read
        position = None
    if names != {ids, *caches} | ({position} if position else set()):
        raise LPXError(f"step inputs {sorted(names)} are not input_ids, position and {len(caches)} caches")
    layouts = {b.name: b.layout for b in region.program.bindings}
    kept = {layouts[n] for n in caches}
    rest = [(n, shape) for n, shape in region.outputs if layouts[n] not in kept]
    int_out = [n for n, _ in rest if layouts[n].dtype.short == "int32"]
    float_out = [n for n, _ in rest if layouts[n].dtype.short != "int32"]
    if not last:
        if int_out or len(float_out) != 1 or len(region.outputs) != 1 + len(caches):
            raise LPXError(f"step outputs {region.outputs}: expected hidden rows and the caches in place")
        return StepProgram(tokens, region, ids, position, caches, None, None, hidden=float_out[0])
    if len(int_out) != 1 or len(float_out) != 1 or len(region.outputs) != 2 + len(caches):
        raise LPXError(f"step outputs {region.outputs}: expected next ids, logits and the caches in place")
    return StepProgram(tokens, region, ids, position, caches, int_out[0], float_out[0])


def prompt_ids(spec: decoders.DecoderSpec, input_ids, max_new_tokens: int) -> np.ndarray:
    """``input_ids`` ([batch, P] token ids, or [P] for a batch of one) as a [batch, P]
    array, checked against the session's batch, vocabulary and context."""
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] != spec.batch:
        raise ModelError(f"input_ids of shape {ids.shape}: this session decodes a batch of {spec.batch} "
                         f"([{spec.batch}, prompt length])")
    if ids.dtype.kind not in "iu" or ids.size and (ids.min() < 0 or ids.max() >= spec.vocab):
        raise ModelError(f"input_ids must be token ids in 0..{spec.vocab - 1}")
    prompt = ids.shape[1]
    if max_new_tokens < 1 or prompt + max_new_tokens - 1 > spec.max_context:
        raise ModelError(f"{prompt} prompt tokens and {max_new_tokens} new ones do not fit the context of "
                         f"{spec.max_context} positions")
    return ids


def shared_with(decode: StepProgram) -> SharedSram:
    """What a prefill program shares with the decode program of its chip: the caches
    pinned to the decode program's lines, its resident weights reused in place."""
    d = decode.program
    layouts = {b.name: b.layout for b in d.bindings if b.role == "input"}
    return SharedSram(inputs=tuple((n, layouts[n]) for n in decode.caches), images=tuple(d.sram_init),
                      constants=decode.region.constants)


def token_ids(name: str, value, spec: decoders.DecoderSpec) -> np.ndarray:
    """``value`` ([batch, P] token ids, or [P] for a batch of one) as an int64 array
    [batch, P], or a ModelError naming the argument: a ragged prompt, values that are not
    whole numbers, ids outside the vocabulary, another batch, no tokens."""
    try:
        ids = np.asarray(value)
    except (ValueError, TypeError):  # numpy refuses rows of different lengths
        raise ModelError(f"{name}: rows of different lengths; a batch's prompts have one length") from None
    if ids.dtype == object:
        raise ModelError(f"{name}: rows of different lengths or values that are not token ids")
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] != spec.batch:
        raise ModelError(f"{name} of shape {ids.shape}: this session decodes a batch of {spec.batch} "
                         f"([{spec.batch}, prompt length])")
    if ids.shape[1] == 0:
        raise ModelError(f"{name}: an empty prompt; a prompt takes at least one token")
    if ids.dtype.kind not in "iu":
        raise ModelError(f"{name} of dtype {ids.dtype}: expected integer token ids")
    if ids.min() < 0 or ids.max() >= spec.vocab:
        bad = ids[(ids < 0) | (ids >= spec.vocab)][0]
        raise ModelError(f"{name}: {bad} is not a token id of this model (its vocabulary: 0..{spec.vocab - 1})")
    return ids.astype(np.int64)


def generation_arguments(spec: decoders.DecoderSpec, input_ids, max_new_tokens) -> np.ndarray:
    """The prompt of ``generate(input_ids, max_new_tokens)`` as [batch, P] ids, both
    arguments checked (ModelError naming the argument)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
        raise ModelError(f"max_new_tokens={max_new_tokens!r}: expected an integer of at least 1")
    ids = token_ids("input_ids", input_ids, spec)
    prompt = ids.shape[1]
    if prompt >= spec.max_context or prompt + max_new_tokens - 1 > spec.max_context:
        raise ModelError(f"{prompt} prompt tokens and {max_new_tokens} new ones do not fit the context of "
                         f"{spec.max_context} positions (it holds the prompt, and all new tokens but the last)")
    return prompt_ids(spec, ids, int(max_new_tokens))

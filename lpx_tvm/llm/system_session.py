"""A decoder LLM over the chips of a system by tensor and pipeline parallelism
(docs/multichip.md).

The chips are cut into pipeline stages of ``tensor_parallel`` chips each, in order; each
stage holds contiguous layers (:func:`~lpx_tvm.frontends.decoders.stages_of`). Within a
stage each chip runs its own prefill and decode programs: its share of the kv heads
(their query heads and caches) and of the MLP, the partial products of o and down summed
over the links by an all-reduce inside the program
(:class:`~lpx_tvm.frontends.decoders.TensorShard`). The first stage embeds the tokens;
each stage's chip of rank ``r`` sends its hidden rows to the next stage's chip of rank
``r`` over their link as its program ends, and that chip's program receives them as it
starts; the last stage's norm, LM head and argmax are on each of its chips, so every one
computes the same next token. The chips' programs are
built side by side, each receive placed at its message's arrival from the peer's program
(:func:`~lpx_tvm.target.system_programs.build_together`), and run together on the system simulator,
each chip keeping its caches in its SRAM between runs.
"""

from __future__ import annotations

import numpy as np

from ..errors import LPXError
from ..frontends import decoders
from ..frontends.torch import import_torch
from ..machine.system import System
from ..relax_passes.errors import ModelError
from ..relax_passes.tvm_output import quiet_tvm
from ..sim.multichip import SystemSimulator
from ..target.builder import SharedSram
from ..target.codegen.interface import ProgramInterface
from ..target.system_programs import build_together
from .sizing import EIGHT_BIT, FLOAT_OF
from .step_program import embed_choice, generation_arguments, shared_with, step_program


class SystemLLMSession:
    """A decoder compiled for ``chips`` of ``system``: pipeline stages of
    ``tensor_parallel`` chips (default: one stage of all of them).

    ``generate(input_ids, max_new_tokens)`` as :class:`~lpx_tvm.llm.LLMSession`'s;
    ``report`` holds the decode step's cycles on the system."""

    def __init__(self, model, spec: decoders.DecoderSpec, system: System, chips, precision: str,
                 tensor_parallel: "int | None" = None, quantization: "decoders.QuantizedLinears | None" = None,
                 float_precision: "str | None" = None, split_layers: bool = False,
                 embed_on_chip: "bool | None" = None):
        cfg = system.config
        self.model, self.spec, self.system, self.precision = model, spec, system, precision
        # int8 / fp8: W8A8 dense layers with the whole model's activation scales (each chip
        # quantizes its share of the weights); the rest at the float precision.
        self.quantization = quantization
        if (precision in EIGHT_BIT) != (quantization is not None):
            raise LPXError(f"precision {precision} with {'no' if quantization is None else quantization.fmt} "
                           "activation scales")
        self.float_precision = float_precision or FLOAT_OF.get(precision, precision)
        self.chips = tuple(chips)
        bad = [c for c in self.chips if not 0 <= c < system.chips]
        if bad or not self.chips or len(set(self.chips)) != len(self.chips):
            raise LPXError(f"chips {list(self.chips)}: expected distinct chips of system {system.name} "
                           f"(0..{system.chips - 1})")
        t = tensor_parallel or len(self.chips)
        if t < 1 or len(self.chips) % t:
            raise LPXError(f"tensor parallelism over {t} chips: {len(self.chips)} chips are not whole stages of {t}")
        self.tensor_parallel = t
        self.groups = [self.chips[k:k + t] for k in range(0, len(self.chips), t)]
        # Whole layers a stage, as even as they go; or (split_layers) stages cut between a
        # layer's attention and its MLP where that balances the chips' weights.
        self.stages = decoders.split_stages_of(spec.layers, len(self.groups), *decoders.half_layer_values(model, spec)) \
            if split_layers else decoders.stages_of(spec.layers, len(self.groups))
        for group in self.groups:
            for a in group:
                for b in group:
                    if a != b and not system.links_between(a, b):
                        raise LPXError(f"chips {a} and {b} of system {system.name} are not linked: a "
                                       "tensor-parallel group is pairwise linked")
        for g0, g1 in zip(self.groups, self.groups[1:]):
            for a, b in zip(g0, g1):
                if not system.links_between(a, b):
                    raise LPXError(f"chips {a} and {b} of system {system.name} are not linked: a pipeline stage's "
                                   "chip hands its rows to the next stage's chip of its rank over a link")
        self.local = decoders.shard_spec(spec, t)
        self.roles = {}  # chip -> (its TensorShard or None, its PipelineStage or None, its ChipPlace roles)
        for k, group in enumerate(self.groups):
            stage = self.stages[k] if len(self.groups) > 1 else None
            for r, c in enumerate(group):
                place = dict(chips=group, upstream=self.groups[k - 1][r] if k else None,
                             downstream=self.groups[k + 1][r] if k + 1 < len(self.groups) else None,
                             received=("input_ids",) if k else ())
                self.roles[c] = (decoders.TensorShard(r, t) if t > 1 else None, stage, place)
        self.config = cfg
        # The first stage gathers the embedding where it can (as one chip does,
        # LLMSession), or the host looks rows up (embed_on_chip=False).
        self.embed_on_chip = embed_choice(spec, cfg, precision, embed_on_chip)
        self._embed_rows = None if self.embed_on_chip else \
            model.get_input_embeddings().weight.detach().float().numpy()
        self.sim = SystemSimulator(system)
        self.decode = self._compile(1, None)
        timed = self.sim.run(self.programs(self.decode), timing_only=True)  # static: every step's
        self.decode_cycles, self.decode_link_bytes = timed.cycles, sum(timed.link_bytes.values())
        self.decode_stage_ends = self._stage_ends(timed)
        self._prefill = {}  # prompt length -> ({chip: StepProgram}, cycles, each stage's end)
        self._last = {}

    @staticmethod
    def programs(steps: dict) -> dict:
        return {c: s.program for c, s in steps.items()}

    @quiet_tvm()
    def _compile(self, tokens: int, shared: "dict | None") -> dict:
        """{chip: StepProgram} of the step of ``tokens`` tokens."""
        from ..pipeline import lower

        imported = {}
        for c, (shard, stage, _) in self.roles.items():
            embeds = self.embed_on_chip and (stage is None or stage.first)
            step = decoders.decoder_step(self.model, self.spec, tokens, self.embed_on_chip, quant=self.quantization,
                                         shard=shard, stage=stage)
            imported[c] = import_torch(step, decoders.example_inputs(decoders.stage_spec(self.local, stage), tokens,
                                                                     embed_in_step=embeds))
        steps = {}

        def build(c, place):
            shard, stage, _ = self.roles[c]
            interface = ProgramInterface(shared=(shared or {}).get(c) or SharedSram(), chip=place)
            _, regions, offload = lower(imported[c].mod, self.config, self.float_precision, interface=interface)
            steps[c] = step_program(regions, offload, decoders.stage_spec(self.local, stage), tokens, self.config,
                                    self.precision, last=stage is None or stage.last)
            return steps[c].program

        build_together(self.system, self.chips, build, f"the {'decode' if tokens == 1 else 'prefill'} step",
                       roles={c: role[2] for c, role in self.roles.items()})
        return dict(steps)

    def prefill_step(self, prompt_len: int) -> dict:
        """The prefill programs of ``prompt_len`` tokens, each compiled against its chip's
        decode program's SRAM (once per length)."""
        if not 1 <= prompt_len < self.spec.max_context:
            raise ModelError(f"a prompt of {prompt_len} tokens in a context of {self.spec.max_context}: "
                             f"prompts take 1 to {self.spec.max_context - 1} tokens")
        if prompt_len not in self._prefill:
            steps = self._compile(prompt_len, {c: shared_with(d) for c, d in self.decode.items()})
            timed = self.sim.run(self.programs(steps), timing_only=True)
            self._prefill[prompt_len] = steps, timed.cycles, self._stage_ends(timed)
        return self._prefill[prompt_len][0]

    def prefill_cycles(self, prompt_len: int) -> int:
        """The system's cycles for the prefill of ``prompt_len`` tokens (the TTFT)."""
        self.prefill_step(prompt_len)
        return self._prefill[prompt_len][1]

    def prefill_stage_ends(self, prompt_len: int) -> list:
        """The cycle each pipeline stage's prefill of ``prompt_len`` tokens ends (its
        chips' last)."""
        self.prefill_step(prompt_len)
        return self._prefill[prompt_len][2]

    def _stage_ends(self, timed) -> list:
        return [max(timed.chips[c].cycles for c in g) for g in self.groups]

    def _run(self, steps: dict, ids: np.ndarray, position: int, fresh: bool, logits: bool):
        ids = ids.astype(np.int32).reshape(-1)
        tokens = ids if self._embed_rows is None else self._embed_rows[ids]
        feed, keep = {}, {}
        for c, step in steps.items():
            feed[c] = {step.position: np.array([position], np.int32)} if step.position else {}
            if c in self.groups[0]:  # the later stages receive their rows from the stage before
                feed[c][step.ids] = tokens
            if fresh:  # a new request: its prefill starts from empty caches
                # the stage's attending layers' caches
                feed[c].update(self.local.with_caches(len(step.caches)).zero_caches(step.caches))
            else:
                keep[c] = step.caches
        r = self.sim.run(self.programs(steps), feed, keep=keep)
        first, *rest = self.groups[-1]
        next_ids = r.chips[first].outputs[steps[first].next_ids]
        for c in rest:
            if not np.array_equal(r.chips[c].outputs[steps[c].next_ids], next_ids):
                raise LPXError(f"chips {first} and {c} chose different tokens: their programs disagree")
        out = r.chips[first].outputs[steps[first].logits] if logits else None
        return r.cycles, next_ids, out

    def generate(self, input_ids, max_new_tokens: int, return_logits: bool = False):
        """Greedy tokens after ``input_ids`` ([batch, P] ints, or [P] for a batch of one)."""
        spec = self.spec
        ids = generation_arguments(spec, input_ids, max_new_tokens)
        prompt = ids.shape[1]
        ttft, next_ids, logits = self._run(self.prefill_step(prompt), ids, 0, True, return_logits)
        out, all_logits = [], []
        for k in range(max_new_tokens):
            out.append(next_ids.reshape(spec.batch, 1))
            if return_logits:
                all_logits.append(logits.astype(np.float32).reshape(spec.batch, -1))
            if k + 1 < max_new_tokens:
                _, next_ids, logits = self._run(self.decode, next_ids, prompt + k, False, return_logits)
        self._last = dict(prompt_len=prompt, new_tokens=max_new_tokens, ttft_cycles=ttft)
        tokens = np.concatenate(out, axis=1).astype(np.int64)
        return (tokens, np.stack(all_logits)) if return_logits else tokens

    @property
    def report(self) -> dict:
        cfg, spec = self.config, self.spec
        per_user = cfg.clock_hz / self.decode_cycles
        return dict(system=self.system.name, chips=list(self.chips), tensor_parallel=self.tensor_parallel,
                    pipeline_stages=len(self.stages), stage_layers=[st.stop - st.start for st in self.stages],
                    stage_halves=[(st.attention_layers, st.mlp_layers) for st in self.stages],
                    preset=cfg.name, precision=self.precision, family=spec.family, parameters=spec.parameters,
                    layers=spec.layers,
                    batch=spec.batch, max_context=spec.max_context, ttft_cycles=self._last.get("ttft_cycles"),
                    decode_cycles_per_token=self.decode_cycles, tokens_per_s_per_user=per_user,
                    tokens_per_s_per_chip=per_user * spec.batch / len(self.chips),
                    link_bytes_per_token=self.decode_link_bytes)


__all__ = ["SystemLLMSession"]

"""A decoder LLM over the chips of a system by tensor parallelism (docs/multichip.md).

Each chip of the group runs its own prefill and decode programs: its share of the kv
heads (their query heads and caches) and of the MLP, the partial products of o and down
summed over the links by an all-reduce inside the program
(:class:`~lpx_tvm.frontends.decoders.TensorShard`). Norms, the embedding and the LM head
are on every chip, so every chip computes the same next token. The chips' programs are
built side by side, each receive placed at its message's arrival from the peer's program
(:func:`~lpx_tvm.target.collectives.build_together`), and run together on the system simulator,
each chip keeping its caches in its SRAM between runs.
"""

from __future__ import annotations

import numpy as np

from ..errors import LPXError
from ..frontends import decoders
from ..frontends.torch import import_torch
from ..machine.system import System
from ..relax_passes.errors import ModelError
from ..sim.multichip import SystemSimulator
from ..target.builder import SharedSram
from ..target.codegen.options import codegen_options
from ..target.collectives import build_together
from .steps import float_bytes, prompt_ids, shared_with, step_program

FLOAT = ("fp32", "fp16", "bf16")


class SystemLLMSession:
    """A decoder compiled for ``chips`` of ``system`` (tensor parallelism over all of them).

    ``generate(input_ids, max_new_tokens)`` as :class:`~lpx_tvm.llm.LLMSession`'s;
    ``report`` holds the decode step's cycles on the system."""

    def __init__(self, model, spec: decoders.DecoderSpec, system: System, chips, precision: str):
        if precision not in FLOAT:
            raise LPXError(f"precision {precision}: tensor parallelism runs {', '.join(FLOAT)} so far "
                           "(docs/multichip.md)")
        self.model, self.spec, self.system, self.precision = model, spec, system, precision
        self.chips = tuple(chips)
        bad = [c for c in self.chips if not 0 <= c < system.chips]
        if bad or not self.chips or len(set(self.chips)) != len(self.chips):
            raise LPXError(f"chips {list(self.chips)}: expected distinct chips of system {system.name} "
                           f"(0..{system.chips - 1})")
        for a in self.chips:
            for b in self.chips:
                if a != b and not system.links_between(a, b):
                    raise LPXError(f"chips {a} and {b} of system {system.name} are not linked: a tensor-parallel "
                                   "group is pairwise linked")
        self.local = decoders.shard_spec(spec, len(self.chips))
        self.shards = {c: decoders.TensorShard(k, len(self.chips)) for k, c in enumerate(self.chips)}
        cfg = system.config
        self.config = cfg
        self.embed_on_chip = spec.vocab * float_bytes(precision) <= cfg.lines_per_slice
        self._embed_rows = None if self.embed_on_chip else \
            model.get_input_embeddings().weight.detach().float().numpy()
        self.sim = SystemSimulator(system)
        self.decode = self._compile(1, None)
        timed = self.sim.run(self.programs(self.decode), timing_only=True)  # static: every step's
        self.decode_cycles, self.decode_link_bytes = timed.cycles, sum(timed.link_bytes.values())
        self._prefill = {}  # prompt length -> ({chip: StepProgram}, cycles)
        self._last = {}

    @staticmethod
    def programs(steps: dict) -> dict:
        return {c: s.program for c, s in steps.items()}

    def _compile(self, tokens: int, shared: "dict | None") -> dict:
        """{chip: StepProgram} of the step of ``tokens`` tokens."""
        from ..pipeline import lower

        imported = {c: import_torch(decoders.decoder_step(self.model, self.spec, tokens, self.embed_on_chip,
                                                          shard=self.shards[c]),
                                    decoders.example_inputs(self.local, tokens, embed_in_step=self.embed_on_chip))
                    for c in self.chips}
        steps = {}

        def build(c, place):
            with codegen_options(shared=(shared or {}).get(c) or SharedSram(), system=place):
                _, regions, offload = lower(imported[c].mod, self.config, self.precision)
            steps[c] = step_program(regions, offload, self.local, tokens, self.config, self.precision)
            return steps[c].program

        build_together(self.system, self.chips, build, f"the {'decode' if tokens == 1 else 'prefill'} step")
        return dict(steps)

    def prefill_step(self, prompt_len: int) -> dict:
        """The prefill programs of ``prompt_len`` tokens, each compiled against its chip's
        decode program's SRAM (once per length)."""
        if not 1 <= prompt_len < self.spec.max_context:
            raise ModelError(f"a prompt of {prompt_len} tokens in a context of {self.spec.max_context}: "
                             f"prompts take 1 to {self.spec.max_context - 1} tokens")
        if prompt_len not in self._prefill:
            steps = self._compile(prompt_len, {c: shared_with(d) for c, d in self.decode.items()})
            self._prefill[prompt_len] = steps, self.sim.run(self.programs(steps), timing_only=True).cycles
        return self._prefill[prompt_len][0]

    def prefill_cycles(self, prompt_len: int) -> int:
        """The system's cycles for the prefill of ``prompt_len`` tokens (the TTFT)."""
        self.prefill_step(prompt_len)
        return self._prefill[prompt_len][1]

    def _run(self, steps: dict, ids: np.ndarray, position: int, fresh: bool, logits: bool):
        ids = ids.astype(np.int32).reshape(-1)
        tokens = ids if self._embed_rows is None else self._embed_rows[ids]
        feed, keep = {}, {}
        for c, step in steps.items():
            feed[c] = {step.ids: tokens, step.position: np.array([position], np.int32)}
            if fresh:  # a new request: its prefill starts from empty caches
                zeros = np.zeros((self.local.cache_rows, self.local.head_dim), np.float32)
                feed[c].update({n: zeros for n in step.caches})
            else:
                keep[c] = step.caches
        r = self.sim.run(self.programs(steps), feed, keep=keep)
        first = self.chips[0]
        next_ids = r.chips[first].outputs[steps[first].next_ids]
        for c in self.chips[1:]:
            if not np.array_equal(r.chips[c].outputs[steps[c].next_ids], next_ids):
                raise LPXError(f"chips {first} and {c} chose different tokens: their programs disagree")
        out = r.chips[first].outputs[steps[first].logits] if logits else None
        return r.cycles, next_ids, out

    def generate(self, input_ids, max_new_tokens: int, return_logits: bool = False):
        """Greedy tokens after ``input_ids`` ([batch, P] ints, or [P] for a batch of one)."""
        spec = self.spec
        ids = prompt_ids(spec, input_ids, max_new_tokens)
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
        return dict(system=self.system.name, chips=list(self.chips), tensor_parallel=len(self.chips),
                    preset=cfg.name, precision=self.precision, family=spec.family, parameters=spec.parameters,
                    layers=spec.layers,
                    batch=spec.batch, max_context=spec.max_context, ttft_cycles=self._last.get("ttft_cycles"),
                    decode_cycles_per_token=self.decode_cycles, tokens_per_s_per_user=per_user,
                    tokens_per_s_per_chip=per_user * spec.batch / len(self.chips),
                    link_bytes_per_token=self.decode_link_bytes)


__all__ = ["SystemLLMSession"]

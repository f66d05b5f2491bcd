"""Many chips: the planner against the whole model simulated, and the system simulator's
speed, measured side by side in one run (docs/multichip.md).

- For tensor parallelism over 2, 4 and 8 chips of a GroqNode (and one chip), a small
  Llama (8 kv heads, 6 layers) is planned (its steps simulated with two and three
  layers, composed) and then compiled and simulated whole: the relative error of the predicted decode
  cycles per token, and of TTFT.
- The system simulator's speed on the 8-chip decode step: simulated chip-cycles per wall
  second, functional, and timing-only inline against timing-only in 2 worker processes.

The last line printed is JSON with ``planner_max_error`` (the largest relative error of
predicted against simulated decode cycles per token over the cases) and the keys of the
large-model targets, ``llama2_70b_tokens_per_s_per_user``, ``llama2_70b_chips`` and
``lp30_llama3_70b_tokens_per_s_per_user``: null until the mapping they need (the LM head
split by vocabulary, pipeline parallelism, 8-bit tensor parallelism) is built; the
reason is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import lpx_tvm
from lpx_tvm.llm.plan import plan

CONFIG = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
              num_attention_heads=8, num_key_value_heads=8, head_dim=32, max_position_embeddings=128)


def simulated(chips: int, context: int, prompt: int, precision: str):
    if chips == 1:
        s = lpx_tvm.compile_llm(CONFIG, preset="tsp", precision=precision, max_context=context, prompt_len=prompt)
        return s, s.decode.cycles, s.prefill_step(prompt).cycles
    s = lpx_tvm.compile_llm(CONFIG, precision=precision, max_context=context, prompt_len=prompt, system="groqnode",
                            chips=range(chips))
    return s, s.decode_cycles, s.prefill_cycles(prompt)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chips", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--precision", default="fp32")
    args = p.parse_args()
    t0 = time.perf_counter()
    predicted = plan(CONFIG, "groqnode", precision=args.precision, context=args.context,
                     prompt_len=args.prompt_len, tensor_parallel=args.chips)
    plan_s = time.perf_counter() - t0
    cases, last = [], None
    for m in predicted.mappings:
        t = time.perf_counter()
        session, decode, ttft = simulated(m.tensor_parallel, args.context, args.prompt_len, args.precision)
        case = dict(chips=m.tensor_parallel, predicted_decode=m.decode_cycles_per_token, simulated_decode=decode,
                    decode_error=(m.decode_cycles_per_token - decode) / decode, predicted_ttft=m.ttft_cycles,
                    simulated_ttft=ttft, ttft_error=(m.ttft_cycles - ttft) / ttft, layer_cycles=m.layer_cycles,
                    tokens_per_s_per_user=m.tokens_per_s_per_user, link_utilization=m.link_utilization,
                    compile_s=time.perf_counter() - t)
        cases.append(case)
        print(f"{m.tensor_parallel} chip(s): decode predicted {m.decode_cycles_per_token:,} simulated {decode:,} "
              f"({case['decode_error']:+.1%}); TTFT predicted {m.ttft_cycles:,} simulated {ttft:,} "
              f"({case['ttft_error']:+.1%}); a layer {m.layer_cycles:,} cycles", flush=True)
        last = session
    speed = {}
    if last is not None and hasattr(last, "sim"):
        progs = last.programs(last.decode)
        n = len(progs)
        feed = {c: {s.ids: [0], s.position: [args.prompt_len]} for c, s in last.decode.items()}
        for c, s in last.decode.items():
            feed[c].update({name: np.zeros((last.local.cache_rows, last.local.head_dim), np.float32)
                            for name in s.caches})
        t = time.perf_counter()
        r = last.sim.run(progs, feed)
        functional = time.perf_counter() - t
        t = time.perf_counter()
        last.sim.run(progs, timing_only=True)
        inline = time.perf_counter() - t
        t = time.perf_counter()
        last.sim.run(progs, timing_only=True, workers=2)
        pooled = time.perf_counter() - t
        speed = dict(chips=n, cycles=r.cycles, functional_chip_cycles_per_s=n * r.cycles / functional,
                     timing_chip_cycles_per_s=n * r.cycles / inline,
                     timing_2_workers_over_inline=pooled / inline)
        print(f"system simulator, {n}-chip decode step of {r.cycles:,} cycles: functional "
              f"{speed['functional_chip_cycles_per_s']:,.0f} chip-cycles/s, timing-only "
              f"{speed['timing_chip_cycles_per_s']:,.0f}; 2 worker processes take {pooled / inline:.2f}x the "
              "inline time (process start-up included)", flush=True)
    missing = ("the 70B mappings need the LM head split by vocabulary (it is on every chip today), pipeline "
               "parallelism and 8-bit tensor parallelism: not built yet (docs/multichip.md, Status)")
    print(f"llama2_70b / lp30_llama3_70b: {missing}")
    print(json.dumps(dict(planner_max_error=max(abs(c["decode_error"]) for c in cases),
                          planner_max_ttft_error=max(abs(c["ttft_error"]) for c in cases),
                          llama2_70b_tokens_per_s_per_user=None, llama2_70b_chips=None,
                          lp30_llama3_70b_tokens_per_s_per_user=None, missing=missing, plan_s=plan_s,
                          cases=cases, simulator=speed)))


if __name__ == "__main__":
    main()

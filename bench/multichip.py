"""Many chips: the planner against the whole mapping simulated, the large models planned,
and the system simulator's speed, measured side by side in one run (docs/multichip.md).

- A small Llama (8 kv heads, 8 layers) on a TSP rack, on 1 chip and on 2 to 16 by tensor
  parallelism and pipeline stages (1, 2, 4, 8, 8 and 16 chips): the planner's prediction
  (steps of two and four layers, a pipeline of two-layer stages, composed) against the
  whole mapping compiled and simulated; the relative error of decode cycles per token and
  of TTFT. The same cases predicted from one chip's samples (``samples="chip"``), and a
  mapping whose stages cut layers between attention and MLP (6 chips).
- Llama-2-70B in int8 on TSP systems of up to 576 chips (whole-layer stages at 4k
  context; stages cut at half layers at 4k and 2k, and at 4k with a 92% SRAM budget),
  and Llama-3-70B and -8B in fp8 on an LP30 rack (4k context at batch 1 and 2, 1k
  context at batches 1, 2 and 4), from their published configs: one chip's share of
  their layers compiled and simulated, composed with the collectives simulated on the
  system; where nothing fits or compiles, why.
- The stages the planner sizes, one chip's share compiled for real (Llama-2-70B's
  heaviest at 2k and 4k on TSPs, Llama-3-70B's on LP30): resident, or weights streamed.
- A Llama-2-70B middle stage (one chip's 1/8 of one layer, int8, 4k) at batch 1 to 16:
  its cycles and tokens/s per chip beside its multiply and install floors.
- Each collective of the 70B plans (the hidden rows' all-reduce and hand-off at batch 1
  and 8 and for a 128-token prompt, the logits' all-reduce) beside its link floor.
- The system simulator's speed on the 16-chip decode step: simulated chip-cycles per wall
  second, functional, and timing-only inline against timing-only in 2 worker processes.

The last line printed is JSON with ``planner_max_error`` (the largest relative error of
predicted against simulated decode cycles per token over the 2- to 16-chip cases),
``planner_chip_max_error`` (the same from one chip's samples, and the split mapping),
``llama2_70b_tokens_per_s_per_user``, ``llama2_70b_chips`` and ``llama2_70b_context``,
``llama2_70b_4k_tokens_per_s_per_user`` (4k context, stages cut at half layers, the
default SRAM budget), ``llama2_70b_4k_stage_batches`` (a middle stage at batch 1 to 16,
each beside its floors) and ``lp30_llama3_70b_tokens_per_s_per_user`` (batch 1, 4k
context; null where no mapping fits or compiles, the reason beside them), and
``collectives`` (each collective's cycles and link floor).
"""

from __future__ import annotations

import argparse
import json
import time


import lpx_tvm
from lpx_tvm.llm.capacity import plan

SYSTEM = "tsp-rack"
CONFIG = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=8, head_dim=32, max_position_embeddings=128)
# (tensor parallel, pipeline stages): 1, 2, 4, 8, 8 and 16 chips
CASES = [(1, 1), (2, 1), (2, 2), (4, 2), (2, 4), (4, 4)]
SPLIT_CASES = [(2, 3)]  # 8 layers over 3 stages of 2 chips, cut at half layers (6 chips)

# Published configs (Hugging Face config.json of meta-llama/Llama-2-70b-hf, Meta-Llama-3-70B, Meta-Llama-3-8B).
LLAMA2_70B = dict(model_type="llama", vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                  num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=4096,
                  rms_norm_eps=1e-5)
LLAMA3_70B = dict(LLAMA2_70B, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
LLAMA3_8B = dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                 rope_theta=500000.0, rms_norm_eps=1e-5)


def simulated(t: int, stages: int, context: int, prompt: int, precision: str, split: bool = False):
    if t * stages == 1:
        s = lpx_tvm.compile_llm(CONFIG, preset="tsp", precision=precision, max_context=context, prompt_len=prompt)
        return s, s.decode.cycles, s.prefill_step(prompt).cycles
    s = lpx_tvm.compile_llm(CONFIG, precision=precision, max_context=context, prompt_len=prompt, system=SYSTEM,
                            tensor_parallel=t, pipeline_stages=stages, split_layers=split)
    return s, s.decode_cycles, s.prefill_cycles(prompt)


def large(name, config, system, precision, context, batches, max_chips, pipeline, prompt=128, workers=2,
          tensor_parallel=(1, 2, 4, 8), split=False, sram_budget=0.9):
    """The mappings of a large model (its published config, sized on torch's meta
    device), predicted from one chip's share of one and two layers compiled and
    simulated alone, with the collectives simulated on the system (``samples="chip"``:
    the whole sampled mappings take more than this machine's 24 GiB to compile), or why
    none fits."""
    t = time.perf_counter()
    p = plan(config, system, precision=precision, context=context, prompt_len=prompt, batches=batches,
             tensor_parallel=list(tensor_parallel), pipeline=pipeline, max_chips=max_chips, samples="chip",
             workers=workers, split_layers=split, sram_budget=sram_budget)
    fits = [m for m in p.mappings if m.fits]
    out = dict(model=name, system=system, precision=precision, context=context, prompt=prompt, split_layers=split,
               sram_budget=sram_budget,
               plan_s=time.perf_counter() - t, mappings=len(p.mappings), fitting=len(fits))
    if not fits:
        least = min(p.mappings, key=lambda m: m.sram_fill)
        out.update(why=f"no mapping of up to {max_chips} chips fits: the emptiest is TP{least.tensor_parallel} x "
                       f"PP{least.pipeline_stages} ({least.chips} chips), {least.why}")
        print(f"{name} on {system} ({precision}, context {context}): {out['why']}", flush=True)
        return out
    done = [m for m in fits if m.decode_cycles_per_token is not None]
    for m in fits:
        if m.decode_cycles_per_token is None:
            print(f"{name}: TP{m.tensor_parallel} x PP{m.pipeline_stages}, batch {m.batch}: {m.why}", flush=True)
    out.update(mapped=[m.to_json() for m in fits])
    if not done:
        out.update(why="no fitting mapping compiled: " + "; ".join(sorted({m.why for m in fits})))
        return out
    one = [m for m in done if m.batch == 1]
    out.update(best=max(one or done, key=lambda m: m.tokens_per_s_per_user).to_json())
    for m in sorted(done, key=lambda m: (m.batch, m.chips, m.micro_batches)):
        print(f"{name} on {system} ({precision}, context {context}{', layers split' if split else ''}): "
              f"TP{m.tensor_parallel} x PP{m.pipeline_stages} x "
              f"{m.micro_batches} micro-batch(es) of {m.batch}, {m.chips} chips, SRAM {m.sram_fill:.0%}: decode "
              f"{m.decode_cycles_per_token:,} cycles/token (a layer {m.layer_cycles:,}), TTFT({prompt}) "
              f"{m.ttft_cycles:,}; {m.tokens_per_s_per_user:,.0f} tokens/s/user, "
              f"{m.tokens_per_s_per_system:,.0f} per system, {m.tokens_per_s_per_chip:,.1f} per chip", flush=True)
    return out


def compiled_stages(name, config, system, precision, context, t, layers, stages, split=False):
    """One chip's share (``1/t``, ``plan.shard_config``) of ``layers`` layers over
    ``stages`` pipeline stages, compiled and timed for real, to check what the planner
    sized from the samples: does each stage's chip hold its weights resident, or does the
    compiler stream some of them over the off-chip path?"""
    from lpx_tvm.frontends.decoder_config import with_layers
    from lpx_tvm.llm.capacity import shard_config

    start = time.perf_counter()
    s = lpx_tvm.compile_llm(shard_config(with_layers(config, layers), t), system=system, tensor_parallel=1,
                            pipeline_stages=stages, split_layers=split, precision=precision, max_context=context,
                            embed_on_chip=False)
    chips = []
    for c, st in s.decode.items():
        image = sum(len(m.data) for m in st.program.sram_init)
        chips.append(dict(chip=c, image_bytes=image, streamed_bytes=st.region.streamed_bytes,
                          sram_lines=st.region.sram_lines))
    out = dict(model=name, system=system, precision=precision, context=context, tensor_parallel=t, layers=layers,
               stage_halves=s.report["stage_halves"], stage_ends=s.decode_stage_ends, chips=chips,
               compile_s=time.perf_counter() - start)
    print(f"{name} ({precision}, context {context}), one chip's 1/{t} of {layers} layers over {stages} stages "
          f"{out['stage_halves']} (attention, MLP halves): " + "; ".join(
              f"{c['image_bytes'] / 2**20:,.1f} MiB resident, {c['streamed_bytes'] / 2**20:,.1f} MiB streamed"
              for c in chips) + f" of {s.config.sram_bytes / 2**20:,.0f}; stage ends {out['stage_ends']}", flush=True)
    return out


def collective_floors(name, config, system, precision, t, batches, prompt=128):
    """Each collective of a tensor-parallel stage of ``t`` chips on ``system`` alone,
    beside its link floor (``Collective.link_floor``): the all-reduce of the hidden rows
    (two a layer) and a stage's hand-off of them, at each decode batch and for a prompt of
    ``prompt`` tokens, and the all-reduce of the logits."""
    from lpx_tvm.llm.sizing import FLOAT_OF
    from lpx_tvm.machine.system import load_system
    from lpx_tvm.target.system_programs import collective, handoff

    s = load_system(system)
    lanes, dtype = s.config.lanes, FLOAT_OF.get(precision, precision)
    first, second = s.stage_groups(t, 2)
    hidden, vocab = -(-config["hidden_size"] // lanes), -(-config["vocab_size"] // lanes)
    cases = [(f"all-reduce, hidden, batch {b}", "all_reduce", b * hidden) for b in batches] + \
            [(f"hand-off, hidden, batch {b}", "handoff", b * hidden) for b in batches] + \
            [(f"all-reduce, hidden, {prompt}-token prompt", "all_reduce", prompt * hidden),
             (f"hand-off, hidden, {prompt}-token prompt", "handoff", prompt * hidden),
             ("all-reduce, logits, batch 1", "all_reduce", vocab)]
    rows = []
    for what, kind, vectors in cases:
        c = handoff(s, first, second, vectors, dtype) if kind == "handoff" else \
            collective(kind, s, first, vectors, dtype)
        rows.append(dict(what=what, vectors=vectors, cycles=c.cycles, link_floor=c.link_floor,
                         over_floor=c.cycles / c.link_floor))
        print(f"{name} TP{t} on {system}, {what} ({vectors} {dtype} vectors): {c.cycles:,} cycles, link floor "
              f"{c.link_floor:,} ({c.cycles / c.link_floor:.2f}x)", flush=True)
    return rows


def stage_batches(name, config, system, precision, context, t, batches):
    """One chip's share (``1/t``) of a middle pipeline stage of one layer (a stage between
    the embedding's and the head's: three one-layer stages compiled, the middle one
    timed), at each batch: decode cycles, tokens/s per chip, and the stage program's own
    floors (multiply grows with the batch, install stays: the weights are installed once
    per step), which says where a batch stops paying."""
    from lpx_tvm.frontends.decoder_config import with_layers
    from lpx_tvm.llm.capacity import shard_config
    from lpx_tvm.runtime.floors import floors_of

    rows = []
    for b in batches:
        start = time.perf_counter()
        try:
            s = lpx_tvm.compile_llm(shard_config(with_layers(config, 3), t), system=system, tensor_parallel=1,
                                    pipeline_stages=3, precision=precision, max_context=context, batch=b,
                                    embed_on_chip=False)
        except lpx_tvm.LPXError as e:
            rows.append(dict(batch=b, why=str(e)))
            print(f"{name} stage (1/{t} of a layer, {precision}, context {context}), batch {b}: {e}", flush=True)
            continue
        # The middle stage's cycles: from the first stage's end (its rows sent) to its own.
        ends = s.decode_stage_ends
        cycles = ends[1] - ends[0]
        own = floors_of(s.config, s.decode[sorted(s.decode)[1]].program.instrs)
        binding, floor = own.largest()
        floors = own.to_json()
        per_chip = b * s.config.clock_hz / cycles
        rows.append(dict(batch=b, cycles=cycles, tokens_per_s_per_chip=per_chip, floors=floors,
                         binding=binding, over_floor=cycles / floor, compile_s=time.perf_counter() - start))
        print(f"{name} stage (1/{t} of a layer, {precision}, context {context}), batch {b:2d}: {cycles:,} cycles "
              f"a step, {per_chip:,.0f} tokens/s per chip; floors multiply {floors['multiply']:,.0f}, install "
              f"{floors['install']:,.0f}, largest {binding} {floor:,.0f} ({cycles / floor:.2f}x)", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--precision", default="fp32")
    args = p.parse_args()
    t0 = time.perf_counter()
    predicted = plan(CONFIG, SYSTEM, precision=args.precision, context=args.context, prompt_len=args.prompt_len,
                     tensor_parallel=sorted({t for t, _ in CASES}), pipeline=sorted({s for _, s in CASES}))
    plan_s = time.perf_counter() - t0
    cases, last = [], None
    for t, stages in CASES:
        (m,) = [m for m in predicted.mappings if (m.tensor_parallel, m.pipeline_stages, m.micro_batches) ==
                (t, stages, 1)]
        start = time.perf_counter()
        session, decode, ttft = simulated(t, stages, args.context, args.prompt_len, args.precision)
        case = dict(chips=t * stages, tensor_parallel=t, pipeline_stages=stages,
                    predicted_decode=m.decode_cycles_per_token, simulated_decode=decode,
                    decode_error=(m.decode_cycles_per_token - decode) / decode, predicted_ttft=m.ttft_cycles,
                    simulated_ttft=ttft, ttft_error=(m.ttft_cycles - ttft) / ttft, layer_cycles=m.layer_cycles,
                    handoff_cycles=m.handoff_cycles, tokens_per_s_per_user=m.tokens_per_s_per_user,
                    link_utilization=m.link_utilization, compile_s=time.perf_counter() - start)
        cases.append(case)
        print(f"TP{t} x PP{stages} ({t * stages} chips): decode predicted {m.decode_cycles_per_token:,} simulated "
              f"{decode:,} ({case['decode_error']:+.1%}); TTFT predicted {m.ttft_cycles:,} simulated {ttft:,} "
              f"({case['ttft_error']:+.1%}); a layer {m.layer_cycles:,} cycles", flush=True)
        last = session
    # One chip's samples (samples="chip") against the same simulations, and stages cut at
    # half layers against theirs.
    chip_plan = plan(CONFIG, SYSTEM, precision=args.precision, context=args.context, prompt_len=args.prompt_len,
                     tensor_parallel=sorted({t for t, _ in CASES if t > 1}), pipeline=sorted({s for _, s in CASES}),
                     samples="chip")
    for case in cases:
        if case["chips"] < 2:
            continue
        (m,) = [m for m in chip_plan.mappings if (m.tensor_parallel, m.pipeline_stages, m.micro_batches) ==
                (case["tensor_parallel"], case["pipeline_stages"], 1)]
        case.update(chip_predicted_decode=m.decode_cycles_per_token,
                    chip_decode_error=(m.decode_cycles_per_token - case["simulated_decode"]) / case["simulated_decode"])
        print(f"TP{m.tensor_parallel} x PP{m.pipeline_stages}: one chip's samples predict {m.decode_cycles_per_token:,} "
              f"({case['chip_decode_error']:+.1%})", flush=True)
    split_cases = []
    for t, stages in SPLIT_CASES:
        (m,) = [m for m in plan(CONFIG, SYSTEM, precision=args.precision, context=args.context,
                                prompt_len=args.prompt_len, tensor_parallel=[t], pipeline=[stages], samples="chip",
                                split_layers=True).mappings if m.micro_batches == 1]
        session, decode, ttft = simulated(t, stages, args.context, args.prompt_len, args.precision, split=True)
        split_cases.append(dict(chips=t * stages, tensor_parallel=t, pipeline_stages=stages,
                                stage_halves=session.report["stage_halves"], predicted_decode=m.decode_cycles_per_token,
                                simulated_decode=decode,
                                decode_error=(m.decode_cycles_per_token - decode) / decode))
        print(f"TP{t} x PP{stages}, stages cut at half layers {session.report['stage_halves']}: one chip's samples "
              f"predict {m.decode_cycles_per_token:,}, simulated {decode:,} ({split_cases[-1]['decode_error']:+.1%})",
              flush=True)
    speed = {}
    if last is not None and hasattr(last, "sim"):
        progs = last.programs(last.decode)
        n = len(progs)
        feed = {c: {s.position: [args.prompt_len]} if s.position else {} for c, s in last.decode.items()}
        for c in last.groups[0]:
            feed[c][last.decode[c].ids] = [0]
        for c, s in last.decode.items():
            feed[c].update(last.local.with_caches(len(s.caches)).zero_caches(s.caches))
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
    # Llama-2-70B: whole-layer stages at 4k; stages cut at half layers at 4k and 2k.
    llama2_whole = large("Llama-2-70B", LLAMA2_70B, "tsp-576", "int8", 4096, [1], 576, [36, 40, 72, 80],
                         tensor_parallel=[8])
    llama2_4k = large("Llama-2-70B", LLAMA2_70B, "tsp-576", "int8", 4096, [1], 576, [64, 72], tensor_parallel=[8],
                      split=True)
    llama2 = large("Llama-2-70B", LLAMA2_70B, "tsp-576", "int8", 2048, [1], 576, [64, 72], tensor_parallel=[8],
                   split=True)
    # At 4k the heaviest stage's weights and caches are 91% of a TSP: planned at a 92%
    # budget, and that stage compiled for real below (resident or not).
    llama2_4k_edge = large("Llama-2-70B", LLAMA2_70B, "tsp-576", "int8", 4096, [1], 576, [64, 72],
                           tensor_parallel=[8], split=True, sram_budget=0.92)
    llama3 = large("Llama-3-70B", LLAMA3_70B, "lp30-rack", "fp8", 4096, [1, 2], 256, [16, 32, 40],
                   tensor_parallel=[8])
    llama3_batches = large("Llama-3-70B", LLAMA3_70B, "lp30-rack", "fp8", 1024, [1, 2, 4], 256, [32],
                           tensor_parallel=[8])
    llama3_8b = large("Llama-3-8B", LLAMA3_8B, "lp30-rack", "fp8", 4096, [1], 256, [4, 8, 16, 32],
                      tensor_parallel=[4, 8])
    llama3_8b_batches = large("Llama-3-8B", LLAMA3_8B, "lp30-rack", "fp8", 1024, [1, 2, 4], 256, [8],
                              tensor_parallel=[8])
    # The stages the planner sizes, compiled for real: Llama-2-70B's MLP-attention-MLP
    # stage at 2k (4 layers over 3 stages cut at half layers: [A M A | M A M | A M]), and
    # Llama-3-70B's stages of 3 layers and of 2 with the head on LP30 at 4k.
    stages = [compiled_stages("Llama-2-70B", LLAMA2_70B, "groqnode", "int8", 2048, 8, 4, 3, split=True),
              compiled_stages("Llama-2-70B", LLAMA2_70B, "groqnode", "int8", 4096, 8, 4, 3, split=True),
              compiled_stages("Llama-3-70B", LLAMA3_70B, "lp30-rack", "fp8", 4096, 8, 5, 2)]
    # A Llama-2-70B middle stage (one chip's 1/8 of a layer) at 4k, batch 1 to 16.
    stage_curve = stage_batches("Llama-2-70B", LLAMA2_70B, "groqnode", "int8", 4096, 8, [1, 2, 4, 8, 16])
    # Each collective of those plans beside its link floor.
    collectives = dict(llama2_70b_tsp=collective_floors("Llama-2-70B", LLAMA2_70B, "tsp-576", "int8", 8, [1, 8]),
                       lp30_llama3_70b=collective_floors("Llama-3-70B", LLAMA3_70B, "lp30-rack", "fp8", 8, [1, 8]))
    big = [c for c in cases if c["chips"] >= 2]
    l2, l3, l2_4k = llama2.get("best"), llama3.get("best"), llama2_4k.get("best")
    print(json.dumps(dict(planner_max_error=max(abs(c["decode_error"]) for c in big),
                          planner_max_ttft_error=max(abs(c["ttft_error"]) for c in big),
                          one_chip_decode_error=next(c["decode_error"] for c in cases if c["chips"] == 1),
                          planner_chip_max_error=max([abs(c["chip_decode_error"]) for c in big] +
                                                     [abs(c["decode_error"]) for c in split_cases]),
                          llama2_70b_tokens_per_s_per_user=l2 and l2["tokens_per_s_per_user"],
                          llama2_70b_chips=l2 and l2["chips"], llama2_70b_context=llama2["context"],
                          llama2_70b_4k_tokens_per_s_per_user=l2_4k and l2_4k["tokens_per_s_per_user"],
                          llama2_70b_4k_stage_batches=stage_curve,
                          lp30_llama3_70b_tokens_per_s_per_user=l3 and l3["tokens_per_s_per_user"],
                          llama2_70b=llama2, llama2_70b_4k=llama2_4k,
                          llama2_70b_4k_at_92_percent=llama2_4k_edge, llama2_70b_whole_layers=llama2_whole,
                          lp30_llama3_70b=llama3, lp30_llama3_70b_batches=llama3_batches, lp30_llama3_8b=llama3_8b,
                          lp30_llama3_8b_batches=llama3_8b_batches, plan_s=plan_s, cases=cases,
                          split_cases=split_cases, simulator=speed, compiled_stages=stages,
                          collectives=collectives)))


if __name__ == "__main__":
    main()

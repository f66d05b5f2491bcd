"""LLM decode on one chip: a Llama-architecture decoder (random weights) through
lpx_tvm.compile_llm, measured side by side in one run.

For each machine (``tsp``, then ``lp30``):
- ``ttft_cycles``: the prefill program of a ``--prompt-len`` prompt (default 128), beside
  ``ttft_floor_cycles`` (the larger of its install and multiply floors, docs/llm.md);
- ``decode_cycles_per_token`` and ``tokens_per_s_per_user`` at batch 1;
- ``decode_floor_cycles``: the larger of the decode program's MXM weight bytes over the
  chip's install bandwidth and the KV cache's values over its SRAM read bandwidth
  (docs/llm.md, "The report"), ``decode_over_floor`` (target: <= 1.4);
- ``decode_latency_floor_cycles``: the fewest cycles any schedule of the step's dataflow
  takes on the machine (its floorplan's trips to the VXM, its weight buffers; docs/llm.md,
  "The latency floor"), and ``decode_over_latency_floor``;
- the decode program's own floors (multiply, install, SRAM, stream, VXM, SXM) and the
  largest of them;
- a batch sweep (1 to 16) of the decode program: tokens/s per user against tokens/s per
  chip, as a table and a PNG (``--png``), each batch beside its program's multiply and
  install floors and its largest;
- ``sim_over_torch``: the simulator's wall time for one decode step against the same
  step in torch on this CPU (median of 5), the simulator's own speed.

Each machine runs its own precision (``--precision tsp=int8 lp30=fp8`` by default: each
one's 8-bit W8A8 path, docs/llm.md: int8 on tsp, fp8 e4m3 on lp30) on a model sized to
fit one chip at that precision. The last line printed is JSON with
``ttft_cycles``, ``ttft_floor_cycles``, ``decode_cycles_per_token``, ``decode_floor_cycles``,
``decode_latency_floor_cycles``,
``tokens_per_s_per_user`` for the tsp case at batch 1 and the same keys prefixed
``lp30_``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
import transformers

import lpx_tvm
from lpx_tvm.frontends import decoders
from lpx_tvm.frontends.decoder_config import with_layers
from lpx_tvm.llm import DoesNotFit

# Llama-architecture configs sized to one chip (weights + KV cache + working space within
# the 90% weight budget), by the bytes of a weight: at 16 bits about 60M parameters on
# tsp (220 MiB of SRAM) and about 150M on lp30 (500 MB); at 8 bits about 110M on tsp and
# 370M on lp30.
# Head dim 64, untied embeddings.
MODELS = {
    ("tsp", 2): dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
                     num_key_value_heads=4, vocab_size=8192),
    ("tsp", 1): dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                     num_key_value_heads=4, vocab_size=8192),
    ("lp30", 2): dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
                      num_key_value_heads=4, vocab_size=8192),
    ("lp30", 1): dict(hidden_size=2048, intermediate_size=5120, num_hidden_layers=8, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=8192),
}
WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "fp8": 1}


def config(preset: str, precision: str, context: int, small: bool) -> transformers.LlamaConfig:
    kw = dict(MODELS[preset, min(2, WEIGHT_BYTES[precision])])
    if small:  # a quick check of the script itself
        kw = with_layers(dict(kw, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                              vocab_size=1024), 2)
    return transformers.LlamaConfig(**kw, max_position_embeddings=max(context, 128), tie_word_embeddings=False)


def torch_step_s(session, repeats: int = 5) -> float:
    """Median wall time of the decode step in torch (fp32, this CPU)."""
    spec = session.spec
    step = decoders.decoder_step(session.model, spec, 1, session.embed_on_chip)
    args = decoders.example_inputs(spec, 1, embed_in_step=session.embed_on_chip)
    times = []
    with torch.no_grad():
        step(*args)  # warm up: torch's first call allocates and dispatches lazily
        for _ in range(repeats):
            t = time.perf_counter()
            step(*args)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(preset: str, precision: str, args) -> dict:
    cfg = config(preset, precision, args.context, args.small)
    t = time.perf_counter()
    session = lpx_tvm.compile_llm(cfg, preset=preset, precision=precision, max_context=args.context,
                                  prompt_len=args.prompt_len)
    compile_s = time.perf_counter() - t
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, args.prompt_len))
    t = time.perf_counter()
    session.generate(ids, args.new_tokens)
    sim_s = time.perf_counter() - t
    rep = session.report
    sim_step_s = (sim_s - session._last["sim_prefill_wall_s"]) / max(1, args.new_tokens - 1)
    torch_s = torch_step_s(session)
    row = {k: rep[k] for k in ("parameters", "ttft_cycles", "ttft_floor_cycles", "ttft_floor_kind", "ttft_over_floor",
                               "decode_cycles_per_token", "decode_floor_cycles",
                               "decode_floor_kind", "decode_over_floor", "decode_latency_floor_cycles",
                               "decode_over_latency_floor", "tokens_per_s_per_user",
                               "mxm_utilization", "install_utilization")}
    row.update(preset=preset, precision=precision, context=args.context, prompt_len=args.prompt_len,
               compile_s=compile_s, program_floors=rep["floors"]["program"],
               program_binding=rep["floors"]["program_binding"], sram=rep["sram"],
               embedding=rep["on_chip"]["embedding"], sim_step_s=sim_step_s, torch_step_s=torch_s,
               sim_over_torch=sim_step_s / torch_s)
    print(f"{preset}: {rep['parameters'] / 1e6:.1f}M parameters, {precision}; compiled in {compile_s:.0f} s; "
          f"TTFT ({args.prompt_len} tokens) {rep['ttft_cycles']:,} cycles, floor {rep['ttft_floor_cycles']:,.0f} "
          f"({rep['ttft_floor_kind']}) -> {rep['ttft_over_floor']:.1f}x; decode {rep['decode_cycles_per_token']:,} "
          f"cycles/token = {rep['tokens_per_s_per_user']:,.0f} tokens/s per user; floor "
          f"{rep['decode_floor_cycles']:,.0f} ({rep['decode_floor_kind']}) -> {rep['decode_over_floor']:.1f}x; "
          f"latency floor {rep['decode_latency_floor_cycles']:,.0f} -> {rep['decode_over_latency_floor']:.2f}x; "
          f"program's own largest floor {rep['floors']['program_binding']} "
          f"{rep['floors']['program'][rep['floors']['program_binding']]:,.0f}; "
          f"sim/torch per step {sim_step_s / torch_s:.1f}x", flush=True)
    if args.batches and preset == "tsp":
        row["batches"] = sweep(cfg, preset, precision, args)
    return row


def sweep(cfg, preset: str, precision: str, args) -> list:
    """Decode cycles per token for each batch (the decode program only)."""
    rows = []
    for b in args.batches:
        try:
            s = lpx_tvm.compile_llm(cfg, preset=preset, precision=precision, max_context=args.context, batch=b)
        except DoesNotFit as e:
            print(f"  batch {b:2d}: does not fit: {e}", flush=True)
            rows.append(dict(batch=b, does_not_fit=str(e)))
            continue
        rep = s.report
        own, binding = rep["floors"]["program"], rep["floors"]["program_binding"]
        rows.append(dict(batch=b, decode_cycles_per_token=rep["decode_cycles_per_token"],
                         tokens_per_s_per_user=rep["tokens_per_s_per_user"],
                         tokens_per_s_per_chip=rep["tokens_per_s_per_chip"], multiply_floor=own["multiply"],
                         install_floor=own["install"], program_binding=binding, binding_floor=own[binding]))
        print(f"  batch {b:2d}: {rep['decode_cycles_per_token']:,} cycles/token, "
              f"{rep['tokens_per_s_per_user']:,.0f} tokens/s per user, {rep['tokens_per_s_per_chip']:,.0f} per chip; "
              f"floors multiply {own['multiply']:,.0f}, install {own['install']:,.0f}, largest {binding} "
              f"{own[binding]:,.0f} ({rep['decode_cycles_per_token'] / own[binding]:.2f}x)", flush=True)
    return rows


def plot(rows: list, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    rows = [r for r in rows if "tokens_per_s_per_chip" in r]
    x = [r["tokens_per_s_per_chip"] for r in rows]
    y = [r["tokens_per_s_per_user"] for r in rows]
    ax.plot(x, y, "o-")
    for r, xi, yi in zip(rows, x, y):
        ax.annotate(f"B={r['batch']}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("tokens/s per chip")
    ax.set_ylabel("tokens/s per user")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", nargs="+", default=["tsp=int8", "lp30=fp8"],
                   help="PRESET=PRECISION for each machine (fp32, fp16, bf16, int8, fp8)")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--batches", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    p.add_argument("--presets", nargs="+", default=["tsp", "lp30"])
    p.add_argument("--png", default="llm_batches.png")
    p.add_argument("--small", action="store_true", help="2-layer models: a quick check of the script")
    args = p.parse_args()
    precisions = dict(item.split("=", 1) for item in args.precision)
    out = {}
    for preset in args.presets:
        precision = precisions.get(preset, "fp16")
        row = measure(preset, precision, args)
        prefix = "" if preset == "tsp" else f"{preset}_"
        for k in ("ttft_cycles", "ttft_floor_cycles", "decode_cycles_per_token", "decode_floor_cycles",
                  "decode_latency_floor_cycles", "tokens_per_s_per_user"):
            out[prefix + k] = row[k]
        out[f"{preset}_details"] = row
        if row.get("batches") and args.png:
            plot(row["batches"], args.png, f"{row['parameters'] / 1e6:.0f}M Llama, {precision}, {preset}, "
                                           f"context {args.context}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

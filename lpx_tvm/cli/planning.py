"""``lpx-tvm plan``: the mappings of a decoder LLM onto a system, predicted from simulated layers."""

from __future__ import annotations

import argparse

from ..errors import LPXError
from .arguments import (LLM_PRECISIONS, _check_ray, fraction, int_list, natural_int, non_negative, positive_int,
                        whole_number)


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a transformers config.json of a Llama, Qwen2, Mistral or GPT-2 "
                                                   "decoder (random weights: nothing is downloaded)")
    p.add_argument("--system", required=True, help="a system preset (groqnode, tsp-rack, tsp-576, lp30-rack) or a "
                                                   "system JSON file")
    p.add_argument("--precision", default="fp16", choices=LLM_PRECISIONS)
    p.add_argument("--context", type=whole_number(2), default=256, help="positions the KV cache holds (default 256)")
    p.add_argument("--prompt-len", type=positive_int, default=None,
                   help="prompt tokens for TTFT (default: context / 2)")
    p.add_argument("--batches", type=int_list(1), default=[1], help="batch sizes, comma-separated (default 1)")
    p.add_argument("--slo-tokens-per-s-per-user", type=non_negative, default=0.0,
                   help="the best mapping is the one with the most tokens/s per chip at or above this")
    p.add_argument("--max-chips", type=positive_int, default=None, help="the most chips a mapping may use")
    p.add_argument("--tensor-parallel", type=int_list(1), default=None,
                   help="tensor-parallel degrees, comma-separated (default: the kv heads' divisors that fit a group)")
    p.add_argument("--pipeline", type=int_list(1), default=None,
                   help="pipeline depths, comma-separated (default: 1, 2, 4, ... up to the layers, and the layers)")
    p.add_argument("--workers", type=natural_int, default=0,
                   help="compile and simulate the sampled models in this many worker processes (default 0: inline)")
    p.add_argument("--ray", default=None, metavar="ADDRESS", help="run them on the Ray cluster at ADDRESS")
    p.add_argument("--samples", default="system", choices=["system", "chip"],
                   help="system: simulate sampled mappings whole (default); chip: one chip's share of a layer alone, "
                        "the collectives added (a model too large to compile whole, docs/multichip.md)")
    p.add_argument("--split-layers", action="store_true",
                   help="let pipeline stages cut a layer between its attention and its MLP (with --samples chip)")
    p.add_argument("--sram-budget", type=fraction, default=0.9,
                   help="the share of a chip's SRAM weights and caches may fill; the rest is working space (0.9)")
    p.add_argument("--png", default=None, help="write the Pareto figure (tokens/s per user against per chip) here")
    p.add_argument("--report", default=None, help="write the plan as JSON here")


def _plan(args) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from ..files import Output, check_outputs

    check_outputs([Output("--png", args.png, suffix=".png"), Output("--report", args.report)],
                  inputs=[args.config, args.system])
    if args.prompt_len is not None and args.prompt_len >= args.context:
        raise LPXError(f"--prompt-len {args.prompt_len}: a prompt takes 1 to {args.context - 1} tokens in a "
                       f"--context of {args.context}")
    if args.split_layers and args.samples != "chip":
        raise LPXError("--split-layers plans from one chip's samples: give --samples chip")
    _check_ray(args.ray)
    from ..llm.capacity import PLAN_COLUMNS, plan, plan_table, save_pareto
    from ..llm.session import llm_machine, quiet_transformers

    llm_machine(args.precision, system=args.system, name="--precision")
    with quiet_transformers():
        p = plan(args.config, args.system, precision=args.precision, context=args.context,
                 prompt_len=args.prompt_len or args.context // 2, batches=args.batches,
                 tensor_parallel=args.tensor_parallel, pipeline=args.pipeline, max_chips=args.max_chips,
                 workers=args.workers, ray_address=args.ray, samples=args.samples, split_layers=args.split_layers,
                 sram_budget=args.sram_budget)
    table = Table(title=f"{p.model} on {p.system} ({p.precision}, context {p.context}, {p.layers} layers): "
                        "predicted from simulated layers (docs/multichip.md)")
    for c in PLAN_COLUMNS:
        table.add_column(c, justify="right")
    for row in plan_table(p):
        table.add_row(*row)
    console = Console(width=150)
    console.print(table)
    best = p.best(args.slo_tokens_per_s_per_user)
    if best is None:
        console.print(f"no mapping meets {args.slo_tokens_per_s_per_user:,.0f} tokens/s per user")
    else:
        console.print(f"best at >= {args.slo_tokens_per_s_per_user:,.0f} tokens/s per user: tensor parallel "
                      f"{best.tensor_parallel}, {best.pipeline_stages} stage(s), batch {best.batch}: {best.tokens_per_s_per_user:,.0f} tokens/s per "
                      f"user, {best.tokens_per_s_per_chip:,.0f} per chip on {best.chips} chip(s)")
    if args.png:
        save_pareto(p, args.png)
        console.print(f"Pareto figure: {args.png}")
    if args.report:
        with open(args.report, "w") as f:
            json.dump(dict(p.to_json(), best=best.to_json() if best else None), f, indent=1)
        console.print(f"plan: {args.report}")
    return 0

"""Mixture-of-experts building blocks on LPX (docs/moe.md), each beside its floor.

Measured side by side in one run, at batch 1; cycles are exact, and each floor is the
bytes installed over the chip's install bandwidth:

- the product by the expert a router picks on chip (``x @ W[argmax(x @ gate)]``, its
  weights installed through gathers) against the same program with one fixed matrix (a
  plain dense layer, installed by reads);
- a Mixtral-shaped sparse MoE MLP for one token (``RoutedExperts`` from transformers'
  block: the router's top-2 and the two experts' SwiGLU), against the install floor of
  the router and the two experts' matrices.

The last line printed is JSON: ``expert_products`` (per shape, the two programs' cycles,
their ratio and the install floor) and ``moe_block``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import lpx_tvm
from lpx_tvm.machine.config import load_config

WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


class Routed(torch.nn.Module):
    """The router's pick and the chosen expert's product (``fixed``: expert 0's always)."""

    def __init__(self, experts: int, k: int, n: int, fixed: bool):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.gate = torch.nn.Parameter(torch.randn(k, experts, generator=g))
        self.experts = torch.nn.Parameter(torch.randn(experts, k, n, generator=g) / k ** 0.5)
        self.fixed = fixed

    def forward(self, x):
        e = (x @ self.gate).argmax(-1).to(torch.int32)
        w = self.experts[0] if self.fixed else torch.index_select(self.experts, 0, e).reshape(self.experts.shape[1:])
        return x @ w, e


def measure(preset: str, precision: str, experts: int, k: int, n: int) -> dict:
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(1))
    row = dict(preset=preset, precision=precision, experts=experts, k=k, n=n)
    for name, fixed in (("expert", False), ("dense", True)):
        compiled = lpx_tvm.from_torch(Routed(experts, k, n, fixed).eval(), (x,), preset=preset, precision=precision)
        compiled.run([x.numpy()])
        row[f"{name}_cycles"] = compiled.report["cycles"]
    cfg = load_config(preset)
    row["install_floor_cycles"] = k * n * WEIGHT_BYTES[precision] / cfg.install_bytes_per_cycle
    row["expert_over_dense"] = row["expert_cycles"] / row["dense_cycles"]
    print(f"{preset} {precision} E={experts} {k}x{n}: expert {row['expert_cycles']:,} cycles, fixed matrix "
          f"{row['dense_cycles']:,} ({row['expert_over_dense']:.2f}x); the matrix's install floor "
          f"{row['install_floor_cycles']:,.0f}", flush=True)
    return row


def measure_block(preset: str, precision: str, hidden: int, inner: int, experts: int, top_k: int) -> dict:
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    from lpx_tvm.frontends.moe_modules import RoutedExperts

    block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=hidden, intermediate_size=inner,
                                                num_local_experts=experts, num_experts_per_tok=top_k))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    routed = RoutedExperts.from_block(block.eval()).eval()
    h = torch.randn(1, hidden, generator=torch.Generator().manual_seed(1))
    compiled = lpx_tvm.from_torch(routed, (h,), preset=preset, precision=precision)
    compiled.run([h.numpy()])
    cfg = load_config(preset)
    values = hidden * experts + top_k * 3 * hidden * inner  # the router, and the chosen experts
    row = dict(preset=preset, precision=precision, hidden=hidden, inner=inner, experts=experts, top_k=top_k,
               cycles=compiled.report["cycles"],
               install_floor_cycles=values * WEIGHT_BYTES[precision] / cfg.install_bytes_per_cycle,
               on_cpu=sorted(compiled.report["offload"]["cpu"]))
    row["over_floor"] = row["cycles"] / row["install_floor_cycles"]
    print(f"{preset} {precision} MoE MLP, hidden {hidden}, {experts} experts of {inner}, top-{top_k}: "
          f"{row['cycles']:,} cycles; the install floor {row['install_floor_cycles']:,.0f} "
          f"({row['over_floor']:.1f}x)", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="one small shape (a quick check of the script)")
    args = ap.parse_args(argv)
    shapes = [("tsp", "fp16", 8, 320, 320)] if args.small else \
        [("tsp", "fp16", 8, 1024, 1024), ("tsp", "fp16", 8, 2048, 1408), ("lp30", "fp16", 16, 2048, 1024)]
    rows = [measure(*s) for s in shapes]
    block = measure_block("tsp", "fp16", 256, 320, 4, 2) if args.small else \
        measure_block("tsp", "fp16", 1024, 1408, 8, 2)
    print(json.dumps(dict(expert_products=rows, moe_block=block)))


if __name__ == "__main__":
    main()

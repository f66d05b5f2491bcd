"""The report printers the commands share: a model's, a profile's, a program's, a decoder's
and a system's."""

from __future__ import annotations

import sys


def _print_model_report(rep) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    top = Table(title=f"model on {rep.preset} ({rep.precision})", show_header=False)
    top.add_row("cycles", f"{rep.cycles:,}")
    top.add_row("latency", f"{rep.latency_s * 1e3:,.3f} ms")
    top.add_row("MACs on LPX", f"{rep.macs:,}")
    top.add_row("MXM utilization", f"{rep.mxm_utilization:.1%}")
    top.add_row("simulator wall time", f"{rep.sim_wall_s:.2f} s")
    top.add_row("CPU ops wall time", f"{rep.cpu_wall_s:.2f} s")
    console.print(top)
    off = Table(title="offload")
    for col in ("op", "on LPX", "on CPU"):
        off.add_column(col, justify="left" if col == "op" else "right")
    lpx, cpu = rep.offload.lpx, rep.offload.cpu
    for op in sorted(set(lpx) | set(cpu)):
        off.add_row(op, str(lpx.get(op, 0)), str(cpu.get(op, 0)))
    console.print(off)


def _print_profile(profile) -> None:
    from rich.console import Console
    from rich.table import Table

    # Off a terminal rich would wrap at 80 columns; layer names and numbers need more.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    kind, floor = profile.floors.largest()
    top = Table(title=f"profile on {profile.preset} ({profile.precision})", show_header=False)
    top.add_row("cycles", f"{profile.cycles:,}")
    top.add_row("largest floor", f"{kind} {floor:,.0f} cycles")
    top.add_row("cycles / largest floor", f"{profile.cycles / floor:.2f}x" if floor else "-")
    if profile.dependency_cycles:  # the schedules' groups with every port and stream free
        top.add_row("dependency floor (every port free)",
                    f"{profile.dependency_cycles:,} cycles: {profile.cycles / profile.dependency_cycles:.2f}x")
    kernels = sum(1 for c in profile.calls if c.cpu)
    top.add_row("CPU kernels (measured wall time)",
                f"{kernels} call(s), {profile.cpu_wall_s * 1e3:,.3f} ms" if kernels else "none")
    console.print(top)
    table = Table(title="per layer: each cycle owned by one layer (docs/profile.md)")
    # "floor": the layer's largest floor; "of floor": that floor over the layer's cycles
    for col in ("layer", "cycles", "share", "waited", "MACs", "floor", "floor cycles", "of floor", "bottleneck"):
        table.add_column(col, justify="left" if col in ("layer", "floor", "bottleneck") else "right")
    for x in profile.layers:
        share = x.cycles / profile.cycles if profile.cycles else 0.0
        frac = "-" if x.floor_fraction is None else f"{x.floor_fraction:.1%}"
        table.add_row(x.name, f"{x.cycles:,}", f"{share:.1%}", f"{x.waited:,}", f"{x.macs:,}", x.floor_kind,
                      f"{x.floor_cycles:,.1f}", frac, x.bottleneck)
    console.print(table)
    if profile.kinds:
        kinds = Table(title="by kind: the layers above summed (floors summed per resource)")
        for col in ("kind", "cycles", "share", "waited", "MACs", "floor", "floor cycles", "cycles / floor"):
            kinds.add_column(col, justify="left" if col in ("kind", "floor") else "right")
        for x in profile.kinds:
            share = x.cycles / profile.cycles if profile.cycles else 0.0
            over = f"{x.cycles / x.floor_cycles:,.1f}x" if x.floor_cycles else "-"
            kinds.add_row(x.name, f"{x.cycles:,}", f"{share:.1%}", f"{x.waited:,}", f"{x.macs:,}", x.floor_kind,
                          f"{x.floor_cycles:,.1f}", over)
        console.print(kinds)


def _print_tuned(model, onnx_model, log: str, cfg, precision: str) -> None:
    """The demo's tuned line: the shipped log, how many MXM layers took a tuned schedule,
    and the default schedules' cycles (the model's LPX regions compiled again with the
    defaults and simulated timing only: a few seconds)."""
    import os

    from ..relax_passes import import_onnx
    from ..tune.refine import ModelContext

    report = model.report
    tuning = report.tuning or {}
    tuned, default = len(tuning.get("tuned_layers", [])), len(tuning.get("default_layers", []))
    cycles = report.cycles
    base = ModelContext(import_onnx(onnx_model).mod, cfg, precision).cycles({})
    print(f"  tuned: shipped log lpx_tvm/tuning_logs/{os.path.basename(log)}, {tuned} of {tuned + default} "
          f"distinct MXM layers (tuning tasks) on a tuned schedule; {cycles:,} cycles vs {base:,} with the "
          f"default schedules ({base / cycles:.3f}x; --no-tuning-log runs the defaults)")


def _print_program_report(rep) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    top = Table(title=f"LPX run on {rep.preset}", show_header=False)
    top.add_row("cycles", f"{rep.cycles:,}")
    top.add_row("latency", f"{rep.latency_s * 1e6:,.1f} us")
    top.add_row("MACs", f"{rep.macs:,}")
    dtypes = "/".join(rep.mxm_dtypes) or "no MXM"
    top.add_row(f"MXM utilization ({dtypes})", f"{rep.mxm_utilization:.1%}")
    top.add_row("SRAM bytes (read + written)", f"{rep.sram_bytes:,}")
    if rep.offchip_bytes:
        top.add_row("off-chip bytes", f"{rep.offchip_bytes:,}")
    console.print(top)
    layers = Table(title="per layer (each cycle counted once: docs/report.md)")
    for col in ("layer", "instructions", "cycles", "share", "MACs"):
        layers.add_column(col, justify="left" if col == "layer" else "right")
    for row in rep.layers:
        share = row.cycles / rep.cycles if rep.cycles else 0.0
        layers.add_row(row.name, f"{row.instructions:,}", f"{row.cycles:,}", f"{share:.1%}", f"{row.macs:,}")
    console.print(layers)


def _print_llm_report(rep: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="LLM decode on one chip (docs/llm.md)", show_header=False)
    table.add_row("time to first token", f"{rep['ttft_cycles']:,} cycles ({rep['ttft_s'] * 1e6:,.1f} us)")
    table.add_row("decode, per token", f"{rep['decode_cycles_per_token']:,} cycles "
                                       f"({rep['decode_s_per_token'] * 1e6:,.2f} us)")
    table.add_row("decode floor", f"{rep['decode_floor_cycles']:,.0f} cycles ({rep['decode_floor_kind']}): "
                                  f"{rep['decode_over_floor']:.2f}x")
    table.add_row("tokens/s per user", f"{rep['tokens_per_s_per_user']:,.0f}")
    table.add_row("tokens/s per chip", f"{rep['tokens_per_s_per_chip']:,.0f}")
    sram = rep["sram"]
    table.add_row("SRAM: weights / KV cache / working",
                  f"{sram['weights_bytes'] / 2**20:,.2f} / {sram['kv_cache_bytes'] / 2**20:,.2f} / "
                  f"{sram['working_bytes'] / 2**20:,.2f} MiB of {sram['capacity_bytes'] / 2**20:,.0f}")
    table.add_row("MXM / install utilization", f"{rep['mxm_utilization']:.1%} / {rep['install_utilization']:.1%}")
    Console().print(table)


def _print_system_report(rep: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="LLM decode over chips of a system (docs/multichip.md)", show_header=False)
    table.add_row("mapping", f"{rep['pipeline_stages']} pipeline stage(s) of {rep['tensor_parallel']} chip(s); "
                             f"layers per stage {rep['stage_layers']}")
    table.add_row("time to first token", f"{rep['ttft_cycles']:,} cycles")
    table.add_row("decode, per token", f"{rep['decode_cycles_per_token']:,} cycles")
    table.add_row("tokens/s per user", f"{rep['tokens_per_s_per_user']:,.0f}")
    table.add_row("tokens/s per chip", f"{rep['tokens_per_s_per_chip']:,.0f}")
    table.add_row("link bytes per token", f"{rep['link_bytes_per_token']:,}")
    Console().print(table)

"""``lpx-tvm tune``: a model's MXM schedules searched on the simulator into a tuning log."""

from __future__ import annotations

import argparse

from ..precision import Precision
from .arguments import _bundled_model, _check_ray


def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx model or a model bundled with onnx (light_resnet50, ...)")
    p.add_argument("--preset", default="tsp", help="tsp, mini, lp30 or a JSON machine file")
    p.add_argument("--precision", default="fp16", choices=Precision.names())
    p.add_argument("--trials", type=int, default=64, help="measured candidates per task (default 64)")
    p.add_argument("--log", required=True, help="tuning log folder to write (a rerun resumes it)")
    p.add_argument("--workers", type=int, default=0,
                   help="worker processes building and simulating candidates (0: this process)")
    p.add_argument("--ray", metavar="ADDRESS", help="send candidates to this Ray cluster instead")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategy", default="evolutionary", choices=["evolutionary", "random"],
                   help="evolutionary search guided by the XGBoost cost model, or random search")
    p.add_argument("--no-context", dest="context", action="store_false",
                   help="keep each task's best schedule measured alone; by default the search is followed "
                        "by a refinement that chooses each task's schedule by the whole model's cycles")
    p.add_argument("--context-top-k", type=int, default=4, metavar="K",
                   help="best distinct isolated schedules per task tried in the whole model (default 4)")
    p.add_argument("--context-sweeps", type=int, default=2, metavar="N",
                   help="passes over the tasks in the refinement (default 2; stops when one changes nothing)")
    p.add_argument("--no-placement", dest="placement", action="store_false",
                   help="skip the refinement's last pass, which tries each task's first plane and installs "
                        "ahead in the whole model (planes + 2 whole-model runs per task)")


def _tune(args) -> int:
    import time

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.table import Table

    from ..machine.config import load_config
    from ..relax_passes import import_onnx
    from ..tune.tuner import extract_tasks, tune

    _check_ray(args.ray)
    cfg = load_config(args.preset)
    path = _bundled_model(args.model)
    mod = import_onnx(path).mod
    tasks = extract_tasks(mod, cfg, args.precision)
    console = Console()
    console.print(f"{args.model} on {cfg.name} ({args.precision}): {len(tasks)} tuning task(s), "
                  f"{args.trials} trials each, log {args.log}")
    start = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[unit]}"),
                  TimeRemainingColumn(), console=console, transient=False) as progress:
        bar = progress.add_task("tuning", total=None, unit="trials")

        def report(state, name):
            best, default = state["best"].get(name), state["default"].get(name)
            gain = f" ({default / best:.2f}x default)" if best and default else ""
            served = f"; {state['served']} measured before, from the log" if state["served"] else ""
            progress.update(bar, total=state["total"], completed=state["done"],
                            description=(f"{name}: best {best:,} cycles{gain}" if best else name) + served)

        results = tune(tasks, cfg, args.log, args.trials, workers=args.workers, ray_address=args.ray,
                       seed=args.seed, strategy=args.strategy, model=args.model, report=report)
        refined = None
        if args.context and tasks:
            from ..tune.refine import refine_in_context

            ctx_bar = progress.add_task("in context", total=None, unit="whole-model runs")

            def ctx_report(st):
                where = f"{st['phase']}, {st['task']}" if st["task"] else st["phase"]
                progress.update(ctx_bar, total=st["total"], completed=st["done"],
                                description=f"in context ({where}): best {st['best']:,} cycles "
                                            f"({st['default'] / st['best']:.3f}x default)")

            refined = refine_in_context(mod, tasks, cfg, args.log, top_k=args.context_top_k,
                                        sweeps=args.context_sweeps, model=args.model, report=ctx_report,
                                        place=args.placement)
    table = Table(title=f"tuning {args.model} on {cfg.name}: {time.perf_counter() - start:.0f} s "
                        "(each task measured alone)")
    # "rejected": fast records whose outputs differed from the default schedule's (shown when any did).
    rejected = any(r.rejected for r in results)
    for col in ("task", "count", "trials") + (("rejected",) if rejected else ()) + ("default cycles", "tuned cycles", "speedup"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for r in results:
        if r.default_cycles is None:
            table.add_row(r.task.name, str(r.task.weight), *["-"] * (3 + rejected), f"not tuned: {r.error}")
            continue
        tuned = r.tuned_cycles if r.tuned_cycles is not None else r.default_cycles
        table.add_row(r.task.name, str(r.task.weight), str(r.trials), *([str(r.rejected)] if rejected else []),
                      f"{r.default_cycles:,}", f"{tuned:,}",
                      f"{r.default_cycles / tuned:.2f}x")
    console.print(table)
    if refined is not None:
        chosen = Table(title="chosen in the whole model")
        for col in ("task", "schedule"):
            chosen.add_column(col)
        for r in results:
            chosen.add_row(r.task.name, refined.choices.get(r.task.name, "default"))
        console.print(chosen)
        iso = refined.isolated_cycles
        iso = f"{iso:,} ({refined.default_cycles / iso:.3f}x)" if iso else "rejected by the compiler"
        console.print(f"whole model: default {refined.default_cycles:,} cycles, isolated best schedules {iso}, "
                      f"chosen in context {refined.cycles:,} ({refined.default_cycles / refined.cycles:.3f}x); "
                      f"{refined.evaluations} whole-model runs in {refined.wall_s:.0f} s")
    return 0

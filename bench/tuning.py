"""Auto-tuning benchmark.

Convergence: three small tasks on mini whose whole design space is enumerated on the
simulator (a matmul, a 3x3 convolution, a depthwise convolution), so the true optimum
is known. For each seed, XGBoost-guided evolutionary search and random search get the
same trial budget; the figures are the trials and the wall time each needs to get
within 5% of the optimum (median over tasks and seeds; a run that never gets there
counts as the budget and its whole wall time), and the same to reach the optimum itself.
A convergence plot (best cycles over
the optimum against trials) is written as a PNG.

Gain (``--gain``): ResNet-50 (light_resnet50, bf16), the int8 ResNet-50 of
bench/e2e.py and BERT-base (fp16, seq 128) on tsp (``--gain-models`` picks some) tuned with ``--gain-trials`` per task, then refined
in context (``--context-top-k`` isolated records per task and the default, tried in the
whole model): default, isolated-tuned (each task's best record measured alone) and
refined cycles of the whole model, and MXM utilization. ``--gain-only`` skips the
convergence part.

The last line printed is JSON: guided_trials_to_5pct, random_trials_to_5pct,
guided_wall_to_5pct_s, random_wall_to_5pct_s, the same *_to_optimum, resnet50_tuned_speedup,
resnet50_isolated_speedup, resnet50_int8_mxm_utilization, bert_base_tuned_speedup (null
when not measured), and with --gain each model's *_mxm_utilization.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import shutil

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.machine.config import load_config
from lpx_tvm.tir_schedules import DenseTiling, DenseWorkload
from lpx_tvm.tir_schedules.schedules import Conv2dTiling
from lpx_tvm.tune.measure import task_cycles
from lpx_tvm.tune.space import _rows_loop_and_limit, fits, structures
from lpx_tvm.tune.refine import refine_in_context
from lpx_tvm.tune.database import APPLIED
from lpx_tvm.tune.tuner import extract_tasks, tune

RNG = np.random.default_rng(0)


def _model(nodes, x_shape, y_shape, inits):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _w(name, shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def convergence_models() -> dict:
    """matmul 32x512x16, 3x3 conv 4->32 channels on 48x8 (few input channels: its taps
    may be packed), depthwise 3x3 stride 2 on 64x8x16: spaces where about a third of the
    points (a tenth for the convolution) are within 5% of the optimum."""
    mm = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [32, 512], [32, 16], [_w("w", (512, 16))])
    conv = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [1, 4, 48, 8], [1, 32, 48, 8],
                  [_w("w", (32, 4, 3, 3))])
    dw = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=16, strides=[2, 2])],
                [1, 16, 64, 8], [1, 16, 32, 4], [_w("w", (16, 1, 3, 3))])
    return {"matmul": mm, "conv3x3": conv, "depthwise": dw}


def enumerate_space(task, cfg) -> dict:
    """Cycles of every point of the task's design space that the postprocessor accepts."""
    from tvm import s_tir

    from lpx_tvm.tune.space import workload_module

    w = task.workload
    _, extent, limit = _rows_loop_and_limit(s_tir.Schedule(workload_module(task, cfg)), w, cfg)
    out = {}
    for order, pack in structures(w, cfg.lanes):
        for rows in [d for d in range(1, min(extent, limit) + 1) if extent % d == 0]:
            for k_split in range(1, cfg.mxm_planes + 1):
                t = (DenseTiling(rows, cfg.lanes, cfg.lanes, order, k_split) if isinstance(w, DenseWorkload)
                     else Conv2dTiling(rows, cfg.lanes, cfg.lanes, order, k_split, pack))
                if fits(w, t, cfg) is None:
                    out[(order, pack, rows, k_split)] = task_cycles(task, cfg, t)
    return out


def search_curve(task, cfg, strategy: str, trials: int, seed: int, per_iter: int) -> list:
    """[(trials measured, wall s since the search started, best cycles so far)]."""
    curve = []

    def report(state, name):
        curve.append((state["done"], time.perf_counter() - state["start"], state["best"].get(name)))

    with tempfile.TemporaryDirectory(prefix="lpx_bench_tune_") as log:
        tune([task], cfg, log, trials, seed=seed, strategy=strategy, trials_per_iter=per_iter, report=report)
    return curve


def to_target(curve, target: float, budget: int, wall_end: float):
    for n, wall, best in curve:
        if best is not None and best <= target:
            return n, wall
    return budget, wall_end


def convergence(seeds: int, trials: int, per_iter: int, plot: "str | None") -> dict:
    cfg = load_config("mini")
    rows = {"guided": [], "random": []}
    curves = {}
    for name, model in convergence_models().items():
        (task,) = extract_tasks(import_onnx(model).mod, cfg, "fp16")
        t0 = time.perf_counter()
        space = enumerate_space(task, cfg)
        opt = min(space.values())
        default = task_cycles(task, cfg)
        print(f"{name}: {task.name}, {len(space)} points enumerated in {time.perf_counter() - t0:.1f} s; "
              f"optimum {opt:,} cycles {min(space, key=space.get)}, default {default:,} "
              f"({default / opt:.3f}x), worst {max(space.values()) / opt:.2f}x, median "
              f"{statistics.median(space.values()) / opt:.3f}x", flush=True)
        for strategy, label in (("evolutionary", "guided"), ("random", "random")):
            for seed in range(seeds):
                curve = search_curve(task, cfg, strategy, trials, seed, per_iter)
                end = curve[-1][1] if curve else 0.0
                n, wall = to_target(curve, 1.05 * opt, trials, end)
                n1, wall1 = to_target(curve, opt, trials, end)
                rows[label].append((n, wall, n1, wall1))
                curves.setdefault((name, label), []).append([(c[0], c[2] / opt) for c in curve if c[2]])
                print(f"  {label:6s} seed {seed}: within 5% after {n} trials, {wall:.1f} s; optimum after "
                      f"{n1} trials, {wall1:.1f} s; "
                      f"final {curve[-1][2] / opt:.3f}x optimum", flush=True)
    out = {}
    for label, rs in rows.items():
        out[f"{label}_trials_to_5pct"] = statistics.median(r[0] for r in rs)
        out[f"{label}_wall_to_5pct_s"] = round(statistics.median(r[1] for r in rs), 2)
        out[f"{label}_trials_to_optimum"] = statistics.median(r[2] for r in rs)
        out[f"{label}_wall_to_optimum_s"] = round(statistics.median(r[3] for r in rs), 2)
    if plot:
        _plot(curves, plot)
    return out


def _plot(curves: dict, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({k[0] for k in curves})
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        for label, color in (("guided", "tab:blue"), ("random", "tab:orange")):
            for i, c in enumerate(curves.get((name, label), [])):
                if c:
                    ax.step([p[0] for p in c], [p[1] for p in c], where="post", color=color, alpha=0.6,
                            label=label if i == 0 else None)
        ax.axhline(1.05, color="gray", ls="--", lw=0.8)
        ax.set_title(name)
        ax.set_xlabel("trials")
        ax.set_ylabel("best / optimum cycles")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"convergence plot: {path}")


GAIN_MODELS = ("resnet50", "resnet50_int8", "bert_base")


def gain(trials: int, workers: int, models=GAIN_MODELS, top_k: int = 4, sweeps: int = 2) -> dict:
    import lpx_tvm

    sys.path.insert(0, os.path.dirname(__file__))
    from e2e import bert_base, bundled, model_input, quantized_resnet50

    cfg = load_config("tsp")
    out = {}
    make = {"resnet50": lambda: (bundled("light_resnet50"), "bf16"),
            "resnet50_int8": lambda: (quantized_resnet50(tempfile.mkdtemp(prefix="lpx_bench_")), "int8"),
            "bert_base": lambda: (bert_base(tempfile.mkdtemp(prefix="lpx_bench_")), "fp16")}
    cases = [(key, *make[key]()) for key in models]
    for key, path, precision in cases:
        log = tempfile.mkdtemp(prefix=f"lpx_tune_{key}_")
        mod = import_onnx(path).mod
        tasks = extract_tasks(mod, cfg, precision)
        t0 = time.perf_counter()
        tune(tasks, cfg, log, trials, workers=workers, model=key)
        tune_s = time.perf_counter() - t0

        def progress(st):
            if st["done"] % 10 == 0:
                print(f"  in context: {st['done']}/{st['total']} whole-model runs, best {st['best']:,} cycles "
                      f"({st['default'] / st['best']:.3f}x default), {time.perf_counter() - st['start']:.0f} s",
                      flush=True)

        ref = refine_in_context(mod, tasks, cfg, log, top_k=top_k, sweeps=sweeps, model=key, report=progress)
        print(f"{key}: refined in context in {ref.wall_s:.0f} s ({ref.evaluations} whole-model runs, "
              f"{ref.wall_s / max(ref.evaluations, 1):.1f} s each, {ref.sweeps} sweep(s)); choices {ref.choices}",
              flush=True)
        isolated = log + "_isolated"  # the same log without the in-context choice: best records
        shutil.copytree(log, isolated)
        os.remove(os.path.join(isolated, APPLIED))
        cycles, util = {}, {}
        for which, tl in (("default", None), ("isolated", isolated), ("tuned", log)):
            m = lpx_tvm.compile_model(path, preset="tsp", precision=precision, tuning_log=tl)
            name, shape, dtype = m.inputs[0]
            m.run({name: model_input(name, shape, dtype)})
            cycles[which], util[which] = m.report["cycles"], m.report["mxm_utilization"]
        print(f"{key}: {len(tasks)} tasks x {trials} trials in {tune_s:.0f} s; cycles default {cycles['default']:,}, "
              f"isolated {cycles['isolated']:,} ({cycles['default'] / cycles['isolated']:.3f}x), refined "
              f"{cycles['tuned']:,} ({cycles['default'] / cycles['tuned']:.3f}x; in context {ref.cycles:,}); "
              f"MXM utilization {util['default']:.1%} / {util['isolated']:.1%} / {util['tuned']:.1%}; log {log}",
              flush=True)
        out[f"{key}_isolated_speedup"] = round(cycles["default"] / cycles["isolated"], 3)
        out[f"{key}_tuned_speedup"] = round(cycles["default"] / cycles["tuned"], 3)
        out[f"{key}_mxm_utilization"] = round(util["tuned"], 4)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=16, help="trial budget per search (convergence)")
    ap.add_argument("--per-iter", type=int, default=1, help="candidates measured per search round")
    ap.add_argument("--plot", default="tuning_convergence.png")
    ap.add_argument("--gain", action="store_true", help="also tune ResNet-50 on tsp (long)")
    ap.add_argument("--gain-models", default=",".join(GAIN_MODELS),
                    help=f"with --gain: comma-separated, of {', '.join(GAIN_MODELS)}")
    ap.add_argument("--gain-trials", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--context-top-k", type=int, default=4, help="isolated records per task tried in context")
    ap.add_argument("--context-sweeps", type=int, default=2)
    ap.add_argument("--gain-only", action="store_true", help="--gain without the convergence part")
    args = ap.parse_args(argv)
    if args.plot and not args.gain_only:
        try:  # checked now, not after the whole convergence study
            import matplotlib  # noqa: F401
        except ModuleNotFoundError:
            ap.error("the convergence plot needs matplotlib: pip install -e '.[profile]' (or --plot '' for none)")
    out = {} if args.gain_only else convergence(args.seeds, args.trials, args.per_iter, args.plot)
    out.update({"resnet50_tuned_speedup": None, "resnet50_isolated_speedup": None,
                "resnet50_int8_mxm_utilization": None, "bert_base_tuned_speedup": None})
    if args.gain or args.gain_only:
        models = [m for m in args.gain_models.split(",") if m]
        unknown = set(models) - set(GAIN_MODELS)
        if unknown:
            ap.error(f"--gain-models: unknown {', '.join(sorted(unknown))} (known: {', '.join(GAIN_MODELS)})")
        out.update(gain(args.gain_trials, args.workers, models, args.context_top_k, args.context_sweeps))
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""End to end: ResNet-50 (the light_resnet50 model bundled with onnx) compiled for tsp.

Measured side by side in one run:
- compile_s: lpx_tvm.compile_model (import, passes, partition, TensorIR, codegen, CPU build);
- tvm_llvm_build_s: plain tvm.compile(..., target="llvm") of the same imported model;
- sim_wall_s: one inference on the functional simulator; ort_wall_s: onnxruntime (median of 5);
- cycles, images_per_s (simulated, batch 1, at the preset's clock), mxm_utilization.

The last line printed is JSON. Targets (default schedules): sim_over_ort <= 5,
compile_s <= 3 x tvm_llvm_build_s, mxm_utilization >= 0.15.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
import tvm

import lpx_tvm
from lpx_tvm.relax_passes import import_onnx


def bundled(name: str) -> str:
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"{name}.onnx")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="light_resnet50")
    ap.add_argument("--preset", default="tsp")
    ap.add_argument("--precision", default="bf16",
                    help="bf16: the light model's constant weights overflow fp16's range")
    args = ap.parse_args(argv)
    path = bundled(args.model) if not os.path.exists(args.model) else args.model

    t = time.perf_counter()
    model = lpx_tvm.compile_model(path, preset=args.preset, precision=args.precision)
    compile_s = time.perf_counter() - t

    t = time.perf_counter()
    tvm.compile(import_onnx(path).mod, target="llvm")
    llvm_build_s = time.perf_counter() - t

    name, shape, dtype = model.inputs[0]
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    t = time.perf_counter()
    got = model.run({name: x})
    sim_s = time.perf_counter() - t

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = sess.run(None, {name: x})
    ort_times = []
    for _ in range(5):
        t = time.perf_counter()
        sess.run(None, {name: x})
        ort_times.append(time.perf_counter() - t)
    ort_s = statistics.median(ort_times)
    err = float(np.linalg.norm(list(got.values())[0] - want[0]) / np.linalg.norm(want[0]))

    rep = model.report
    out = {
        "model": args.model, "preset": args.preset, "precision": args.precision,
        "compile_s": round(compile_s, 2), "tvm_llvm_build_s": round(llvm_build_s, 2),
        "compile_over_llvm_build": round(compile_s / llvm_build_s, 2),
        "sim_wall_s": round(sim_s, 3), "ort_wall_s": round(ort_s, 4), "sim_over_ort": round(sim_s / ort_s, 1),
        "cycles": rep["cycles"], "latency_s": rep["latency_s"], "images_per_s": round(1.0 / rep["latency_s"], 1),
        "mxm_utilization": round(rep["mxm_utilization"], 4), "rel_l2_vs_ort": err,
        "lpx_regions": len(model.executable.regions), "offload_cpu": rep["offload"].get("cpu", {}),
    }
    print(f"{args.model} on {args.preset} ({args.precision}): {rep['cycles']:,} cycles, "
          f"{out['images_per_s']:,} images/s simulated, MXM utilization {rep['mxm_utilization']:.1%}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Real architectures on LPX: regions, ops left on the CPU, compile time, accuracy.

For each model of ``tests/e2e/architecture_models.py`` (``transformers`` MobileNetV2,
ConvNeXt, ViT, Llama, Qwen2 from small configs; an FPN detector and a DBNet-style text
detector exported to ONNX with dynamic axes), measured side by side in one run:

- ``regions``: LPX regions after partitioning; ``cpu_ops``: the Relax ops left on the
  CPU, by op name (only embedding lookups and their index arithmetic should remain);
- ``compile_s``: ``lpx_tvm.compile_model`` (import excluded: the same imported module
  goes to both builds), against ``tvm_llvm_build_s``: a plain ``tvm.compile(mod,
  target="llvm")`` of it; target ``compile_over_llvm_build`` <= 3;
- ``rel_l2``: the simulated output against torch (or onnxruntime for the ONNX models).

``--full`` builds MobileNetV2 at its default size (224 x 224, width 1.0) instead of the
small configs' 64 x 64, 0.35. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch
import tvm

import lpx_tvm
from lpx_tvm.frontends.torch import import_torch
from lpx_tvm.relax_passes import import_onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
import architecture_models as models  # noqa: E402


def imported(name: str, full: bool, folder: str):
    """(imported model, {input: array}, reference output) of one architecture."""
    torch.manual_seed(0)
    if name in models.ONNX:
        module, example = models.ONNX[name]()
        path = models.export_onnx(module, example, os.path.join(folder, f"{name}.onnx"))
        x = example[0].numpy()
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]
        return import_onnx(path, {"images": x.shape}), {"images": x}, want
    kwargs = {"image": 224, "depth_multiplier": 1.0} if full and name == "mobilenet_v2" else {}
    module, example = models.TORCH[name](**kwargs)
    with torch.no_grad():
        want = module(*example).numpy()
    imp = import_torch(module, example)
    return imp, {imp.inputs[0][0]: example[0].numpy()}, want


def measure(name: str, preset: str, precision: str, full: bool, run: bool, folder: str) -> dict:
    imp, inputs, want = imported(name, full, folder)
    t = time.perf_counter()
    model = lpx_tvm.compile_model(imp, preset=preset, precision=precision)
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    tvm.compile(imp.mod, target="llvm")
    llvm_s = time.perf_counter() - t
    offload = model.report["offload"]
    row = {"model": name, "regions": offload["regions"],
           "cpu_ops": dict(collections.Counter(op["op"] for op in offload["cpu_ops"])),
           "compile_s": round(compile_s, 2), "tvm_llvm_build_s": round(llvm_s, 2),
           "compile_over_llvm_build": round(compile_s / llvm_s, 2)}
    if run:
        got = list(model.run(inputs).values())[0].astype(np.float64)
        row["rel_l2"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        row["cycles"] = model.report["cycles"]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join([*models.TORCH, *models.ONNX]))
    ap.add_argument("--preset", default="tsp")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--full", action="store_true", help="MobileNetV2 at 224 x 224, width 1.0")
    ap.add_argument("--no-run", action="store_true", help="compile only (no simulated run, no accuracy)")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lpx_arch_") as folder:
        for name in args.models.split(","):
            row = measure(name, args.preset, args.precision, args.full, not args.no_run, folder)
            print(f"{name:14} regions {row['regions']:3}  compile {row['compile_s']:7.1f} s  "
                  f"llvm {row['tvm_llvm_build_s']:6.1f} s  x{row['compile_over_llvm_build']:<5}  "
                  f"rel_l2 {row.get('rel_l2', float('nan')):.1e}  cpu {row['cpu_ops']}", flush=True)
            rows.append(row)
    print(json.dumps({"preset": args.preset, "precision": args.precision, "full": args.full, "models": rows}))


if __name__ == "__main__":
    main()

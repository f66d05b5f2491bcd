"""End to end: ResNet-50 (the light_resnet50 model bundled with onnx) or BERT-base compiled for tsp.

Measured side by side in one run:
- compile_s: lpx_tvm.compile_model (import, passes, partition, TensorIR, codegen, CPU build);
- tvm_llvm_build_s: plain tvm.compile(..., target="llvm") of the same imported model;
- sim_wall_s: one inference on the functional simulator; ort_wall_s: onnxruntime (median of 5);
- cycles, images_per_s (simulated, batch 1, at the preset's clock) or, for BERT-base
  (``--model bert_base``: seq 128, fp16), tokens_per_s, and mxm_utilization.

The last line printed is JSON. Targets (default schedules): sim_over_ort <= 5,
compile_s <= 3 x tvm_llvm_build_s, mxm_utilization >= 0.15.

``--int8``: ResNet-50 built in torch (tests/e2e/torch_models.py, random weights),
exported to ONNX and quantized offline with onnxruntime's quantize_static (QDQ, u8s8,
per-channel weights, 2 calibration images), compiled at precision int8; the reference
is onnxruntime with graph optimizations off, the error is given in output
quantization steps, and mxm_utilization is against the int8 peak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
import tvm

import lpx_tvm
from lpx_tvm.relax_passes import import_onnx


# The test suite's model builders (torch_models.py, transformer_models.py).
TEST_MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e")


def bundled(name: str) -> str:
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"{name}.onnx")


def bert_base(folder: str, seq: int = 128) -> str:
    """BERT-base (12 layers, hidden 768, 12 heads) from its transformers config with random
    weights, exported to ONNX (dynamo) in ``folder``: the path. Needs torch and transformers."""
    import torch

    sys.path.insert(0, TEST_MODELS)
    from transformer_models import LastHiddenState, bert

    vocab = 30522
    torch.manual_seed(0)
    stack = LastHiddenState(bert(768, 12, 12, vocab=vocab, positions=512).eval())

    path = os.path.join(folder, "bert_base.onnx")
    ids = torch.randint(0, vocab, (1, seq))
    torch.onnx.export(stack.eval(), (ids,), path, dynamo=True, input_names=["input_ids"],
                      output_names=["last_hidden_state"], verbose=False)
    return path


def model_input(name, shape, dtype):
    """A deterministic input: token ids for an int64 input, else standard normal values."""
    rng = np.random.default_rng(0)
    if np.dtype(dtype).kind == "i":
        return rng.integers(0, 1000, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def quantized_resnet50(folder: str, hw: int = 224) -> str:
    """ResNet-50 (random weights, randomized BatchNorm statistics) as a QDQ u8s8 ONNX model."""
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    sys.path.insert(0, TEST_MODELS)
    from torch_models import randomized, resnet50

    torch.manual_seed(0)
    src, dst = os.path.join(folder, "resnet50.onnx"), os.path.join(folder, "resnet50_qdq_u8s8.onnx")
    torch.onnx.export(randomized(resnet50()), (torch.randn(1, 3, hw, hw),), src, dynamo=True, verbose=False)
    name = onnx.load(src).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.data = iter([{name: rng.standard_normal((1, 3, hw, hw)).astype(np.float32)} for _ in range(2)])

        def get_next(self):
            return next(self.data, None)

    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    return dst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="light_resnet50",
                    help="a bundled light model, an .onnx path, or bert_base (seq 128; needs torch, transformers)")
    ap.add_argument("--preset", default="tsp")
    ap.add_argument("--precision", default=None,
                    help="default bf16 for the light models (their constant weights overflow fp16's range), "
                         "fp16 for bert_base")
    ap.add_argument("--int8", action="store_true", help="ResNet-50 quantized QDQ u8s8, at precision int8")
    args = ap.parse_args(argv)
    tokens = args.model == "bert_base"
    args.precision = args.precision or ("fp16" if tokens else "bf16")
    if args.int8:
        args.model, args.precision = "resnet50_qdq_u8s8", "int8"
        path = quantized_resnet50(tempfile.mkdtemp(prefix="lpx_int8_"))
    elif tokens:
        path = bert_base(tempfile.mkdtemp(prefix="lpx_bench_"))
    else:
        path = bundled(args.model) if not os.path.exists(args.model) else args.model

    t = time.perf_counter()
    model = lpx_tvm.compile_model(path, preset=args.preset, precision=args.precision)
    compile_s = time.perf_counter() - t

    t = time.perf_counter()
    tvm.compile(import_onnx(path).mod, target="llvm")
    llvm_build_s = time.perf_counter() - t

    name, shape, dtype = model.inputs[0]
    x = model_input(name, shape, dtype)
    t = time.perf_counter()
    got = model.run({name: x})
    sim_s = time.perf_counter() - t

    so = ort.SessionOptions()
    if args.int8:  # the QDQ graph as written (no QDQ fusion): ONNX's definition of its result
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
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
        "cycles": rep["cycles"], "latency_s": rep["latency_s"],
        "mxm_utilization": round(rep["mxm_utilization"], 4), "rel_l2_vs_ort": err,
        "lpx_regions": len(model.executable.regions), "offload_cpu": rep["offload"].get("cpu", {}),
    }
    rate, unit = (shape[-1] / rep["latency_s"], "tokens_per_s") if tokens else (1.0 / rep["latency_s"], "images_per_s")
    out[unit] = round(rate, 1)
    if args.int8:
        m = onnx.load(path)
        inits = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
        last = next(n for n in m.graph.node if m.graph.output[0].name in n.output)
        step = float(inits[last.input[1]].reshape(-1)[0])
        out["max_err_output_steps"] = round(float(np.abs(list(got.values())[0] - want[0]).max()) / step, 3)
    print(f"{args.model} on {args.preset} ({args.precision}): {rep['cycles']:,} cycles, "
          f"{out[unit]:,} {unit.replace('_per_s', '/s')} simulated, MXM utilization {rep['mxm_utilization']:.1%}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

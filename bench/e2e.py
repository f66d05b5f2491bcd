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

Floors: for every model the run prints its lower bounds on this machine, from the LPX
region programs it ran (``lpx_tvm.runtime.floors.floors_of`` of each region's
instructions, once per call; regions run one after another, so their floors add): the
MXM multiply, weight install, SRAM read and write bandwidth, stream, VXM, SXM and DMA
floors, the largest of them (``floor_cycles``, ``floor_kind``) and the achieved cycles
as a multiple of it (``over_floor``). ``compute_floor_cycles`` is the model's useful MACs
over the precision's MXM peak per cycle: the multiply floor above it is padding.

``--gemv``: an int8 GEMV (default 1x4096x4096, the LLM decode shape; ``--gemv-shape
MxKxN``), an ONNX MatMul of random weights (seeded) quantized QDQ u8s8 like ``--int8``,
compiled at precision int8 and checked against onnxruntime (within one output step),
with its cycles and floors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from lpx_tvm.runtime.floors import add, floors_of


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


def quantize_qdq(src: str, dst: str, shape, seed: int = 1) -> str:
    """``src`` quantized offline by onnxruntime's quantize_static into ``dst``: QDQ, uint8
    activations and per-channel int8 weights (u8s8), calibrated on 2 standard normal inputs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    name = onnx.load(src).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(seed)
            self.data = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(2)])

        def get_next(self):
            return next(self.data, None)

    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    return dst


def quantized_resnet50(folder: str, hw: int = 224) -> str:
    """ResNet-50 (random weights, randomized BatchNorm statistics) as a QDQ u8s8 ONNX model."""
    import torch

    sys.path.insert(0, TEST_MODELS)
    from torch_models import randomized, resnet50

    torch.manual_seed(0)
    src, dst = os.path.join(folder, "resnet50.onnx"), os.path.join(folder, "resnet50_qdq_u8s8.onnx")
    torch.onnx.export(randomized(resnet50()), (torch.randn(1, 3, hw, hw),), src, dynamo=True, verbose=False)
    return quantize_qdq(src, dst, (1, 3, hw, hw))


def gemv_shape(text: str) -> tuple:
    """``MxKxN`` (e.g. ``1x4096x4096``) as ``(m, k, n)``."""
    if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*x[1-9][0-9]*", text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected MxKxN with positive integers, e.g. 1x1024x1024")
    return tuple(int(d) for d in text.split("x"))


def quantized_gemv(folder: str, shape: tuple, seed: int = 0) -> str:
    """y = x W for x (M, K) and a constant W (K, N) of standard normal values / sqrt(K)
    (seeded), as one ONNX MatMul quantized QDQ u8s8: the path of the quantized model."""
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = shape
    w = (np.random.default_rng(seed).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w, "w")])
    src, dst = os.path.join(folder, "gemv.onnx"), os.path.join(folder, "gemv_qdq_u8s8.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    return quantize_qdq(src, dst, (m, k))


def output_step(path: str) -> float:
    """The scale of the DequantizeLinear that produces a QDQ model's (first) output."""
    m = onnx.load(path)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    last = next(n for n in m.graph.node if m.graph.output[0].name in n.output)
    return float(inits[last.input[1]].reshape(-1)[0])


def ort_session(path: str, qdq: bool) -> ort.InferenceSession:
    """An onnxruntime CPU session of ``path``; a QDQ model runs as written (no QDQ fusion:
    ONNX's definition of its result)."""
    so = ort.SessionOptions()
    if qdq:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


# ---- floors ------------------------------------------------------------------------

def run_floors(executable):
    """The floors of the executable's last run: each LPX region's program floors once per
    call of it, added (regions run one after another)."""
    cfg = executable.config
    per_region = {name: floors_of(cfg, executable.regions[name].program.instrs)
                  for name in executable.stats.calls}
    return add(*[per_region[name] for name, calls in executable.stats.calls.items() for _ in range(calls)])


def floor_figures(model) -> dict:
    """The last run's floors and its distance from them: ``floors`` (every kind, cycles),
    ``floor_cycles`` / ``floor_kind`` (the largest), ``over_floor`` (achieved cycles over
    it), and ``compute_floor_cycles``: the useful MACs at the precision's MXM peak, which
    the multiply floor exceeds by the padding of its tiles."""
    exe, rep = model.executable, model.report
    floors = run_floors(exe)
    kind, floor = floors.largest()
    compute = rep["macs"] / exe.config.peak_macs_per_cycle_for(exe.precision)
    return {
        "floor_cycles": round(floor, 1), "floor_kind": kind,
        "over_floor": round(rep["cycles"] / floor, 3) if floor else None,
        "compute_floor_cycles": round(compute, 1),
        "over_compute_floor": round(rep["cycles"] / compute, 3) if compute else None,
        "floors": {k: round(v, 1) for k, v in floors.to_json().items()},
    }


def print_floors(cycles: int, fig: dict) -> None:
    """The floors, one line each, then the achieved cycles over the largest."""
    rows = [*fig["floors"].items(), ("compute", fig["compute_floor_cycles"])]
    width = max(len(k) for k, _ in rows)
    for kind, n in rows:
        padding = fig["floors"]["multiply"] / n if kind == "compute" and n else None
        note = {fig["floor_kind"]: "  <- largest",
                "compute": f"  (useful MACs at the MXM peak; the multiply floor is {padding:.2f}x it: padding)"
                if padding else ""}.get(kind, "")
        print(f"  {kind:<{width}} floor {n:>14,.1f} cycles{note}")
    print(f"  achieved {cycles:,} cycles = {fig['over_floor']}x the {fig['floor_kind']} floor, "
          f"{fig['over_compute_floor']}x the compute floor")


# ---- the int8 GEMV -----------------------------------------------------------------

def gemv(shape: tuple = (1, 4096, 4096), preset: str = "tsp", folder: "str | None" = None) -> tuple:
    """Compile, run and check :func:`quantized_gemv` of ``shape`` on ``preset``: returns
    ``(figures, got, want, step)``, the benchmark's figures (what its JSON line carries),
    the simulator's and onnxruntime's outputs, and the output quantization step."""
    path = quantized_gemv(folder or tempfile.mkdtemp(prefix="lpx_gemv_"), shape)
    t = time.perf_counter()
    model = lpx_tvm.compile_model(path, preset=preset, precision="int8")
    compile_s = time.perf_counter() - t

    name, in_shape, dtype = model.inputs[0]
    x = model_input(name, in_shape, dtype)
    t = time.perf_counter()
    got = list(model.run({name: x}).values())[0]
    sim_s = time.perf_counter() - t
    want = ort_session(path, qdq=True).run(None, {name: x})[0]
    step = output_step(path)

    rep = model.report
    out = {
        "model": "gemv_int8_" + "x".join(map(str, shape)), "preset": preset, "precision": "int8",
        "shape": list(shape), "compile_s": round(compile_s, 2), "sim_wall_s": round(sim_s, 3),
        "cycles": rep["cycles"], "latency_s": rep["latency_s"], "macs": rep["macs"],
        "mxm_utilization": round(rep["mxm_utilization"], 4), "weight_bytes": rep["weight_bytes"],
        "max_err_output_steps": round(float(np.abs(got - want).max()) / step, 3),
        "lpx_regions": len(model.executable.regions), "offload_cpu": rep["offload"].get("cpu", {}),
        **floor_figures(model),
    }
    return out, got, want, step


def main_gemv(shape: tuple, preset: str) -> None:
    out, _, _, _ = gemv(shape, preset)
    print(f"int8 GEMV {'x'.join(map(str, shape))} on {preset}: {out['cycles']:,} cycles, "
          f"floor {out['floor_cycles']:,} cycles ({out['floor_kind']}), "
          f"max error {out['max_err_output_steps']} output steps against onnxruntime")
    print_floors(out["cycles"], out)
    print(json.dumps(out))
    if out["max_err_output_steps"] > 1.001:  # one output step (and float rounding of it)
        sys.exit(f"e2e.py: the GEMV differs from onnxruntime by {out['max_err_output_steps']} output steps")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="light_resnet50",
                    help="a bundled light model, an .onnx path, or bert_base (seq 128; needs torch, transformers)")
    ap.add_argument("--preset", default="tsp")
    ap.add_argument("--precision", default=None,
                    help="default bf16 for the light models (their constant weights overflow fp16's range), "
                         "fp16 for bert_base")
    ap.add_argument("--int8", action="store_true", help="ResNet-50 quantized QDQ u8s8, at precision int8")
    ap.add_argument("--gemv", action="store_true", help="an int8 GEMV (QDQ MatMul), 1x4096x4096 unless --gemv-shape")
    ap.add_argument("--gemv-shape", type=gemv_shape, default=None, metavar="MxKxN",
                    help="the GEMV's shape (implies --gemv), e.g. 1x1024x1024")
    args = ap.parse_args(argv)
    if args.gemv or args.gemv_shape:
        return main_gemv(args.gemv_shape or (1, 4096, 4096), args.preset)
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

    sess = ort_session(path, qdq=args.int8)
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
        out["max_err_output_steps"] = round(float(np.abs(list(got.values())[0] - want[0]).max()) / output_step(path), 3)
    out.update(floor_figures(model))
    print(f"{args.model} on {args.preset} ({args.precision}): {rep['cycles']:,} cycles, "
          f"{out[unit]:,} {unit.replace('_per_s', '/s')} simulated, MXM utilization {rep['mxm_utilization']:.1%}")
    print_floors(rep["cycles"], out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

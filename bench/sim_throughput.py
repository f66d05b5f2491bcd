"""Simulator throughput on a tiled 2048 x 2048 x 2048 fp16 GEMM on the tsp preset.

Measures, side by side in one run (medians of several repeats):
- the functional simulation (real numbers) and the timing-only simulation (cycles only).
  The warm-up run checks the program; the measured functional runs replay it without
  the checks (docs/design.md, "Verify once, replay"), the timing-only runs do every
  check each time;
- ``np.matmul`` of the same shapes in fp32 — numpy has no BLAS path for fp16, and the
  simulator itself multiplies fp16 tiles through fp32 BLAS, so fp32 is the honest
  reference for "what a plain numpy matmul of these shapes costs".

The last line printed is JSON: instructions_per_s, simulated_macs_per_s,
sim_over_numpy (functional wall / numpy wall) and timing_only_speedup
(functional wall / timing-only wall). Targets: sim_over_numpy <= 3, timing_only_speedup >= 20.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from lpx_tvm.kernels import gemm
from lpx_tvm.sim import Simulator


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--preset", default="tsp")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    n = args.size
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float16)
    b = rng.standard_normal((n, n)).astype(np.float16)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)

    t = time.perf_counter()
    prog = gemm(args.preset, n, n, n, "fp16")
    build_s = time.perf_counter() - t
    sim = Simulator(args.preset)
    result = sim.run(prog, {"A": a, "B": b})  # warm-up, and the correctness check
    err = float(np.abs(result.outputs["C"] - a32 @ b32).max())
    assert err < 1e-2, f"simulated GEMM is wrong (max abs error {err})"
    np.matmul(a32, b32)

    # Interleave the three measurements so machine noise hits them alike.
    func, timing, numpy_t = [], [], []
    for _ in range(args.repeats):
        func.append(_median_time(lambda: sim.run(prog, {"A": a, "B": b}), 1))
        timing.append(_median_time(lambda: sim.run(prog, timing_only=True), 3))
        numpy_t.append(_median_time(lambda: np.matmul(a32, b32), 3))
    func_s, timing_s, numpy_s = (statistics.median(x) for x in (func, timing, numpy_t))

    report = {
        "preset": args.preset,
        "shape": [n, n, n],
        "dtype": "fp16",
        "instructions": len(prog.instrs),
        "cycles": result.cycles,
        "build_s": round(build_s, 4),
        "functional_s": round(func_s, 4),
        "timing_only_s": round(timing_s, 5),
        "numpy_fp32_matmul_s": round(numpy_s, 4),
        "instructions_per_s": round(len(prog.instrs) / func_s, 1),
        "timing_only_instructions_per_s": round(len(prog.instrs) / timing_s, 1),
        "simulated_macs_per_s": round(result.counters.macs / func_s, 1),
        "sim_over_numpy": round(func_s / numpy_s, 3),
        "timing_only_speedup": round(func_s / timing_s, 1),
    }
    print(f"{n}^3 fp16 GEMM on {args.preset}: {len(prog.instrs)} instructions, {result.cycles:,} cycles; "
          f"functional {func_s:.3f} s, timing-only {timing_s * 1e3:.1f} ms, numpy fp32 {numpy_s:.3f} s")
    print(json.dumps(report))


if __name__ == "__main__":
    main()

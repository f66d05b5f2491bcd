"""Hand-written kernels on tsp and mini against numpy references."""

import numpy as np
import pytest
import tvm.testing

from lpx_tvm.kernels import gemm, layernorm, softmax, transpose
from lpx_tvm.sim import Simulator
from lpx_tvm.machine.config import load_config

preset = tvm.testing.parameter("mini", "tsp")


def _lanes(preset):
    return load_config(preset).lanes


def _rel_l2(got, want):
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def test_gemm_int8_exact(preset):
    lanes = _lanes(preset)
    M, K, N = 70, 2 * lanes + 5, lanes + 9  # several K and N tiles, ragged edges
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (M, K), dtype=np.int8)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    out = Simulator(preset).run(gemm(preset, M, K, N, "int8"), {"A": a, "B": b}).outputs["C"]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


def test_gemm_fp16_fp32_accumulate(preset):
    lanes = _lanes(preset)
    M, K, N = 45, 3 * lanes - 2, 2 * lanes + 1
    rng = np.random.default_rng(1)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    out = Simulator(preset).run(gemm(preset, M, K, N, "fp16"), {"A": a, "B": b}).outputs["C"]
    assert out.dtype == np.float32
    # fp16 products are exact in fp32; only the fp32 summation order differs from fp64.
    tvm.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_gemm_rows_beyond_accumulators():
    """M larger than half the accumulator depth is split into row chunks (mini: 128)."""
    M, K, N = 300, 20, 40
    rng = np.random.default_rng(2)
    a = rng.integers(-128, 128, (M, K), dtype=np.int8)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    out = Simulator("mini").run(gemm("mini", M, K, N, "int8"), {"A": a, "B": b}).outputs["C"]
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


def test_gemm_bias_relu(preset):
    lanes = _lanes(preset)
    M, K, N = 33, lanes + 3, lanes + 5
    rng = np.random.default_rng(3)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    bias = rng.standard_normal(N).astype(np.float32)
    prog = gemm(preset, M, K, N, "fp16", bias=bias, relu=True, out_dtype="fp16")
    out = Simulator(preset).run(prog, {"A": a, "B": b}).outputs["C"]
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    assert out.dtype == np.float16
    assert (out >= 0).all()
    assert _rel_l2(out, want) < 1e-3


def test_the_benchmark_gemm_fills_whole_slices():
    """bench/sim_throughput.py's 2048^3 fp16 GEMM on tsp: each C tile (2048 fp32 rows) is
    a whole slice, so it must take its slice before B's install parts spread over all of
    them. Its multiply floor with K and N padded to 7 tiles of 320: 2048 x 2240 x 2240
    MACs at 4 x 320 x 320 / 4 per cycle = 100,352 cycles."""
    n = 2048
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float16)
    b = rng.standard_normal((n, n)).astype(np.float16)
    prog = gemm("tsp", n, n, n, "fp16")
    r = Simulator("tsp").run(prog, {"A": a, "B": b})
    want = a.astype(np.float32) @ b.astype(np.float32)
    assert np.abs(r.outputs["C"] - want).max() < 1e-2
    assert r.cycles >= 2048 * 2240 * 2240 // (4 * 320 * 320 // 4) == 100_352


def test_gemm_int8_bias_relu():
    M, K, N = 20, 40, 24
    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, (M, K), dtype=np.int8)
    b = rng.integers(-128, 128, (K, N), dtype=np.int8)
    bias = rng.integers(-5000, 5000, N).astype(np.int32)
    prog = gemm("mini", M, K, N, "int8", bias=bias, relu=True)
    out = Simulator("mini").run(prog, {"A": a, "B": b}).outputs["C"]
    np.testing.assert_array_equal(out, np.maximum(a.astype(np.int64) @ b.astype(np.int64) + bias, 0))


def test_softmax(preset):
    lanes = _lanes(preset)
    rows, cols = 50, lanes - 3
    x = (np.random.default_rng(5).standard_normal((rows, cols)) * 4).astype(np.float16)
    out = Simulator(preset).run(softmax(preset, rows, cols, "fp16"), {"X": x}).outputs["Y"]
    xf = x.astype(np.float64)
    e = np.exp(xf - xf.max(axis=1, keepdims=True))
    tvm.testing.assert_allclose(out.astype(np.float64), e / e.sum(axis=1, keepdims=True), rtol=2e-3, atol=1e-4)


def test_softmax_is_stable_for_large_inputs():
    """exp(x) alone would overflow fp32 at x = 1000; subtracting the row max must not."""
    x = np.full((4, 10), 1000.0, np.float32)
    x[:, 0] = 1001.0
    out = Simulator("mini").run(softmax("mini", 4, 10, "fp32"), {"X": x}).outputs["Y"]
    e = np.exp(x.astype(np.float64) - 1001.0)
    tvm.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-6)


def test_layernorm(preset):
    lanes = _lanes(preset)
    rows, cols = 40, lanes - 1
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((rows, cols)) * 3 + 100).astype(np.float32)  # large mean: tests centering
    gamma, beta = rng.standard_normal(cols), rng.standard_normal(cols)
    out = Simulator(preset).run(layernorm(preset, rows, cols, gamma, beta, "fp32"), {"X": x}).outputs["Y"]
    xf = x.astype(np.float64)
    mu = xf.mean(axis=1, keepdims=True)
    want = (xf - mu) / np.sqrt(((xf - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5) * gamma + beta
    tvm.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_transpose(preset):
    lanes = _lanes(preset)
    rows, cols = 2 * lanes + 3, lanes + 7
    x = np.random.default_rng(7).standard_normal((rows, cols)).astype(np.float16)
    out = Simulator(preset).run(transpose(preset, rows, cols, "fp16"), {"X": x}).outputs["Y"]
    np.testing.assert_array_equal(out, x.T)


def test_scheduler_overlaps_installs_with_multiplies():
    """Weight installs into one buffer run while the other buffer multiplies, so the
    multiplies of a plane follow each other with no idle cycle."""
    cfg = load_config("tsp")
    M, K, N = 1024, 1280, 640  # 4 K tiles; 2 N tiles on the two west planes sharing one A read
    prog = gemm(cfg, M, K, N, "fp16")
    c = Simulator(cfg).run(prog, timing_only=True).counters
    for plane in (0, 1):
        muls = sorted(i.cycle for i in prog.instrs if i.op in ("mxm.mul", "mxm.mac") and i.unit == plane)
        assert len(muls) == 4
        # fp16 streams at 4 cycles per vector: each multiply occupies the plane 4 * M cycles.
        assert np.diff(muls).tolist() == [4 * M] * 3
        assert c.port_busy_cycles[f"mxm{plane}.compute"] == 4 * 4 * M
    # First install (320 rows + latency) before, one drain (M rows + latency) after.
    assert c.cycles < 4 * 4 * M + 320 + M + 64


def test_mutation_moving_any_instruction_is_caught_or_harmless():
    """Shifting any single GEMM instruction by one cycle either raises a schedule hazard
    or leaves the result bit-identical: never a silent wrong answer."""
    from dataclasses import replace

    from lpx_tvm.errors import LPXError

    M, K, N = 20, 24, 20  # two K tiles and two N tiles on mini
    rng = np.random.default_rng(8)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    prog = gemm("mini", M, K, N, "fp16")
    sim = Simulator("mini")
    golden = sim.run(prog, {"A": a, "B": b}).outputs["C"]
    caught = harmless = tried = 0
    for i, ins in enumerate(prog.instrs):
        for delta in (-1, 1):
            if ins.cycle + delta < 0:
                continue
            tried += 1
            instrs = list(prog.instrs)
            instrs[i] = ins.moved(delta)
            try:
                out = sim.run(replace(prog, instrs=instrs), {"A": a, "B": b}).outputs["C"]
            except LPXError:
                caught += 1
                continue
            np.testing.assert_array_equal(out, golden, err_msg=f"moving #{i} {ins} by {delta} changed the result")
            harmless += 1
    assert tried >= len(prog.instrs)
    assert caught + harmless == tried and caught > 0


def test_two_dimensional_window_read_and_write():
    """A 3 x 4 window (every 2nd pixel in a row) of an 8 x 10 pixel grid, written into the
    interior of a zero-padded 5 x 6 grid: the access pattern of a strided convolution."""
    from lpx_tvm.target.builder import ProgramBuilder

    b = ProgramBuilder("mini")
    x = b.input("X", (8 * 10, 16), "fp16")
    y = b.output("Y", (5 * 6, 16), "fp16")
    g = b.group("window")
    v = g.read(x.tile(0).window(first=1 * 10 + 2, rows=3, cols=4, row_pitch=10, col_step=2))
    g.write(v, y.tile(0).window(first=1 * 6 + 1, rows=3, cols=4, row_pitch=6))
    prog = b.build()
    assert any(i.op == "mem.read" and i.aux0 == 4 for i in prog.instrs)
    data = np.random.default_rng(9).standard_normal((8, 10, 16)).astype(np.float16)
    out = Simulator("mini").run(prog, {"X": data.reshape(80, 16)}).outputs["Y"].reshape(5, 6, 16)
    want = np.zeros((5, 6, 16), np.float16)
    want[1:4, 1:5] = data[1:4, 2:10:2]
    np.testing.assert_array_equal(out, want)

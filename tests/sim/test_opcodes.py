"""Every LPX opcode against an independent numpy reference, in small hand-timed programs.

The programs are written with explicit issue cycles derived here from the preset's
latencies and floorplan positions (mini: MXM0=0, SXM0=1, MEM0-3=2..5, VXM=6,
MEM4-7=7..10, SXM1=11, MXM1=12); the simulator refuses any mistimed consumer, so a
clean run also confirms the timing rules.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import special

from lpx_tvm.machine.encoding import decode_program, encode_program
from lpx_tvm.machine.isa import OPS, DType

from lpx_hand import BF16, E, Hand, W, assert_same_float, clip_int, f64, round_to, same_float, wrap_int32

# Overflow to inf is a legitimate result here; numpy's warnings about it are noise.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

RNG = np.random.default_rng(1234)
LANES = 16
HYP = settings(max_examples=25, deadline=None)

TESTED = set()  # opcodes exercised in this file, checked against isa.OPS at the end


def covers(*ops):
    TESTED.update(ops)

    def deco(fn):
        return fn
    return deco


def vec(values, dtype, rows=None):
    """A (rows, 16) array of ``dtype`` cycling through ``values``."""
    v = np.asarray(values, np.float64 if DType.parse(dtype).is_float else np.int64).ravel()
    rows = rows or -(-len(v) // LANES)
    flat = np.resize(v, rows * LANES)
    return flat.reshape(rows, LANES).astype(DType.parse(dtype).np)


def test_reference_rounding():
    """The reference rounding agrees with numpy's correctly rounded float64 casts, and with
    hand-worked bf16 cases (ml_dtypes is not used: its float64 cast rounds twice)."""
    x = np.concatenate([RNG.standard_normal(2000) * 10.0 ** RNG.integers(-9, 6, 2000),
                        [65504.0, 65519.99, 65520.0, 1e-8, 2.0**-25, 2.0**-25 * 1.0000001, 3.5e38, -1e-46, 0.0]])
    assert_same_float(round_to(x, "fp16"), x.astype(np.float16), "fp16")
    assert_same_float(round_to(x, "fp32"), x.astype(np.float32), "fp32")
    one = 1.0
    cases = {one + 2**-8: 1.0, one + 3 * 2**-8: 1 + 2**-6, one + 2**-8 + 2**-40: 1 + 2**-7,
             2.0**24 + 2**16 + 1: 2.0**24 + 2**17, 3.3961e38: float(ml_dtypes_max()), 3.3962e38: np.inf,
             2.0**-134: 0.0, 2.0**-134 * 1.5: 2.0**-133, -(2.0**-133) * 2.5: -(2.0**-132)}
    got = f64(round_to(np.array(list(cases)), "bf16"))
    assert got.tolist() == list(cases.values())


def ml_dtypes_max():
    return (2 - 2.0**-7) * 2.0**127


# =============================================================================
# MEM
# =============================================================================

@covers("mem.read", "mem.write")
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "fp16", "bf16", "fp32"])
def test_copy_west_to_east(dtype):
    h = Hand()
    n = 10
    x = vec(RNG.integers(-100, 100, n * LANES), dtype, n) if dtype != "uint8" else \
        vec(RNG.integers(0, 255, n * LANES), dtype, n)
    h.input("X", n, dtype, 0, addr=7)
    h.output("Y", n, dtype, 5, addr=3)
    # read slice 0 (pos 2) at 0: emits at 0 + 2 = 2; slice 5 is at pos 8: 2 + 6 = 8
    h.add("mem.read", 0, unit=0, count=n, addr=7, stride=DType.parse(dtype).itemsize, dtype=dtype, dst=E(0))
    h.add("mem.write", 8, unit=5, count=n, addr=3, stride=DType.parse(dtype).itemsize, dtype=dtype, src0=E(0))
    out = h.run({"X": x}).outputs["Y"]
    assert out.dtype == x.dtype
    assert np.array_equal(out.view(np.uint8), x.view(np.uint8))


@covers("mem.read", "mem.write")
def test_copy_east_to_west():
    h = Hand()
    x = vec(np.arange(64), "int32")
    h.input("X", 4, "int32", 7)
    h.output("Y", 4, "int32", 0)
    # slice 7 is at pos 10, slice 0 at pos 2: westward, 8 hops; write at 2 + 8 = 10
    h.add("mem.read", 0, unit=7, count=4, addr=0, stride=4, dtype="int32", dst=W(3))
    h.add("mem.write", 10, unit=0, count=4, addr=0, stride=4, dtype="int32", src0=W(3))
    assert np.array_equal(h.run({"X": x}).outputs["Y"], x)


@covers("mem.read", "mem.write")
@pytest.mark.parametrize("dtype", ["int8", "fp16", "fp32"])
@pytest.mark.parametrize("start, step, count", [(1, 2, 5), (0, 3, 4), (11, -1, 12), (9, -3, 4), (3, 0, 6)])
def test_strided_read(dtype, start, step, count):
    """Read rows start, start+step, ... (step 0 repeats one row, negative steps go backwards)."""
    w = DType.parse(dtype).itemsize
    n = 12
    x = vec(RNG.integers(-120, 120, n * LANES), dtype, n)
    h = Hand()
    h.input("X", n, dtype, 1)
    h.output("Y", count, dtype, 2)
    # slice 1 (pos 3) -> slice 2 (pos 4): read at 0, emit 2, write at 3
    h.add("mem.read", 0, unit=1, count=count, addr=start * w, stride=step * w, dtype=dtype, dst=E(1))
    h.add("mem.write", 3, unit=2, count=count, addr=0, stride=w, dtype=dtype, src0=E(1))
    out = h.run({"X": x}).outputs["Y"]
    rows = [start + k * step for k in range(count)]
    assert np.array_equal(out, x[rows])


@covers("mem.write")
@pytest.mark.parametrize("reverse", [False, True])
def test_strided_write(reverse):
    """Write with a gap between vectors (row stride 3 lines) or backwards."""
    n, dtype = 6, "int8"
    x = vec(np.arange(n * LANES) - 40, dtype, n)
    h = Hand()
    h.input("X", n, dtype, 3)
    h.output("Y", n, dtype, 3, addr=100, stride=3)  # output rows 3 lines apart in the same slice
    # slice 3 is pos 5 -> same slice: 0 hops. Its read port and write port are separate.
    # read at 0 emits at 2; the write at pos 5 issues at 2.
    addr, stride = (100 + 3 * (n - 1), -3) if reverse else (100, 3)
    h.add("mem.read", 0, unit=3, count=n, addr=0, stride=1, dtype=dtype, dst=E(0))
    h.add("mem.write", 2, unit=3, count=n, addr=addr, stride=stride, dtype=dtype, src0=E(0))
    out = h.run({"X": x}).outputs["Y"]
    assert np.array_equal(out, x[::-1] if reverse else x)


@covers("mem.write")
def test_write_stride_zero_keeps_last_vector():
    h = Hand()
    x = vec(np.arange(3 * LANES), "int32", 3)
    h.input("X", 3, "int32", 0)
    h.output("Y", 1, "int32", 1)
    h.add("mem.read", 0, unit=0, count=3, addr=0, stride=4, dtype="int32", dst=E(0))
    h.add("mem.write", 3, unit=1, count=3, addr=0, stride=0, dtype="int32", src0=E(0))
    assert np.array_equal(h.run({"X": x}).outputs["Y"], x[2:3])


@covers("mem.read", "mem.write")
@pytest.mark.parametrize("dtype", ["int32", "fp16"])
def test_vector_lines_hold_the_vector_bytes_in_order(dtype):
    """A w-byte vector fills w lines with its little-endian bytes in order: reading its
    lines as int8 shows the vector's bytes, lane 0 first."""
    dt = DType.parse(dtype)
    w = dt.itemsize
    x = RNG.standard_normal((1, LANES)).astype(dt.np)
    want = np.ascontiguousarray(x).view(np.uint8).reshape(w, LANES)
    h = Hand()
    h.input("X", 1, dtype, 0)
    h.output("Y", w, "int8", 1)
    h.add("mem.read", 0, unit=0, count=w, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.write", 3, unit=1, count=w, addr=0, stride=1, dtype="int8", src0=E(0))
    assert np.array_equal(h.run({"X": x}).outputs["Y"].view(np.uint8), want)


def test_initial_image_in_documented_byte_order_reads_back():
    """An SRAM image written by hand in the documented byte order is the expected int32 tensor."""
    from lpx_tvm.sim import Simulator
    from lpx_tvm.machine.program import SramImage
    values = RNG.integers(-2**31, 2**31, (3, LANES)).astype(np.int32)
    image = values.astype("<i4").tobytes()  # row after row, lane 0 first, little-endian
    h = Hand()
    h.output("Y", 3, "int32", 2, addr=8)
    prog = h.program()
    prog.sram_init = [SramImage(2, 8, image)]
    assert np.array_equal(Simulator("mini").run(prog).outputs["Y"], values)


@covers("mem.read")
def test_tsp_copy_across_the_chip():
    h = Hand("tsp")
    x = RNG.standard_normal((5, h.lanes)).astype(np.float32)
    h.input("X", 5, "fp32", 87)
    h.output("Y", 5, "fp32", 0)
    # tsp: slice 87 at pos 91, slice 0 at pos 3: 88 hops west; write at 2 + 88 = 90
    assert (h.mem(87), h.mem(0)) == (91, 3)
    h.add("mem.read", 0, unit=87, count=5, addr=0, stride=4, dtype="fp32", dst=W(7))
    h.add("mem.write", 90, unit=0, count=5, addr=0, stride=4, dtype="fp32", src0=W(7))
    assert_same_float(h.run({"X": x}).outputs["Y"], x, "tsp copy")


@covers("mem.gather")
@pytest.mark.parametrize("dtype, base, step", [("fp32", 0, 4), ("int8", 5, 2), ("bf16", 2, 2)])
def test_gather(dtype, base, step):
    """out[k] = vector at line base + idx[k] * step of the table slice (idx from lane 0)."""
    w = DType.parse(dtype).itemsize
    n_table = 20
    table = vec(RNG.integers(-100, 100, n_table * LANES), dtype, n_table)
    # The table tensor occupies lines base + r*step (gaps when step > w).
    idx_rows = 9
    max_idx = (n_table - 1)
    idx = RNG.integers(-99, 99, (idx_rows, LANES)).astype(np.int32)  # other lanes are ignored
    idx[:, 0] = RNG.integers(0, max_idx + 1, idx_rows)
    idx[3, 0] = idx[4, 0]  # a repeated index
    h = Hand()
    h.input("T", n_table, dtype, 1, addr=base, stride=step)
    h.input("I", idx_rows, "int32", 0)
    h.output("Y", idx_rows, dtype, 4)
    # idx: slice 0 (pos 2) read at 0, emits 2; gather on slice 1 (pos 3) issues at 3,
    # emits at 3 + mem_gather (4) = 7; slice 4 (pos 7): write at 7 + 4 = 11
    h.add("mem.read", 0, unit=0, count=idx_rows, addr=0, stride=4, dtype="int32", dst=E(0))
    h.add("mem.gather", 3, unit=1, count=idx_rows, addr=base, stride=step, dtype=dtype, src0=E(0), dst=E(1))
    h.add("mem.write", 11, unit=4, count=idx_rows, addr=0, stride=w, dtype=dtype, src0=E(1))
    out = h.run({"T": table, "I": idx}).outputs["Y"]
    assert np.array_equal(out.view(np.uint8), table[idx[:, 0]].view(np.uint8))


@covers("mem.scatter")
@pytest.mark.parametrize("dtype, base, step", [("fp32", 0, 4), ("int8", 5, 2), ("bf16", 2, 2)])
def test_scatter(dtype, base, step):
    """table[idx[k]] = values[k] in order (idx from lane 0; a repeated index: the later
    vector wins); every other row of the table is kept."""
    w = DType.parse(dtype).itemsize
    n_table, n = 20, 7
    table = vec(RNG.integers(-100, 100, n_table * LANES), dtype, n_table)
    values = vec(RNG.integers(-100, 100, n * LANES), dtype, n)
    idx = RNG.integers(-99, 99, (n, LANES)).astype(np.int32)  # other lanes are ignored
    idx[:, 0] = RNG.choice(n_table, n, replace=False)
    idx[5, 0] = idx[2, 0]  # a repeated index
    h = Hand()
    h.input("T", n_table, dtype, 1, addr=base, stride=step)
    h.input("I", n, "int32", 0)
    h.input("V", n, dtype, 2)
    h.output("Y", n_table, dtype, 1, addr=base, stride=step)  # the table's own lines
    # idx: slice 0 (pos 2) read at 0, at pos 3 at 3; values: slice 2 (pos 4) read at 0,
    # west, at pos 3 at 3; the scatter on slice 1 (pos 3) issues at 3.
    h.add("mem.read", 0, unit=0, count=n, addr=0, stride=4, dtype="int32", dst=E(0))
    h.add("mem.read", 0, unit=2, count=n, addr=0, stride=w, dtype=dtype, dst=W(0))
    h.add("mem.scatter", 3, unit=1, count=n, addr=base, stride=step, dtype=dtype, src0=W(0), src1=E(0))
    r = h.run({"T": table, "I": idx, "V": values})
    want = table.copy()
    for k in range(n):
        want[idx[k, 0]] = values[k]
    assert np.array_equal(r.outputs["Y"].view(np.uint8), want.view(np.uint8))
    assert not np.array_equal(want[idx[2, 0]].view(np.uint8), values[2].view(np.uint8))  # vector 5 won
    # The last vector lands at 3 + (n - 1) + mem_write.
    assert r.cycles == 3 + (n - 1) + h.cfg.latency["mem_write"]
    assert r.counters.sram_bytes_written == n * LANES * w


# =============================================================================
# DMA
# =============================================================================

def dma_cycles(h, n, dtype):
    """Off-chip transfer time: latency + bytes / (bytes per cycle), rounded up."""
    nbytes = n * h.lanes * DType.parse(dtype).itemsize
    return h.cfg.offchip_latency + math.ceil(nbytes * h.cfg.clock_hz / h.cfg.offchip_bytes_per_s)


@covers("dma.load")
@pytest.mark.parametrize("dtype", ["int8", "fp16", "fp32"])
def test_dma_load(dtype):
    n = 7
    x = vec(RNG.integers(-100, 100, n * LANES), dtype, n)
    h = Hand()
    h.host_init = b"\xee" * 48 + x.tobytes()  # 48 junk bytes first: host offset 48
    h.host_bytes = len(h.host_init) + 64
    h.output("Y", n, dtype, 6, addr=10, stride=2 * x.itemsize)  # every other vector slot
    h.add("dma.load", 0, unit=0, slice=6, addr=10, stride=2 * x.itemsize, count=n, dtype=dtype, aux0=48)
    r = h.run()
    assert np.array_equal(r.outputs["Y"].view(np.uint8), x.view(np.uint8))
    assert r.counters.offchip_bytes_read == x.nbytes
    assert r.counters.offchip_bytes_written == 0
    assert r.cycles == dma_cycles(h, n, dtype)


@covers("dma.store", "dma.load")
def test_dma_store_then_load_round_trip():
    n, dtype = 5, "fp16"
    x = vec(RNG.standard_normal(n * LANES), dtype, n)
    h = Hand()
    h.host_bytes = 4096  # all zero
    h.input("X", n, dtype, 3)
    h.output("Y", n, dtype, 6)
    d = dma_cycles(h, n, dtype)  # 900 + ceil(160 / 35.55..) = 905
    assert d == 905
    h.add("dma.store", 0, unit=0, slice=3, addr=0, stride=2, count=n, dtype=dtype, aux0=1000)
    h.add("dma.load", d, unit=0, slice=6, addr=0, stride=2, count=n, dtype=dtype, aux0=1000)
    r = h.run({"X": x})
    assert np.array_equal(r.outputs["Y"].view(np.uint8), x.view(np.uint8))
    assert r.counters.offchip_bytes_written == x.nbytes
    assert r.counters.offchip_bytes_read == x.nbytes
    assert r.counters.sram_bytes_read == x.nbytes and r.counters.sram_bytes_written == x.nbytes
    assert r.cycles == 2 * d


@covers("dma.store", "dma.load")
def test_dma_partial_overwrite_of_host_init():
    """A store overwrites only its bytes of the host memory; a load sees the rest unchanged."""
    h = Hand()
    base = np.arange(4 * LANES, dtype=np.int32).reshape(4, LANES)  # 4 int32 vectors of host data
    h.host_init = base.tobytes()
    h.host_bytes = len(h.host_init)
    x = vec(-np.arange(LANES) - 1, "int32", 1)
    h.input("X", 1, "int32", 0)
    h.output("Y", 4, "int32", 1)
    d1 = dma_cycles(h, 1, "int32")
    h.add("dma.store", 0, unit=0, slice=0, addr=0, stride=4, count=1, dtype="int32", aux0=2 * LANES * 4)
    h.add("dma.load", d1, unit=0, slice=1, addr=0, stride=4, count=4, dtype="int32", aux0=0)
    want = base.copy()
    want[2] = x[0]
    assert np.array_equal(h.run({"X": x}).outputs["Y"], want)


# =============================================================================
# MXM
# =============================================================================

ACC = {"int8": "int32", "uint8": "int32", "fp8": "fp32", "fp16": "fp32", "bf16": "fp32", "fp32": "fp32"}


def mxm_program(x, wts, act_dt, w_dt, *, width, plane=0, preset="mini", k_rows=None):
    """Install ``wts`` (K rows) into ``plane`` buffer 0, multiply every row of ``x``, drain.

    Returns (Hand, inputs, cycle of the drain). Weight and activation slices are on the
    plane's side of the chip; the drained result is written on the other side of it.
    """
    h = Hand(preset)
    cfg, L = h.cfg, h.lat
    M = x.shape[0]
    K = wts.shape[0] if k_rows is None else k_rows
    pp = h.pos("MXM", plane)
    west = pp < h.pos("VXM")
    sw, sx, so = (1, 0, 2) if west else (cfg.mem_slices - 2, cfg.mem_slices - 1, cfg.mem_slices - 3)
    to_plane = W if west else E
    from_plane = E if west else W
    h.input("X", M, act_dt, sx)
    h.input("B", wts.shape[0], w_dt, sw)
    h.output("Y", M, ACC[act_dt], so)
    ws, xs, acc_dt = DType.parse(w_dt).itemsize, DType.parse(act_dt).itemsize, DType.parse(ACC[act_dt])
    t_inst = L["mem_read"] + abs(pp - h.mem(sw))
    t_mul = t_inst + K + L["mxm_install"]  # weights ready once the install completes
    t_x = t_mul - L["mem_read"] - abs(pp - h.mem(sx))
    r = max(cfg.mxm_cycles_per_vector[act_dt], cfg.mxm_cycles_per_vector[w_dt])
    # row k lands at t_mul + r*(k+1) + mxm_mul - 1; the drain reads row k at t_d + k
    t_d = max(t_mul + r * (k + 1) + L["mxm_mul"] - 1 - k for k in range(M))
    t_w = t_d + L["mxm_drain"] + abs(h.mem(so) - pp)
    h.add("mem.read", 0, unit=sw, count=K, addr=0, stride=ws, dtype=w_dt, dst=to_plane(0))
    h.add("mxm.install", t_inst, unit=plane, buf=0, count=K, dtype=w_dt, aux0=width, src0=to_plane(0))
    h.add("mem.read", t_x, unit=sx, count=M, addr=0, stride=xs, dtype=act_dt, dst=to_plane(1))
    h.add("mxm.mul", t_mul, unit=plane, buf=0, addr=3, count=M, dtype=act_dt, src0=to_plane(1))
    h.add("mxm.drain", t_d, unit=plane, addr=3, count=M, dtype=acc_dt, dst=from_plane(2))
    h.add("mem.write", t_w, unit=so, count=M, addr=0, stride=acc_dt.itemsize, dtype=acc_dt, src0=from_plane(2))
    return h, {"X": x, "B": wts}, t_d


def int_matmul_ref(x, wts, K, N, lanes):
    ref = np.zeros((x.shape[0], lanes), np.int64)
    ref[:, :N] = x[:, :K].astype(np.int64) @ wts[:K, :N].astype(np.int64)
    return ref


@covers("mxm.install", "mxm.mul", "mxm.drain")
@pytest.mark.parametrize("plane", [0, 1])
@pytest.mark.parametrize("act_dt, w_dt", [("int8", "int8"), ("uint8", "int8"), ("int8", "uint8"),
                                          ("uint8", "uint8")])
def test_int_matmul_exact(plane, act_dt, w_dt):
    M, K, N = 9, 16, 16
    lo = {"int8": -128, "uint8": 0}
    hi = {"int8": 128, "uint8": 256}
    x = RNG.integers(lo[act_dt], hi[act_dt], (M, LANES)).astype(act_dt)
    wts = RNG.integers(lo[w_dt], hi[w_dt], (K, LANES)).astype(w_dt)
    x[0, :] = hi[act_dt] - 1  # extreme rows: the largest sums
    wts[:, 0] = hi[w_dt] - 1 if w_dt == "uint8" else -128
    h, inputs, _ = mxm_program(x, wts, act_dt, w_dt, width=N, plane=plane)
    r = h.run(inputs)
    y = r.outputs["Y"]
    assert y.dtype == np.int32
    assert np.array_equal(y.astype(np.int64), int_matmul_ref(x, wts, K, N, LANES))
    assert r.counters.macs == M * K * N


@covers("mxm.install", "mxm.mul")
def test_partial_rows_and_width():
    """K < rows: lanes >= K of the activations are ignored; N < cols: the other columns read 0."""
    M, K, N = 6, 11, 7
    x = RNG.integers(-128, 128, (M, LANES)).astype(np.int8)  # lanes 11.. hold junk
    wts = RNG.integers(-128, 128, (LANES, LANES)).astype(np.int8)  # tensor has 16 rows, 11 installed
    h, inputs, _ = mxm_program(x, wts, "int8", "int8", width=N, k_rows=K)
    r = h.run(inputs)
    assert np.array_equal(r.outputs["Y"].astype(np.int64), int_matmul_ref(x, wts, K, N, LANES))
    assert r.counters.macs == M * K * N


@covers("mxm.mul", "mxm.drain")
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("plane", [0, 1])
def test_float_matmul(dtype, plane):
    M, K, N = 7, 16, 13
    x = RNG.standard_normal((M, LANES)).astype(DType.parse(dtype).np)
    wts = (RNG.standard_normal((K, LANES)) * 3).astype(DType.parse(dtype).np)
    h, inputs, _ = mxm_program(x, wts, dtype, dtype, width=N, plane=plane)
    y = h.run(inputs).outputs["Y"]
    assert y.dtype == np.float32
    ref = f64(x[:, :K]) @ f64(wts[:, :N])
    bound = (K + 1) * 2.0**-24 * (np.abs(f64(x[:, :K])) @ np.abs(f64(wts[:, :N]))) + 1e-30
    assert np.all(np.abs(f64(y[:, :N]) - ref) <= bound)
    assert np.all(y[:, N:] == 0)


@covers("mxm.mul")
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_float_matmul_products_exact_sum_in_fp32(dtype):
    """fp16/bf16 products are exact in fp32: with values whose sums fit 24 bits the result is exact.

    Here x*w uses 3 + 3 significant bits and spans 2^-8..2^7, so every partial sum is exact
    in fp32 — a result rounded to the input dtype (8/11 bits) would not be.
    """
    M, K, N = 4, 16, 16
    x = (RNG.integers(1, 8, (M, LANES)) * 2.0 ** RNG.integers(-4, 4, (M, LANES))).astype(DType.parse(dtype).np)
    wts = (RNG.integers(-7, 8, (K, LANES)) * 2.0 ** RNG.integers(-4, 4, (K, LANES))).astype(DType.parse(dtype).np)
    h, inputs, _ = mxm_program(x, wts, dtype, dtype, width=N)
    y = h.run(inputs).outputs["Y"]
    ref = f64(x) @ f64(wts)
    assert np.array_equal(f64(y), ref)
    assert not np.array_equal(f64(round_to(ref, dtype)), ref)  # the check could tell them apart


@covers("mxm.mul", "mxm.mac", "mxm.drain")
@pytest.mark.parametrize("dtype", ["int8", "fp16", "fp32"])
def test_narrow_mul_and_mac_over_wide_rows(dtype):
    """mul of width 16; drain; mac of width 6 keeps lanes 6.. ; a drain does not clear the
    rows; a mul of width 6 zeroes lanes 6.. of rows that held values."""
    h = Hand()
    dt = DType.parse(dtype)
    acc = DType.INT32 if dt.is_int else DType.FP32
    s, r, L = dt.itemsize, h.cfg.mxm_cycles_per_vector[dtype], h.lat
    x1, x2 = (RNG.integers(-8, 8, (4, LANES)).astype(dt.np) for _ in range(2))
    w16, w6 = (RNG.integers(-8, 8, (16, LANES)).astype(dt.np) for _ in range(2))
    for name, arr, sl in (("X1", x1, 0), ("W16", w16, 1), ("W6", w6, 2), ("X2", x2, 3)):
        h.input(name, len(arr), dtype, sl)
    assert L["mxm_mul"] == 8 and L["mxm_drain"] == 2

    def land(t, k):  # accumulator row k of a multiply issued at t
        return t + r * (k + 1) + 8 - 1

    def drain(t_min, stream, out_slice, name):
        h.add("mxm.drain", t_min, unit=0, addr=0, count=4, dtype=acc, dst=stream)
        h.output(name, 4, acc, out_slice)
        h.add("mem.write", t_min + 2 + h.mem(out_slice), unit=out_slice, count=4, addr=0, stride=4, dtype=acc,
              src0=stream)

    # weights: W16 from slice 1 (pos 3) installed at 5 (ready 25); W6 from slice 2 (pos 4) at 21 (ready 41)
    h.add("mem.read", 0, unit=1, count=16, addr=0, stride=s, dtype=dtype, dst=W(0))
    h.add("mxm.install", 5, unit=0, buf=0, count=16, dtype=dtype, aux0=16, src0=W(0))
    h.add("mem.read", 15, unit=2, count=16, addr=0, stride=s, dtype=dtype, dst=W(1))
    h.add("mxm.install", 21, unit=0, buf=1, count=16, dtype=dtype, aux0=6, src0=W(1))
    # mul X1 @ W16 at 25 (X1 from slice 0, pos 2: read at 21)
    h.add("mem.read", 21, unit=0, count=4, addr=0, stride=s, dtype=dtype, dst=W(2))
    h.add("mxm.mul", 25, unit=0, buf=0, addr=0, count=4, dtype=dtype, src0=W(2))
    d_a = max(land(25, k) - k for k in range(4))
    drain(d_a, E(0), 4, "Y1")
    # mac X2 @ W6 once the port is free, buffer 1 ready, and after drain A's reads
    t_mac = max(25 + 4 * r, 41, d_a + 4)
    h.add("mem.read", t_mac - 2 - 5, unit=3, count=4, addr=0, stride=s, dtype=dtype, dst=W(3))
    h.add("mxm.mac", t_mac, unit=0, buf=1, addr=0, count=4, dtype=dtype, src0=W(3))
    d_b = max(max(land(t_mac, k) - k for k in range(4)), d_a + 4)
    drain(d_b, E(1), 5, "Y2")
    d_c = d_b + 4
    drain(d_c, E(2), 6, "Y3")
    # mul X1 @ W6 into the same rows, landing after drain C's reads
    t_mul2 = max(t_mac + 4 * r, d_c + 4)
    h.add("mem.read", t_mul2 - 4, unit=0, count=4, addr=0, stride=s, dtype=dtype, dst=W(0))
    h.add("mxm.mul", t_mul2, unit=0, buf=1, addr=0, count=4, dtype=dtype, src0=W(0))
    drain(max(land(t_mul2, k) - k for k in range(4)), E(3), 7, "Y4")
    out = h.run({"X1": x1, "W16": w16, "W6": w6, "X2": x2}).outputs
    y1 = f64(x1) @ f64(w16)
    y2 = y1.copy()
    y2[:, :6] += f64(x2) @ f64(w6[:, :6])
    y4 = np.zeros_like(y1)
    y4[:, :6] = f64(x1) @ f64(w6[:, :6])
    for name, want in (("Y1", y1), ("Y2", y2), ("Y3", y2), ("Y4", y4)):
        assert np.array_equal(f64(out[name]), want), name


@covers("mxm.mac")
@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_mac_accumulates_two_k_tiles(dtype):
    """acc = X1 @ W1 (mul into buffer 0), then acc += X2 @ W2 (mac from buffer 1)."""
    h = Hand()
    L, dt = h.lat, DType.parse(dtype)
    M, K, N = 5, 16, 12
    acc_dt = DType.parse(ACC[dtype])
    if dt.is_int:
        x1, x2 = (RNG.integers(-128, 128, (M, LANES)).astype(np.int8) for _ in range(2))
        w1, w2 = (RNG.integers(-128, 128, (K, LANES)).astype(np.int8) for _ in range(2))
    else:
        x1, x2 = (RNG.integers(-8, 8, (M, LANES)).astype(np.float16) for _ in range(2))
        w1, w2 = (RNG.integers(-8, 8, (K, LANES)).astype(np.float16) for _ in range(2))
    s = dt.itemsize
    for name, arr, sl in (("X1", x1, 0), ("W1", w1, 1), ("W2", w2, 2), ("X2", x2, 3)):
        h.input(name, len(arr), dtype, sl)
    h.output("Y", M, acc_dt, 4)
    r = h.cfg.mxm_cycles_per_vector[dtype]
    # plane 0 at pos 0. W1 from slice 1 (pos 3): read at 0, emits 2, install at 2 + 3 = 5.
    h.add("mem.read", 0, unit=1, count=K, addr=0, stride=s, dtype=dtype, dst=W(0))
    h.add("mxm.install", 5, unit=0, buf=0, count=K, dtype=dtype, aux0=N, src0=W(0))
    # second install: the install port is free at 5 + 16 = 21; W2 from slice 2 (pos 4) read at 21 - 2 - 4 = 15
    h.add("mem.read", 15, unit=2, count=K, addr=0, stride=s, dtype=dtype, dst=W(1))
    h.add("mxm.install", 21, unit=0, buf=1, count=K, dtype=dtype, aux0=N, src0=W(1))
    # buffer 0 ready at 5 + 16 + 4 = 25: mul at 25, X1 from slice 0 (pos 2) read at 25 - 2 - 2 = 21
    h.add("mem.read", 21, unit=0, count=M, addr=0, stride=s, dtype=dtype, dst=W(2))
    h.add("mxm.mul", 25, unit=0, buf=0, addr=0, count=M, dtype=dtype, src0=W(2))
    # buffer 1 ready at 21 + 16 + 4 = 41; the compute port is free at 25 + r*M (<= 41 for r <= 4)
    t_mac = max(41, 25 + r * M)
    h.add("mem.read", t_mac - 2 - 5, unit=3, count=M, addr=0, stride=s, dtype=dtype, dst=W(3))
    h.add("mxm.mac", t_mac, unit=0, buf=1, addr=0, count=M, dtype=dtype, src0=W(3))
    # last row lands at t_mac + r*M + 8 - 1; drain reads row k at t_d + k
    t_d = max(t_mac + r * (k + 1) + 7 - k for k in range(M))
    h.add("mxm.drain", t_d, unit=0, addr=0, count=M, dtype=acc_dt, dst=E(0))
    h.add("mem.write", t_d + 2 + 7, unit=4, count=M, addr=0, stride=4, dtype=acc_dt, src0=E(0))
    res = h.run({"X1": x1, "W1": w1, "W2": w2, "X2": x2})
    y = res.outputs["Y"]
    ref = np.zeros((M, LANES))
    ref[:, :N] = f64(x1) @ f64(w1[:, :N]) + f64(x2) @ f64(w2[:, :N])
    assert np.array_equal(f64(y), ref)  # small integers: exact in int32 and in fp32
    assert res.counters.macs == 2 * M * K * N


@covers("mxm.install", "mxm.mul", "mxm.drain")
def test_tsp_full_plane_uint8_exact():
    """tsp: K = 320 rows of 255 * 255 sums to 20,808,000 > 2^24: still exact in int32."""
    h0 = Hand("tsp")
    lanes = h0.lanes
    M, K, N = 4, lanes, lanes
    x = np.full((M, lanes), 255, np.uint8)
    x[1] = RNG.integers(0, 256, lanes)
    x[2, ::2] = 254
    wts = np.full((K, lanes), 255, np.uint8)
    wts[:, 1] = RNG.integers(0, 256, K)
    h, inputs, _ = mxm_program(x, wts, "uint8", "uint8", width=N, plane=2, preset="tsp")
    y = h.run(inputs).outputs["Y"]
    ref = int_matmul_ref(x, wts, K, N, lanes)
    assert ref.max() > 2**24
    assert np.array_equal(y.astype(np.int64), ref)


@covers("mxm.mul")
def test_tsp_int8_matmul():
    h0 = Hand("tsp")
    lanes = h0.lanes
    M, K, N = 3, lanes, 200
    x = RNG.integers(-128, 128, (M, lanes)).astype(np.int8)
    wts = RNG.integers(-128, 128, (K, lanes)).astype(np.int8)
    h, inputs, _ = mxm_program(x, wts, "int8", "int8", width=N, plane=1, preset="tsp")
    y = h.run(inputs).outputs["Y"]
    assert np.array_equal(y.astype(np.int64), int_matmul_ref(x, wts, K, N, lanes))


# =============================================================================
# VXM
# =============================================================================

VXM_CLASS = {
    **dict.fromkeys(["vxm.add", "vxm.sub", "vxm.mul", "vxm.max", "vxm.min"], "vxm_alu"),
    **dict.fromkeys(["vxm.exp", "vxm.tanh", "vxm.sigmoid", "vxm.gelu", "vxm.gelu_tanh", "vxm.erf",
                     "vxm.rsqrt", "vxm.recip"], "vxm_transcendental"),
    **dict.fromkeys(["vxm.cvt", "vxm.requant"], "vxm_convert"),
    **dict.fromkeys(["vxm.reduce_sum", "vxm.reduce_max"], "vxm_reduce"),
}


def run_vxm(op, a, dtype, *, b=None, imm=0.0, to=None, zp=0, width=0, scale=None, alu=3, preset="mini",
            roundtrip=False):
    """a (and b / a per-lane scale vector) -> VXM op -> SRAM; returns the output array.

    Operands come from slices west of the VXM on eastward streams and arrive at the
    VXM position exactly at its issue cycle ``tv``; the result goes one slice east.
    """
    h = Hand(preset)
    L = h.lat
    dt = DType.parse(dtype)
    n = a.shape[0]
    out_dt = DType.parse(to) if to else dt
    pv = h.pos("VXM")
    tv = L["mem_read"] + (pv - h.mem(0)) + 3
    h.input("A", n, dt, 0)
    h.add("mem.read", tv - L["mem_read"] - (pv - h.mem(0)), unit=0, count=n, addr=0, stride=dt.itemsize,
          dtype=dt, dst=E(0))
    inputs = {"A": a}
    kw = {}
    if b is not None:
        h.input("B", n, dt, 1)
        inputs["B"] = b
        h.add("mem.read", tv - L["mem_read"] - (pv - h.mem(1)), unit=1, count=n, addr=0, stride=dt.itemsize,
              dtype=dt, dst=E(1))
        kw["src1"] = E(1)
    if scale is not None:  # one fp32 vector read n times (stride 0)
        h.input("S", 1, "fp32", 2)
        inputs["S"] = scale.reshape(1, -1)
        h.add("mem.read", tv - L["mem_read"] - (pv - h.mem(2)), unit=2, count=n, addr=0, stride=0,
              dtype="fp32", dst=E(2))
        kw["src1"] = E(2)
    if op in ("vxm.add", "vxm.sub", "vxm.mul", "vxm.max", "vxm.min", "vxm.requant") and imm:
        kw["imm"] = imm
    if to:
        kw["out_dtype"] = out_dt
    if op == "vxm.requant":
        kw["aux0"] = zp
    if op.startswith("vxm.reduce"):
        kw["aux0"] = width
    h.add(op, tv, unit=alu, count=n, dtype=dt, src0=E(0), dst=E(3), **kw)
    first_east = h.cfg.mem_slices // 2  # the first slice east of the VXM
    h.output("Y", n, out_dt, first_east)
    t_w = tv + L[VXM_CLASS[op]] + (h.mem(first_east) - pv)
    h.add("mem.write", t_w, unit=first_east, count=n, addr=0, stride=out_dt.itemsize, dtype=out_dt, src0=E(3))
    prog = h.program()
    if roundtrip:
        prog = decode_program(encode_program(prog))
    from lpx_tvm.sim import Simulator
    return Simulator(h.cfg).run(prog, inputs).outputs["Y"]


_F64_BINARY = {"vxm.add": np.add, "vxm.sub": np.subtract, "vxm.mul": np.multiply,
               "vxm.max": np.maximum, "vxm.min": np.minimum}


def float_binary_ref(op, a, b, dtype):
    """Computed exactly (float64 holds every sum/product of these operands closely enough),
    rounded to fp32, then rounded once more to the dtype."""
    with np.errstate(over="ignore", invalid="ignore"):
        return round_to(round_to(_F64_BINARY[op](f64(a), f64(b)), "fp32"), dtype)


def int_binary_ref(op, a, b, dtype):
    py = {"vxm.add": lambda x, y: x + y, "vxm.sub": lambda x, y: x - y, "vxm.mul": lambda x, y: x * y,
          "vxm.max": max, "vxm.min": min}[op]
    bb = np.broadcast_to(np.asarray(b, dtype=object), a.shape)
    exact = np.vectorize(lambda x, y: py(int(x), int(y)), otypes=[object])(a.astype(object), bb)
    if dtype == "int32":
        return wrap_int32(exact.astype(np.int64))
    return clip_int(exact.astype(np.int64), dtype)


BINARY_OPS = ["vxm.add", "vxm.sub", "vxm.mul", "vxm.max", "vxm.min"]


@covers(*BINARY_OPS)
@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_float_binary_stream(op, dtype):
    a = vec(RNG.standard_normal(64) * 100, dtype, 4)
    b = vec(RNG.standard_normal(64) * 100, dtype, 4)
    a[0, :4] = [65504, -65504, 1e-3, 0] if dtype == "fp16" else [3e38, -3e38, 1e-38, 0]
    b[0, :4] = [65504, -65504, 1e-3, -0.0] if dtype == "fp16" else [3e38, -3e38, 1e-38, -0.0]
    assert_same_float(run_vxm(op, a, dtype, b=b), float_binary_ref(op, a, b, dtype), f"{op} {dtype}")


@covers(*BINARY_OPS)
@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize("dtype, imm", [("fp16", 1.5), ("bf16", -0.375), ("fp32", 0.1), ("fp16", 0.1)])
def test_float_binary_imm(op, dtype, imm):
    """The immediate is a float32: for fp16, a*0.1 means a * float32(0.1) rounded to fp32, then fp16."""
    a = vec(RNG.standard_normal(48) * 10, dtype, 3)
    want = float_binary_ref(op, a, np.float32(imm), dtype)
    assert_same_float(run_vxm(op, a, dtype, imm=imm), want, f"{op} {dtype} imm={imm}")


@covers("vxm.mul")
@pytest.mark.parametrize("imm, a_vals", [
    (0.1, [5 * 2.0**-24, 25 * 2.0**-24, 45 * 2.0**-24]),  # fp16 subnormals
    (0.7, [8.732080459594727e-05, 8.851289749145508e-05, 8.970499038696289e-05]),
])
def test_fp16_times_float32_imm_rounds_through_fp32(imm, a_vals):
    """fp16 * float32(imm) is rounded to fp32, then to fp16: for these operands that differs
    from rounding the exact product once (the imm has 24 significant bits, not 11)."""
    a = vec(a_vals, "fp16", 1)
    want = float_binary_ref("vxm.mul", a, np.float32(imm), "fp16")
    direct = round_to(f64(a) * float(np.float32(imm)), "fp16")
    assert not same_float(want[0, :3], direct[0, :3])
    assert_same_float(run_vxm("vxm.mul", a, "fp16", imm=imm), want, f"fp16 * {imm}")


@covers(*BINARY_OPS)
@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32"])
def test_int_binary_stream(op, dtype):
    info = np.iinfo(DType.parse(dtype).np)
    edge = [info.min, info.max, 0, 1, -1 if info.min < 0 else 2, info.max // 2 + 1]
    a = vec(np.concatenate([edge * 2, RNG.integers(info.min, info.max, 52, endpoint=True)]), dtype, 4)
    b = vec(np.concatenate([edge + edge[::-1], RNG.integers(info.min, info.max, 52, endpoint=True)]), dtype, 4)
    out = run_vxm(op, a, dtype, b=b)
    assert out.dtype == a.dtype
    assert np.array_equal(out, int_binary_ref(op, a, b, dtype))


@covers("vxm.add", "vxm.sub", "vxm.mul")
@pytest.mark.parametrize("op, dtype, a_vals, imm, want", [
    ("vxm.add", "int8", [100, 127, -128, 0], 100, [127, 127, -28, 100]),  # saturates
    ("vxm.sub", "int8", [-100, 127, -128, 0], 100, [-128, 27, -128, -100]),
    ("vxm.mul", "int8", [-2, 2, 64, -64], 64, [-128, 127, 127, -128]),
    ("vxm.add", "uint8", [200, 255, 0, 10], 100, [255, 255, 100, 110]),
    ("vxm.sub", "uint8", [10, 255, 0, 200], 20, [0, 235, 0, 180]),
    ("vxm.add", "int32", [2**31 - 1, -(2**31), 5, -1], 1, [-(2**31), -(2**31) + 1, 6, 0]),  # wraps
    ("vxm.mul", "int32", [2**30, 65536, -(2**31), 3], 4, [0, 262144, 0, 12]),
    ("vxm.sub", "int32", [-(2**31), 0, 7, 2**31 - 1], 1, [2**31 - 1, -1, 6, 2**31 - 2]),
])
def test_int_saturation_and_wrap_with_imm(op, dtype, a_vals, imm, want):
    a = vec(a_vals, dtype, 1)
    out = run_vxm(op, a, dtype, imm=imm)
    assert out[0].tolist() == (want * 4)


@covers("vxm.max", "vxm.min")
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_float_max_min_propagate_nan(dtype):
    a = vec([np.nan, 1.0, np.nan, -np.inf, 2.0, -0.5], dtype, 1)
    b = vec([1.0, np.nan, np.nan, np.nan, -3.0, -0.25], dtype, 1)
    for op, want in (("vxm.max", [np.nan, np.nan, np.nan, np.nan, 2.0, -0.25]),
                     ("vxm.min", [np.nan, np.nan, np.nan, np.nan, -3.0, -0.5])):
        got = f64(run_vxm(op, a, dtype, b=b)[0])
        assert_same_float(got, f64(vec(want, dtype, 1)[0]), op)


@covers("vxm.add")
def test_stream_operand_wins_over_imm():
    a = vec(np.arange(16), "int32", 1)
    b = vec(np.arange(16) * 100, "int32", 1)
    h_out = run_vxm("vxm.add", a, "int32", b=b, imm=7)  # both given: b is used
    assert h_out.tolist() == (a + b).tolist()


@covers("vxm.add")
@pytest.mark.parametrize("dtype", ["int32", "fp32"])
def test_imm_is_a_float32(dtype):
    """imm = 16777217 is not a float32: the instruction means 16777216, before and after encoding."""
    a = vec(np.arange(16), dtype, 1)
    want = (np.arange(16) + 16777216).astype(DType.parse(dtype).np)
    for roundtrip in (False, True):
        got = run_vxm("vxm.add", a, dtype, imm=16777217.0, roundtrip=roundtrip)
        assert got[0].tolist() == want.tolist()


@covers("vxm.max", "vxm.min")
def test_int_max_min_imm():
    a = vec([-128, -5, 0, 5, 127], "int8", 1)
    assert run_vxm("vxm.max", a, "int8", imm=0)[0].tolist() == np.maximum(a[0].astype(int), 0).tolist()
    assert run_vxm("vxm.min", a, "int8", imm=-3)[0].tolist() == np.minimum(a[0].astype(int), -3).tolist()


@HYP
@given(a=hnp.arrays(np.uint16, (2, LANES)), b=hnp.arrays(np.uint16, (2, LANES)), op=st.sampled_from(BINARY_OPS))
def test_fp16_binary_random(a, b, op):
    """Any fp16 bit patterns: subnormals, infinities, NaNs."""
    a, b = a.view(np.float16), b.view(np.float16)
    assert_same_float(run_vxm(op, a, "fp16", b=b), float_binary_ref(op, a, b, "fp16"), op)


@HYP
@given(a=hnp.arrays(np.float32, (2, LANES), elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
       b=hnp.arrays(np.float32, (2, LANES), elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
       op=st.sampled_from(["vxm.add", "vxm.mul", "vxm.sub"]))
def test_bf16_binary_random(a, b, op):
    a, b = a.astype(BF16), b.astype(BF16)
    assert_same_float(run_vxm(op, a, "bf16", b=b), float_binary_ref(op, a, b, "bf16"), op)


@HYP
@given(a=hnp.arrays(np.int8, (2, LANES)), b=hnp.arrays(np.int8, (2, LANES)), op=st.sampled_from(BINARY_OPS))
def test_int8_binary_random(a, b, op):
    assert np.array_equal(run_vxm(op, a, "int8", b=b), int_binary_ref(op, a, b, "int8"))


@HYP
@given(a=hnp.arrays(np.int32, (2, LANES)), b=hnp.arrays(np.int32, (2, LANES)),
       op=st.sampled_from(["vxm.add", "vxm.sub", "vxm.mul"]))
def test_int32_binary_random(a, b, op):
    assert np.array_equal(run_vxm(op, a, "int32", b=b), int_binary_ref(op, a, b, "int32"))


# ---- transcendental ------------------------------------------------------------

def _phi(x):
    return special.ndtr(x)  # standard normal CDF


UNARY_REF = {
    "vxm.exp": lambda x: np.array([math.exp(v) if v < 709 else math.inf for v in x.ravel()]).reshape(x.shape),
    "vxm.tanh": lambda x: np.vectorize(math.tanh)(x),
    "vxm.sigmoid": lambda x: np.array([1.0 / (1.0 + math.exp(-v)) if v > -709 else 0.0
                                       for v in x.ravel()]).reshape(x.shape),
    "vxm.gelu": lambda x: x * _phi(x),
    # 0.5 * x * (1 + tanh(y)) == x / (1 + exp(-2y)), without the cancellation for x < 0
    "vxm.gelu_tanh": lambda x: np.array([v / (1.0 + math.exp(min(709.0, -2.0 * math.sqrt(2.0 / math.pi)
                                                                 * (v + 0.044715 * v * v * v))))
                                         for v in x.ravel()]).reshape(x.shape),
    "vxm.erf": lambda x: np.vectorize(math.erf)(x),
    "vxm.rsqrt": lambda x: np.array([(1.0 / math.sqrt(v)) if v > 0 else
                                     (math.copysign(math.inf, v) if v == 0 else math.nan)
                                     for v in x.ravel()]).reshape(x.shape),
    "vxm.recip": lambda x: np.array([1.0 / v if v != 0 else math.copysign(math.inf, v)
                                     for v in x.ravel()]).reshape(x.shape),
}

UNARY_OPS = list(UNARY_REF)


def unary_inputs(op, dtype):
    if op in ("vxm.rsqrt",):
        vals = np.concatenate([[0.0, 1.0, 4.0, 0.25, 3.0, 1e-3, 1e3, -1.0],
                               np.abs(RNG.standard_normal(40)) * 10])
    elif op == "vxm.recip":
        vals = np.concatenate([[0.0, -0.0, 1.0, -3.0, 7.0, 1e-3, 1e4, 0.1], RNG.standard_normal(40) * 10])
    elif op == "vxm.exp":
        vals = np.concatenate([[0.0, 1.0, -1.0, 11.0, 12.0, -20.0, 88.0, 89.0], RNG.standard_normal(40) * 4])
    else:  # -5 .. -10: where 1 + erf(x) or 1 + tanh(x) would cancel
        vals = np.concatenate([[0.0, -0.0, 1.0, -1.0, 6.0, -6.0, 30.0, -30.0, -5.0, -7.5, -8.0, -10.0, -3.3],
                               RNG.standard_normal(35) * 3])
    return vec(vals, dtype, 3)


@covers(*UNARY_OPS)
@pytest.mark.parametrize("op", UNARY_OPS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_transcendental(op, dtype):
    a = unary_inputs(op, dtype)
    with np.errstate(all="ignore"):
        want = round_to(UNARY_REF[op](f64(a)), dtype)
    assert_same_float(run_vxm(op, a, dtype), want, f"{op} {dtype}")


@HYP
@given(a=hnp.arrays(np.float16, (1, LANES), elements=st.floats(-12, 12, width=16)),
       op=st.sampled_from(["vxm.exp", "vxm.tanh", "vxm.sigmoid", "vxm.gelu", "vxm.erf"]),
       dtype=st.sampled_from(["fp16", "bf16", "fp32"]))
def test_transcendental_random(a, op, dtype):
    a = a.astype(DType.parse(dtype).np)
    with np.errstate(all="ignore"):
        want = round_to(UNARY_REF[op](f64(a)), dtype)
    assert_same_float(run_vxm(op, a, dtype), want, f"{op} {dtype}")


# ---- conversions ----------------------------------------------------------------

CVT_VALUES = {
    "int8": [-128, -127, -1, 0, 1, 2, 100, 127],
    "uint8": [0, 1, 2, 127, 128, 200, 254, 255],
    "int32": [-(2**31), 2**31 - 1, -129, 128, 256, -300, 2049, 2051, 65504, 65519, 65520, 70000,
              16777217, 16842753, -16842753, 33554435],
    "fp16": [2.5, 3.5, -2.5, -3.5, 0.5, 1.5, -0.5, 127.5, 128.5, -128.5, -129.0, 255.5, 256.0, -1e4, 65504.0,
             np.inf, -np.inf, np.nan, -0.0, 6e-8, 1000.5],
    "bf16": [2.5, 3.5, -2.5, 0.5, -0.5, 127.5, 128.0, -129.0, 255.0, 3e38, -3e38, 1e-40, np.nan, np.inf,
             -np.inf, 1.5, 65536.0, 2.0**31, -(2.0**31) - 2**24],
    "fp32": [2.5, 3.5, -2.5, -3.5, 0.49999997, 1e10, -1e10, 2147483520.0, 65520.0, 65519.99, 1 + 2**-11,
             1 + 3 * 2**-11, 1 + 2**-8, 1 + 2**-8 + 2**-20, 1 + 3 * 2**-8, np.nan, np.inf, -np.inf, 1e-45,
             3.4e38, -3.39e38, 6.1e-5, 2.0**-24 * 1.5, 127.5, 255.5, -128.5],
}
DTYPES = list(CVT_VALUES)


def round_half_even_int(v: float) -> int:
    return int(round(v))  # Python rounds floats half to even


def cvt_ref(a, src, dst):
    s, d = DType.parse(src), DType.parse(dst)
    if d.is_float:
        return round_to(f64(a), d)  # int32 -> f64 is exact, so this is a single rounding
    info = np.iinfo(d.np)
    out = []
    for v in f64(a).ravel() if s.is_float else a.astype(np.int64).ravel():
        if s.is_float:
            if math.isnan(v):
                v = 0
            elif math.isinf(v):
                v = info.max if v > 0 else info.min
            else:
                v = round_half_even_int(v)
        out.append(min(max(int(v), info.min), info.max))
    return np.array(out, np.int64).reshape(a.shape).astype(d.np)


@covers("vxm.cvt")
@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_cvt(src, dst):
    with np.errstate(all="ignore"):
        a = vec(CVT_VALUES[src], src)
    out = run_vxm("vxm.cvt", a, src, to=dst)
    want = cvt_ref(a, src, dst)
    if DType.parse(dst).is_float:
        assert_same_float(out, want, f"cvt {src}->{dst}")
    else:
        assert out.dtype == want.dtype and out.tolist() == want.tolist(), (a, out, want)


@covers("vxm.cvt")
def test_cvt_round_half_even_examples():
    a = vec([2.5, 3.5, -2.5, -3.5, 0.5, 1.5, -0.5, -1.5], "fp32", 1)
    assert run_vxm("vxm.cvt", a, "fp32", to="int32")[0].tolist() == [2, 4, -2, -4, 0, 2, 0, -2] * 2
    assert run_vxm("vxm.cvt", a, "fp32", to="int8")[0].tolist() == [2, 4, -2, -4, 0, 2, 0, -2] * 2
    sat = vec([300.0, -300.0, np.nan, np.inf, -np.inf, 254.5, 255.5, -0.5], "fp32", 1)
    assert run_vxm("vxm.cvt", sat, "fp32", to="int8")[0].tolist() == [127, -128, 0, 127, -128, 127, 127, 0] * 2
    assert run_vxm("vxm.cvt", sat, "fp32", to="uint8")[0].tolist() == [255, 0, 0, 255, 0, 254, 255, 0] * 2


@covers("vxm.cvt")
def test_cvt_fp32_to_half_rounds_to_nearest_even():
    one = 1.0
    a = vec([one + 2**-11, one + 3 * 2**-11, one + 2**-11 + 2**-20, 65519.0, 65520.0, 2.0**-25, 2.0**-25 * 1.5,
             one + 2**-8, one + 3 * 2**-8, one + 2**-8 + 2**-20, 3.3961e38, 3.3962e38, -0.0, 2.0**-134,
             2.0**-133 * 1.5, 1e-45], "fp32", 1)
    fp16 = run_vxm("vxm.cvt", a, "fp32", to="fp16")[0]
    assert f64(fp16[:7]).tolist() == [1.0, 1 + 2**-9, 1 + 2**-10, 65504.0, np.inf, 0.0, 2.0**-24]
    bf16 = run_vxm("vxm.cvt", a, "fp32", to="bf16")[0]
    assert f64(bf16[7:10]).tolist() == [1.0, 1 + 2**-6, 1 + 2**-7]
    assert_same_float(bf16, round_to(f64(a[0]), "bf16"), "fp32 -> bf16")
    assert_same_float(fp16, round_to(f64(a[0]), "fp16"), "fp32 -> fp16")


@covers("vxm.cvt")
def test_cvt_int32_to_bf16_rounds_once():
    """16842753 = 2^24 + 2^16 + 1 is just above the midpoint of two bf16 neighbours.
    Rounding once gives 2^24 + 2^17; rounding through fp32 first would land exactly on the
    midpoint and tie to 2^24."""
    a = vec([16842753, -16842753, 2**24 + 2**16, 2**24 + 3 * 2**16], "int32", 1)
    out = f64(run_vxm("vxm.cvt", a, "int32", to="bf16")[0, :4])
    assert out.tolist() == [2**24 + 2**17, -(2**24 + 2**17), 2**24, 2**24 + 2**18]


@HYP
@given(a=hnp.arrays(np.float32, (2, LANES), elements=st.floats(width=32)),
       dst=st.sampled_from(["int8", "uint8", "int32", "fp16", "bf16"]))
def test_cvt_fp32_random(a, dst):
    out = run_vxm("vxm.cvt", a, "fp32", to=dst)
    want = cvt_ref(a, "fp32", dst)
    if DType.parse(dst).is_float:
        assert_same_float(out, want, dst)
    else:
        assert out.tolist() == want.tolist()


# ---- requant ---------------------------------------------------------------------

def requant_ref(a, scale, zp, out):
    info = np.iinfo(DType.parse(out).np)
    s = np.broadcast_to(f64(scale), a.shape)
    vals = [min(max(round_half_even_int(float(x) * float(sc)) + zp, info.min), info.max)
            for x, sc in zip(a.astype(np.int64).ravel(), s.ravel())]
    return np.array(vals).reshape(a.shape).astype(DType.parse(out).np)


@covers("vxm.requant")
@pytest.mark.parametrize("out, zp", [("int8", 0), ("int8", -5), ("uint8", 128), ("uint8", 0)])
def test_requant_imm(out, zp):
    a = vec(np.concatenate([[0, 5, 10, 15, -5, -15, 25, 35, 2**31 - 1, -(2**31), 2540, -2540, 1270, -1290,
                              30, 50], RNG.integers(-3000, 3000, 32)]), "int32", 3)
    scale = 0.1  # not a float32: the instruction holds float32(0.1)
    got = run_vxm("vxm.requant", a, "int32", to=out, imm=scale, zp=zp)
    assert got.dtype == DType.parse(out).np
    assert got.tolist() == requant_ref(a, np.float32(scale), zp, out).tolist()


@covers("vxm.requant")
def test_requant_imm_half_even_ties():
    a = vec([5, 15, 25, -5, -15, -25, 35, 45], "int32", 1)
    got = run_vxm("vxm.requant", a, "int32", to="int8", imm=0.5)  # x.5 ties, exact
    assert got[0, :8].tolist() == [2, 8, 12, -2, -8, -12, 18, 22]


@covers("vxm.requant")
def test_requant_same_result_after_encoding():
    """The binary stores imm as float32: a program must compute the same before and after."""
    a = vec([5, 15, 25, -5, 35, -35, 45, 55], "int32", 1)  # x * 0.1 lands on the float64 tie 0.5
    direct = run_vxm("vxm.requant", a, "int32", to="int8", imm=0.1)
    decoded = run_vxm("vxm.requant", a, "int32", to="int8", imm=0.1, roundtrip=True)
    assert direct.tolist() == decoded.tolist()


@covers("vxm.requant")
@pytest.mark.parametrize("out, zp", [("int8", 3), ("uint8", 100)])
def test_requant_per_lane_scale(out, zp):
    a = vec(RNG.integers(-5000, 5000, 64), "int32", 4)
    scale = (np.abs(RNG.standard_normal(LANES)) * 0.05).astype(np.float32)
    scale[0] = 0.5
    scale[1] = 1e-9
    got = run_vxm("vxm.requant", a, "int32", to=out, scale=scale, zp=zp)
    assert got.tolist() == requant_ref(a, scale[None, :], zp, out).tolist()


# ---- reductions ---------------------------------------------------------------------

@covers("vxm.reduce_sum", "vxm.reduce_max")
@pytest.mark.parametrize("width", [1, 5, 16])
@pytest.mark.parametrize("dtype", ["int32", "fp16", "bf16", "fp32"])
def test_reduce(width, dtype):
    dt = DType.parse(dtype)
    if dt.is_int:
        a = vec(RNG.integers(-10**6, 10**6, 64), dtype, 4)
    else:  # small integers and halves: every partial sum is exact in fp32
        a = vec(RNG.integers(-64, 64, 64) / 2, dtype, 4)
    a[0, width:] = 1000  # lanes past the width must not count
    s = run_vxm("vxm.reduce_sum", a, dtype, width=width)
    m = run_vxm("vxm.reduce_max", a, dtype, width=width)
    for k in range(a.shape[0]):
        part = [float(v) if dt.is_float else int(v) for v in a[k, :width]]
        want_sum = sum(part)
        assert [float(v) for v in s[k]] == [float(round_to(want_sum, dt)) if dt.is_float else want_sum] * LANES
        assert [float(v) for v in m[k]] == [max(part)] * LANES


@covers("vxm.reduce_sum")
def test_reduce_sum_int32_wraps():
    a = vec([2**31 - 1, 1, 2**31 - 1, 2**31 - 1], "int32", 1)
    assert run_vxm("vxm.reduce_sum", a, "int32", width=2)[0].tolist() == [-(2**31)] * LANES
    # 3 * (2^31 - 1) + 1 = 2^32 + 2^31 - 2 wraps to 2^31 - 2
    assert run_vxm("vxm.reduce_sum", a, "int32", width=4)[0].tolist() == [2**31 - 2] * LANES


@covers("vxm.reduce_max")
def test_reduce_max_int8():
    a = vec([-128, -7, -3, 5, 100, -1, 127], "int8", 1)
    assert run_vxm("vxm.reduce_max", a, "int8", width=4)[0].tolist() == [5] * LANES
    assert run_vxm("vxm.reduce_max", a, "int8", width=3)[0].tolist() == [-3] * LANES


@covers("vxm.add", "vxm.exp", "vxm.cvt")
def test_tsp_vxm_ops():
    lanes = Hand("tsp").lanes
    a = (RNG.standard_normal((3, lanes)) * 4).astype(np.float16)
    b = (RNG.standard_normal((3, lanes)) * 4).astype(np.float16)
    assert_same_float(run_vxm("vxm.add", a, "fp16", b=b, preset="tsp", alu=15),
                      float_binary_ref("vxm.add", a, b, "fp16"), "tsp add")
    assert_same_float(run_vxm("vxm.exp", a, "fp16", preset="tsp"), round_to(np.exp(f64(a)), "fp16"), "tsp exp")
    got = run_vxm("vxm.cvt", a, "fp16", to="int8", preset="tsp")
    assert got.tolist() == cvt_ref(a, "fp16", "int8").tolist()


# =============================================================================
# SXM
# =============================================================================

def run_sxm(op, a, dtype, *, unit=0, by=0, table=None, out=0, lane=0, before=0, width=0):
    """a -> SXM op -> SRAM. SXM0 (pos 1) takes a westward stream from slice 0 (pos 2) and sends
    its result east to slice 1 (pos 3); SXM1 (pos 11) mirrors that with slices 7 and 6."""
    h = Hand()
    L, dt = h.lat, DType.parse(dtype)
    n = a.shape[0]
    src, dst_slice = (0, 1) if unit == 0 else (7, 6)
    to_sxm, from_sxm = (W, E) if unit == 0 else (E, W)
    ps = h.pos("SXM", unit)
    assert (h.mem(src), h.mem(dst_slice)) == ((2, 3) if unit == 0 else (10, 9))
    h.input("A", n, dt, src)
    t_s = L["mem_read"] + 1  # one hop from the slice to the SXM
    h.add("mem.read", 0, unit=src, count=n, addr=0, stride=dt.itemsize, dtype=dt, dst=to_sxm(0))
    aux0 = {"sxm.shift": by, "sxm.rotate": by, "sxm.transpose": out, "sxm.broadcast": lane,
            "sxm.pad": before}.get(op, 0)
    if op == "sxm.permute":
        aux0 = h.table(table)
    h.add(op, t_s, unit=unit, count=n, dtype=dt, aux0=aux0, aux1=width if op == "sxm.pad" else 0,
          src0=to_sxm(0), dst=from_sxm(1))
    n_out = out if op == "sxm.transpose" else n
    emit = t_s + (n + L["sxm_transpose"] if op == "sxm.transpose" else L["sxm"])
    assert abs(h.mem(dst_slice) - ps) == 2
    h.output("Y", n_out, dt, dst_slice)
    h.add("mem.write", emit + 2, unit=dst_slice, count=n_out, addr=0, stride=dt.itemsize, dtype=dt,
          src0=from_sxm(1))
    return h.run({"A": a}).outputs["Y"]


def sxm_inputs(dtype="int32", rows=3):
    return vec(np.arange(rows * LANES) + 1, dtype, rows)


@covers("sxm.shift")
@pytest.mark.parametrize("by", [0, 1, 5, 15, 16, 40, -1, -7, -16])
@pytest.mark.parametrize("unit", [0, 1])
def test_shift(by, unit):
    a = sxm_inputs()
    want = np.zeros_like(a)
    for j in range(LANES):
        if 0 <= j - by < LANES:
            want[:, j] = a[:, j - by]
    assert np.array_equal(run_sxm("sxm.shift", a, "int32", by=by, unit=unit), want)


@covers("sxm.rotate")
@pytest.mark.parametrize("by", [0, 1, 3, 15, 16, 17, -1, -5])
def test_rotate(by):
    a = sxm_inputs("fp16")
    want = np.array([[a[i, (j - by) % LANES] for j in range(LANES)] for i in range(a.shape[0])], np.float16)
    assert_same_float(run_sxm("sxm.rotate", a, "fp16", by=by), want, "rotate")


@covers("sxm.permute")
def test_permute_with_zero_entries():
    a = sxm_inputs("int8")
    table = [15, 0, -1, 3, 3, 7, -1, 1, 2, 14, 13, 12, 11, -1, 9, 8]
    want = np.array([[a[i, t] if t >= 0 else 0 for t in table] for i in range(a.shape[0])], np.int8)
    assert np.array_equal(run_sxm("sxm.permute", a, "int8", table=table, unit=1), want)


@covers("sxm.transpose")
@pytest.mark.parametrize("n, out", [(16, 16), (5, 16), (16, 3), (7, 9), (1, 1)])
def test_transpose(n, out):
    a = vec(RNG.integers(-1000, 1000, n * LANES), "int32", n)
    want = np.zeros((out, LANES), np.int32)
    for i in range(n):
        for j in range(out):
            want[j, i] = a[i, j]
    assert np.array_equal(run_sxm("sxm.transpose", a, "int32", out=out), want)


@covers("sxm.broadcast")
@pytest.mark.parametrize("lane", [0, 6, 15])
def test_broadcast(lane):
    a = sxm_inputs("bf16")
    want = np.repeat(a[:, lane:lane + 1], LANES, axis=1)
    assert_same_float(run_sxm("sxm.broadcast", a, "bf16", lane=lane, unit=1), want, "broadcast")


@covers("sxm.pad")
@pytest.mark.parametrize("before, width", [(0, 16), (2, 5), (4, 16), (0, 3), (15, 4), (16, 2), (3, 0)])
def test_pad(before, width):
    a = sxm_inputs("int32")
    want = np.zeros_like(a)
    for j in range(LANES):
        if before <= j < before + width:
            want[:, j] = a[:, j - before]
    assert np.array_equal(run_sxm("sxm.pad", a, "int32", before=before, width=width), want)


# =============================================================================
# C2C, nops, sync
# =============================================================================

def c2c_cycles_per_vector(h, dtype):
    return math.ceil(h.lanes * DType.parse(dtype).itemsize * h.cfg.clock_hz / h.cfg.c2c_bytes_per_s)


@covers("c2c.send", "c2c.recv")
@pytest.mark.parametrize("dtype, link", [("int8", 0), ("fp32", 3), ("bf16", 1)])
def test_c2c_loopback(dtype, link):
    h = Hand()
    n = 6
    x = vec(RNG.integers(-100, 100, n * LANES), dtype, n)
    h.input("X", n, dtype, 0)
    h.output("Y", n, dtype, 4)
    s = DType.parse(dtype).itemsize
    # slice 0 (pos 2) -> VXM/C2C position 6: read at 0, emits 2, send at 6
    h.add("mem.read", 0, unit=0, count=n, addr=0, stride=s, dtype=dtype, dst=E(0))
    h.add("c2c.send", 6, unit=link, count=n, dtype=dtype, src0=E(0))
    arrival = 6 + n * c2c_cycles_per_vector(h, dtype) + h.cfg.c2c_latency
    # recv emits at arrival + 1 at pos 6; slice 4 at pos 7
    h.add("c2c.recv", arrival, unit=link, count=n, dtype=dtype, dst=E(1))
    h.add("mem.write", arrival + 2, unit=4, count=n, addr=0, stride=s, dtype=dtype, src0=E(1))
    r = h.run({"X": x})
    assert np.array_equal(r.outputs["Y"].view(np.uint8), x.view(np.uint8))
    assert r.counters.c2c_bytes_sent == x.nbytes


@covers("c2c.send", "c2c.recv")
def test_c2c_messages_split_and_joined():
    """Two sends received by one recv, then one send received by two recvs, in FIFO order."""
    h = Hand()
    x = vec(np.arange(8 * LANES) - 60, "int8", 8)
    h.input("X", 8, "int8", 0)
    h.output("Y", 8, "int8", 4)
    cpv = c2c_cycles_per_vector(h, "int8")  # ceil(16 B / 15.56 B per cycle) = 2
    assert cpv == 2
    h.add("mem.read", 0, unit=0, count=3, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("c2c.send", 6, unit=2, count=3, dtype="int8", src0=E(0))
    # the tx port is busy 3 * 2 = 6 cycles: the second send at 12, its data read at 12 - 2 - 4 = 6
    h.add("mem.read", 6, unit=0, count=5, addr=3, stride=1, dtype="int8", dst=E(1))
    h.add("c2c.send", 12, unit=2, count=5, dtype="int8", src0=E(1))
    second = 12 + 5 * 2 + 450  # arrival of the second message: 472
    h.add("c2c.recv", second, unit=2, count=4, dtype="int8", dst=E(2))  # 3 of msg 1 + 1 of msg 2
    h.add("c2c.recv", second + 4, unit=2, count=4, dtype="int8", dst=E(3))  # the remaining 4
    h.add("mem.write", second + 2, unit=4, count=4, addr=0, stride=1, dtype="int8", src0=E(2))
    h.add("mem.write", second + 6, unit=4, count=4, addr=4, stride=1, dtype="int8", src0=E(3))
    assert np.array_equal(h.run({"X": x}).outputs["Y"], x)


NOP_QUEUES = {"mem.nop": 2, "dma.nop": 0, "mxm.nop": 1, "vxm.nop": 7, "sxm.nop": 1, "c2c.nop": 3}
NOP_PORTS = {"mem.nop": ["mem2.rd", "mem2.wr"], "dma.nop": ["dma0"],
             "mxm.nop": [f"mxm1.install{k}" for k in range(4)] + ["mxm1.compute", "mxm1.drain"], "vxm.nop": ["vxm7"],
             "sxm.nop": ["sxm1"], "c2c.nop": ["c2c3.tx", "c2c3.rx"]}


@covers(*NOP_QUEUES)
@pytest.mark.parametrize("op", list(NOP_QUEUES))
def test_nop_holds_every_port_and_changes_nothing(op):
    h = Hand()
    x = vec(np.arange(LANES), "int32", 1)
    h.input("X", 1, "int32", 0)
    h.output("X_out", 1, "int32", 0)  # same place: a nop must leave SRAM alone
    h.add(op, 10, unit=NOP_QUEUES[op], count=7)
    r = h.run({"X": x})
    assert np.array_equal(r.outputs["X_out"], x)
    assert r.cycles == 17
    assert dict(r.counters.port_busy_cycles) == {p: 7 for p in NOP_PORTS[op]}
    assert r.counters.macs == r.counters.sram_bytes_read == r.counters.sram_bytes_written == 0


@covers("icu.sync")
def test_sync_after_everything_completed():
    h = Hand()
    x = vec(np.arange(LANES), "fp32", 1)
    h.input("X", 1, "fp32", 0)
    h.output("Y", 1, "fp32", 4)
    h.add("mem.read", 0, unit=0, count=1, addr=0, stride=4, dtype="fp32", dst=E(0))
    h.add("vxm.exp", 6, unit=0, count=1, dtype="fp32", src0=E(0), dst=E(1))
    h.add("mem.write", 13, unit=4, count=1, addr=0, stride=4, dtype="fp32", src0=E(1))
    # the write lands at 13 + 2 = 15: a sync at 15 sees nothing in flight
    h.add("icu.sync", 15)
    h.add("mem.read", 15, unit=4, count=1, addr=0, stride=4, dtype="fp32", dst=W(0))
    # slice 4 (pos 7) -> slice 0 (pos 2): emits at 17, 5 hops west: write at 22, lands at 24
    h.add("mem.write", 22, unit=0, count=1, addr=0, stride=4, dtype="fp32", src0=W(0))
    r = h.run({"X": x})
    assert_same_float(r.outputs["Y"], round_to(np.exp(f64(x)), "fp32"), "exp")
    assert r.cycles == 24


# =============================================================================

def test_every_opcode_is_tested():
    assert TESTED == set(OPS), sorted(set(OPS) ^ TESTED)


# =============================================================================
# The same opcodes in programs scheduled by ProgramBuilder
# =============================================================================

def builder_run(b, inputs):
    from lpx_tvm.sim import Simulator
    prog = b.build()
    full = Simulator(b.config).run(prog, inputs)
    timed = Simulator(b.config).run(prog, timing_only=True)
    assert full.counters.to_json() == timed.counters.to_json()
    return full, prog


@covers("sxm.permute", "vxm.mul", "vxm.cvt")
def test_builder_permute_scale_convert():
    from lpx_tvm.target.builder import ProgramBuilder
    b = ProgramBuilder("mini")
    x = b.input("x", (40, 16), "fp16")
    y = b.output("y", (40, 16), "int8")
    table = [(7 * j) % 16 for j in range(16)]
    table[5] = -1
    t = b.table(table)
    g = b.group("perm")
    v = g.sxm("sxm.permute", g.read(x.tile(0)), map=t)
    g.write(g.vxm("vxm.cvt", g.vxm("vxm.mul", v, imm=3.0), to="int8"), y.tile(0))
    data = (RNG.standard_normal((40, 16)) * 20).astype(np.float16)
    r, _ = builder_run(b, {"x": data})
    perm = np.array([[row[j] if j >= 0 else 0 for j in table] for row in f64(data)])
    scaled = round_to(round_to(perm * 3.0, "fp32"), "fp16")
    assert r.outputs["y"].tolist() == cvt_ref(scaled, "fp16", "int8").tolist()


@covers("mem.gather")
def test_builder_gather_rows():
    from lpx_tvm.target.builder import ProgramBuilder
    b = ProgramBuilder("mini")
    tbl_data = RNG.standard_normal((30, 16)).astype(np.float32)
    tbl = b.constant("tbl", tbl_data, "fp32")
    idx = b.input("idx", (12, 16), "int32")
    y = b.output("y", (12, 16), "fp32")
    g = b.group("gather")
    g.write(g.gather(g.read(idx.tile(0)), tbl.tile(0)), y.tile(0))
    ids = np.zeros((12, 16), np.int32)
    ids[:, 0] = RNG.integers(0, 30, 12)
    r, _ = builder_run(b, {"idx": ids})
    assert np.array_equal(r.outputs["y"], tbl_data[ids[:, 0]])


@covers("dma.load", "dma.store", "icu.sync")
def test_builder_dma_round_trip():
    from lpx_tvm.target.builder import ProgramBuilder
    b = ProgramBuilder("mini")
    data = RNG.integers(-1000, 1000, (6, 16)).astype(np.int32)
    host = b.host_buffer(data)
    spare = b.host_buffer(np.zeros_like(data))
    stage = b.tensor("stage", (6, 16), "int32")
    y = b.output("y", (6, 16), "int32")
    g = b.group("load")
    g.dma_load(host, stage.tile(0))
    g = b.group("store")
    g.dma_store(stage.tile(0), spare)
    b.sync()
    g = b.group("reload")
    g.dma_load(spare, y.tile(0))
    r, prog = builder_run(b, {})
    assert np.array_equal(r.outputs["y"], data)
    d = 900 + math.ceil(6 * 64 / (32e9 / 900e6))  # 384 B -> 900 + 11
    assert sorted((i.cycle, i.op) for i in prog.instrs) == [(0, "dma.load"), (d, "dma.store"),
                                                            (2 * d, "dma.load"), (2 * d, "icu.sync")]
    assert r.cycles == 3 * d


@covers("c2c.send", "c2c.recv")
def test_builder_c2c_loopback():
    from lpx_tvm.target.builder import ProgramBuilder
    b = ProgramBuilder("mini")
    x = b.input("x", (5, 16), "bf16")
    y = b.output("y", (5, 16), "bf16")
    g = b.group("send")
    g.send(2, g.read(x.tile(0)))
    g = b.group("recv")
    g.write(g.recv(2, 5, "bf16"), y.tile(0))
    data = RNG.standard_normal((5, 16)).astype(BF16)
    r, _ = builder_run(b, {"x": data})
    assert_same_float(r.outputs["y"], data, "c2c")


@covers("mxm.install", "mxm.mul", "mxm.mac", "mxm.drain", "vxm.requant")
def test_builder_k_split_matmul_requant():
    """C = requant(A[:, :16] @ B[:16] + A[:, 16:] @ B[16:]) on plane 1 with both weight buffers."""
    from lpx_tvm.target.builder import ProgramBuilder
    b = ProgramBuilder("mini")
    M, K, N = 20, 32, 16
    A = b.input("A", (M, K), "int8")
    B = b.input("B", (K, N), "int8")
    C = b.output("C", (M, N), "int8")
    for kt in range(2):
        g = b.group("install")
        g.install(1, kt, g.read(B.tile(0).rows(16 * kt, 16 * kt + 16)), width=N)
    for kt in range(2):
        g = b.group("mul")
        g.mul(1, kt, g.read(A.tile(kt)), acc=0, accumulate=kt > 0)
    g = b.group("out")
    g.write(g.vxm("vxm.requant", g.drain(1, 0, M, "int32"), imm=0.01, to="int8", zp=-3), C.tile(0))
    a = RNG.integers(-128, 128, (M, K)).astype(np.int8)
    w = RNG.integers(-128, 128, (K, N)).astype(np.int8)
    r, _ = builder_run(b, {"A": a, "B": w})
    acc = a.astype(np.int64) @ w.astype(np.int64)
    assert r.outputs["C"].tolist() == requant_ref(acc, np.float32(0.01), -3, "int8").tolist()
    assert r.counters.macs == M * K * N


@covers("sxm.transpose", "sxm.broadcast", "sxm.pad", "sxm.rotate", "sxm.shift", "vxm.reduce_max")
def test_builder_sxm_chain():
    from lpx_tvm.target.builder import ProgramBuilder
    b = ProgramBuilder("mini")
    x = b.input("x", (16, 16), "int32")
    t = b.output("t", (16, 16), "int32")
    y = b.output("y", (16, 16), "int32")
    z = b.output("z", (16, 16), "int32")
    g = b.group("transpose")
    g.write(g.sxm("sxm.transpose", g.read(x.tile(0)), out=16), t.tile(0))
    g = b.group("chain")  # SXM0 -> SXM1 -> SXM0: each op on a free unit
    v = g.sxm("sxm.pad", g.read(x.tile(0)), unit=0, before=2, width=10)
    v = g.sxm("sxm.rotate", v, unit=1, by=-1)
    g.write(g.sxm("sxm.shift", v, unit=0, by=3), y.tile(0))
    g = b.group("bmax")
    g.write(g.sxm("sxm.broadcast", g.vxm("vxm.reduce_max", g.read(x.tile(0)), width=7), lane=4), z.tile(0))
    data = RNG.integers(-10**6, 10**6, (16, 16)).astype(np.int32)
    r, _ = builder_run(b, {"x": data})
    assert np.array_equal(r.outputs["t"], data.T)
    padded = np.zeros_like(data)
    padded[:, 2:12] = data[:, :10]
    rot = np.roll(padded, -1, axis=1)
    shifted = np.zeros_like(rot)
    shifted[:, 3:] = rot[:, :13]
    assert np.array_equal(r.outputs["y"], shifted)
    assert np.array_equal(r.outputs["z"], np.repeat(data[:, :7].max(axis=1, keepdims=True), 16, axis=1))


@covers("mxm.mul", "mxm.drain")
@pytest.mark.parametrize("dtype", ["fp16", "int8"])
def test_same_activations_through_weights_of_different_k(dtype):
    """One SRAM region multiplied twice, by 16-row weights and by 12-row weights."""
    h = Hand()
    dt = DType.parse(dtype)
    acc = DType.INT32 if dt.is_int else DType.FP32
    s = dt.itemsize
    r = h.cfg.mxm_cycles_per_vector[dtype]
    x = RNG.integers(-8, 8, (4, LANES)).astype(dt.np)
    w1 = RNG.integers(-8, 8, (16, LANES)).astype(dt.np)
    w2 = RNG.integers(-8, 8, (12, LANES)).astype(dt.np)
    h.input("X", 4, dtype, 0)
    h.input("W1", 16, dtype, 1)
    h.input("W2", 12, dtype, 2)
    h.output("Y1", 4, acc, 4)
    h.output("Y2", 4, acc, 5)
    # W1: slice 1 (pos 3) -> plane 0 (pos 0): install at 5, ready at 25.
    h.add("mem.read", 0, unit=1, count=16, addr=0, stride=s, dtype=dtype, dst=W(0))
    h.add("mxm.install", 5, unit=0, buf=0, count=16, dtype=dtype, aux0=16, src0=W(0))
    # W2: slice 2 (pos 4) read at 15, install at 21 (port free), ready at 21 + 12 + 4 = 37.
    h.add("mem.read", 15, unit=2, count=12, addr=0, stride=s, dtype=dtype, dst=W(1))
    h.add("mxm.install", 21, unit=0, buf=1, count=12, dtype=dtype, aux0=16, src0=W(1))
    # X read twice from slice 0 (pos 2): mul at 25 into rows 0..3, mul at t2 into rows 8..11
    h.add("mem.read", 21, unit=0, count=4, addr=0, stride=s, dtype=dtype, dst=W(2))
    h.add("mxm.mul", 25, unit=0, buf=0, addr=0, count=4, dtype=dtype, src0=W(2))
    t2 = max(37, 25 + 4 * r)
    h.add("mem.read", t2 - 4, unit=0, count=4, addr=0, stride=s, dtype=dtype, dst=W(3))
    h.add("mxm.mul", t2, unit=0, buf=1, addr=8, count=4, dtype=dtype, src0=W(3))
    # drains once the last rows have landed (row k at t + r(k+1) + 7, read at t_d + k)
    d1 = max(25 + r * (k + 1) + 7 - k for k in range(4))
    d2 = max(t2 + r * (k + 1) + 7 - k for k in range(4))
    d2 = max(d2, d1 + 4)
    h.add("mxm.drain", d1, unit=0, addr=0, count=4, dtype=acc, dst=E(0))
    h.add("mxm.drain", d2, unit=0, addr=8, count=4, dtype=acc, dst=E(1))
    h.add("mem.write", d1 + 2 + 7, unit=4, count=4, addr=0, stride=4, dtype=acc, src0=E(0))
    h.add("mem.write", d2 + 2 + 8, unit=5, count=4, addr=0, stride=4, dtype=acc, src0=E(1))
    out = h.run({"X": x, "W1": w1, "W2": w2}).outputs
    assert np.array_equal(f64(out["Y1"]), f64(x) @ f64(w1))
    assert np.array_equal(f64(out["Y2"]), f64(x[:, :12]) @ f64(w2))


@covers("mxm.mac")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_builder_float_k_split_accuracy(dtype):
    """Four K tiles accumulated in fp32: within the fp32 summation bound of the exact result."""
    from lpx_tvm.target.builder import ProgramBuilder
    b = ProgramBuilder("mini")
    M, K, N = 24, 64, 16
    A = b.input("A", (M, K), dtype)
    B = b.input("B", (K, N), dtype)
    C = b.output("C", (M, N), "fp32")
    for kt in range(4):
        g = b.group("install")
        g.install(0, kt % 2, g.read(B.tile(0).rows(16 * kt, 16 * kt + 16)), width=N)
        g = b.group("mul")
        g.mul(0, kt % 2, g.read(A.tile(kt)), acc=0, accumulate=kt > 0)
    g = b.group("out")
    g.write(g.drain(0, 0, M, "fp32"), C.tile(0))
    a = RNG.standard_normal((M, K)).astype(DType.parse(dtype).np)
    w = RNG.standard_normal((K, N)).astype(DType.parse(dtype).np)
    r, _ = builder_run(b, {"A": a, "B": w})
    exact = f64(a) @ f64(w)
    bound = (K + 4) * 2.0**-24 * (np.abs(f64(a)) @ np.abs(f64(w)))
    assert np.all(np.abs(f64(r.outputs["C"]) - exact) <= bound)

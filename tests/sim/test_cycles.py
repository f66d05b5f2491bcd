"""Exact cycle counts and counters of small programs, worked out by hand.

mini preset: positions MXM0=0, SXM0=1, MEM0..3=2..5, VXM=6, MEM4..7=7..10, SXM1=11,
MXM1=12; latencies mem_read 2, mem_write 2, mxm_install 4, mxm_mul 8, mxm_drain 2,
vxm_alu 2, vxm_transcendental 6; MXM cycles per vector int8 1, fp16 4, fp32 16;
off-chip 32e9 B/s at 900 MHz (35.55.. B/cycle) after 900 cycles; c2c 14e9 B/s
(15.55.. B/cycle) after 450 cycles.
"""

from __future__ import annotations

import numpy as np
import pytest

from lpx_tvm.errors import ScheduleHazard
from lpx_tvm.sim import Simulator
from lpx_tvm.target.builder import ProgramBuilder
from lpx_tvm.machine.isa import DType, Stream

from lpx_hand import E, Hand, W

RNG = np.random.default_rng(7)


def counters_equal(a, b):
    return a.to_json() == b.to_json()


def both_modes(h, inputs):
    """Run functionally and timing-only; they must agree on every counter."""
    full = h.run(inputs)
    timed = h.run(None, timing_only=True)
    assert timed.outputs == {}
    assert counters_equal(full.counters, timed.counters)
    assert full.cycles == timed.cycles
    return full


# ---- a copy across the chip ------------------------------------------------------

def test_copy_across_chip():
    h = Hand()
    n = 8
    x = RNG.standard_normal((n, 16)).astype(np.float32)
    h.input("X", n, "fp32", 0)
    h.output("Y", n, "fp32", 7)
    # read slice 0 (pos 2) at 0: emits vectors at 2..9, read done at 2 + 8 = 10.
    # slice 7 is pos 10: 8 hops east, write issues at 2 + 8 = 10,
    # vector k lands at 10 + k + 2; the last (k = 7) at 19.
    h.add("mem.read", 0, unit=0, count=n, addr=0, stride=4, dtype="fp32", dst=E(0), tag="rd")
    h.add("mem.write", 10, unit=7, count=n, addr=0, stride=4, dtype="fp32", src0=E(0), tag="wr")
    r = both_modes(h, {"X": x})
    assert np.array_equal(r.outputs["Y"], x)
    assert r.cycles == 19
    c = r.counters
    assert c.instructions == 2
    assert dict(c.port_busy_cycles) == {"mem0.rd": 8, "mem7.wr": 8}
    assert c.sram_bytes_read == c.sram_bytes_written == 8 * 16 * 4  # 512
    rd, wr = c.by_tag["rd"], c.by_tag["wr"]
    assert (rd.instructions, rd.busy_cycles, rd.first_cycle, rd.last_cycle) == (1, 8, 0, 10)
    assert (wr.instructions, wr.busy_cycles, wr.first_cycle, wr.last_cycle) == (1, 8, 10, 19)
    assert (rd.sram_bytes_read, rd.sram_bytes_written, wr.sram_bytes_read, wr.sram_bytes_written) == \
        (512, 0, 0, 512)
    assert rd.span_cycles == 10 and wr.span_cycles == 9
    assert c.utilization("mem0.rd") == 8 / 19


def test_copy_one_cycle_early_or_late_is_refused():
    for t_write in (9, 11):
        h = Hand()
        h.add("mem.read", 0, unit=0, count=8, addr=0, stride=4, dtype="fp32", dst=E(0))
        h.add("mem.write", t_write, unit=7, count=8, addr=0, stride=4, dtype="fp32", src0=E(0))
        with pytest.raises(ScheduleHazard) as e:
            h.run(timing_only=True)
        # one early: vector 0 has not reached pos 10 yet. One late: vector 0 passed, and the
        # 8th read runs past the end of the value.
        assert e.value.kind == ("stream-empty" if t_write == 9 else "stream-misaligned")


# ---- read -> vxm.add -> write ----------------------------------------------------

def test_read_add_write_chain():
    h = Hand()
    n = 4
    a = RNG.integers(-50, 50, (n, 16)).astype(np.int32)
    b = RNG.integers(-50, 50, (n, 16)).astype(np.int32)
    h.input("A", n, "int32", 0)
    h.input("B", n, "int32", 1)
    h.output("Y", n, "int32", 4)
    # A: slice 0 (pos 2) read at 0, emits 2, reaches the VXM (pos 6) at 6.
    # B: slice 1 (pos 3) read at 1, emits 3, reaches pos 6 at 6.
    # add at 6 emits at 6 + 2 = 8; slice 4 (pos 7) writes at 9; last lands 9 + 3 + 2 = 14.
    h.add("mem.read", 0, unit=0, count=n, addr=0, stride=4, dtype="int32", dst=E(0), tag="a")
    h.add("mem.read", 1, unit=1, count=n, addr=0, stride=4, dtype="int32", dst=E(1), tag="b")
    h.add("vxm.add", 6, unit=5, count=n, dtype="int32", src0=E(0), src1=E(1), dst=E(2), tag="add")
    h.add("mem.write", 9, unit=4, count=n, addr=0, stride=4, dtype="int32", src0=E(2), tag="out")
    r = both_modes(h, {"A": a, "B": b})
    assert np.array_equal(r.outputs["Y"], a + b)
    assert r.cycles == 14
    assert dict(r.counters.port_busy_cycles) == {"mem0.rd": 4, "mem1.rd": 4, "vxm5": 4, "mem4.wr": 4}
    assert r.counters.by_tag["add"].last_cycle == 12  # emits 8..11
    assert r.counters.sram_bytes_read == 2 * 4 * 64 and r.counters.sram_bytes_written == 4 * 64


def test_transcendental_latency():
    h = Hand()
    # exp: emits at 6 + 6 = 12, write at slice 4 at 13, n = 3 lands last at 13 + 2 + 2 = 17
    h.add("mem.read", 0, unit=0, count=3, addr=0, stride=2, dtype="fp16", dst=E(0))
    h.add("vxm.exp", 6, unit=0, count=3, dtype="fp16", src0=E(0), dst=E(1))
    h.add("mem.write", 13, unit=4, count=3, addr=0, stride=2, dtype="fp16", src0=E(1))
    assert h.run(timing_only=True).cycles == 17


# ---- MXM: install + mul + drain ----------------------------------------------------

def mxm_chain(dtype, t_drain, M=8, K=16):
    h = Hand()
    dt = DType.parse(dtype)
    acc = DType.INT32 if dt.is_int else DType.FP32
    s = dt.itemsize
    h.input("X", M, dtype, 0)
    h.input("B", K, dtype, 1)
    h.output("Y", M, acc, 2)
    # weights: slice 1 (pos 3) read at 0, emits 2, 3 hops west to plane 0 (pos 0): install at 5.
    # install done (weights ready) at 5 + 16 + 4 = 25.
    h.add("mem.read", 0, unit=1, count=K, addr=0, stride=s, dtype=dtype, dst=W(0), tag="w")
    h.add("mxm.install", 5, unit=0, buf=1, count=K, dtype=dtype, aux0=16, src0=W(0), tag="w")
    # activations: slice 0 (pos 2) read at 21, emit 23, 2 hops: at pos 0 at 25 = mul issue.
    h.add("mem.read", 21, unit=0, count=M, addr=0, stride=s, dtype=dtype, dst=W(1), tag="mm")
    h.add("mxm.mul", 25, unit=0, buf=1, addr=0, count=M, dtype=dtype, src0=W(1), tag="mm")
    # drain emits at t_drain + 2 from pos 0; slice 2 (pos 4): write at t_drain + 6.
    h.add("mxm.drain", t_drain, unit=0, addr=0, count=M, dtype=acc, dst=E(2), tag="out")
    h.add("mem.write", t_drain + 6, unit=2, count=M, addr=0, stride=4, dtype=acc, src0=E(2), tag="out")
    return h


@pytest.mark.parametrize("dtype, t_drain, cycles, compute", [
    # int8, 1 cycle/vector: row k lands at 25 + (k+1) + 8 - 1 = 33 + k; the drain reads row k at
    # t_d + k, so t_d = 33. Write at 39, last (k = 7) lands at 39 + 7 + 2 = 48.
    ("int8", 33, 48, 8),
    # fp16, 4 cycles/vector: row k lands at 25 + 4(k+1) + 7 = 36 + 4k; t_d + k >= 36 + 4k for
    # k = 7 gives t_d = 36 + 21 = 57. Write at 63, last lands at 63 + 7 + 2 = 72.
    ("fp16", 57, 72, 32),
    # fp32, 16 cycles/vector: row k lands at 25 + 16(k+1) + 7 = 48 + 16k; t_d = 48 + 15*7 = 153.
    # Write at 159, last lands at 159 + 9 = 168.
    ("fp32", 153, 168, 128),
])
def test_install_mul_drain(dtype, t_drain, cycles, compute):
    M, K = 8, 16
    np_dt = DType.parse(dtype).np
    x = RNG.integers(-5, 5, (M, 16)).astype(np_dt)
    w = RNG.integers(-5, 5, (K, 16)).astype(np_dt)
    r = both_modes(mxm_chain(dtype, t_drain), {"X": x, "B": w})
    assert np.array_equal(r.outputs["Y"].astype(np.float64), x.astype(np.float64) @ w.astype(np.float64))
    assert r.cycles == cycles
    c = r.counters
    assert c.macs == M * K * 16 == 2048
    assert c.port_busy_cycles["mxm0.install0"] == K
    assert c.port_busy_cycles["mxm0.compute"] == compute
    assert c.port_busy_cycles["mxm0.drain"] == M
    assert c.by_tag["mm"].macs == 2048 and c.by_tag["w"].macs == 0
    # the tag's span: its read at 21 to the last accumulator row landing, 25 + compute + 7
    assert (c.by_tag["mm"].first_cycle, c.by_tag["mm"].last_cycle) == (21, 25 + compute + 7)
    assert c.mxm_mac_utilization(c.macs / c.cycles) == pytest.approx(1.0)
    # one cycle earlier, the last row has not landed
    with pytest.raises(ScheduleHazard) as e:
        mxm_chain(dtype, t_drain - 1).run(timing_only=True)
    assert e.value.kind == "acc-read-before-write"


# ---- installs at the plane's rate: one part per install lane ---------------------------

def lanes_chain(dtype="int8", parts=((0, 0), (1, 4), (2, 8), (3, 12)), lanes=(0, 1, 2, 3), t_mul=15, t_drain=23,
                M=8, K=16, rows=4):
    """K = 16 weight rows in four parts of 4 rows, part j in slice j (positions 2..5), each
    read at 0 onto stream W<2j> (a group of two registers, room for an fp16 part) and installed through lane j of plane 0 (position 0) when it
    arrives: at 2 (mem_read) + hops = 4, 5, 6, 7; lane j is done at its issue + 4 rows + 4
    (mxm_install) = 12, 13, 14, 15, so the weights are ready at 15 (one stream: 25).
    Activations from slice 4 (position 7) reach plane 0 at t + 2 + 7: read at t_mul - 9.
    Row k lands at t_mul + (k + 1) + 8 - 1 = 23 + k: the drain issues at 23, emits at 25 east
    to slice 5 (position 8) at 33; the last row lands at 33 + 7 + 2 = 42."""
    h = Hand()
    dt = DType.parse(dtype)
    s = dt.itemsize
    acc = DType.INT32 if dt.is_int else DType.FP32
    h.input("X", M, dtype, 4)
    h.output("Y", M, acc, 5)
    for j, (sl, row) in enumerate(parts):
        h.input(f"B{j}", rows, dtype, sl)
        hops = h.mem(sl) - h.pos("MXM", 0)
        h.add("mem.read", 0, unit=sl, count=rows, addr=0, stride=s, dtype=dtype, dst=Stream("W", 2 * j), tag="w")
        h.add("mxm.install", 2 + hops, unit=0, buf=0, count=rows, dtype=dtype, aux0=16, addr=row, aux1=lanes[j],
              src0=Stream("W", 2 * j), tag="w")
    h.add("mem.read", t_mul - 9, unit=4, count=M, addr=0, stride=s, dtype=dtype, dst=Stream("W", 12), tag="mm")
    h.add("mxm.mul", t_mul, unit=0, buf=0, addr=0, count=M, dtype=dtype, src0=Stream("W", 12), tag="mm")
    h.add("mxm.drain", t_drain, unit=0, addr=0, count=M, dtype=acc, dst=E(2), tag="out")
    h.add("mem.write", t_drain + 10, unit=5, count=M, addr=0, stride=4, dtype=acc, src0=E(2), tag="out")
    return h


def test_install_lanes_fill_one_buffer_at_once():
    M, K = 8, 16
    x = RNG.integers(-5, 5, (M, 16)).astype(np.int8)
    w = RNG.integers(-5, 5, (K, 16)).astype(np.int8)
    inputs = {"X": x, **{f"B{j}": w[4 * j:4 * j + 4] for j in range(4)}}
    r = both_modes(lanes_chain(), inputs)
    assert np.array_equal(r.outputs["Y"], x.astype(np.int32) @ w.astype(np.int32))
    assert r.cycles == 42
    c = r.counters
    assert [c.port_busy_cycles[f"mxm0.install{j}"] for j in range(4)] == [4, 4, 4, 4]
    # one cycle too early for the last lane's rows (ready at 15)
    with pytest.raises(ScheduleHazard) as e:
        lanes_chain(t_mul=14, t_drain=22).run(timing_only=True)
    assert e.value.kind == "weights-not-ready"


def test_install_parts_in_any_row_order():
    """The parts land in rows 8.., 0.., 12.., 4..: the buffer's matrix is in row order."""
    M, K = 8, 16
    order = (8, 0, 12, 4)
    x = RNG.integers(-5, 5, (M, 16)).astype(np.int8)
    w = RNG.integers(-5, 5, (K, 16)).astype(np.int8)
    inputs = {"X": x, **{f"B{j}": w[r:r + 4] for j, r in enumerate(order)}}
    h = lanes_chain(parts=tuple(zip(range(4), order)))
    r = both_modes(h, inputs)
    assert np.array_equal(r.outputs["Y"], x.astype(np.int32) @ w.astype(np.int32))


@pytest.mark.parametrize("parts, lanes, kind", [
    (((0, 0), (1, 4), (2, 8), (3, 16 - 4 + 1)), (0, 1, 2, 3), "bad-operand"),  # rows 13..16: past the plane's 16
    (((0, 0), (1, 4), (2, 8), (3, 8)), (0, 1, 2, 3), "weights-overlap"),  # rows 8..11 twice
    (((0, 0), (1, 4), (2, 12), (3, 16 - 4)), (0, 1, 2, 3), "weights-overlap"),
    (((0, 0), (1, 8), (2, 12)), (0, 1, 2), "weights-incomplete"),  # rows 4..7 never installed
    (((0, 0), (1, 4), (2, 8), (3, 12)), (0, 1, 2, 4), "bad-operand"),  # mini has 4 install lanes
    (((0, 0), (1, 4), (2, 8), (3, 12)), (0, 1, 1, 3), "unit-overlap"),  # lane 1 busy 5..9 at 6
])
def test_install_lane_hazards(parts, lanes, kind):
    with pytest.raises(ScheduleHazard) as e:
        lanes_chain(parts=parts, lanes=lanes).run(timing_only=True)
    assert e.value.kind == kind


def test_fp16_rows_take_two_install_streams():
    """mini: 4 install streams, so 2 lanes for fp16 rows: lane 1 holds install streams 2 and 3,
    and a lane 2 does not exist."""
    M, K = 8, 16
    x = RNG.integers(-5, 5, (M, 16)).astype(np.float16)
    w = RNG.integers(-5, 5, (K, 16)).astype(np.float16)
    parts = ((0, 0), (1, 8))
    inputs = {"X": x, "B0": w[:8], "B1": w[8:]}
    # lane j's 8 rows arrive at 4, 5; done at 4 + 8 + 4 = 16 and 17: mul at 17; fp16 is 4
    # cycles a vector, row k lands at 17 + 4(k + 1) + 7 = 28 + 4k, the drain at 28 + 21 = 49.
    h = lanes_chain("fp16", parts=parts, lanes=(0, 1), t_mul=17, t_drain=49, rows=8)
    r = both_modes(h, inputs)
    assert np.array_equal(r.outputs["Y"], (x.astype(np.float32) @ w.astype(np.float32)))
    assert r.cycles == 49 + 10 + 7 + 2
    c = r.counters
    assert [c.port_busy_cycles[f"mxm0.install{k}"] for k in range(4)] == [8, 8, 8, 8]
    with pytest.raises(ScheduleHazard) as e:
        lanes_chain("fp16", parts=parts, lanes=(0, 2), t_mul=17, t_drain=49, rows=8).run(timing_only=True)
    assert e.value.kind == "bad-operand"


def test_sync_when_the_last_accumulator_row_lands():
    """The mul's last row (int8, 8 rows from 25) lands at 33 + 7 = 40: a sync at 40 is fine."""
    h = mxm_chain("int8", 33)
    h.instrs = h.instrs[:4]
    h.add("icu.sync", 40)
    r = h.run(timing_only=True)
    assert r.cycles == 40
    h.instrs[-1] = h.instrs[-1].moved(-1)
    with pytest.raises(ScheduleHazard) as e:
        h.run(timing_only=True)
    assert e.value.kind == "sync-in-flight"


# ---- off-chip and chip-to-chip ------------------------------------------------------

@pytest.mark.parametrize("preset, n, dtype, cycles", [
    ("mini", 64, "int8", 900 + 29),  # 1024 B / 35.55 B per cycle = 28.8 -> 29
    ("mini", 64, "fp32", 900 + 116),  # 4096 B -> 115.2 -> 116
    ("mini", 9, "fp16", 900 + 9),  # 288 B -> 8.1 -> 9
    ("tsp", 10, "fp16", 900 + 180),  # 6400 B -> exactly 180
    ("lp30", 10, "int8", 1500 + 75),  # 3200 B / 42.66 B per cycle (64e9 / 1.5e9) = 75
])
def test_dma_load_time(preset, n, dtype, cycles):
    h = Hand(preset)
    nbytes = n * h.lanes * DType.parse(dtype).itemsize
    h.host_bytes = nbytes
    h.add("dma.load", 0, unit=0, slice=0, addr=0, stride=DType.parse(dtype).itemsize, count=n, dtype=dtype,
          tag="ld")
    # the second transfer waits for the engine
    h.add("dma.load", cycles, unit=0, slice=1, addr=0, stride=DType.parse(dtype).itemsize, count=n, dtype=dtype,
          tag="ld")
    r = both_modes(h, None)
    assert r.cycles == 2 * cycles
    assert r.counters.port_busy_cycles["dma0"] == 2 * cycles
    assert r.counters.offchip_bytes_read == 2 * nbytes
    assert r.counters.by_tag["ld"].offchip_bytes == 2 * nbytes
    h.instrs[1] = h.instrs[1].moved(-1)
    with pytest.raises(ScheduleHazard) as e:
        h.run(timing_only=True)
    assert e.value.kind == "unit-overlap"


def test_dma_then_read_when_it_lands():
    h = Hand()
    h.host_bytes = 4 * 16 * 4
    # 256 B: 900 + ceil(7.2) = 908; the lines are written at 908, a read at 908 sees them
    h.add("dma.load", 0, unit=0, slice=3, addr=0, stride=4, count=4, dtype="fp32")
    h.add("mem.read", 908, unit=3, count=4, addr=0, stride=4, dtype="fp32", dst=E(0))
    assert h.run(timing_only=True).cycles == 908 + 2 + 4
    h.instrs[1] = h.instrs[1].moved(-1)
    with pytest.raises(ScheduleHazard) as e:
        h.run(timing_only=True)
    assert e.value.kind == "sram-read-before-write"


def test_c2c_send_time():
    h = Hand()
    # fp32 vector = 64 B; 64 / 15.55 = 4.1 -> 5 cycles per vector; 4 vectors: tx busy 20.
    # send at 6 (data from slice 0), arrives at 6 + 20 + 450 = 476; recv emits 477..480
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=4, dtype="fp32", dst=E(0))
    h.add("c2c.send", 6, unit=1, count=4, dtype="fp32", src0=E(0))
    h.add("c2c.recv", 476, unit=1, count=4, dtype="fp32", dst=E(1))
    r = h.run(timing_only=True)
    assert r.cycles == 476 + 1 + 4
    assert r.counters.port_busy_cycles["c2c1.tx"] == 20
    assert r.counters.port_busy_cycles["c2c1.rx"] == 4
    assert r.counters.c2c_bytes_sent == 256


def test_transpose_and_sxm_timing():
    h = Hand()
    # slice 0 (pos 2) read at 0, emits 2, SXM0 (pos 1) at 3; transpose of 5 vectors emits its
    # 16 outputs from 3 + 5 + 4 = 12 at pos 1, busy 5 + 16 = 21 cycles. Slice 1 (pos 3): write at
    # 14, lands last at 14 + 15 + 2 = 31.
    h.add("mem.read", 0, unit=0, count=5, addr=0, stride=1, dtype="int8", dst=W(0))
    h.add("sxm.transpose", 3, unit=0, count=5, dtype="int8", aux0=16, src0=W(0), dst=E(0))
    h.add("mem.write", 14, unit=1, count=16, addr=0, stride=1, dtype="int8", src0=E(0))
    r = h.run(timing_only=True)
    assert r.cycles == 31
    assert r.counters.port_busy_cycles["sxm0"] == 21


# ---- the program builder's schedule --------------------------------------------------

def test_builder_add_one_schedule():
    b = ProgramBuilder("mini")
    x = b.input("x", (64, 16), "fp32")
    y = b.output("y", (64, 16), "fp32")
    g = b.group("add_one")
    g.write(g.vxm("vxm.add", g.read(x.tile(0)), imm=1.0), y.tile(0))
    prog = b.build()
    # x lands in slice 0 (pos 2), y in slice 1 (pos 3). Read at 0, at the VXM (pos 6) at 6,
    # add emits at 8, back west to pos 3 at 11; 64 vectors: the last lands at 11 + 63 + 2 = 76.
    assert [(i.op, i.cycle) for i in prog.instrs] == [("mem.read", 0), ("vxm.add", 6), ("mem.write", 11)]
    data = RNG.standard_normal((64, 16)).astype(np.float32)
    r = Simulator("mini").run(prog, {"x": data})
    assert r.cycles == 76
    assert np.array_equal(r.outputs["y"], data + np.float32(1.0))
    t = Simulator("mini").run(prog, timing_only=True)
    assert t.outputs == {} and counters_equal(r.counters, t.counters)
    assert r.counters.by_tag["add_one"].instructions == 3
    assert r.counters.by_tag["add_one"].busy_cycles == 3 * 64


def _two_copies_of_one_slice():
    """(builder, program): x on slice 0 copied to slices 4 and 5, a group each."""
    b = ProgramBuilder("mini")
    x = b.input("x", (64, 16), "int8", slices=[0])
    y1 = b.output("y1", (64, 16), "int8", slices=[4])
    y2 = b.output("y2", (64, 16), "int8", slices=[5])
    for y in (y1, y2):
        g = b.group("copy")
        g.write(g.read(x.tile(0)), y.tile(0))
    return b, b.build()


def test_builder_two_groups_share_a_slice_port():
    """Two copies out of the same slice: the second read waits for the port (64 cycles)."""
    _, prog = _two_copies_of_one_slice()
    reads = sorted(i.cycle for i in prog.instrs if i.op == "mem.read")
    assert reads == [0, 64]
    # second write: slice 5 (pos 8) from pos 2 = 6 hops: 64 + 2 + 6 = 72; last lands 72 + 63 + 2
    data = RNG.integers(-100, 100, (64, 16)).astype(np.int8)
    r = Simulator("mini").run(prog, {"x": data})
    assert r.cycles == 137
    assert np.array_equal(r.outputs["y1"], data) and np.array_equal(r.outputs["y2"], data)
    assert r.counters.port_busy_cycles["mem0.rd"] == 128
    assert r.counters.by_tag["copy"].instructions == 4
    assert r.counters.by_tag["copy"].sram_bytes_read == 2 * 64 * 16


def _copy_of_a_copy():
    """(builder, program): x on slice 0 copied to t on slice 4, t copied to y on slice 5."""
    b = ProgramBuilder("mini")
    x = b.input("x", (64, 16), "int8", slices=[0])
    t = b.tensor("t", (64, 16), "int8", slices=[4])
    y = b.output("y", (64, 16), "int8", slices=[5])
    for src, dst in ((x, t), (t, y)):
        g = b.group("copy")
        g.write(g.read(src.tile(0)), dst.tile(0))
    prog = b.build()
    return b, prog


def test_dependency_floor_frees_the_ports_but_keeps_the_chain():
    """The builder's dependency floor places the same groups with every port free: the two
    copies of the test above both read at 0, and the second lands at 8 + 63 + 2 = 73
    (137 - 64, the port's wait); a chain through SRAM (a copy, then a copy of the copy)
    keeps its order, so its floor is its schedule."""
    b, prog = _two_copies_of_one_slice()
    assert Simulator("mini").run(prog, timing_only=True).cycles == 137 and b.dependency_cycles == 73
    b, prog = _copy_of_a_copy()
    assert b.dependency_cycles == Simulator("mini").run(prog, timing_only=True).cycles


def test_a_copy_of_a_copy_streams_behind_it():
    """Dependencies meet line by line: the second copy reads line k of t the cycle it
    lands, not after t's last line. x on slice 0 (pos 2) read at 0 comes out at 2 and
    reaches slice 4 (pos 7) at 7, line k landing at 9 + k; the second copy reads line k
    at 9 + k, so its read issues at 9 (not 9 + 63 = 72), reaches slice 5 (pos 8) at 12,
    and its last line lands at 12 + 2 + 63 = 77 (140 when it waited for the whole of t)."""
    b, prog = _copy_of_a_copy()
    assert [(i.op, i.cycle) for i in prog.instrs] == [("mem.read", 0), ("mem.write", 7), ("mem.read", 9),
                                                      ("mem.write", 12)]
    data = RNG.integers(-100, 100, (64, 16)).astype(np.int8)
    r = Simulator("mini").run(prog, {"x": data})
    assert r.cycles == 77 and b.dependency_cycles == 77
    assert np.array_equal(r.outputs["y"], data)


def test_a_read_issues_after_the_writes_it_follows():
    """The simulator runs instructions in issue order, so a read issues after every write
    of its lines, even where its lines alone would let it go first. t's two halves are
    copied from x by two groups (slice 0's read port takes one at a time: the second reads
    at 64 and writes at 71, row 64 + j landing at 73 + j); a copy of all of t could read
    line k at 9 + k as far as the lines go, but issues at 72, after that write. Its last
    line lands at 72 + 2 + 1 + 2 + 127 = 204, and y is x (at 9, its second half would be
    what t held before)."""
    b = ProgramBuilder("mini")
    x = b.input("x", (128, 16), "int8", slices=[0])
    t = b.tensor("t", (128, 16), "int8", slices=[4])
    y = b.output("y", (128, 16), "int8", slices=[5])
    for rows in ((0, 64), (64, 128)):
        g = b.group("half")
        g.write(g.read(x.tile(0).rows(*rows)), t.tile(0).rows(*rows))
    g = b.group("copy")
    g.write(g.read(t.tile(0)), y.tile(0))
    prog = b.build()
    assert [(i.op, i.cycle) for i in prog.instrs if i.tag == "copy"] == [("mem.read", 72), ("mem.write", 75)]
    data = RNG.integers(-100, 100, (128, 16)).astype(np.int8)
    r = Simulator("mini").run(prog, {"x": data})
    assert r.cycles == 204
    assert np.array_equal(r.outputs["y"], data)


# ---- per-tag breakdown and timing-only agreement on a mixed program -----------------

def test_tag_counters_add_up():
    h = Hand()
    x = RNG.integers(-9, 9, (4, 16)).astype(np.int8)
    h.input("X", 4, "int8", 0)
    h.output("Y", 4, "int8", 4)
    h.host_init = x.tobytes()
    h.host_bytes = 2 * x.nbytes
    # dma.load of 64 B: 900 + ceil(1.8) = 902, into slice 6, tag "dma"
    h.add("dma.load", 0, unit=0, slice=6, addr=0, stride=1, count=4, dtype="int8", tag="dma")
    h.add("dma.store", 902, unit=0, slice=0, addr=0, stride=1, count=4, dtype="int8", aux0=64, tag="dma")
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(0), tag="copy")
    h.add("vxm.max", 6, unit=0, count=4, dtype="int8", src0=E(0), imm=0, dst=E(1), tag="relu")
    h.add("mem.write", 9, unit=4, count=4, addr=0, stride=1, dtype="int8", src0=E(1), tag="copy")
    r = both_modes(h, {"X": x})
    c = r.counters
    assert r.cycles == 902 + 902
    assert np.array_equal(r.outputs["Y"], np.maximum(x, 0))
    tags = c.by_tag
    assert set(tags) == {"dma", "copy", "relu"}
    for name in ("instructions", "busy_cycles", "macs", "sram_bytes_read", "sram_bytes_written"):
        total = {"instructions": c.instructions, "busy_cycles": sum(c.port_busy_cycles.values()),
                 "macs": c.macs, "sram_bytes_read": c.sram_bytes_read,
                 "sram_bytes_written": c.sram_bytes_written}[name]
        assert sum(getattr(t, name) for t in tags.values()) == total, name
    assert tags["dma"].offchip_bytes == c.offchip_bytes_read + c.offchip_bytes_written == 128
    assert (tags["dma"].sram_bytes_read, tags["dma"].sram_bytes_written) == (64, 64)
    assert (tags["copy"].sram_bytes_read, tags["copy"].sram_bytes_written) == (64, 64)
    assert tags["dma"].busy_cycles == 2 * 902
    assert (tags["relu"].first_cycle, tags["relu"].last_cycle) == (6, 12)
    js = c.to_json()
    assert js["by_tag"]["copy"]["instructions"] == 2
    assert js["port_busy_cycles"] == {"dma0": 1804, "mem0.rd": 4, "mem4.wr": 4, "vxm0": 4}


def test_timing_only_needs_no_inputs_and_still_checks():
    h = Hand()
    h.input("X", 2, "int8", 0)
    h.add("mem.read", 0, unit=0, count=2, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.write", 4, unit=1, count=2, addr=0, stride=1, dtype="int8", src0=E(0))  # should be 3
    with pytest.raises(ScheduleHazard):
        h.run(timing_only=True)


def test_long_program_of_many_copies():
    """600 one-vector copies (streams are pruned every 512 instructions): slice s (pos 2 + s)
    -> slice 4 + s (pos 7 + s) on stream E<s>; copy k reads at k, writes at k + 2 + 5."""
    h = Hand()
    n = 75
    xs = [RNG.integers(-128, 128, (n, 16)).astype(np.int8) for _ in range(4)]
    for s in range(4):
        h.input(f"X{s}", n, "int8", s)
        h.output(f"Y{s}", n, "int8", 4 + s)
    for k in range(4 * n):
        s, row = k % 4, k // 4
        h.add("mem.read", k, unit=s, count=1, addr=row, stride=1, dtype="int8", dst=E(s), tag=f"c{s}")
        h.add("mem.write", k + 7, unit=4 + s, count=1, addr=row, stride=1, dtype="int8", src0=E(s), tag=f"c{s}")
    r = both_modes(h, {f"X{s}": xs[s] for s in range(4)})
    for s in range(4):
        assert np.array_equal(r.outputs[f"Y{s}"], xs[s])
        assert r.counters.by_tag[f"c{s}"].instructions == 2 * n
    assert r.counters.instructions == 600
    assert r.cycles == 299 + 7 + 2  # the last write lands at 308
    assert r.counters.sram_bytes_read == r.counters.sram_bytes_written == 300 * 16

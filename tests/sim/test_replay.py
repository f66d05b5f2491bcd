"""Verify once, replay: a Simulator's later functional runs of a verified program.

The first run of a program checks its whole schedule; later functional runs of the same,
unchanged program on the same Simulator replay the recorded steps without the checks.
These tests check that a replay computes exactly what a checked run computes, that it
really skips the checks, and that anything that could make the checks find something
else (a changed program, data-dependent addresses, a timing-only or traced run) checks
again.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from lpx_tvm.errors import ProgramError, ScheduleHazard
from lpx_tvm.sim import Simulator
from lpx_tvm.sim import simulator as simmod
from lpx_tvm.sim.replay_steps import MxmSettleEarly
from lpx_tvm.target.builder import ProgramBuilder
from lpx_tvm.machine.isa import DType
from lpx_tvm.machine.program import Binding, SramImage, TensorLayout

from lpx_hand import E, Hand, W, assert_same_result

RNG = np.random.default_rng(99)
LANES = 16


class CountingRun(simmod._Run):
    """The schedule checker, counting how often it runs."""

    made = 0

    def __post_init__(self):
        type(self).made += 1
        super().__post_init__()


@pytest.fixture
def checks(monkeypatch):
    CountingRun.made = 0
    monkeypatch.setattr(simmod, "_Run", CountingRun)
    return CountingRun


def add_one_program():
    b = ProgramBuilder("mini")
    x = b.input("x", (64, 16), "fp32")
    y = b.output("y", (64, 16), "fp32")
    g = b.group("add_one")
    g.write(g.vxm("vxm.add", g.read(x.tile(0)), imm=1.0), y.tile(0))
    return b.build()


def test_second_run_replays_with_new_inputs(checks):
    prog = add_one_program()
    sim = Simulator("mini")
    x1, x2 = (RNG.standard_normal((64, 16)).astype(np.float32) for _ in range(2))
    r1 = sim.run(prog, {"x": x1})
    r2 = sim.run(prog, {"x": x2})
    assert checks.made == 1  # the second run did no checking
    assert np.array_equal(r1.outputs["y"], x1 + np.float32(1))
    assert np.array_equal(r2.outputs["y"], x2 + np.float32(1))
    assert r2.counters.to_json() == r1.counters.to_json()
    r2.counters.by_tag["add_one"].instructions += 1  # each result has its own counters
    assert sim.run(prog, {"x": x1}).counters.to_json() == r1.counters.to_json()


def test_replay_checks_its_inputs(checks):
    prog = add_one_program()
    sim = Simulator("mini")
    sim.run(prog, {"x": np.zeros((64, 16), np.float32)})
    with pytest.raises(Exception, match="missing input"):
        sim.run(prog, {})
    with pytest.raises(Exception, match="expected shape"):
        sim.run(prog, {"x": np.zeros((63, 16), np.float32)})


def test_verify_then_replay(checks):
    prog = add_one_program()
    sim = Simulator("mini")
    timed = sim.verify(prog)
    x = RNG.standard_normal((64, 16)).astype(np.float32)
    r = sim.run(prog, {"x": x})
    assert checks.made == 1
    assert np.array_equal(r.outputs["y"], x + np.float32(1))
    assert r.counters.to_json() == timed.counters.to_json()


def test_timing_only_and_traced_runs_always_check(checks):
    prog = add_one_program()
    sim = Simulator("mini")
    x = np.ones((64, 16), np.float32)
    sim.run(prog, {"x": x})
    sim.run(prog, timing_only=True)
    r = sim.run(prog, {"x": x}, trace=True)
    assert checks.made == 3
    assert r.trace is not None


def test_a_changed_program_is_checked_again(checks):
    prog = add_one_program()
    sim = Simulator("mini")
    x = np.ones((64, 16), np.float32)
    sim.run(prog, {"x": x})
    # the write one cycle early: its stream is not there yet
    k = next(i for i, ins in enumerate(prog.instrs) if ins.op == "mem.write")
    prog.instrs[k] = replace(prog.instrs[k], cycle=prog.instrs[k].cycle - 1)
    with pytest.raises(ScheduleHazard) as e:
        sim.run(prog, {"x": x})
    assert e.value.kind == "stream-empty"
    assert checks.made == 2


def test_an_equal_copy_of_a_program_is_checked(checks):
    """Replays are per program object: a rebuilt (equal) program is verified again."""
    sim = Simulator("mini")
    x = np.ones((64, 16), np.float32)
    sim.run(add_one_program(), {"x": x})
    sim.run(add_one_program(), {"x": x})
    assert checks.made == 2


def test_a_changed_table_is_checked_again(checks):
    h = Hand()
    x = RNG.integers(-100, 100, (4, LANES)).astype(np.int8)
    h.input("X", 4, "int8", 0)
    h.output("Y", 4, "int8", 4)
    t = h.table(np.arange(LANES)[::-1])
    # read slice 0 (pos 2) at 0, emits at 2 on E0; SXM1 (pos 11) at 2 + 9 = 11 emits at 11 + sxm
    # latency on W1; back to slice 4 (pos 7): 4 hops
    e = 11 + h.lat["sxm"]
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("sxm.permute", 11, unit=1, count=4, aux0=t, dtype="int8", src0=E(0), dst=W(1))
    h.add("mem.write", e + 4, unit=4, count=4, addr=0, stride=1, dtype="int8", src0=W(1))
    prog = h.program()
    sim = Simulator("mini")
    assert np.array_equal(sim.run(prog, {"X": x}).outputs["Y"], x[:, ::-1])
    prog.tables[t][:] = np.arange(LANES)
    assert np.array_equal(sim.run(prog, {"X": x}).outputs["Y"], x)
    assert checks.made == 2
    prog.tables[t][0] = LANES  # out of range: the check must see it
    with pytest.raises(ScheduleHazard, match="permutation map"):
        sim.run(prog, {"X": x})


def test_gather_programs_are_always_checked(checks):
    h = Hand()
    table = RNG.integers(-100, 100, (20, LANES)).astype(np.int8)
    idx = np.zeros((5, LANES), np.int32)
    idx[:, 0] = [3, 19, 0, 7, 7]
    h.input("T", 20, "int8", 1)
    h.input("I", 5, "int32", 0)
    h.output("Y", 5, "int8", 4)
    h.add("mem.read", 0, unit=0, count=5, addr=0, stride=4, dtype="int32", dst=E(0))
    h.add("mem.gather", 3, unit=1, count=5, addr=0, stride=1, dtype="int8", src0=E(0), dst=E(1))
    h.add("mem.write", 11, unit=4, count=5, addr=0, stride=1, dtype="int8", src0=E(1))
    prog = h.program()
    sim = Simulator("mini")
    assert np.array_equal(sim.run(prog, {"T": table, "I": idx}).outputs["Y"], table[idx[:, 0]])
    idx[1, 0] = h.cfg.lines_per_slice  # past the slice's end: only a checked run can tell
    with pytest.raises(ScheduleHazard) as e:
        sim.run(prog, {"T": table, "I": idx})
    assert e.value.kind == "address-out-of-range"
    assert checks.made == 2


@pytest.mark.parametrize("dtype, window", [("fp16", False), ("int8", False), ("fp16", True)])
def test_activations_overwritten_before_the_drain(dtype, window):
    """The MXM keeps float activations until the drain; the SRAM lines they were read from
    are overwritten before it. A replay must still multiply the values read (``window``:
    read with a 2-D pattern of a single group, the same lines)."""
    h = Hand()
    L = h.lat
    M, K, N = 7, 16, 16
    dt = DType.parse(dtype)
    w = dt.itemsize
    if dt.is_float:
        x = RNG.standard_normal((M, LANES)).astype(dt.np)
        wts = RNG.standard_normal((K, LANES)).astype(dt.np)
    else:
        x = RNG.integers(-128, 128, (M, LANES)).astype(dt.np)
        wts = RNG.integers(-128, 128, (K, LANES)).astype(dt.np)
    acc = DType.FP32 if dt.is_float else DType.INT32
    # plane 0 (pos 0); weights in slice 1 (pos 3), activations in slice 0 (pos 2), result to slice 2 (pos 4)
    h.input("X", M, dtype, 0)
    h.input("B", K, dtype, 1)
    h.output("Y", M, acc.short, 2)
    t_inst = L["mem_read"] + 3
    t_mul = t_inst + K + L["mxm_install"]
    t_x = t_mul - L["mem_read"] - 2
    r = h.cfg.mxm_cycles_per_vector[dtype]
    t_d = max(t_mul + r * (k + 1) + L["mxm_mul"] - 1 - k for k in range(M))
    h.add("mem.read", 0, unit=1, count=K, addr=0, stride=w, dtype=dtype, dst=W(0))
    h.add("mxm.install", t_inst, unit=0, buf=0, count=K, dtype=dtype, aux0=N, src0=W(0))
    pattern = dict(aux0=M, aux1=M * w + 8) if window else {}
    h.add("mem.read", t_x, unit=0, count=M, addr=0, stride=w, dtype=dtype, dst=W(1), **pattern)
    h.add("mxm.mul", t_mul, unit=0, buf=0, addr=3, count=M, dtype=dtype, src0=W(1))
    # after X's lines are read (t_x .. t_x + M - 1), overwrite them with B's first rows
    t_r = t_x + M
    h.add("mem.read", t_r, unit=1, count=M, addr=0, stride=w, dtype=dtype, dst=W(2))
    t_ow = t_r + L["mem_read"] + 1
    assert t_ow < t_d
    h.add("mem.write", t_ow, unit=0, count=M, addr=0, stride=w, dtype=dtype, src0=W(2))
    h.add("mxm.drain", t_d, unit=0, addr=3, count=M, dtype=acc, dst=E(2))
    h.add("mem.write", t_d + L["mxm_drain"] + 4, unit=2, count=M, addr=0, stride=acc.itemsize, dtype=acc,
          src0=E(2))
    sim, prog = Simulator("mini"), h.program()
    first = sim.run(prog, {"X": x, "B": wts})
    again = sim.run(prog, {"X": x, "B": wts})
    assert_same_result(again, first)
    ref = x.astype(np.float64) @ wts.astype(np.float64)
    if dt.is_float:
        assert np.allclose(first.outputs["Y"], ref, rtol=1e-5, atol=1e-5)
    else:
        assert np.array_equal(first.outputs["Y"], ref.astype(np.int32))


@pytest.mark.skipif("offchip" not in Binding.__dataclass_fields__, reason="no off-chip bindings")
def test_offchip_bindings():
    """Inputs and outputs in off-chip memory (column tile after column tile), through a DMA
    round trip: load the input into SRAM, store it back to the output's bytes."""
    rows, cols, w = 5, 2 * LANES + 3, 2
    x = RNG.standard_normal((rows, cols)).astype(np.float16)
    h = Hand()
    ntiles = 3
    nbytes = ntiles * rows * LANES * w
    h.host_bytes = 2 * nbytes
    layout = TensorLayout((rows, cols), DType.FP16, (), w)
    h.bindings.append(Binding("X", "input", layout, offchip=0))
    h.bindings.append(Binding("Y", "output", layout, offchip=nbytes))
    d = dma_cycles(h, ntiles * rows, "fp16")
    h.add("dma.load", 0, unit=0, slice=3, addr=0, stride=w, count=ntiles * rows, dtype="fp16", aux0=0)
    h.add("dma.store", d, unit=0, slice=3, addr=0, stride=w, count=ntiles * rows, dtype="fp16", aux0=nbytes)
    r = h.run({"X": x})
    assert np.array_equal(r.outputs["Y"].view(np.uint16), x.view(np.uint16))
    # the SRAM holds the tiles one after another, zero past the last column
    got = Simulator("mini")
    h.bindings.append(Binding("S", "output", TensorLayout((ntiles * rows, LANES), DType.FP16, ((3, 0),), w)))
    s = got.run(h.program(), {"X": x}).outputs["S"].reshape(ntiles, rows, LANES)
    want = np.zeros((rows, ntiles * LANES), np.float16)
    want[:, :cols] = x
    assert np.array_equal(s.view(np.uint16), want.reshape(rows, ntiles, LANES).transpose(1, 0, 2).view(np.uint16))


def test_offchip_binding_outside_the_offchip_memory():
    if "offchip" not in Binding.__dataclass_fields__:
        pytest.skip("no off-chip bindings")
    h = Hand()
    h.host_bytes = 100
    h.bindings.append(Binding("X", "input", TensorLayout((2, LANES), DType.INT8, (), 1), offchip=80))
    with pytest.raises(ProgramError, match="off-chip"):
        h.run({"X": np.zeros((2, LANES), np.int8)})


def dma_cycles(h, n, dtype):
    nbytes = n * h.lanes * DType.parse(dtype).itemsize
    return h.cfg.offchip_latency + math.ceil(nbytes * h.cfg.clock_hz / h.cfg.offchip_bytes_per_s)


def image_program():
    """Slice 0 starts with a constant image C; the program copies it to Y, then overwrites
    it with the input X (Z is slice 0 at the end)."""
    h = Hand()
    c = (np.arange(4 * LANES) % 120 - 60).astype(np.int8).reshape(4, LANES)
    h.input("X", 4, "int8", 1)
    h.output("Y", 4, "int8", 4)
    h.output("Z", 4, "int8", 0)
    # slice 0 (pos 2) read at 0 emits at 2 on E0: slice 4 (pos 7) writes at 7; slice 1 (pos 3)
    # read at 4 emits at 6 on W1: slice 0 writes at 7, after slice 0 was read (cycles 0..3)
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.write", 7, unit=4, count=4, addr=0, stride=1, dtype="int8", src0=E(0))
    h.add("mem.read", 4, unit=1, count=4, addr=0, stride=1, dtype="int8", dst=W(1))
    h.add("mem.write", 7, unit=0, count=4, addr=0, stride=1, dtype="int8", src0=W(1))
    return replace(h.program(), sram_init=[SramImage(0, 0, c.tobytes())]), c


def test_the_initial_image_is_restored_between_runs():
    prog, c = image_program()
    other = add_one_program()
    sim = Simulator("mini")
    sim.load(prog)
    for k in range(3):
        x = np.full((4, LANES), k + 1, np.int8)
        r = sim.run(prog, {"X": x})
        assert np.array_equal(r.outputs["Y"], c)  # the image, though the last run overwrote it
        assert np.array_equal(r.outputs["Z"], x)
        if k == 1:  # another program in between: it sees zeros, not this image
            y = sim.run(other, {"x": np.zeros((64, 16), np.float32)}).outputs["y"]
            assert np.array_equal(y, np.ones((64, 16), np.float32))


def test_vxm_results_read_twice_are_not_overwritten():
    """A = X + 1 feeds two VXM ops; only the last reader may compute in place over A."""
    h = Hand()
    n = 6
    x = RNG.standard_normal((n, LANES)).astype(np.float32)
    h.input("X", n, "fp32", 0)
    h.output("B", n, "fp32", 4)
    h.output("C", n, "fp32", 5)
    # slice 0 (pos 2) read at 0 emits at 2 on E0; VXM (pos 6) at 6 emits at 8 on E1
    h.add("mem.read", 0, unit=0, count=n, addr=0, stride=4, dtype="fp32", dst=E(0))
    h.add("vxm.add", 6, unit=0, count=n, dtype="fp32", src0=E(0), imm=1.0, dst=E(1))
    # B = A * 2 and C = A + 3 on two more ALUs, both at 8; they emit at 10 on E2 / E3
    h.add("vxm.mul", 8, unit=1, count=n, dtype="fp32", src0=E(1), imm=2.0, dst=E(2))
    h.add("vxm.add", 8, unit=2, count=n, dtype="fp32", src0=E(1), imm=3.0, dst=E(3))
    h.add("mem.write", 11, unit=4, count=n, addr=0, stride=4, dtype="fp32", src0=E(2))
    h.add("mem.write", 12, unit=5, count=n, addr=0, stride=4, dtype="fp32", src0=E(3))
    r = h.run({"X": x})
    a = x + np.float32(1)
    assert np.array_equal(r.outputs["B"], a * np.float32(2))
    assert np.array_equal(r.outputs["C"], a + np.float32(3))


def test_blocks_with_the_same_weights_settle_together():
    """Weights installed once, two row blocks multiplied into different accumulator rows,
    then drained: the second block is computed in the first one's matmul."""
    h = Hand()
    L = h.lat
    M, K, N, r = 7, 16, 13, h.cfg.mxm_cycles_per_vector["fp16"]
    x = RNG.standard_normal((2 * M, LANES)).astype(np.float16)
    wts = RNG.standard_normal((K, LANES)).astype(np.float16)
    h.input("X", 2 * M, "fp16", 0)  # slice 0, position 2
    h.input("B", K, "fp16", 1)  # slice 1, position 3
    h.output("Y", 2 * M, "fp32", 2)  # slice 2, position 4
    t_inst = L["mem_read"] + 3
    h.add("mem.read", 0, unit=1, count=K, addr=0, stride=2, dtype="fp16", dst=W(0))
    h.add("mxm.install", t_inst, unit=0, buf=0, count=K, dtype="fp16", aux0=N, src0=W(0))
    t_mul = [t_inst + K + L["mxm_install"]]
    t_mul.append(t_mul[0] + r * M)
    drains = []
    for blk in range(2):
        h.add("mem.read", t_mul[blk] - L["mem_read"] - 2, unit=0, count=M, addr=2 * M * blk, stride=2,
              dtype="fp16", dst=W(1))
        h.add("mxm.mul", t_mul[blk], unit=0, buf=0, addr=M * blk, count=M, dtype="fp16", src0=W(1))
        drains.append(t_mul[blk] + r * M + L["mxm_mul"] - M)  # row k lands at t + r(k+1) + mul - 1
    drains[1] = max(drains[1], drains[0] + M)
    for blk in range(2):
        h.add("mxm.drain", drains[blk], unit=0, addr=M * blk, count=M, dtype="fp32", dst=E(2))
        h.add("mem.write", drains[blk] + L["mxm_drain"] + 4, unit=2, count=M, addr=4 * M * blk, stride=4,
              dtype="fp32", src0=E(2))
    sim, prog = Simulator("mini"), h.program()
    y = sim.run(prog, {"X": x, "B": wts}).outputs["Y"]
    steps = sim._plans[id(prog)].steps
    assert sum(isinstance(s, MxmSettleEarly) for s in steps) == 1  # the test covers the batch
    ref = x.astype(np.float64) @ wts[:, :N].astype(np.float64)
    assert np.allclose(y[:, :N], ref, rtol=1e-5, atol=1e-5)
    assert np.all(y[:, N:] == 0)

"""SRAM state kept across runs and programs on one Simulator (``run(keep=...)``), as a KV
cache stays on chip between a prefill and the decode steps; ``outputs=`` and ``read``.

mini positions: MXM0=0, SXM0=1, MEM0..3=2..5, VXM=6, MEM4..7=7..10, SXM1=11, MXM1=12;
a read at cycle c emits at c + 2 at its slice and moves one position a cycle.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lpx_tvm.errors import ProgramError
from lpx_tvm.machine.program import Binding, SramImage, TensorLayout
from lpx_tvm.machine.isa import DType
from lpx_tvm.sim import Simulator

from lpx_hand import E, Hand, W

# The reference interpreter runs each program alone, from its image and inputs: it has no
# state kept from an earlier run. These tests compare with numpy replays instead.
COMPARES_ITSELF = True

RNG = np.random.default_rng(77)
LANES = 16
ROWS, T_ADDR = 12, 8  # the cache: 12 int32 rows on slice 1 from line 8 (lines 8..55)


def ints(rows, lo=-1000, hi=1000):
    return RNG.integers(lo, hi, (rows, LANES)).astype(np.int32)


def index_rows(rows, n):
    idx = RNG.integers(-99, 99, (n, LANES)).astype(np.int32)  # only lane 0 counts
    idx[:, 0] = RNG.choice(rows, n, replace=False)
    return idx


def scattered(table, idx, values):
    want = table.copy()
    for k in range(len(idx)):
        want[idx[k, 0]] = values[k]
    return want


def scatter_a(n=3):
    """T[I[k]] = V[k]; Y is T's own lines (the cache returned in place)."""
    h = Hand(name="A")
    h.input("T", ROWS, "int32", 1, addr=T_ADDR)
    h.input("I", n, "int32", 0)
    h.input("V", n, "int32", 2)
    h.output("Y", ROWS, "int32", 1, addr=T_ADDR)
    # idx east from slice 0 (pos 2), values west from slice 2 (pos 4): both at pos 3 at 3
    h.add("mem.read", 0, unit=0, count=n, addr=0, stride=4, dtype="int32", dst=E(0))
    h.add("mem.read", 0, unit=2, count=n, addr=0, stride=4, dtype="int32", dst=W(0))
    h.add("mem.scatter", 3, unit=1, count=n, addr=T_ADDR, stride=4, dtype="int32", src0=W(0), src1=E(0))
    return h.program()


B_IMAGE = (np.arange(2 * LANES, dtype=np.int32) * 7 - 50).reshape(2, LANES)


def scatter_b(n=2):
    """Another program on the same cache: S = T as it starts, then T[J[k]] = V2[k]; U = V2 on
    slice 1 lines 200.. (outside the cache); Z = its own image on slice 5."""
    h = Hand(name="B")
    h.input("T", ROWS, "int32", 1, addr=T_ADDR)
    h.input("J", n, "int32", 0, addr=100)
    h.input("V2", n, "int32", 2, addr=100)
    h.output("S", ROWS, "int32", 4)
    h.output("Y", ROWS, "int32", 1, addr=T_ADDR)
    h.output("U", n, "int32", 1, addr=200)
    h.output("Z", 2, "int32", 5)
    # T from slice 1 (pos 3) at 0 emits at 2, at slice 4 (pos 7) at 6
    h.add("mem.read", 0, unit=1, count=ROWS, addr=T_ADDR, stride=4, dtype="int32", dst=E(1))
    h.add("mem.write", 6, unit=4, count=ROWS, addr=0, stride=4, dtype="int32", src0=E(1))
    # the scatter lands from 25 on, after T's rows were read (cycles 0..11)
    h.add("mem.read", 20, unit=0, count=n, addr=100, stride=4, dtype="int32", dst=E(0))
    h.add("mem.read", 20, unit=2, count=n, addr=100, stride=4, dtype="int32", dst=W(0))
    h.add("mem.scatter", 23, unit=1, count=n, addr=T_ADDR, stride=4, dtype="int32", src0=W(0), src1=E(0))
    # V2 again, from slice 2 (pos 4) at 30: at pos 3 at 33
    h.add("mem.read", 30, unit=2, count=n, addr=100, stride=4, dtype="int32", dst=W(2))
    h.add("mem.write", 33, unit=1, count=n, addr=200, stride=4, dtype="int32", src0=W(2))
    return replace(h.program(), sram_init=[SramImage(5, 0, B_IMAGE.tobytes())])


def test_scatter_programs_share_the_kept_cache():
    a, b = scatter_a(), scatter_b()
    sim = Simulator("mini")
    t0 = ints(ROWS)
    i1, v1 = index_rows(ROWS, 3), ints(3)
    r = sim.run(a, {"T": t0, "I": i1, "V": v1})
    want = scattered(t0, i1, v1)
    assert np.array_equal(r.outputs["Y"], want)

    # B sees A's writes, and scatters on top of them; its image is loaded as usual.
    j2, v2 = index_rows(ROWS, 2), ints(2)
    r = sim.run(b, {"J": j2, "V2": v2}, keep={"T"})
    assert np.array_equal(r.outputs["S"], want)
    want = scattered(want, j2, v2)
    assert np.array_equal(r.outputs["Y"], want)
    assert np.array_equal(r.outputs["U"], v2)
    assert np.array_equal(r.outputs["Z"], B_IMAGE)

    # A again, keeping the cache: the scatters accumulate.
    for _ in range(3):
        i3, v3 = index_rows(ROWS, 3), ints(3)
        r = sim.run(a, {"I": i3, "V": v3}, keep="T")
        want = scattered(want, i3, v3)
        assert np.array_equal(r.outputs["Y"], want)
    assert np.array_equal(sim.read(a, "T"), want)
    assert np.array_equal(sim.read(b, "Y"), want)
    # The lines of B outside the cache were cleared as before: A starts from zeros there.
    assert not sim.read(b, "U").any() and not sim.read(b, "Z").any()

    # A timing-only run keeps nothing and changes nothing.
    sim.run(a, timing_only=True, keep={"T"})
    r = sim.run(b, {"J": j2, "V2": v2}, keep={"T"}, outputs={"S", "Y"})
    assert r.outputs.keys() == {"S", "Y"}
    assert np.array_equal(r.outputs["S"], want)
    want = scattered(want, j2, v2)
    assert np.array_equal(r.outputs["Y"], want)

    # A program that does not keep the cache clears its lines, as any other program's.
    r = sim.run(copy_r(), {"T": small(1), "X": small(2)})
    assert np.array_equal(r.outputs["C"], R_IMAGE)
    assert not sim.read(a, "T").any()

    # Without keep, the cache is fed again.
    t4, i4, v4 = ints(ROWS), index_rows(ROWS, 3), ints(3)
    r = sim.run(a, {"T": t4, "I": i4, "V": v4})
    assert np.array_equal(r.outputs["Y"], scattered(t4, i4, v4))
    r = sim.run(b, {"T": t0, "J": j2, "V2": v2})
    assert np.array_equal(r.outputs["S"], t0)
    assert np.array_equal(r.outputs["Y"], scattered(t0, j2, v2))


R_IMAGE = (np.arange(4 * LANES) % 120 - 60).astype(np.int8).reshape(4, LANES)


def copy_r():
    """No scatter (replayed): S = T, C = the image, then T = X and the image = X."""
    h = Hand(name="R")
    h.input("T", 4, "int8", 1)
    h.input("X", 4, "int8", 2)
    h.output("S", 4, "int8", 4)
    h.output("C", 4, "int8", 5)
    h.output("Y", 4, "int8", 1)
    h.output("Z", 4, "int8", 0)
    # the image from slice 0 (pos 2) at 0: slice 5 (pos 8) at 8; T from slice 1 (pos 3) at 0: slice 4 (pos 7) at 6
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.write", 8, unit=5, count=4, addr=0, stride=1, dtype="int8", src0=E(0))
    h.add("mem.read", 0, unit=1, count=4, addr=0, stride=1, dtype="int8", dst=E(1))
    h.add("mem.write", 6, unit=4, count=4, addr=0, stride=1, dtype="int8", src0=E(1))
    # X from slice 2 (pos 4) at 10: slice 1 (pos 3) at 13; again at 14: slice 0 (pos 2) at 18
    h.add("mem.read", 10, unit=2, count=4, addr=0, stride=1, dtype="int8", dst=W(1))
    h.add("mem.write", 13, unit=1, count=4, addr=0, stride=1, dtype="int8", src0=W(1))
    h.add("mem.read", 14, unit=2, count=4, addr=0, stride=1, dtype="int8", dst=W(2))
    h.add("mem.write", 18, unit=0, count=4, addr=0, stride=1, dtype="int8", src0=W(2))
    return replace(h.program(), sram_init=[SramImage(0, 0, R_IMAGE.tobytes())])


def write_r2():
    """Another program with T at the same lines: T = X."""
    h = Hand(name="R2")
    h.input("T", 4, "int8", 1)
    h.input("X", 4, "int8", 2)
    h.output("Y", 4, "int8", 1)
    h.add("mem.read", 0, unit=2, count=4, addr=0, stride=1, dtype="int8", dst=W(1))
    h.add("mem.write", 3, unit=1, count=4, addr=0, stride=1, dtype="int8", src0=W(1))
    return h.program()


def small(k):
    return np.full((4, LANES), k, np.int8) + np.arange(LANES, dtype=np.int8)


def test_replayed_runs_keep_state():
    r_prog, r2 = copy_r(), write_r2()
    sim = Simulator("mini")
    r = sim.run(r_prog, {"T": small(1), "X": small(2)})
    assert np.array_equal(r.outputs["S"], small(1)) and np.array_equal(r.outputs["Z"], small(2))
    for k in range(3, 6):  # replays: the image is restored around the kept lines
        r = sim.run(r_prog, {"X": small(k)}, keep={"T"})
        assert np.array_equal(r.outputs["S"], small(k - 1))  # the last run's write
        assert np.array_equal(r.outputs["C"], R_IMAGE)
        assert np.array_equal(r.outputs["Y"], small(k))
    # without keep, T is what is fed
    r = sim.run(r_prog, {"T": small(9), "X": small(10)})
    assert np.array_equal(r.outputs["S"], small(9))
    assert np.array_equal(r.outputs["C"], R_IMAGE)

    # another program (first run: checked, then replayed) writes the shared lines
    sim.run(r2, {"X": small(20)}, keep={"T"})
    r = sim.run(r_prog, {"X": small(21)}, keep={"T"}, outputs=["S", "C"])
    assert r.outputs.keys() == {"S", "C"}
    assert np.array_equal(r.outputs["S"], small(20))
    assert np.array_equal(r.outputs["C"], R_IMAGE)
    assert np.array_equal(sim.read(r_prog, "T"), small(21))
    assert np.array_equal(sim.read(r_prog, "Y"), small(21))
    assert np.array_equal(sim.read(r_prog, "Z"), small(21))  # the image, overwritten by the run

    # load keeps them too; a load without keep clears the inputs
    sim.load(r2, keep={"T"})
    assert np.array_equal(sim.read(r2, "T"), small(21))
    r = sim.run(r_prog, {"X": small(22)}, keep={"T"})
    assert np.array_equal(r.outputs["S"], small(21))
    sim.load(r_prog)
    assert not sim.read(r_prog, "T").any()
    assert np.array_equal(sim.read(r_prog, "Z"), R_IMAGE)


def test_keep_errors():
    a, r_prog = scatter_a(), copy_r()
    sim = Simulator("mini")
    feed = {"I": index_rows(ROWS, 3), "V": ints(3)}
    for timing_only in (False, True):
        with pytest.raises(ProgramError, match=r"cannot keep \['Q'\].*inputs are \['I', 'T', 'V'\]"):
            sim.run(a, feed, keep={"Q", "T"}, timing_only=timing_only)
        with pytest.raises(ProgramError, match=r"input\(s\) \['T'\] are both given and kept"):
            sim.run(a, {**feed, "T": ints(ROWS)}, keep={"T"}, timing_only=timing_only)
    with pytest.raises(ProgramError, match=r"missing input 'T'"):
        sim.run(a, feed)
    with pytest.raises(ProgramError, match=r"unknown output\(s\) \['Q'\].*outputs are \['Y'\]"):
        sim.run(a, {**feed, "T": ints(ROWS)}, outputs={"Q"})

    # an image over the kept lines (T: slice 1 lines 0..3)
    over = replace(r_prog, sram_init=r_prog.sram_init + [SramImage(1, 2, bytes(4 * LANES))])
    msg = r"slice 1 lines 2\.\.5 overlaps kept input 'T' \(slice 1 lines 0\.\.3\) at lines 2\.\.3"
    with pytest.raises(ProgramError, match=msg):
        sim.run(over, {"X": small(1)}, keep={"T"})
    with pytest.raises(ProgramError, match=msg):
        sim.load(over, keep={"T"})
    sim.run(over, {"T": small(1), "X": small(1)})  # without keep it runs

    # off-chip inputs start afresh each run
    h = Hand()
    h.host_bytes = 4 * LANES
    h.bindings.append(Binding("X", "input", TensorLayout((4, LANES), DType.INT8, (), 1), offchip=0))
    with pytest.raises(ProgramError, match=r"cannot keep \['X'\]: off-chip"):
        sim.run(h.program(), keep={"X"})
    with pytest.raises(ProgramError, match="off-chip"):
        sim.read(h.program(), "X")
    with pytest.raises(ProgramError, match="no input or output named 'Q'"):
        sim.read(a, "Q")
    with pytest.raises(ProgramError, match="nothing has run"):
        Simulator("mini").read(a, "T")


def test_outputs_filter():
    b = scatter_b()
    sim = Simulator("mini")
    feed = {"T": ints(ROWS), "J": index_rows(ROWS, 2), "V2": ints(2)}
    r = sim.run(b, feed, outputs={"Z"})
    assert r.outputs.keys() == {"Z"} and np.array_equal(r.outputs["Z"], B_IMAGE)
    assert sim.run(b, feed, outputs=()).outputs == {}
    assert sim.run(b, feed).outputs.keys() == {"S", "Y", "U", "Z"}
    r_prog = copy_r()
    r = sim.run(r_prog, {"T": small(1), "X": small(2)}, outputs="Y")
    assert r.outputs.keys() == {"Y"} and np.array_equal(r.outputs["Y"], small(2))

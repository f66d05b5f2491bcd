"""Weights installed from addresses computed at run time: ``mem.gather`` feeding
``mxm.install`` (docs/moe.md, "Experts installed by address").

A mixture-of-experts layer picks its experts per token, yet a static program fixes every
cycle. The experts' weights lie side by side in SRAM, a table of ``E * K`` rows; a gather
reads the ``K`` rows of expert ``e`` through the indices ``e * K + k`` and streams them
into a plane's install, as a read would. The program, and so every cycle, is the same
whichever expert the indices name. These programs are written by hand, their cycles
worked out here from the ``mini`` preset's latencies and floorplan (docs/isa.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from lpx_tvm.machine.isa import DType

from lpx_hand import E, Hand, W
from test_hazards import expect

RNG = np.random.default_rng(37)
ACC = {"int8": "int32", "fp32": "fp32"}


def expert_program(dtype: str, experts: int, K: int, M: int, *, early: int = 0):
    """x (M rows) times expert ``e``'s K x 16 weights, the expert named by the index rows.

    mini floorplan: MXM0 at 0, MEM0..3 at 2..5. The indices (int32) on slice 3 flow west
    to the table on slice 1, whose gather streams the rows west to plane 0; x on slice 0;
    the sums drained east to slice 2. ``early`` issues the install that many cycles early.
    Returns (Hand, cycle of the install)."""
    h = Hand("mini")
    L = h.lat
    w = DType.parse(dtype).itemsize
    acc = DType.parse(ACC[dtype])
    s_idx, s_tab, s_x, s_out = 3, 1, 0, 2
    pp = h.pos("MXM", 0)
    h.input("I", K, "int32", s_idx)
    h.input("T", experts * K, dtype, s_tab)
    h.input("X", M, dtype, s_x)
    h.output("Y", M, acc.name.lower(), s_out)
    # The indices leave slice 3 at mem_read and reach the gather on slice 1 two positions on.
    t_gather = L["mem_read"] + abs(h.mem(s_tab) - h.mem(s_idx))
    # Gathered rows leave slice 1 at mem_gather and cross to the plane.
    t_install = t_gather + L["mem_gather"] + abs(pp - h.mem(s_tab))
    t_mul = t_install + K + L["mxm_install"]
    t_x = t_mul - L["mem_read"] - abs(pp - h.mem(s_x))
    r = h.cfg.mxm_cycles_per_vector[dtype]
    t_drain = max(t_mul + r * (k + 1) + L["mxm_mul"] - 1 - k for k in range(M))
    t_write = t_drain + L["mxm_drain"] + abs(h.mem(s_out) - pp)
    h.add("mem.read", 0, unit=s_idx, count=K, addr=0, stride=4, dtype="int32", dst=W(0))
    h.add("mem.gather", t_gather, unit=s_tab, count=K, addr=0, stride=w, dtype=dtype, src0=W(0), dst=W(1))
    h.add("mxm.install", t_install - early, unit=0, buf=0, count=K, dtype=dtype, aux0=16, src0=W(1))
    h.add("mem.read", t_x, unit=s_x, count=M, addr=0, stride=w, dtype=dtype, dst=W(2))
    h.add("mxm.mul", t_mul, unit=0, buf=0, addr=0, count=M, dtype=dtype, src0=W(2))
    h.add("mxm.drain", t_drain, unit=0, addr=0, count=M, dtype=acc, dst=E(0))
    h.add("mem.write", t_write, unit=s_out, count=M, addr=0, stride=acc.itemsize, dtype=acc, src0=E(0))
    return h, t_install


def expert_rows(e: int, K: int) -> np.ndarray:
    """The index rows of expert ``e``: ``e * K + k`` in lane 0, junk elsewhere (unread)."""
    idx = RNG.integers(-1000, 1000, (K, 16)).astype(np.int32)
    idx[:, 0] = e * K + np.arange(K)
    return idx


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_each_expert_same_cycles(dtype):
    """Every expert's product is exact, and the program's cycles are the same for each."""
    experts, K, M = 5, 16, 3
    # Small integers: the fp32 sums are exact, so both dtypes compare bit for bit.
    table = RNG.integers(-8, 9, (experts * K, 16)).astype(DType.parse(dtype).np)
    x = RNG.integers(-8, 9, (M, 16)).astype(DType.parse(dtype).np)
    h, _ = expert_program(dtype, experts, K, M)
    cycles = set()
    for e in range(experts):
        r = h.run({"I": expert_rows(e, K), "T": table, "X": x})
        want = x.astype(np.int64) @ table[e * K:(e + 1) * K].astype(np.int64)
        assert np.array_equal(r.outputs["Y"].astype(np.int64), want), f"expert {e}"
        cycles.add(r.cycles)
    assert len(cycles) == 1, cycles
    # Timing alone (no data, no addresses) gives the same count.
    assert h.run(timing_only=True).cycles == cycles.pop()


def test_install_before_the_gathered_rows_arrive():
    """One cycle early, the install finds no row on its stream: the gather's latency
    (mem_gather, 4 on mini, against mem_read's 2) is part of the install's timing."""
    h, t_install = expert_program("int8", 3, 16, 2, early=1)
    table = RNG.integers(-8, 9, (48, 16)).astype(np.int8)
    x = RNG.integers(-8, 9, (2, 16)).astype(np.int8)
    expect(h, "stream-empty", 2, "mxm0", t_install - 1, {"I": expert_rows(2, 16), "T": table, "X": x})


def test_index_past_the_table():
    """An index naming a row past the table's lines is an address error in a functional
    run (a timing-only run knows no addresses)."""
    h, _ = expert_program("int8", 3, 16, 2)
    idx = expert_rows(2, 16)
    idx[5, 0] = 10_000  # line 10_000 is past mini's slices
    table = RNG.integers(-8, 9, (48, 16)).astype(np.int8)
    x = RNG.integers(-8, 9, (2, 16)).astype(np.int8)
    expect(h, "address-out-of-range", 1, "mem1", expert_program("int8", 3, 16, 2)[0].instrs[1].cycle,
           {"I": idx, "T": table, "X": x}, both=False)

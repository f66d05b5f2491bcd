"""``ProgramBuilder.install_by_index``: one of several weight matrices, the one an index
computed on chip names, installed through gathers (docs/moe.md, "Experts installed by
address"), against numpy, with the same cycles whichever matrix is named."""

from __future__ import annotations

import numpy as np
import pytest

from lpx_tvm.errors import SchedulingError
from lpx_tvm.machine.isa import DType
from lpx_tvm.sim import Simulator
from lpx_tvm.target.builder import ProgramBuilder

RNG = np.random.default_rng(370)
ACC = {"int8": "int32", "fp16": "fp32", "fp32": "fp32"}


def expert_product(dtype: str, experts: int, K: int, M: int, part_slices=(0, 1, 2, 3)):
    """y = x @ table[expert]: the experts' K x 16 matrices cut into one region a slice of
    ``part_slices``, each region holding its rows of every expert in turn (mini: plane 0
    installs from the slices west of the VXM)."""
    b = ProgramBuilder("mini")
    nparts = len(part_slices)
    rows = K // nparts  # every expert's rows in each region
    tables = RNG.integers(-8, 9, (experts, K, 16)).astype(DType.parse(dtype).np)
    regions = []
    for p, sl in enumerate(part_slices):
        part = tables[:, p * rows:(p + 1) * rows].reshape(experts * rows, 16)  # expert-major
        regions.append((p * rows, b.constant(f"experts{p}", part, dtype, slices=[sl]).tile(0).rows(0, rows)))
    x = b.input("x", (M, 16), dtype, slices=[5])
    chosen = b.input("expert", (1, 16), "int32", slices=[6])
    counting = np.zeros((16, 16), np.int32)
    counting[:, 0] = np.arange(16)
    counting_t = b.constant("counting", counting, "int32", slices=[4])
    base = b.tensor("base", (1, 16), "int32", slices=[7])
    y = b.output("y", (M, 16), ACC[dtype], slices=[6])
    g = b.group("expert_base")  # e * rows: where expert e's rows start in each region
    g.write(g.vxm("vxm.mul", g.read(chosen.tile(0)), imm=rows), base.tile(0))
    b.install_by_index("experts.install", 0, 0, regions, experts, rows, base.tile(0), counting_t.tile(0), 16)
    g = b.group("experts.mul")
    g.mul(0, 0, g.read(x.tile(0)), acc=0)
    g = b.group("experts.drain")
    g.write(g.drain(0, 0, M, ACC[dtype]), y.tile(0))
    return b.build(), tables


@pytest.mark.parametrize("dtype", ["int8", "fp16", "fp32"])
def test_each_expert_same_cycles(dtype):
    """int8: four lanes, one group of four gathers; fp16: two lanes, two groups; fp32: one
    lane, four groups. Small integers keep the float sums exact."""
    experts, K, M = 5, 16, 3
    prog, tables = expert_product(dtype, experts, K, M)
    gathers = [i for i in prog.instrs if i.op == "mem.gather"]
    assert len(gathers) == 4 and not any(i.op == "mem.read" and i.unit in (0, 1, 2, 3) for i in prog.instrs), \
        "every weight row comes through a gather"
    x = RNG.integers(-8, 9, (M, 16)).astype(DType.parse(dtype).np)
    cycles = set()
    for e in range(experts):
        chosen = np.zeros((1, 16), np.int32)
        chosen[0, 0] = e
        r = Simulator("mini").run(prog, {"x": x, "expert": chosen})
        want = x.astype(np.float64) @ tables[e].astype(np.float64)
        assert np.array_equal(r.outputs["y"].astype(np.float64), want), f"expert {e}"
        cycles.add(r.cycles)
    assert len(cycles) == 1, cycles
    assert Simulator("mini").run(prog, timing_only=True).cycles == cycles.pop()


def test_parts_on_one_slice_take_turns():
    """Parts that share a slice (one read port) go in separate groups, each with its own
    indices: two regions on slice 0 still give the right product."""
    prog, tables = expert_product("int8", 3, 16, 2, part_slices=(0, 0, 1, 2))
    x = RNG.integers(-8, 9, (2, 16)).astype(np.int8)
    chosen = np.zeros((1, 16), np.int32)
    chosen[0, 0] = 2
    r = Simulator("mini").run(prog, {"x": x, "expert": chosen})
    assert np.array_equal(r.outputs["y"].astype(np.int64), x.astype(np.int64) @ tables[2].astype(np.int64))


def test_too_few_counting_rows():
    b = ProgramBuilder("mini")
    t = b.constant("experts", np.zeros((64, 16), np.int8), "int8", slices=[0])
    counting = b.constant("counting", np.zeros((2, 16), np.int32), "int32", slices=[4])
    base = b.tensor("base", (1, 16), "int32", slices=[5])
    with pytest.raises(SchedulingError, match="counting rows"):
        b.install_by_index("e", 0, 0, [(0, t.tile(0).rows(0, 16))], 4, 16, base.tile(0), counting.tile(0), 16)

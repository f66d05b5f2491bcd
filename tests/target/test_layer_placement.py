"""A layer's place among its neighbours: the plane of its first block (``first_plane``)
and how many of each plane's installs go ahead of earlier work (``install_ahead``).

The hoist is checked on a program built by hand (where each group must land follows from
what it touches); the two decisions are checked on compiled layers against numpy, and
the planes their multiplies run on against the round robin worked out by hand.
"""

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from lpx_tvm import load_config
from lpx_tvm.errors import SchedulingError
from lpx_tvm.pipeline import build_executable, lower
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.sim import Simulator
from lpx_tvm.target.builder import Barrier, ProgramBuilder
from lpx_tvm.target.codegen import TilingPolicy
from lpx_tvm.target.codegen.mxm_tiles import wavefront
from lpx_tvm.tir_schedules import default_tiling
from lpx_tvm.tir_schedules.schedules import DenseTiling, describe
from lpx_tvm.tune.space import fits
from lpx_tvm.tune.tuner import extract_tasks

MINI = load_config("mini")  # 2 planes, 16 lanes, 2 weight buffers
RNG = np.random.default_rng(0)


def test_hoist_moves_a_group_to_just_after_the_last_one_touching_its_state():
    b = ProgramBuilder(MINI, "hoist")
    A, B = b.input("A", (4, 16), "fp32"), b.input("B", (16, 16), "fp32")
    C, D = b.output("C", (4, 16), "fp32"), b.output("D", (4, 16), "fp32")
    g = b.group("install0")
    g.install(0, 0, g.read(B.tile(0).rows(0, 16)), width=16)
    g = b.group("mul0")
    g.mul(0, 0, g.read(A.tile(0).rows(0, 4)), acc=0)
    g = b.group("drain0")
    g.write(g.drain(0, 0, 4, "fp32"), C.tile(0).rows(0, 4))
    # Plane 0 buffer 0 again: it must stay after mul0, which reads that buffer.
    again = b.install("install0b", 0, 0, [(0, B.tile(0).rows(0, 16))], width=16)
    b.hoist(again)
    assert [g.tag for g in b.schedule.entries[:3]] + [b.schedule.entries[2 + len(again)].tag] == \
        ["install0", "mul0", "install0b", "drain0"]
    # Plane 1 touches nothing of plane 0: it goes before everything.
    other = b.install("install1", 1, 0, [(0, B.tile(0).rows(0, 16))], width=16)
    b.hoist(other)
    assert all(g.tag == "install1" for g in b.schedule.entries[:len(other)])
    g = b.group("mul1")
    g.mul(1, 0, g.read(A.tile(0).rows(0, 4)), acc=0)
    g = b.group("drain1")
    g.write(g.drain(1, 0, 4, "fp32"), D.tile(0).rows(0, 4))
    a, w = RNG.standard_normal((4, 16)).astype(np.float32), RNG.standard_normal((16, 16)).astype(np.float32)
    out = Simulator(MINI).run(b.build(), {"A": a, "B": w}).outputs
    np.testing.assert_allclose(out["C"], a @ w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["D"], a @ w, rtol=1e-6, atol=1e-6)


def test_hoist_stops_at_a_barrier_and_only_moves_the_last_groups():
    b = ProgramBuilder(MINI, "barrier")
    B = b.input("B", (16, 16), "fp32")
    first = b.install("install0", 0, 0, [(0, B.tile(0).rows(0, 16))], width=16)
    b.sync()
    late = b.install("install1", 1, 0, [(0, B.tile(0).rows(0, 16))], width=16)
    b.hoist(late)
    assert isinstance(b.schedule.entries[len(first)], Barrier) and b.schedule.entries[len(first) + 1] is late[0]
    with pytest.raises(SchedulingError, match="added last"):
        b.hoist(first)


def _two_dense(k=32, n=48, seed=0):
    """x (4, k) -> MatMul w1 (k, n) -> Relu -> MatMul w2 (n, n): integer weights, so that
    fp32 results are exact."""
    rng = np.random.default_rng(seed)
    w1 = rng.integers(-2, 3, (k, n)).astype(np.float32)
    w2 = rng.integers(-2, 3, (n, n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model, w1, w2


def _run(model, tuned, x):
    cpu_mod, regions, offload = lower(import_onnx(model).mod, MINI, "fp32", TilingPolicy(tuned))
    exe = build_executable(cpu_mod, regions, MINI, "fp32", offload)
    (region,) = exe.regions.values()
    return exe.run([x])[0], region.program


@pytest.mark.parametrize("first_plane, ahead", [(0, 0), (1, 0), (0, 1), (1, 2)])
def test_placement_decisions_keep_the_numbers_and_move_the_planes(first_plane, ahead):
    model, w1, w2 = _two_dense()
    tasks = extract_tasks(import_onnx(model).mod, MINI, "fp32")
    assert len(tasks) == 2
    second = next(t for t in tasks if t.workload.K == 48)
    t = DenseTiling(m=4, k=16, n=16, first_plane=first_plane, install_ahead=ahead)
    x = RNG.integers(-3, 4, (4, 32)).astype(np.float32)
    got, program = _run(model, {second.key: t}, x)
    np.testing.assert_array_equal(got, np.maximum(x @ w1, 0) @ w2)
    # The first layer keeps its default tiling: blocks of 2 rows, so 2 x 3 blocks of 2
    # reduction tiles, round robin from plane 0: 6 multiplies on each plane.
    # The second: one row block, 3 column blocks of 3 reduction tiles. 3 blocks on 2
    # planes leave 1 over, split in 2 parts when 3 tiles * max(4 rows * 16 cycles (fp32),
    # 16 install cycles) * (1 - 1/2) = 96 saved beat 5 * 4 + 20 = 40: it is, into parts
    # of 2 and 1 tiles. Round robin from first_plane: block 0, block 1, part 0, part 1, so
    # first_plane multiplies 3 + 2 tiles and the other plane 3 + 1.
    muls = [ins.unit for ins in program.instrs if ins.op in ("mxm.mul", "mxm.mac")]
    want = {first_plane: 6 + 5, 1 - first_plane: 6 + 4}
    assert {p: muls.count(p) for p in (0, 1)} == want


def test_placement_decisions_are_checked_and_described():
    w = extract_tasks(import_onnx(_two_dense()[0]).mod, MINI, "fp32")[0].workload
    t = default_tiling(MINI, w)
    assert fits(w, dataclasses.replace(t, first_plane=1, install_ahead=2), MINI) is None
    assert "first plane 2 of 2 planes" in fits(w, dataclasses.replace(t, first_plane=2), MINI)
    assert "3 installs ahead" in fits(w, dataclasses.replace(t, install_ahead=3), MINI)
    assert describe(dataclasses.replace(t, first_plane=1, install_ahead=2)).endswith(
        "first plane 1, 2 install(s) ahead")


def test_wavefront_emits_one_round_of_the_planes_side_by_side():
    # Blocks A, B, C of 2 tiles each on 2 planes (A, C on plane 0, B on plane 1), in the
    # schedule's order A0 A1 B0 B1 C0 C1: round 0 is A and B, step by step (A0 B0 A1 B1),
    # then round 1, C alone.
    keys = ["A", "A", "B", "B", "C", "C"]
    parts = [0] * 6
    planes = [0, 0, 1, 1, 0, 0]
    assert wavefront(keys, parts, planes) == [0, 2, 1, 3, 4, 5]
    # K parts of one block are (block, part)s of their own: a block split in 2 parts of
    # 2 tiles on planes 0 and 1 runs both parts side by side.
    assert wavefront(["A"] * 4, [0, 0, 1, 1], [0, 0, 1, 1]) == [0, 2, 1, 3]


def test_region_outputs_sit_next_to_the_vxm(tmp_path):
    model, w1, w2 = _two_dense()
    x = RNG.integers(-3, 4, (4, 32)).astype(np.float32)
    got, program = _run(model, {}, x)
    np.testing.assert_array_equal(got, np.maximum(x @ w1, 0) @ w2)
    (out,) = [b for b in program.bindings if b.role == "output"]
    # mini's floorplan: MXM, SXM, 4 MEM (positions 2-5), VXM (6), 4 MEM (7-10), SXM, MXM.
    # The output's 3 column tiles take the slices 1 hop from the VXM (3 and 4), then one
    # 2 hops away (2 before 5).
    assert sorted(sl for sl, _ in out.layout.tiles) == [2, 3, 4]

"""The reference interpreter and the simulator agree: outputs bit for bit, and cycles.

:mod:`lpx_tvm.sim.reference` defines each instruction plainly, one at a time; the
simulator checks the schedule, then runs recorded steps on whole tiles with views,
in-place ops and lazy MXM accumulation, and replays them on later runs. Each program
below runs on a Simulator twice (a checked run, then a replay) and on the reference:

- the hand-written kernels (lpx_tvm.kernels) on mini and tsp;
- the compiled test models of tests/program_hashes.py (the ResNet-50 variants are
  ``slow``);
- random valid programs (tests/machine/program_strategies.py ``valid_programs``);
- the hand-written programs of tests/sim: every functional run there is compared with
  the reference by tests/sim/conftest.py (``test_hand_programs_are_compared`` checks
  that it does).

Programs that the two would disagree on, one instruction changed, show that the
comparison can fail.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings

from lpx_tvm.kernels import gemm, layernorm, softmax, transpose
from lpx_tvm.machine.config import load_config
from lpx_tvm.machine.isa import DType
from lpx_tvm.sim import Simulator, reference
from lpx_tvm.sim.mxm import Accumulators
from lpx_tvm.sim.numerics import ACC_FLOAT

from lpx_hand import E, Hand, assert_same_as_reference, compare_runs_with_reference

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "machine"))
sys.path.insert(0, os.path.join(HERE, ".."))

from program_strategies import random_data, valid_programs  # noqa: E402

COMPARES_ITSELF = True  # conftest.py need not compare these runs again

# Overflow to inf and invalid ops (rsqrt of a negative) are legitimate results here.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def random_inputs(program, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {b.name: random_data(rng, b.layout.shape, b.layout.dtype) for b in program.inputs}


def check(config, program, inputs):
    """A checked run and a replay on one Simulator, each equal to the reference."""
    sim = Simulator(config)
    first = sim.run(program, inputs)
    again = sim.run(program, inputs)
    assert_same_as_reference(sim, program, inputs, first, again)
    return first


# ---- hand-written kernels --------------------------------------------------------

def _kernels(preset):
    lanes = load_config(preset).lanes
    rng = np.random.default_rng(5)
    cols = 300 if preset == "tsp" else 13
    return {
        "gemm_int8": gemm(preset, 70, 2 * lanes + 5, lanes + 9, "int8"),
        "gemm_fp16": gemm(preset, 45, 3 * lanes - 2, 2 * lanes + 1, "fp16"),
        "gemm_bf16": gemm(preset, 21, lanes + 7, lanes - 3, "bf16"),
        "gemm_fp16_bias_relu": gemm(preset, 33, lanes + 3, lanes + 5, "fp16", bias=rng.standard_normal(lanes + 5),
                                    relu=True, out_dtype="fp16"),
        "gemm_int8_bias_relu": gemm(preset, 20, 40, 24, "int8", bias=rng.integers(-5000, 5000, 24), relu=True),
        "gemm_rows_beyond_accumulators": gemm(preset, 300, 20, 40, "int8"),
        "softmax_fp16": softmax(preset, 24, 16, "fp16"),
        "softmax_fp32": softmax(preset, 9, lanes, "fp32"),
        "layernorm_fp16": layernorm(preset, 8, cols, rng.standard_normal(cols), rng.standard_normal(cols)),
        "transpose_fp16": transpose(preset, 32, 48, "fp16"),
        "transpose_int8": transpose(preset, 17, 23, "int8"),
    }


@pytest.mark.parametrize("preset", ["mini", "tsp"])
def test_kernels(preset):
    for name, program in _kernels(preset).items():
        try:
            check(preset, program, random_inputs(program))
        except AssertionError as e:
            raise AssertionError(f"kernel {name} on {preset}: {e}") from None


# ---- compiled models ---------------------------------------------------------------

_SLOW = ("light_resnet50_tsp_bf16", "light_resnet50_tsp_bf16_shipped_log", "resnet50_qdq_tsp_int8")
_MODELS = ["small_cnn_mini_fp32", "wide_cnn_mini_fp32", "bert_tiny_tsp_fp16", "gpt2_tiny_tsp_fp16"] + \
    [pytest.param(m, marks=pytest.mark.slow) for m in _SLOW]


@pytest.mark.parametrize("model", _MODELS)
def test_compiled_models(model):
    import program_hashes

    compiled = program_hashes.MODELS[model]()
    regions = compiled.executable.regions
    assert regions
    for name, region in regions.items():
        program = region.program
        check(compiled.executable.config, program, random_inputs(program, seed=len(program.instrs)))


# ---- random valid programs -----------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(valid_programs("mini"))
def test_random_programs_mini(made):
    program, inputs = made
    check("mini", program, inputs)


@settings(max_examples=25, deadline=None)
@given(valid_programs("tsp", max_groups=4))
def test_random_programs_tsp(made):
    program, inputs = made
    check("tsp", program, inputs)


# ---- the comparison can fail -----------------------------------------------------------

def _changed(program, pick, change):
    """``program`` with the first instruction that ``pick`` selects replaced by ``change(ins)``."""
    instrs = list(program.instrs)
    k = next(k for k, ins in enumerate(instrs) if pick(ins))
    instrs[k] = change(instrs[k])
    return replace(program, instrs=instrs)


def _imm_changed():  # layernorm's scale by 1/cols or its epsilon
    program = layernorm("mini", 6, 16, np.ones(16), np.zeros(16), "fp32")
    return program, _changed(program, lambda i: i.op.startswith("vxm.") and i.src1 is None and i.imm != 0,
                             lambda i: replace(i, imm=i.imm * 2))


def _addr_changed():  # one read of gemm one line further
    program = gemm("mini", 10, 20, 12, "int8")
    return program, _changed(program, lambda i: i.op == "mem.read" and i.count > 1,
                             lambda i: replace(i, addr=i.addr + 1))


def _acc_row_changed():  # a drain of gemm one accumulator row further
    program = gemm("mini", 10, 20, 12, "fp16", bias=np.random.default_rng(6).standard_normal(12))
    return program, _changed(program, lambda i: i.op == "mxm.drain", lambda i: replace(i, addr=i.addr + 1))


@pytest.mark.parametrize("make", [_imm_changed, _addr_changed, _acc_row_changed])
def test_a_changed_instruction_disagrees(make):
    """The simulator runs a kernel, the reference the kernel with one instruction changed
    (an immediate, an SRAM address, an accumulator row): their outputs differ (the cycles
    do not), and the comparison fails."""
    program, changed = make()
    inputs = random_inputs(program)
    sim = Simulator("mini")
    got = sim.run(program, inputs)
    want = reference.run("mini", changed, inputs)
    assert got.cycles == want.cycles
    assert any(not np.array_equal(got.outputs[k], want.outputs[k]) for k in got.outputs)
    with pytest.raises(AssertionError, match="differs from the reference"):
        assert_same_as_reference(sim, changed, inputs, got)


def test_hand_programs_are_compared(monkeypatch):
    """tests/sim/conftest.py compares every functional run of these tests with the
    reference: a reference that computes something else fails a hand-written program."""
    compare_runs_with_reference(monkeypatch)  # what conftest.py does for the other files
    h = Hand()
    x = random_data(np.random.default_rng(7), (4, 16), DType.FP32)
    h.input("X", 4, "fp32", 0)
    h.output("Y", 4, "fp32", 4)
    # slice 0 (position 2) reads at 0, emits at 2 on E0; the VXM (6) at 6 emits at 8 on E1;
    # slice 4 (position 7) writes at 9
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=4, dtype="fp32", dst=E(0))
    h.add("vxm.add", 6, unit=0, count=4, dtype="fp32", src0=E(0), imm=1.0, dst=E(1))
    h.add("mem.write", 9, unit=4, count=4, addr=0, stride=4, dtype="fp32", src0=E(1))
    assert np.array_equal(h.run({"X": x}).outputs["Y"], x + np.float32(1))
    monkeypatch.setattr(reference, "vxm_binary", lambda m, ins, t: m.emit(ins, t, m.take(ins, t, ins.src0)))
    with pytest.raises(AssertionError, match="differs from the reference"):
        h.run({"X": x})


# ---- fp32 sums in the reference's order ---------------------------------------------------

def test_fp32_block_of_a_repeated_line_sums_as_the_reference():
    # A stream read with stride 0 repeats one line, so the activations are a broadcast
    # view (row stride 0). BLAS orders a row's fp32 sum by the operands' layout: the
    # block must be summed from row-major operands, as the reference sums it.
    x = np.broadcast_to(np.array([-0.2686, -0.2617, 0.02354, -0.4834], np.float16), (6, 4))
    rows = np.zeros((4, 16), np.float16)
    rows[:, 0] = [-3.244, 7.08, 0.5776, 0.1583]
    accs = Accumulators(1, 8, 16)
    accs.start_run()
    accs.split(0, x, rows, 1)
    accs.settle(0, 0, 0, 6, None, None)
    want = np.ascontiguousarray(x, np.float32) @ rows[:, :1].astype(np.float32)
    got = accs.acc_f[0, :6, :1]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (got[:, 0], want[:, 0])


def test_fp32_block_with_a_repeated_weight_row_sums_as_the_reference():
    # Three splits (K = 1, 2, 1); the second installed one line twice (a read with stride
    # 0), so the concatenated weights must not take that part's layout. (fp16 bit
    # patterns of a program whose sum came out one ulp off.)
    def fp16(*bits):
        return np.array(bits, np.uint16).view(np.float16)[None]

    xs = [fp16(51465), fp16(42698, 49342), fp16(50102)]
    ws = [fp16(9222, 48186, 11552, 11959), np.broadcast_to(fp16(13895, 18433, 11784, 44305), (2, 4)),
          fp16(48303, 50064, 11441, 49487)]
    accs = Accumulators(1, 8, 16)
    accs.start_run()
    for x, w in zip(xs, ws):
        accs.split(0, x, w, 4)
    accs.settle(0, 0, 0, 1, None, None)
    # The reference's operands: row-major fp32 (a column-major copy sums in another order).
    x = np.ascontiguousarray(np.concatenate(xs, axis=1), np.float32)
    want = x @ np.ascontiguousarray(np.concatenate(ws), np.float32)
    got = accs.acc_f[0, :1, :4]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (got, want)


def test_fp32_mac_with_repeated_weight_rows_sums_as_the_reference():
    # A mac that continues no block (its rows were drained since the mul) is computed at
    # once; its weights installed one line 7 times (a read with stride 0) are a broadcast
    # view, whose fp32 copy must be row-major, as the reference's: a column-major one made
    # BLAS (a gemv for one row) order the sum differently (fp16 bit patterns of such a case).
    x = np.array([[49196, 14411, 14781, 16714, 42784, 16427, 16796]], np.uint16).view(np.float16)
    line = np.zeros(16, np.float16)
    line[:5] = np.array([16538, 50363, 16618, 14703, 15048], np.uint16).view(np.float16)
    rows = np.broadcast_to(line, (7, 16))
    accs = Accumulators(1, 8, 16)
    accs.start_run()
    accs.now(0, 0, x, rows, 5, None, ACC_FLOAT, accumulate=False)
    want = np.ascontiguousarray(x, np.float32) @ np.ascontiguousarray(rows[:, :5], np.float32)
    got = accs.acc_f[0, :1, :5]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (got, want)

"""The partitioner's check and the lowering ask the same rule, so they agree: an
elementwise op with a constant is either offloaded and lowered to the numbers numpy
gives, or kept on the CPU by the check and refused by the lowering for the same reason.

The case that once split them: a (1, C) or (C,) constant on an NCHW value. Numpy
aligns it with W, not with the channels; the lowering used to add it per channel."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import lpx_tvm
from lpx_tvm.machine.config import load_config
from lpx_tvm.relax_passes import partition_for_lpx
from lpx_tvm.target.codegen import UnsupportedOnLPX, compile_region
from lpx_tvm.target.codegen.graph import Operand, Region, RegionOp, OpCall
from lpx_tvm.target.codegen.rules import activation_row_problem, binary_operands_problem, constant_broadcast

RNG = np.random.default_rng(11)

# (value shape, constant shape): W == C, so every constant below broadcasts in numpy.
CASES = [
    ((1, 4, 3, 4), (1, 4)),  # along W: the disagreement the check and the lowering had
    ((1, 4, 3, 4), (4,)),  # along W as well
    ((1, 4, 3, 4), (1, 1, 1, 4)),  # along W
    ((1, 4, 3, 4), (4, 1, 1)),  # per channel
    ((1, 4, 3, 4), (1, 4, 1, 1)),  # per channel
    ((1, 4, 3, 4), (1, 4, 3, 4)),  # full
    ((1, 4, 3, 4), (1, 1)),  # a scalar
    ((1, 4, 3, 4), (1, 1, 3, 1)),  # along H
    ((6, 4), (4,)),  # per channel (the last axis)
    ((6, 4), (1, 4)),
    ((6, 4), (6, 1)),  # per row
    ((6, 4), (1, 1, 4)),  # a result larger than the value
]


def _module(op: str, shape: tuple, const: np.ndarray):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(getattr(relax.op, op)(x, relax.const(const)))
        bb.emit_func_output(y)
    return bb.get()


def _check_verdict(op: str, shape: tuple, const: np.ndarray) -> "str | None":
    """The check's reason for keeping the op on the CPU, or None when it is offloaded."""
    _, report = partition_for_lpx(_module(op, shape, const), "mini", "fp32")
    if report.cpu.get(op):
        return report.reasons[op][0]
    assert report.lpx.get(op) == 1
    return None


def _lowering_verdict(op: str, shape: tuple, const: np.ndarray) -> "str | None":
    """The lowering's reason for refusing the op, or None when it lowers it."""
    out_shape = np.broadcast_shapes(shape, const.shape)
    x = Operand("x", shape=shape)
    step = OpCall(op, [x, Operand(const=const, shape=const.shape)], {}, out_shape, "float32")
    region = Region("r", [x], [RegionOp(f"lpx.{op}", step, [], "y", out_shape)], ["y"])
    try:
        compile_region(load_config("mini"), "fp32", "r", region)
    except UnsupportedOnLPX as e:
        return str(e)
    return None


@pytest.mark.parametrize("shape, cshape", CASES)
def test_check_and_lowering_agree_on_constant_broadcasts(shape, cshape):
    const = RNG.standard_normal(cshape).astype(np.float32)
    check, lowering = _check_verdict("add", shape, const), _lowering_verdict("add", shape, const)
    assert check == lowering
    if check is not None:
        return
    exe = lpx_tvm.build(_module("add", shape, const), preset="mini", precision="fp32")
    x = RNG.standard_normal(shape).astype(np.float32)
    (got,) = exe.run([x])
    np.testing.assert_allclose(got, x + const, rtol=1e-6, atol=1e-6)


def test_constant_along_width_is_refused_by_both_with_one_reason():
    const = np.arange(4, dtype=np.float32).reshape(1, 4)
    reason = _check_verdict("add", (1, 4, 3, 4), const)
    assert reason == _lowering_verdict("add", (1, 4, 3, 4), const)
    assert reason == ("constant of shape (1, 4) broadcast against (1, 4, 3, 4): only scalars, one value per "
                      "channel or a full tensor are supported")


@pytest.mark.parametrize("cshape", [(1, 1), (1, 4, 1, 1), (1, 4, 3, 4)])
def test_constant_minus_tensor_runs_on_lpx(cshape):
    """c - x (a scalar, per-channel or full c) is offloaded and lowered as x * -1 + c."""
    shape = (1, 4, 3, 4)
    const = RNG.standard_normal(cshape).astype(np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.subtract(relax.const(const), x))
        bb.emit_func_output(y)
    _, report = partition_for_lpx(bb.get(), "mini", "fp32")
    assert report.lpx.get("subtract") == 1 and not report.cpu
    exe = lpx_tvm.build(bb.get(), preset="mini", precision="fp32")
    xv = RNG.standard_normal(shape).astype(np.float32)
    (got,) = exe.run([xv])
    np.testing.assert_array_equal(got, const - xv)  # one rounding, as numpy's


@pytest.mark.parametrize("tensor, const, kind", [
    ((2, 8, 5, 5), (8, 1, 1), "channel"), ((2, 8, 5, 5), (1, 8, 1, 1), "channel"),
    ((2, 8, 5, 5), (8,), None), ((2, 8, 5, 5), (1, 8), None), ((2, 8, 5, 5), (2, 8, 5, 5), "full"),
    ((2, 8, 5, 5), (1, 1, 1, 1, 1), "scalar"), ((3, 7), (7,), "channel"), ((3, 7), (1, 1, 7), "channel"),
    ((3, 7), (3, 1), None), ((), (3,), None),
])
def test_constant_broadcast_kinds(tensor, const, kind):
    assert constant_broadcast(tensor, const) == kind


def test_a_result_larger_than_the_value_is_refused():
    assert binary_operands_problem("add", (3, 7), (1, 1, 7), False, True, (1, 3, 7)) == \
        "the result is larger than the operands"
    assert binary_operands_problem("multiply", (1, 7), (3, 7), True, False, (3, 7)) is None


def test_activation_row_fit():
    cfg = load_config("mini")
    # An image row of W pixels, its channels padded to whole lane tiles, against 1/8 of the SRAM.
    per_pixel = -(-20 // cfg.lanes) * cfg.lanes * 2  # 20 channels at fp16
    widest = cfg.sram_bytes // 8 // per_pixel
    assert activation_row_problem((1, 20, 2, widest), 2, cfg, "fp16") is None
    problem = activation_row_problem((1, 20, 2, widest + 1), 2, cfg, "fp16")
    assert problem.startswith(f"one row of activation (1, 20, 2, {widest + 1}) needs {(widest + 1) * per_pixel} "
                              "bytes at fp16, more than 1/8 of the mini SRAM")

"""Reading the int8 composites of a QDQ model: dtypes, scalars, and an MXM composite seen
as its integer conv2d / matmul (what the weight placement and the MXM lowering read)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...machine.isa import DType
from .graph import RegionOp, OpCall, UnsupportedOnLPX

_RELAX_DTYPES = {"int8": DType.INT8, "uint8": DType.UINT8, "int32": DType.INT32, "float16": DType.FP16,
                 "bfloat16": DType.BF16, "float32": DType.FP32, "float8_e4m3fn": DType.FP8}

# The int8 composites that run on the MXM.
QMXM_COMPOSITES = ("lpx.qconv2d", "lpx.qdense")
# Those of a float build: int8 values (widened to int32 in Relax) times int8 weights, or
# fp8 values (widened to float32) times fp8 weights.
MXM_8BIT_IN_FLOAT = ("lpx.qlinear", "lpx.qlinear_bias")


def relax_dtype(name: str) -> DType:
    """The LPX dtype of a Relax dtype name."""
    if name not in _RELAX_DTYPES:
        raise UnsupportedOnLPX(f"dtype {name} on LPX")
    return _RELAX_DTYPES[name]


@dataclass
class QEpilogue:
    """What an int8 MXM op does past the multiplies: padding value, drain epilogue, output dtype."""

    fill: float
    epilogue: list
    out_dtype: DType


def step_of(op: RegionOp, name: str) -> OpCall:
    """The step of composite ``op`` that is a ``name`` op."""
    for s in [op.main] + op.epilogue:
        if s.op == name:
            return s
    raise UnsupportedOnLPX(f"{op.composite}: no {name} in the composite")


def scalar(operand) -> float:
    """A scale or zero point operand as one float."""
    a = np.asarray(operand.const)
    if a.size != 1:
        raise UnsupportedOnLPX("a per-channel scale where LPX takes one scale")
    return float(a.reshape(-1)[0])


def zero_point(operand) -> int:
    """A zero point operand as one integer."""
    return int(round(scalar(operand)))


def mxm_view(op: RegionOp) -> RegionOp:
    """An int8 MXM composite seen as its integer conv2d / matmul of the stored values
    (what the weight placement and the MXM lowering read); other ops unchanged."""
    if op.composite not in QMXM_COMPOSITES + MXM_8BIT_IN_FLOAT:
        return op
    core = step_of(op, "nn.conv2d" if op.composite == "lpx.qconv2d" else "matmul")
    main = OpCall(core.op, [op.main.args[0], core.args[1]], core.attrs, core.shape, core.dtype)
    return RegionOp(op.composite, main, [], op.out, op.shape, op.dtype)


QMXM_OUTPUT_STEPS = 2  # VXM ops of an int8 MXM drain's own epilogue: the int32 bias, the requantization


def dequantized(g, v, scale: float, zp: int):
    """(v - zp) * scale in fp32, as ONNX DequantizeLinear computes it."""
    v = g.vxm("vxm.cvt", v, to=DType.FP32)
    if zp:
        v = g.vxm("vxm.sub", v, imm=float(zp))
    return g.vxm("vxm.mul", v, imm=scale)


def fusable_dequantizes(region, alus: int, planes: int) -> dict:
    """{int8 MXM op name: (dequantize op, is a region output)} for each int8 conv2d /
    dense whose value only an ``lpx.dequantize`` reads (a QDQ model's float output, or
    the float input of an op that runs in float): its drains dequantize the requantized
    rows on the way to SRAM, instead of a pass that writes them and reads them back.
    Only where the drain's chain of VXM ops (the K parts' adds, bias, requantization,
    and the dequantization) fits the ALUs: each op holds one while the rows stream."""
    readers = {}
    for op in region.ops:
        for s in [op.main] + op.epilogue:
            for a in s.args:
                if not a.is_const:
                    readers.setdefault(a.name, []).append(op)
    producers = {op.out: op for op in region.ops if op.composite in QMXM_COMPOSITES}
    out = {}
    for name, op in producers.items():
        users = readers.get(name, [])
        if name in region.outputs or len(users) != 1 or users[0].composite != "lpx.dequantize":
            continue
        dq = users[0]
        try:
            zp = zero_point(dq.main.args[2])
            scalar(dq.main.args[1])
        except UnsupportedOnLPX:
            continue  # a per-channel scale: the dequantize runs as its own pass
        if (planes - 1) + QMXM_OUTPUT_STEPS + 2 + bool(zp) <= alus:
            out[name] = (dq, dq.out in region.outputs)
    return out

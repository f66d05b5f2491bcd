"""The fused epilogue of an MXM op or an elementwise op: bias, clips, requantization, a
dequantization that follows it, and the per-channel scale of an int8 layer's sums."""

from __future__ import annotations

import numpy as np

from ...machine.isa import DType
from .lowering_context import LoweringContext
from .graph import RegionOp, UnsupportedOnLPX
from .quant import dequantized


def epilogue_steps(ctx: LoweringContext, op: RegionOp, channels: int) -> list:
    """The epilogue as ("bias", SramTensor) / ("clip", lo, hi) steps."""
    out = []
    for s in op.epilogue:
        if s.op == "add" and s.args[1].is_const:
            bias = np.asarray(s.args[1].const, np.float32).reshape(-1)
            if bias.size == 1:
                bias = np.full(channels, bias[0], np.float32)
            if bias.size != channels:
                raise UnsupportedOnLPX(f"bias of {bias.size} values for {channels} channels")
            out.append(("bias", ctx.temp(ctx.builder.constant(f"{op.out}.bias", bias.reshape(1, channels),
                                                              ctx.acc))))
        elif s.op == "nn.relu":
            out.append(("clip", 0.0, None))
        elif s.op == "clip":
            lo, hi = (float(np.asarray(a.const)) for a in s.args[1:3])
            out.append(("clip", lo, hi))
        else:
            raise UnsupportedOnLPX(f"epilogue op {s.op}")
    return out


def apply_epilogue(g, y, epilogue, tile: int, rows: int):
    """``y`` (``rows`` vectors of column tile ``tile``) through the epilogue steps."""
    for e in epilogue:
        if e[0] == "bias":
            y = g.vxm("vxm.add", y, g.read(e[1].tile(tile).repeat(rows)))
        elif e[0] == "requant":  # int32 -> int8 / uint8 with a per-channel scale
            _, scale, zp, to = e
            y = g.vxm("vxm.requant", y, g.read(scale.tile(tile).repeat(rows)), to=to, zp=zp)
        elif e[0] == "dequant":  # int8 / uint8 -> fp32, (q - zp) * scale: a fused DequantizeLinear
            y = dequantized(g, y, e[1], e[2])
        elif e[0] == "scale":  # int32 sums to fp32 (fp8 ones are fp32), times a per-channel fp32 scale stream
            y = y if y.dtype == DType.FP32 else g.vxm("vxm.cvt", y, to=DType.FP32)
            y = g.vxm("vxm.mul", y, g.read(e[1].tile(tile).repeat(rows)))
        else:
            _, lo, hi = e
            if lo is not None and np.isfinite(lo):
                y = g.vxm("vxm.max", y, imm=lo)
            if hi is not None and np.isfinite(hi):
                y = g.vxm("vxm.min", y, imm=hi)
    return y

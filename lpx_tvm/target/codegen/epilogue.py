"""The fused epilogue of an MXM op or an elementwise op: bias, clips, requantization, a
dequantization that follows it, and the per-channel scale of an int8 layer's sums."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...machine.isa import DType
from .lowering_context import LoweringContext
from .graph import RegionOp, UnsupportedOnLPX
from .quant import dequantized


@dataclass(frozen=True, eq=False)
class Bias:
    """Add a per-channel row (an SRAM tensor of one row)."""

    tensor: object

    @property
    def tensors(self) -> tuple:
        return (self.tensor,)

    def apply(self, g, y, tile: int, rows: int):
        return g.vxm("vxm.add", y, g.read(self.tensor.tile(tile).repeat(rows)))


@dataclass(frozen=True)
class Clip:
    """Clamp to [lo, hi] (None or infinite: no bound on that side)."""

    lo: "float | None"
    hi: "float | None"
    tensors = ()

    def apply(self, g, y, tile: int, rows: int):
        if self.lo is not None and np.isfinite(self.lo):
            y = g.vxm("vxm.max", y, imm=self.lo)
        if self.hi is not None and np.isfinite(self.hi):
            y = g.vxm("vxm.min", y, imm=self.hi)
        return y


@dataclass(frozen=True, eq=False)
class Requant:
    """int32 -> int8 / uint8 with a per-channel scale (an SRAM row) and a zero point."""

    scale: object
    zp: int
    to: DType

    @property
    def tensors(self) -> tuple:
        return (self.scale,)

    def apply(self, g, y, tile: int, rows: int):
        return g.vxm("vxm.requant", y, g.read(self.scale.tile(tile).repeat(rows)), to=self.to, zp=self.zp)


@dataclass(frozen=True)
class Dequant:
    """int8 / uint8 -> fp32, (q - zero_point) * scale: a fused DequantizeLinear."""

    scale: float
    zero_point: int
    tensors = ()

    def apply(self, g, y, tile: int, rows: int):
        return dequantized(g, y, self.scale, self.zero_point)


@dataclass(frozen=True, eq=False)
class Scale:
    """int32 sums to fp32 (fp8 ones are fp32 already), times a per-channel fp32 row."""

    tensor: object

    @property
    def tensors(self) -> tuple:
        return (self.tensor,)

    def apply(self, g, y, tile: int, rows: int):
        y = y if y.dtype == DType.FP32 else g.vxm("vxm.cvt", y, to=DType.FP32)
        return g.vxm("vxm.mul", y, g.read(self.tensor.tile(tile).repeat(rows)))


def epilogue_steps(ctx: LoweringContext, op: RegionOp, channels: int) -> list:
    """The epilogue as :class:`Bias` / :class:`Clip` steps."""
    out = []
    for s in op.epilogue:
        if s.op == "add" and s.args[1].is_const:
            bias = np.asarray(s.args[1].const, np.float32).reshape(-1)
            if bias.size == 1:
                bias = np.full(channels, bias[0], np.float32)
            if bias.size != channels:
                raise UnsupportedOnLPX(f"bias of {bias.size} values for {channels} channels")
            out.append(Bias(ctx.temp(ctx.builder.constant(f"{op.out}.bias", bias.reshape(1, channels), ctx.acc))))
        elif s.op == "nn.relu":
            out.append(Clip(0.0, None))
        elif s.op == "clip":
            lo, hi = (float(np.asarray(a.const)) for a in s.args[1:3])
            out.append(Clip(lo, hi))
        else:
            raise UnsupportedOnLPX(f"epilogue op {s.op}")
    return out


def apply_epilogue(g, y, epilogue, tile: int, rows: int):
    """``y`` (``rows`` vectors of column tile ``tile``) through the epilogue steps."""
    for step in epilogue:
        y = step.apply(g, y, tile, rows)
    return y

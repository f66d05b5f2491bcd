"""Unary ops and activations the VXM has no single instruction for, composed from the
ones it has (add, sub, mul, max, min with an immediate; exp, rsqrt, recip).

Each entry of :data:`UNARY_CHAINS` maps a Relax op to ``chain(group, value, step) ->
value``: the VXM ops it becomes on one run of rows, one op per ALU step. Every VXM op
rounds once to the value's dtype (docs/isa.md, "Numerics"); docs/ops.md gives each
composition's accuracy. :func:`.elementwise.lower_unary` runs these chains.

Streams do not buffer: the two operands of a binary op must arrive in the same cycle,
so where a chain forks, both branches take the same number of ALU ops (a branch that
has nothing to do multiplies by 1, which is exact).
"""

from __future__ import annotations

import numpy as np

from ....machine.timing import vxm_latency
from ..graph import UnsupportedOnLPX

# 2^127 twice: any nonzero finite float times 2^254 is at least 2^105 in magnitude
# (the least fp32 subnormal is 2^-149), so a clip to [-1, 1] leaves only its sign.
_HUGE = 2.0 ** 127


def _same(g, v):
    """x * 1: x itself, one ALU op later (it keeps a fork's branches in step)."""
    return g.vxm("vxm.mul", v, imm=1.0)


def waiting_for(g, v, op: str):
    """x, as many ALU steps of x * 1 later as the VXM op ``op`` takes (for a fork with
    ``op`` on its other branch: SiLU's x * sigmoid(x))."""
    lat, step = vxm_latency(g.cfg, op), vxm_latency(g.cfg, "vxm.mul")
    if lat % step:
        raise UnsupportedOnLPX(f"{op} takes {lat} cycles, not a whole number of {step}-cycle ALU steps: "
                               "its operand cannot wait for it on the stream")
    for _ in range(lat // step):
        v = _same(g, v)
    return v


def _silu(g, v, step):
    """x * sigmoid(x), x kept in step with the sigmoid (:func:`waiting_for`)."""
    return g.vxm("vxm.mul", waiting_for(g, v, "vxm.sigmoid"), g.vxm("vxm.sigmoid", v))


def _abs(g, v, step):
    """max(x * 1, x * -1): exact (negation is exact)."""
    return g.vxm("vxm.max", _same(g, v), g.vxm("vxm.mul", v, imm=-1.0))


def _negative(g, v, step):
    """x * -1: exact."""
    return g.vxm("vxm.mul", v, imm=-1.0)


def _exp(g, v, step):
    return g.vxm("vxm.exp", v)


def _rsqrt(g, v, step):
    return g.vxm("vxm.rsqrt", v)


def _sqrt(g, v, step):
    """recip(rsqrt(x)): two roundings; 0 -> rsqrt inf -> 0, inf -> 0 -> inf, x < 0 -> NaN."""
    return g.vxm("vxm.recip", g.vxm("vxm.rsqrt", v))


def _sign(g, v, step):
    """clip(x * 2^127 * 2^127, -1, 1): exact for every nonzero x, 0 -> 0, NaN -> NaN
    (a product that overflows is +-inf, clipped to +-1)."""
    big = g.vxm("vxm.mul", g.vxm("vxm.mul", v, imm=_HUGE), imm=_HUGE)
    return g.vxm("vxm.min", g.vxm("vxm.max", big, imm=-1.0), imm=1.0)


def _times(g, v, slope):
    """v * slope, ``slope`` an immediate (a float) or a stream."""
    return g.vxm("vxm.mul", v, imm=slope) if isinstance(slope, float) else g.vxm("vxm.mul", v, slope)


def leaky(g, v, slope, within_unit: bool):
    """x where x >= 0, else x * slope rounded once, ``slope`` an immediate or a stream.

    Slopes in [0, 1] (``within_unit``): max(x * 1, x * slope), 3 ops (|x * slope| <= |x|,
    so the max picks x for x >= 0 and x * slope for x < 0). Others:
    max(x, 0) * 1 + min(x, 0) * slope, 5 ops (the add is exact: one side is 0)."""
    if within_unit:
        return g.vxm("vxm.max", _same(g, v), _times(g, v, slope))
    scaled = _times(g, g.vxm("vxm.min", v, imm=0.0), slope)
    return g.vxm("vxm.add", _same(g, g.vxm("vxm.max", v, imm=0.0)), scaled)


def _leakyrelu(g, v, step):
    alpha = float(np.float32(step.attrs["alpha"]))
    return leaky(g, v, alpha, 0.0 <= alpha <= 1.0)


UNARY_CHAINS = {
    "abs": _abs,
    "negative": _negative,
    "exp": _exp,
    "rsqrt": _rsqrt,
    "sqrt": _sqrt,
    "sign": _sign,
    "nn.leakyrelu": _leakyrelu,
    "nn.silu": _silu,
}

"""Unary ops and activations the VXM has no single instruction for, composed from the
ones it has (add, sub, mul, max, min with an immediate; exp, rsqrt, recip).

Each entry of :data:`UNARY_CHAINS` maps a Relax op to ``chain(group, value, step) ->
value``: the VXM ops it becomes on one run of rows, one op per ALU step. Every VXM op
rounds once to the value's dtype (docs/isa.md, "Numerics"); docs/ops.md gives each
composition's accuracy. :func:`.elementwise.lower_unary` runs these chains.
"""

from __future__ import annotations

import numpy as np

# 2^127 twice: any nonzero finite float times 2^254 is at least 2^105 in magnitude
# (the least fp32 subnormal is 2^-149), so a clip to [-1, 1] leaves only its sign.
_HUGE = 2.0 ** 127


def _abs(g, v, step):
    """max(x, -x): exact (negation is exact)."""
    return g.vxm("vxm.max", v, g.vxm("vxm.mul", v, imm=-1.0))


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


def scaled_negative_part(g, v, slope):
    """relu(x) + slope * min(x, 0), ``slope`` an immediate or a stream: x where x >= 0,
    else x * slope rounded once; the add is exact (one side is 0)."""
    negative = g.vxm("vxm.min", v, imm=0.0)
    scaled = g.vxm("vxm.mul", negative, slope) if not isinstance(slope, float) else \
        g.vxm("vxm.mul", negative, imm=slope)
    return g.vxm("vxm.add", g.vxm("vxm.max", v, imm=0.0), scaled)


def _leakyrelu(g, v, step):
    """max(x, a*x) for 0 <= a <= 1 (|a*x| <= |x|, so the max picks x for x >= 0 and a*x
    for x < 0: exact); other slopes relu(x) + a * min(x, 0)."""
    alpha = float(np.float32(step.attrs["alpha"]))
    if 0.0 <= alpha <= 1.0:
        return g.vxm("vxm.max", v, g.vxm("vxm.mul", v, imm=alpha))
    return scaled_negative_part(g, v, alpha)


UNARY_CHAINS = {
    "abs": _abs,
    "negative": _negative,
    "exp": _exp,
    "rsqrt": _rsqrt,
    "sqrt": _sqrt,
    "sign": _sign,
    "nn.leakyrelu": _leakyrelu,
}

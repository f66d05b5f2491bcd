"""Hand-written row softmax and layernorm: one vector per row, reductions across lanes.

Rows of up to ``lanes`` elements stream through the VXM in fp32 (inputs may be fp16,
bf16 or fp32). Both are numerically stable: softmax subtracts the row maximum before
``exp``; layernorm subtracts the mean before squaring; sums accumulate in fp32.
Streams do not buffer, so a value needed after a reduction is re-read from SRAM.
"""

from __future__ import annotations

import numpy as np

from ..errors import SchedulingError
from ..target.builder import ProgramBuilder
from ..machine.isa import DType
from .args import FLOATS, check_sizes, kernel_dtype

F32 = DType.FP32


def _as_f32(g, v):
    return v if v.dtype is F32 else g.vxm("vxm.cvt", v, to=F32)


def _from_f32(g, v, out: DType):
    return v if out is F32 else g.vxm("vxm.cvt", v, to=out)


def _check_width(cfg, cols):
    if cols > cfg.lanes:
        raise SchedulingError(f"rows of {cols} elements do not fit one {cfg.lanes}-lane vector")


def softmax(config, rows: int, cols: int, dtype="fp16", *, name: str = "softmax"):
    """Y = softmax(X, axis=-1) for X of shape (rows, cols), cols <= lanes."""
    check_sizes(name, rows=rows, cols=cols)
    dt = kernel_dtype(name, dtype, FLOATS)
    b = ProgramBuilder(config, name)
    _check_width(b.config, cols)
    X = b.input("X", (rows, cols), dt)
    Y = b.output("Y", (rows, cols), dt)
    Mx = b.tensor("row_max", (rows, 1), F32)  # the max fills every lane of its vector
    E = b.tensor("exp", (rows, cols), F32)  # exp(x - max), kept for the final scaling
    S = b.tensor("inv_sum", (rows, 1), F32)

    g = b.group(f"{name}.max")
    g.write(g.vxm("vxm.reduce_max", _as_f32(g, g.read(X.tile())), width=cols), Mx.tile())

    g = b.group(f"{name}.exp")
    e = g.vxm("vxm.exp", g.vxm("vxm.sub", _as_f32(g, g.read(X.tile())), g.read(Mx.tile())))
    g.write(e, E.tile())
    g.write(g.vxm("vxm.recip", g.vxm("vxm.reduce_sum", e, width=cols)), S.tile())

    g = b.group(f"{name}.scale")
    g.write(_from_f32(g, g.vxm("vxm.mul", g.read(E.tile()), g.read(S.tile())), dt), Y.tile())
    return b.build()


def layernorm(config, rows: int, cols: int, gamma, beta, dtype="fp16", *, eps: float = 1e-5,
              name: str = "layernorm"):
    """Y = (X - mean) / sqrt(var + eps) * gamma + beta over the last axis, cols <= lanes."""
    check_sizes(name, rows=rows, cols=cols)
    dt = kernel_dtype(name, dtype, FLOATS)
    b = ProgramBuilder(config, name)
    _check_width(b.config, cols)
    X = b.input("X", (rows, cols), dt)
    Y = b.output("Y", (rows, cols), dt)
    G = b.constant("gamma", np.asarray(gamma, np.float32).reshape(1, cols), F32)
    B = b.constant("beta", np.asarray(beta, np.float32).reshape(1, cols), F32)
    Mean = b.tensor("mean", (rows, 1), F32)
    D = b.tensor("centered", (rows, cols), F32)
    R = b.tensor("inv_std", (rows, 1), F32)
    inv_n = 1.0 / cols

    g = b.group(f"{name}.mean")
    mean = g.vxm("vxm.mul", g.vxm("vxm.reduce_sum", _as_f32(g, g.read(X.tile())), width=cols), imm=inv_n)
    g.write(mean, Mean.tile())

    g = b.group(f"{name}.var")
    d = g.vxm("vxm.sub", _as_f32(g, g.read(X.tile())), g.read(Mean.tile()))
    g.write(d, D.tile())
    var = g.vxm("vxm.mul", g.vxm("vxm.reduce_sum", g.vxm("vxm.mul", d, d), width=cols), imm=inv_n)
    g.write(g.vxm("vxm.rsqrt", g.vxm("vxm.add", var, imm=eps)), R.tile())

    g = b.group(f"{name}.affine")
    y = g.vxm("vxm.mul", g.read(D.tile()), g.read(R.tile()))
    y = g.vxm("vxm.mul", y, g.read(G.tile().repeat(rows)))
    y = g.vxm("vxm.add", y, g.read(B.tile().repeat(rows)))
    g.write(_from_f32(g, y, dt), Y.tile())
    return b.build()

"""Hand-written 2-D transpose through the SXM: Y = X.T for X of any (rows, cols).

X is cut into blocks of at most ``lanes`` rows by one column tile; the SXM transposes
each block (reading its vectors, emitting one vector per column) and the result lands
in the matching rows of Y's column tile.
"""

from __future__ import annotations

from ..target.builder import ProgramBuilder
from ..machine.isa import DType
from .args import FLOATS, check_sizes, kernel_dtype


def transpose(config, rows: int, cols: int, dtype="fp16", *, name: str = "transpose"):
    check_sizes(name, rows=rows, cols=cols)
    dt = kernel_dtype(name, dtype, (DType.INT8, DType.UINT8, DType.INT32) + FLOATS)
    b = ProgramBuilder(config, name)
    lanes = b.config.lanes
    X = b.input("X", (rows, cols), dt)
    Y = b.output("Y", (cols, rows), dt)
    for rb in range(X.ntiles and -(-rows // lanes)):
        r0, r1 = rb * lanes, min(rows, (rb + 1) * lanes)
        for cb in range(X.ntiles):
            c0, c1 = cb * lanes, min(cols, (cb + 1) * lanes)
            g = b.group(f"{name}.block")
            t = g.sxm("sxm.transpose", g.read(X.tile(cb).rows(r0, r1)), out=c1 - c0)
            g.write(t, Y.tile(rb).rows(c0, c1))
    return b.build()

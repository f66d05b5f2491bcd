"""Hand-written tiled GEMM: C = A @ B (+ bias, ReLU), any size, on any preset.

Mapping (weight-stationary): B is cut into K x N tiles of at most one MXM plane
(rows x cols); each tile is installed into a plane's weight buffer and every row of the
matching A column tile streams through it, accumulating over K tiles in the plane's
accumulators. N tiles go round-robin over the planes; planes on the same side of the
chip share one read of A (a stream passes both). Weight buffers and accumulator
halves alternate, so the next install and the previous drain overlap the multiplies.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..target.builder import ProgramBuilder
from ..machine.isa import DType
from ..machine.schema import compiler_problem
from .args import check_sizes, kernel_dtype

_ACC = {DType.INT8: DType.INT32, DType.UINT8: DType.INT32, DType.FP16: DType.FP32,
        DType.BF16: DType.FP32, DType.FP32: DType.FP32}


def plane_sides(cfg) -> list:
    """Planes grouped by side of the chip (a stream flowing toward a side passes all of them)."""
    mid = cfg.position("VXM")
    west = [p for p in range(cfg.mxm_planes) if cfg.position("MXM", p) < mid]
    east = [p for p in range(cfg.mxm_planes) if cfg.position("MXM", p) > mid]
    return [s for s in (west, east) if s]


def gemm(config, M: int, K: int, N: int, dtype="fp16", *, bias=None, relu: bool = False, out_dtype=None,
         weights=None, name: str = "gemm"):
    """Build the GEMM program. Inputs ``A`` (M, K) and ``B`` (K, N) unless ``weights`` is
    given (then B is a constant in the SRAM image); optional constant ``bias`` (N,).
    Output ``C`` (M, N) in the accumulator dtype (int32 or fp32) or ``out_dtype``.
    """
    b = ProgramBuilder(config, name)
    cfg = b.config
    check_sizes(name, M=M, K=K, N=N)
    dt = kernel_dtype(name, dtype, tuple(_ACC))
    acc_dt = _ACC[dt]
    out_dt = DType.parse(out_dtype) if out_dtype else acc_dt
    R, C = cfg.mxm_rows, cfg.mxm_cols
    problem = compiler_problem(cfg)  # one A vector per K tile, one weight tile per lane tile
    if problem:
        raise ConfigError(problem)
    A = b.input("A", (M, K), dt)
    # A's and C's tiles are read and written whole (one slice each): they take their
    # slices before B's parts spread over every slice.
    Cout = b.output("C", (M, N), out_dt)
    # B's row tiles cut over the install lanes on different slices: installs at full rate.
    B = (b.input("B", (K, N), dt, install_align=R) if weights is None
         else b.constant("B", weights, dt, install_align=R))
    bias_t = None if bias is None else b.constant("bias", np.asarray(bias).reshape(1, N), acc_dt)

    kt_n = -(-K // R)
    nt_n = -(-N // C)
    m_chunk = min(M, cfg.mxm_acc_rows // 2)  # two accumulator halves: drain one, fill the other
    sides = plane_sides(cfg)
    planes_per_round = sum(len(s) for s in sides)
    use = {}  # plane -> tiles it has taken (selects the accumulator half)
    installs = {}  # plane -> installs so far (selects the weight buffer)

    for nt0 in range(0, nt_n, planes_per_round):
        # This round's N tiles, grouped by chip side: one A read feeds each side.
        round_tiles = []
        it = iter(range(nt0, min(nt_n, nt0 + planes_per_round)))
        for side in sides:
            tiles = [(p, nt) for p, nt in zip(side, it)]
            if tiles:
                round_tiles.append(tiles)
        for m0 in range(0, M, m_chunk):
            m1 = min(M, m0 + m_chunk)
            half = {}
            for side in round_tiles:
                for p, _ in side:
                    half[p] = use.get(p, 0) % 2
                    use[p] = use.get(p, 0) + 1
            for kt in range(kt_n):
                k0, k1 = kt * R, min(K, (kt + 1) * R)
                for side in round_tiles:
                    buf = {}
                    for p, nt in side:
                        buf[p] = installs.get(p, 0) % cfg.mxm_weight_buffers
                        installs[p] = installs.get(p, 0) + 1
                        n1 = min(N, (nt + 1) * C)
                        rows = [(r - k0, region) for r, region in B.segments(nt, k0, k1)]
                        b.install(f"{name}.install", p, buf[p], rows, width=n1 - nt * C)
                    g = b.group(f"{name}.mul")
                    x = g.read(A.tile(kt).rows(m0, m1))
                    for p, _ in side:
                        g.mul(p, buf[p], x, acc=half[p] * m_chunk, accumulate=kt > 0)
            for side in round_tiles:
                for p, nt in side:
                    g = b.group(f"{name}.drain")
                    y = g.drain(p, half[p] * m_chunk, m1 - m0, acc_dt)
                    if bias_t is not None:
                        y = g.vxm("vxm.add", y, g.read(bias_t.tile(nt).repeat(m1 - m0)))
                    if relu:
                        y = g.vxm("vxm.max", y, imm=0.0)
                    if out_dt != acc_dt:
                        y = g.vxm("vxm.cvt", y, to=out_dt)
                    g.write(y, Cout.tile(nt).rows(m0, m1))
    return b.build()

"""LPX arithmetic on whole tiles: the definition of what each VXM/SXM/MXM op computes.

Rules (docs/isa.md, "Numerics"):
- float add/sub/mul/max/min are computed in fp32 and rounded once to the dtype
  (round to nearest even); fp32 is exact-rounding for fp16 and bf16 operands.
- transcendental functions are computed in fp64 and rounded once to the dtype.
- int8/uint8 arithmetic saturates; int32 arithmetic wraps (two's complement).
- float -> int conversion rounds half to even and saturates; NaN becomes 0.
- requant: clip(round_half_even(x * scale) + zp) in fp64.
- MXM: int8/uint8 products summed exactly in int32 (through fp32 BLAS, exact while
  |sum| < 2^24, which K <= 320 guarantees); fp16/bf16 products are exact in fp32 and
  summed in fp32; fp32 mode multiplies and sums in fp32.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from ..machine.isa import FP8_MAX, DType

_BF16 = DType.BF16.np
_FP8 = DType.FP8.np
_INT_RANGE = {DType.INT8: (-128, 127), DType.UINT8: (0, 255), DType.INT32: (-(2**31), 2**31 - 1)}


class NumericsError(Exception):
    """An op applied to a dtype it does not support."""


def _to_bf16(x) -> np.ndarray:
    """Round to bfloat16 once, to nearest even.

    A plain cast of a float64 or int32 goes through float32 and rounds twice. Rounding
    to float32 "to odd" first (truncate, then set the last bit when inexact) keeps the
    second rounding exact.
    """
    x = np.asarray(x)
    if x.dtype in (np.float32, DType.BF16.np):
        return x.astype(DType.BF16.np)
    return _to_bf16_odd_fp32(x.astype(np.float64)).astype(DType.BF16.np)


def _to_fp8(x) -> np.ndarray:
    """Round to fp8 e4m3 once, to nearest even, saturating at +-448 (e4m3 has no inf; NaN
    stays NaN). fp16, bf16 and fp32 values are exact in fp32, so one rounding from there
    is the correct one; fp64 first goes to fp32 "to odd", as for bf16."""
    x = np.asarray(x)
    if x.dtype == np.float64 or x.dtype.kind in "iu":
        x = _to_bf16_odd_fp32(x.astype(np.float64))
    x = x.astype(np.float32, copy=False)
    with np.errstate(invalid="ignore"):
        return np.clip(x, -FP8_MAX, FP8_MAX).astype(_FP8)


def _to_bf16_odd_fp32(x: np.ndarray) -> np.ndarray:
    """fp64 -> fp32 rounded to odd (so that a later rounding to fewer bits is exact)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
        f64 = f.astype(np.float64)
        inexact = np.isfinite(x) & (f64 != x)
        if inexact.any():
            toward_zero = np.where(np.abs(f64) > np.abs(x), np.nextafter(f, np.float32(0)), f)
            f = np.where(inexact, (toward_zero.view(np.uint32) | 1).view(np.float32), f)
    return f


def to_dtype(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Convert with LPX rules (round once to nearest even, saturate for ints and fp8)."""
    if dtype is DType.BF16:
        return _to_bf16(x)
    if dtype is DType.FP8:
        return _to_fp8(x)
    if dtype.is_float:
        return np.asarray(x).astype(dtype.np)
    lo, hi = _INT_RANGE[dtype]
    x = np.asarray(x)
    if x.dtype.kind == "f" or x.dtype in (_BF16, _FP8) or x.dtype.kind == "V":
        x = np.nan_to_num(np.rint(x.astype(np.float64)), nan=0.0)
        return np.clip(x, lo, hi).astype(dtype.np)
    return np.clip(x.astype(np.int64), lo, hi).astype(dtype.np)


def convert(x: np.ndarray, dtype: DType) -> np.ndarray:
    """vxm.cvt: ``x`` (a tile of any LPX dtype) to ``dtype``, rounded once."""
    if x.dtype.kind == "f" or x.dtype in (_BF16, _FP8):
        # fp8, fp16, bf16 and fp32 values are exact in fp32 (to_dtype rounds fp64 to bf16
        # or fp8 in two steps, and fp32 in one).
        if dtype in (DType.BF16, DType.FP8) or dtype.is_int:
            return to_dtype(x.astype(np.float32, copy=False), dtype)
        return x.astype(dtype.np)
    return to_dtype(x, dtype)


def _int_result(x64: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is DType.INT32:
        return x64.astype(np.int32)  # wraps
    lo, hi = _INT_RANGE[dtype]
    return np.clip(x64, lo, hi).astype(dtype.np)


def imm_value(imm: float, dtype: DType):
    imm = float(np.float32(imm))  # the instruction's imm field is a float32
    if dtype.is_int:
        if not np.isfinite(imm) or imm != int(imm):
            raise NumericsError(f"immediate {imm} is not an integer for dtype {dtype.short}")
        return int(imm)
    return np.float32(imm)


_BINARY = {
    "vxm.add": np.add,
    "vxm.sub": np.subtract,
    "vxm.mul": np.multiply,
    "vxm.max": np.maximum,
    "vxm.min": np.minimum,
}


def binary(op: str, a: np.ndarray, b, dtype: DType) -> np.ndarray:
    fn = _BINARY[op]
    if dtype.is_float:
        r = fn(a, b, dtype=np.float32)  # the ufunc converts fp16/bf16 operands to fp32 as it goes
        return r if dtype is DType.FP32 else to_dtype(r, dtype) if dtype is DType.FP8 else r.astype(dtype.np)
    bb = b.astype(np.int64) if isinstance(b, np.ndarray) else np.int64(b)
    return _int_result(fn(a.astype(np.int64), bb), dtype)


def binary_into(op: str, a: np.ndarray, b):
    """``binary(op, a, b, FP32)`` for fp32 ``a``, written over ``a``."""
    _BINARY[op](a, b.astype(np.float32, copy=False) if isinstance(b, np.ndarray) else b, out=a)


# Written without 1 + erf(..) / 1 + tanh(..), which cancel for negative x and lose
# every significant bit there: 1 + erf(z) = erfc(-z) and (1 + tanh(y)) / 2 = sigmoid(2y).
def _gelu(x):
    return 0.5 * x * special.erfc(-x / np.sqrt(2.0))


def _gelu_tanh(x):
    return x * special.expit(2.0 * np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))


_UNARY = {
    "vxm.exp": np.exp,
    "vxm.tanh": np.tanh,
    "vxm.sigmoid": special.expit,
    "vxm.gelu": _gelu,
    "vxm.gelu_tanh": _gelu_tanh,
    "vxm.erf": special.erf,
    "vxm.rsqrt": lambda x: 1.0 / np.sqrt(x),
    "vxm.recip": lambda x: 1.0 / x,
}


def unary(op: str, a: np.ndarray, dtype: DType) -> np.ndarray:
    if not dtype.is_float:
        raise NumericsError(f"{op} needs a float dtype, got {dtype.short}")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return to_dtype(_UNARY[op](a.astype(np.float64)), dtype)


def requant(a: np.ndarray, scale, zp: int, out: DType) -> np.ndarray:
    x = a.astype(np.float64) * (scale.astype(np.float64) if isinstance(scale, np.ndarray) else float(scale))
    return to_dtype(np.rint(x) + zp, out)


def reduce(op: str, a: np.ndarray, width: int, dtype: DType) -> np.ndarray:
    """Reduce the first ``width`` lanes of each vector; the result fills every lane."""
    part = a[:, :width]
    if op == "vxm.reduce_max":
        r = part.max(axis=1)
    elif dtype.is_float:
        # numpy's float sum order follows the memory layout: sum a C-ordered copy, so a
        # strided or repeated SRAM view (stride 0) sums in the same order as any other.
        r = np.ascontiguousarray(part, dtype=np.float32).sum(axis=1, dtype=np.float32)
    else:
        r = part.astype(np.int64).sum(axis=1)
    r = to_dtype(r, dtype) if dtype is DType.FP8 else \
        r.astype(dtype.np) if dtype.is_float or op == "vxm.reduce_max" else _int_result(r, dtype)
    return np.repeat(r[:, None], a.shape[1], axis=1)


# ---- SXM -----------------------------------------------------------------
def shift(a: np.ndarray, by: int) -> np.ndarray:
    out = np.zeros_like(a)
    lanes = a.shape[1]
    if by >= 0:
        if by < lanes:
            out[:, by:] = a[:, :lanes - by]
    elif -by < lanes:
        out[:, :lanes + by] = a[:, -by:]
    return out


def rotate(a: np.ndarray, by: int) -> np.ndarray:
    return np.roll(a, by, axis=1)


def permute(a: np.ndarray, table: np.ndarray) -> np.ndarray:
    """out[:, i] = a[:, table[i]]; a table entry of -1 gives zero."""
    out = a[:, np.maximum(table, 0)]
    out[:, table < 0] = 0
    return out


def transpose(a: np.ndarray, out_count: int) -> np.ndarray:
    n, lanes = a.shape
    out = np.zeros((out_count, lanes), a.dtype)
    out[:, :n] = a[:, :out_count].T
    return out


def broadcast(a: np.ndarray, lane: int) -> np.ndarray:
    return np.repeat(a[:, lane:lane + 1], a.shape[1], axis=1)


def pad(a: np.ndarray, before: int, width: int) -> np.ndarray:
    out = np.zeros_like(a)
    lanes = a.shape[1]
    w = max(0, min(width, lanes - before))
    out[:, before:before + w] = a[:, :w]
    return out


# ---- MXM -----------------------------------------------------------------
ACC_INT, ACC_FLOAT = 1, 2


def acc_kind(dtype: DType) -> int:
    return ACC_INT if dtype in (DType.INT8, DType.UINT8) else ACC_FLOAT


def weights_matrix(rows: np.ndarray, width: int) -> np.ndarray:
    """Installed weight rows (K, lanes) -> the (K, width) matrix the plane multiplies by.

    fp32 is exact for every product and sum except uint8 x uint8 with large K, which
    gets fp64 so that integer results stay exact.
    """
    exact_in_fp32 = rows.dtype != np.uint8 or rows.shape[0] * 255 * 255 < 2**24
    return rows[:, :width].astype(np.float32 if exact_in_fp32 else np.float64)

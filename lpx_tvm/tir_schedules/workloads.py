"""TE computes of the MXM workloads, in LPX storage shapes.

Tensors are described as they are stored on LPX: activations as pixels (or rows) by
channels, channels padded to whole tiles, images padded spatially for the convolution
that reads them. Weights are compile-time constants, padded with zeros the same way.
Every tile of a schedule is then whole (no predicated edge tiles), so the tile loops
can be turned into one MXM tile block; the padding costs nothing on the machine,
whose lanes are zero beyond a tensor's last channel anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te

ACC_DTYPE = {"int8": "int32", "uint8": "int32", "float8_e4m3fn": "float32", "float16": "float32", "bfloat16": "float32",
             "float32": "float32"}
MXM_BLOCK = "mxm"  # name of the multiply-accumulate block every workload has


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclass(frozen=True)
class DenseWorkload:
    """C[m, n] = sum_k A[m, k] * B[k, n] with padded extents (M, K, N)."""

    M: int
    K: int
    N: int
    dtype: str

    def prim_func(self):
        A = te.placeholder((self.M, self.K), self.dtype, name="A")
        B = te.placeholder((self.K, self.N), self.dtype, name="B")
        k = te.reduce_axis((0, self.K), name="k")
        acc = ACC_DTYPE[self.dtype]
        C = te.compute((self.M, self.N),
                       lambda m, n: te.sum(A[m, k].astype(acc) * B[k, n].astype(acc), axis=k), name=MXM_BLOCK)
        return te.create_prim_func([A, B, C])


@dataclass(frozen=True)
class Conv2dWorkload:
    """Implicit-GEMM convolution on a spatially padded NHWC image.

    O[n, oh, ow, co] = sum_{kh, kw, ci} A[n, oh*s + kh*d, ow*s + kw*d, ci] * W[kh, kw, ci, co]
    where A is (N, Hp, Wp, C) already padded and C, CO are padded to whole tiles.
    ``channels`` is the input channel count before padding (0: all of C): a schedule may
    pack several taps' channels into one reduction tile when they are few.
    """

    N: int
    Hp: int
    Wp: int
    C: int
    KH: int
    KW: int
    CO: int
    stride: tuple
    dilation: tuple
    dtype: str
    channels: int = 0

    @property
    def OH(self) -> int:
        return (self.Hp - self.dilation[0] * (self.KH - 1) - 1) // self.stride[0] + 1

    @property
    def OW(self) -> int:
        return (self.Wp - self.dilation[1] * (self.KW - 1) - 1) // self.stride[1] + 1

    def prim_func(self):
        (sh, sw), (dh, dw) = self.stride, self.dilation
        A = te.placeholder((self.N, self.Hp, self.Wp, self.C), self.dtype, name="A")
        W = te.placeholder((self.KH, self.KW, self.C, self.CO), self.dtype, name="W")
        kh = te.reduce_axis((0, self.KH), name="kh")
        kw = te.reduce_axis((0, self.KW), name="kw")
        ci = te.reduce_axis((0, self.C), name="ci")
        acc = ACC_DTYPE[self.dtype]
        O = te.compute(
            (self.N, self.OH, self.OW, self.CO),
            lambda n, oh, ow, co: te.sum(
                A[n, oh * sh + kh * dh, ow * sw + kw * dw, ci].astype(acc) * W[kh, kw, ci, co].astype(acc),
                axis=[kh, kw, ci]),
            name=MXM_BLOCK)
        return te.create_prim_func([A, W, O])


@dataclass(frozen=True)
class DepthwiseWorkload:
    """Depthwise convolution on a spatially padded NHWC image (groups == channels).

    O[n, oh, ow, c] = sum_{kh, kw} A[n, oh*s + kh*d, ow*s + kw*d, c] * W[kh, kw, c]. On the
    MXM each tap of a channel tile is a diagonal weight tile.
    """

    N: int
    Hp: int
    Wp: int
    C: int
    KH: int
    KW: int
    stride: tuple
    dilation: tuple
    dtype: str

    OH = Conv2dWorkload.OH
    OW = Conv2dWorkload.OW

    def prim_func(self):
        (sh, sw), (dh, dw) = self.stride, self.dilation
        A = te.placeholder((self.N, self.Hp, self.Wp, self.C), self.dtype, name="A")
        W = te.placeholder((self.KH, self.KW, self.C), self.dtype, name="W")
        kh = te.reduce_axis((0, self.KH), name="kh")
        kw = te.reduce_axis((0, self.KW), name="kw")
        acc = ACC_DTYPE[self.dtype]
        O = te.compute(
            (self.N, self.OH, self.OW, self.C),
            lambda n, oh, ow, c: te.sum(
                A[n, oh * sh + kh * dh, ow * sw + kw * dw, c].astype(acc) * W[kh, kw, c].astype(acc), axis=[kh, kw]),
            name=MXM_BLOCK)
        return te.create_prim_func([A, W, O])

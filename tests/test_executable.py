"""The executable's host-side layout work (lpx_tvm/runtime/executable.py)."""

from __future__ import annotations

import numpy as np
import pytest

from lpx_tvm.runtime.executable import im2col


def im2col_reference(x, kernel, strides, dilation, padding):
    """Row (n, oh, ow), column (kh * KW + kw) * C + c, by loops over every window."""
    kh, kw = kernel
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    n, c, h, w = x.shape
    xp = np.zeros((n, c, h + pt + pb, w + pl + pr), x.dtype)
    xp[:, :, pt:pt + h, pl:pl + w] = x
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n * oh * ow, kh * kw * c), x.dtype)
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                for a in range(kh):
                    for e in range(kw):
                        out[(b * oh + i) * ow + j, (a * kw + e) * c:(a * kw + e + 1) * c] = \
                            xp[b, :, i * sh + a * dh, j * sw + e * dw]
    return out


@pytest.mark.parametrize("kernel, strides, dilation, padding", [
    ((7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),
    ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((3, 2), (2, 1), (2, 1), (0, 1, 2, 0)),
    ((1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
])
def test_im2col(kernel, strides, dilation, padding):
    x = np.random.default_rng(0).standard_normal((2, 3, 11, 9)).astype(np.float32)
    t = {"kernel": kernel, "strides": strides, "dilation": dilation, "padding": padding}
    assert np.array_equal(im2col(x, t), im2col_reference(x, kernel, strides, dilation, padding))

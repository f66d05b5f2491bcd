"""lpx.ConvTransposeAsConv: a transposed convolution becomes a convolution over a
zero-stuffed image.

``conv2d_transpose(x, W)`` with strides s, pads p, output padding q and dilation d
equals a stride-1 convolution (dilation d) of the image with s - 1 zeros stuffed
between its pixels, padded by ``d (k - 1) - p`` before and ``d (k - 1) - p + q`` after,
with the kernel flipped in H and W and its in and out channels swapped (per group). In
Relax the stuffing is (N, C, H, W) -> reshape (N, C, H, 1, W, 1) -> zeros after the unit
axes -> reshape (N, C, H*s, W*s), which LPX runs as one pixel placement
(``lpx.zero_stuff``); the s - 1 zero rows and columns it leaves after the last pixel
serve as after-pad (or are sliced off, ``lpx.zero_stuff_cropped``, when the after-pad is
shorter). The pad then folds into the convolution (:mod:`.fold_pad`, run after this).

Only constant weights (the kernel is flipped at compile time) in NCHW / IOHW, and pads
no larger than the kernel's reach (a negative pad would crop) are rewritten.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._binding_rewrite import bindings, is_const, op_is, rewrite_bindings, static_shape

__all__ = ["ConvTransposeAsConv"]


def conv_weight(w: np.ndarray, groups: int) -> np.ndarray:
    """The OIHW convolution weight of an IOHW transposed-convolution weight: per group,
    in and out channels swapped, the kernel flipped in H and W."""
    cin, cog, kh, kw = w.shape
    w = w.reshape(groups, cin // groups, cog, kh, kw).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
    return np.ascontiguousarray(w.reshape(groups * cog, cin // groups, kh, kw))


def conv_pads(a, kernel) -> "tuple | None":
    """(top, left, bottom, right) pads of the equivalent convolution over the stuffed
    image ((H - 1) s + 1 rows), or None when one would be negative (a crop)."""
    pt, pl, pb, pr = (int(p) for p in a.padding)
    (dh, dw), (qh, qw) = (int(d) for d in a.dilation), (int(q) for q in a.output_padding)
    reach_h, reach_w = dh * (kernel[0] - 1), dw * (kernel[1] - 1)
    pads = (reach_h - pt, reach_w - pl, reach_h - pb + qh, reach_w - pr + qw)
    return pads if min(pads) >= 0 else None


def _rewritable(value) -> "tuple | None":
    if not op_is(value, "relax.nn.conv2d_transpose"):
        return None
    a, (x, w) = value.attrs, value.args
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or a.data_layout)) != ("NCHW", "IOHW", "NCHW"):
        return None
    if not is_const(w) or static_shape(x) is None or len(static_shape(x)) != 4:
        return None
    pads = conv_pads(a, static_shape(w)[2:])
    return None if pads is None else pads


def _as_conv(call, pads, visit, builder):
    a = call.attrs
    x = visit(call.args[0])
    n, c, h, w = static_shape(call.args[0])
    sh, sw = (int(s) for s in a.strides)
    top, left, bottom, right = pads
    if (sh, sw) != (1, 1):
        split = builder.emit(relax.op.reshape(x, (n, c, h, 1, w, 1)))
        spread = builder.emit(relax.op.nn.pad(split, [0] * 7 + [sh - 1] + [0] * 3 + [sw - 1], "constant", 0.0))
        x = builder.emit(relax.op.reshape(spread, (n, c, h * sh, w * sw)))
        # The s - 1 zero rows (columns) after the last pixel serve as after-pad, or are cut.
        keep_h, keep_w = min(sh - 1, bottom), min(sw - 1, right)
        bottom, right = bottom - keep_h, right - keep_w
        if (keep_h, keep_w) != (sh - 1, sw - 1):
            x = builder.emit(relax.op.strided_slice(x, axes=[2, 3], begin=[0, 0],
                                                    end=[(h - 1) * sh + 1 + keep_h, (w - 1) * sw + 1 + keep_w]))
    if any((top, left, bottom, right)):
        x = builder.emit(relax.op.nn.pad(x, [0, 0, 0, 0, top, bottom, left, right], "constant", 0.0))
    weight = call.args[1].value.numpy()
    kernel = relax.const(conv_weight(weight, int(a.groups)).astype(weight.dtype))
    return relax.op.nn.conv2d(x, kernel, 1, 0, a.dilation, int(a.groups), "NCHW", "OIHW", "NCHW", a.out_dtype)


def _plan(func):
    rebuild = {}
    for var, value in bindings(func):
        pads = _rewritable(value)
        if pads is not None:
            rebuild[var] = lambda visit, builder, c=value, p=pads: _as_conv(c, p, visit, builder)
    return rebuild


@relax.transform.function_pass(opt_level=0, name="lpx.ConvTransposeAsConv")
class ConvTransposeAsConv:
    """Replace ``conv2d_transpose`` (constant weight) with zero-stuffing, a pad and ``conv2d``."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        return rewrite_bindings(func, mod, set(), _plan(func))

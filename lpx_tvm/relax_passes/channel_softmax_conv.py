"""lpx.ChannelSoftmaxConv: a softmax over the channels of a reshaped value, then a 1x1
convolution, runs on the 3-D value with the channels last.

A YOLOv8 detect head decodes box sides with a distribution (DFL): the (4 * 16, anchors)
regression is viewed as (1, 16, 4, anchors), softmaxed over the 16 bins (axis 1) and
reduced by a fixed 1x1 convolution (weights 0 .. 15, one output channel):

    conv2d(softmax(reshape(v, (1, C, H, W)), axis=1), w (O, C, 1, 1))

As a 4-D value this is an image of H rows of W = anchors pixels: at 320x320 that is
2,100 pixels, and an image row in fp32 no longer fits one SRAM slice. Nothing in it is
an image, though: the 1x1 convolution is a matrix product over the channels. This pass
rewrites it onto the 3-D value with the channels last,

    t = permute_dims(reshape(v, (C, H, W)), [1, 2, 0])       (H, W, C)
    y = matmul(softmax(t, axis=-1), w (C, O))                (H, W, O)
    r = permute_dims(y, [2, 0, 1])                           (O, H, W)

and gives the convolution's result as ``reshape(r, (1, O, H, W))``, or a reshape of it
that reads the convolution directly as ``reshape(r, ...)``: permutes, a softmax over
the last axis and a matmul by a constant, which LPX runs. The arithmetic is the same
(the matmul sums the C products as the convolution does).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._binding_rewrite import bindings, is_const, is_float, op_is, rewrite_bindings, static_shape, use_counts

__all__ = ["ChannelSoftmaxConv"]


def _pointwise_conv(call) -> bool:
    """A 1x1 NCHW/OIHW conv2d with a constant weight, no padding, stride, dilation or groups."""
    if not op_is(call, "relax.nn.conv2d") or not is_const(call.args[1]):
        return False
    a = call.attrs
    w = static_shape(call.args[1])
    return (w is not None and w[2:] == (1, 1) and int(a.groups) == 1
            and (a.data_layout, a.kernel_layout, a.out_layout or a.data_layout) == ("NCHW", "OIHW", "NCHW")
            and all(int(p) == 0 for p in a.padding) and all(int(s) == 1 for s in a.strides)
            and all(int(d) == 1 for d in a.dilation))


@relax.transform.function_pass(opt_level=0, name="lpx.ChannelSoftmaxConv")
class ChannelSoftmaxConv:
    """Rewrite ``conv2d(softmax(reshape(v, 4-D), axis=1), 1x1 w)`` onto 3-D values."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        values = dict(bindings(func))
        uses = use_counts(func)
        rebuild, made = {}, {}
        for var, conv in values.items():
            if not _pointwise_conv(conv):
                continue
            soft = values.get(conv.args[0])
            if not op_is(soft, "relax.nn.softmax") or uses[conv.args[0]] != 1:
                continue
            shape = static_shape(soft)
            if shape is None or len(shape) != 4 or shape[0] != 1 or int(soft.attrs.axis) % 4 != 1 \
                    or not is_float(soft.ty.dtype):
                continue
            view = values.get(soft.args[0])
            if not op_is(view, "relax.reshape") or uses[soft.args[0]] != 1:
                continue
            src = view.args[0]
            src_shape = static_shape(src)
            if src_shape is None or len(src_shape) < 2 or src_shape[-1] != shape[3]:
                continue  # the 3-D view must keep the source's last axis (storage unmoved)
            _, c, h, w = shape
            o = static_shape(conv.args[1])[0]
            weight = np.ascontiguousarray(conv.args[1].value.numpy().reshape(o, c).T)

            def make(visit, builder, src=src, src_shape=src_shape, c=c, h=h, w=w, o=o, weight=weight, var=var):
                x = visit(src)
                if src_shape != (c, h, w):
                    x = builder.emit(relax.op.reshape(x, (c, h, w)))
                t = builder.emit(relax.op.permute_dims(x, [1, 2, 0]))
                s = builder.emit(relax.op.nn.softmax(t, axis=-1))
                y = builder.emit(relax.op.matmul(s, relax.const(weight, str(weight.dtype))))
                r = builder.emit(relax.op.permute_dims(y, [2, 0, 1]))
                made[var] = r
                return relax.op.reshape(r, (1, o, h, w))
            rebuild[var] = make
        if not rebuild:
            return func
        # A reshape of the convolution's result reads the 3-D result directly.
        for var, value in values.items():
            if op_is(value, "relax.reshape") and value.args[0] in rebuild:
                out = static_shape(value)
                if out is not None:
                    rebuild[var] = lambda visit, builder, conv=value.args[0], out=out: relax.op.reshape(made[conv], out)
        return rewrite_bindings(func, mod, set(), rebuild)

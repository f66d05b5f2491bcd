"""lpx.FoldPad: a spatial ``nn.pad`` that feeds a convolution or a pooling becomes its pads.

TF-style "same" padding (MobileNetV2 in ``transformers``, ONNX ``Conv`` with
``auto_pad=SAME_*``, exporters that write an explicit ``Pad`` before a ``Conv``) puts
a separate pad in front of the consumer. The consumer pads by itself for free (its
padded copy is built anyway), where a separate pad is one more value and one more pass
over it. The fold is exact only where the consumer's own padding means the same:

- ``nn.conv2d`` pads with zeros: a constant pad of 0;
- ``nn.avg_pool2d`` with ``count_include_pad``, or with no pads of its own (it then
  counts the folded pads, as the averaged zeros did): a constant pad of 0;
- ``nn.max_pool2d`` pads with -inf: a constant pad of -inf, or of 0 when the input is
  a ReLU / a clip with a lower bound >= 0 (a pad value never above the window's
  elements cannot change its maximum).

Only the two spatial axes of a 4-D NCHW value fold; a pad also used elsewhere stays
for those other uses (dead code elimination removes it once nothing uses it).
"""

from __future__ import annotations

import math

from tvm import relax

from ._binding_rewrite import bindings, block_index, op_is, rewrite_bindings, static_shape, visible_at
from ..target.codegen.relax_exprs import clip_bounds

__all__ = ["FoldPad"]


def _spatial_pad(value):
    """``(pads (top, left, bottom, right), fill)`` of a constant pad of only H and W of a
    4-D value, else None."""
    if not op_is(value, "relax.nn.pad") or str(value.attrs.pad_mode) != "constant":
        return None
    widths = [int(w) for w in value.attrs.pad_width]
    if len(widths) != 8 or any(widths[:4]) or static_shape(value.args[0]) is None:
        return None
    return (widths[4], widths[6], widths[5], widths[7]), float(value.attrs.pad_value)


def _never_negative(expr, values) -> bool:
    """Whether ``expr`` is a ReLU or a clip whose lower bound is >= 0."""
    value = values.get(expr)
    if op_is(value, "relax.nn.relu"):
        return True
    if op_is(value, "relax.clip"):
        bounds = clip_bounds(value)
        return bounds is not None and bounds[0] >= 0
    return False


def _folds_into(consumer, pads, fill, source, values) -> bool:
    """Whether a constant pad of ``fill`` before ``consumer`` means the consumer's own pads."""
    if op_is(consumer, "relax.nn.max_pool2d", "relax.nn.avg_pool2d") and consumer.attrs.ceil_mode:
        return False  # its last windows reach past the pads: what they count or meet there differs
    if op_is(consumer, "relax.nn.conv2d"):
        a = consumer.attrs
        return fill == 0.0 and str(a.data_layout) == "NCHW"
    if op_is(consumer, "relax.nn.avg_pool2d"):
        a = consumer.attrs
        return fill == 0.0 and str(a.layout) == "NCHW" and (bool(a.count_include_pad) or not any(a.padding))
    if op_is(consumer, "relax.nn.max_pool2d"):
        a = consumer.attrs
        if fill == -math.inf:
            return str(a.layout) == "NCHW"
        # A zero pad below non-negative values: every window must keep an element of the
        # input (LPX pads a max pool with -inf, a window of padding only would differ).
        (kh, kw), (dh, dw) = a.pool_size, a.dilation
        extent = ((int(kh) - 1) * int(dh) + 1, (int(kw) - 1) * int(dw) + 1) * 2
        total = [int(p) + q for p, q in zip(a.padding, pads)]
        return (str(a.layout) == "NCHW" and fill <= 0.0 and _never_negative(source, values)
                and all(t < e for t, e in zip(total, extent)))
    return False


def _with_pads(consumer, data, pads):
    """``consumer`` on ``data`` with ``pads`` (top, left, bottom, right) added to its own."""
    a = consumer.attrs
    total = [int(p) + q for p, q in zip(a.padding, pads)]
    if op_is(consumer, "relax.nn.conv2d"):
        return relax.op.nn.conv2d(data, consumer.args[1], a.strides, total, a.dilation, a.groups, a.data_layout,
                                  a.kernel_layout, a.out_layout, a.out_dtype)
    is_max = op_is(consumer, "relax.nn.max_pool2d")
    pool = relax.op.nn.max_pool2d if is_max else relax.op.nn.avg_pool2d
    # An average pool with no pads of its own averaged the pad's zeros: it now counts them.
    count = bool(a.count_include_pad) if is_max else True
    return pool(data, a.pool_size, a.strides, total, a.dilation, a.ceil_mode, count, a.layout, a.out_layout)


def _plan(func):
    values = dict(bindings(func))
    blocks = block_index(func)
    rebuild = {}
    for var, value in bindings(func):
        if not isinstance(value, relax.Call) or not value.args or value.args[0] not in values:
            continue
        found = _spatial_pad(values[value.args[0]])
        if found is None:
            continue
        pads, fill = found
        source = values[value.args[0]].args[0]
        if _folds_into(value, pads, fill, source, values) and visible_at(blocks, source, var):
            rebuild[var] = lambda visit, builder, c=value, x=source, p=pads: _with_pads(c, visit(x), p)
    return rebuild


@relax.transform.function_pass(opt_level=0, name="lpx.FoldPad")
class FoldPad:
    """Fold ``conv2d(pad(x))`` / ``max_pool2d(pad(x))`` / ``avg_pool2d(pad(x))`` into the
    consumer's pads where the two mean the same."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        return rewrite_bindings(func, mod, set(), _plan(func))

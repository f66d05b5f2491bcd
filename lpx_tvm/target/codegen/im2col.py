"""Image stems: region inputs the host lays out as im2col rows (one row per output pixel,
the taps of all input channels along the lanes), so that a convolution with few input
channels is one dense matmul with a single reduction tile instead of one narrow tile
per tap."""

from __future__ import annotations

from ...machine.config import LPXConfig
from .graph import Region, OpCall
from .quant import mxm_view


def _readers(region: Region) -> dict:
    """Value name -> the ops that read it."""
    readers = {}
    for op in region.ops:
        for a in [x for st in [op.main] + op.epilogue for x in st.args if not x.is_const]:
            readers.setdefault(a.name, []).append(op)
    return readers


def _stem_transform(cfg: LPXConfig, conv: OpCall) -> "dict | None":
    """The im2col layout of a convolution's input, or None when it gains nothing (grouped,
    1x1, or more taps x channels than one reduction tile holds)."""
    a = conv.attrs
    co, cg, kh, kw = conv.args[1].shape
    if a.get("groups", 1) != 1 or cg * kh * kw > cfg.mxm_rows or kh * kw == 1:
        return None
    n, _, oh, ow = conv.shape
    return {"kind": "im2col", "kernel": [kh, kw], "strides": list(a["strides"]), "padding": list(a["padding"]),
            "dilation": list(a["dilation"]), "matrix": [n * oh * ow, kh * kw * cg]}


def float_image_stems(cfg: LPXConfig, region: Region) -> dict:
    """Param name -> its im2col layout, for the region inputs whose only reader is a
    convolution with few input channels."""
    readers = _readers(region)
    out = {}
    for p in region.params:
        ops = readers.get(p.name, [])
        if len(ops) != 1 or ops[0].main.op != "nn.conv2d" or ops[0].main.args[0].name != p.name:
            continue
        tr = _stem_transform(cfg, ops[0].main)
        if tr is not None:
            out[p.name] = tr
    return out


def int8_image_stems(cfg: LPXConfig, region: Region) -> tuple:
    """An int8 image stem: a region input (float) read only by its quantize, read only by a
    convolution with few input channels. The host lays the float image out as im2col
    rows, padding with 0.0, which quantizes to the zero point: the quantize then makes
    exactly the im2col rows of the quantized image padded with ``z_x``, and the
    convolution is one dense matmul with a single reduction tile.

    Returns ({param name: layout}, {value name: layout}): the inputs, and every value
    stored as im2col rows (those inputs and their quantized images)."""
    readers = _readers(region)
    inputs, values = {}, {}
    for p in region.params:
        qs = readers.get(p.name, [])
        if len(qs) != 1 or qs[0].composite != "lpx.quantize" or len(p.shape) != 4:
            continue
        convs = readers.get(qs[0].out, [])
        if len(convs) != 1 or convs[0].composite != "lpx.qconv2d" or qs[0].out in region.outputs:
            continue
        tr = _stem_transform(cfg, mxm_view(convs[0]).main)
        if tr is not None:
            inputs[p.name] = tr
            values[p.name] = tr
            values[qs[0].out] = tr
    return inputs, values

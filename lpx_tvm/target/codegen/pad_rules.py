"""What LPX pads, shared by the pad pattern's check and the pad lowering: spatial
padding of 4-D values (stored NHWC: image rows of pixels, channels in lanes), where
every output pixel is a fill or a copy of one input pixel."""

from __future__ import annotations

PAD_MODES = ("constant", "reflect", "replicate")


def pad_source(mode: str, k: int, before: int, n: int) -> "int | None":
    """The input index that output index ``k`` of an axis of ``n`` padded by ``before``
    copies (None: the constant fill)."""
    i = k - before
    if 0 <= i < n:
        return i
    if mode == "constant":
        return None
    if mode == "replicate":
        return min(max(i, 0), n - 1)
    return -i if i < 0 else 2 * (n - 1) - i  # reflect: the edge pixel is not repeated


def pad_problem(shape, widths, mode: str) -> "str | None":
    """Why a pad of ``shape`` by ``widths`` (before, after per axis) cannot run on LPX, or None."""
    if mode not in PAD_MODES:
        return f"pad mode {mode!r}: LPX pads in constant, reflect and replicate modes"
    if len(shape) != 4 or len(widths) != 8:
        return (f"pad of a {len(shape)}-D value: LPX pads the H and W axes of 4-D NCHW values "
                "(other values keep their last axis in lanes)")
    if any(w < 0 for w in widths):
        return f"pad widths {list(widths)} crop: LPX pads by non-negative widths"
    if any(widths[:4]):
        return ("padding of the batch or channel axis: LPX stores channels in lanes and pads "
                "H and W (image rows and pixels)")
    if mode == "reflect" and any(w >= n for w, n in zip(widths[4:], (shape[2], shape[2], shape[3], shape[3]))):
        return f"reflect padding {widths[4:]} as wide as the image {shape[2:]}: a reflection needs a wider image"
    return None

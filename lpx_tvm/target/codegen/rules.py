"""What the region codegen can lower: each rule once, asked by the BYOC check functions
(declared beside each family's lowering, :mod:`.lowerings`)
and by the lowering that relies on it.

A rule takes plain shapes and numbers (the checks read them from Relax types, the
lowerings from region operands) and returns None or a one-line reason, which the
offload report shows for an op left on the CPU. Because both sides ask the same
function, the partitioner never offloads an op that codegen would then refuse, and
never keeps on the CPU an op it could lower.
"""

from __future__ import annotations

import math

import numpy as np

from ...machine.layout import stored_bytes
from .options import SMALLEST_BAND_SHARE, CodegenOptions

# The largest |n| of an integer power lpx.Decompose writes as multiplies.
MAX_INTEGER_POWER = 16


def _ints(shape) -> tuple:
    return tuple(int(s) for s in shape)


def _matrix(shape: tuple) -> tuple:
    """The (rows, cols) matrix a value is stored as (4-D NCHW values as NHWC)."""
    shape = _ints(shape)
    if len(shape) == 4:
        n, c, h, w = shape
        return (n * h * w, c)
    return (math.prod(shape[:-1]) if len(shape) > 1 else 1, shape[-1] if shape else 1)


def channel_axis(rank: int) -> int:
    """The axis a value of ``rank`` keeps in lanes: C of a 4-D NCHW value, else the last."""
    return 1 if rank == 4 else rank - 1


# ---- storage ------------------------------------------------------------------------


def reshape_keeps_storage(src: tuple, dst: tuple) -> bool:
    """True when a reshape leaves every element where it is stored (a free alias)."""
    if _matrix(src) != _matrix(dst):
        return False
    spatial = lambda s: len(s) == 4 and int(s[2]) * int(s[3]) > 1  # noqa: E731
    # NHWC storage orders a 4-D value with pixels differently from its NCHW flattening.
    return spatial(src) == spatial(dst) and (not spatial(src) or tuple(src) == tuple(dst))


def activation_row_bytes(shape: tuple, itemsize: int, lanes: int) -> int:
    """Bytes of one stored row of an activation (an image row of a 4-D value, the last
    axis of any other), its channels padded to whole lane tiles."""
    shape = _ints(shape)
    if len(shape) == 4:  # W pixels of C channels
        return stored_bytes(shape[3], shape[1], itemsize, lanes)
    return stored_bytes(1, shape[-1] if shape else 1, itemsize, lanes)


def activation_row_problem(shape: tuple, itemsize: int, cfg, precision: str) -> "str | None":
    """Why an activation of ``shape`` (``itemsize`` bytes an element, in a ``precision``
    build) can never be lowered, or None.

    Activations larger than the SRAM stay off chip and run in bands of whole image rows
    (rows of a matrix): one row must fit in the smallest share of the SRAM a band may
    take (:data:`~.options.SMALLEST_BAND_SHARE`), leaving room for the window around it.
    """
    nbytes = activation_row_bytes(shape, itemsize, cfg.lanes)
    if nbytes > SMALLEST_BAND_SHARE * cfg.sram_bytes:
        return (f"one row of activation {_ints(shape)} needs {nbytes} bytes at {precision}, more than "
                f"1/{round(1 / SMALLEST_BAND_SHARE)} of the {cfg.name} SRAM ({cfg.sram_bytes} bytes), "
                "the least a band must leave")
    return image_row_slice_problem(shape, itemsize, cfg, precision)


def image_row_slice_problem(shape: tuple, itemsize: int, cfg, precision: str) -> "str | None":
    """Why a 4-D activation's image rows cannot be stored, or None.

    A 4-D value is stored in chunks of whole image rows, one chunk to a slice, so that a
    window never reads a row split over two slices: an image row of W pixels (one vector
    of ``itemsize`` lines each per lane tile) must fit one slice.
    """
    shape = _ints(shape)
    if len(shape) != 4:
        return None
    fit = cfg.lines_per_slice // itemsize  # pixels one slice holds
    if shape[3] > fit:
        return (f"an image row of {shape[3]} pixels of activation {shape} needs {shape[3] * itemsize} SRAM lines "
                f"at {precision}, more than one {cfg.name} slice holds ({cfg.lines_per_slice}): image rows are "
                "stored whole in one slice")
    return None


def activation_bytes(shape: tuple, itemsize: int, lanes: int) -> int:
    """SRAM bytes of an activation stored as its matrix, columns padded to whole lane tiles."""
    return stored_bytes(*_matrix(shape), itemsize, lanes)


def int8_working_set_problem(values, cfg, weight_bytes: int = 0) -> "str | None":
    """Why one int8 op, reading and writing the activations ``values`` ([(shape,
    itemsize)]) with ``weight_bytes`` of constant weights, cannot be lowered, or None.

    An int8 region keeps every value in SRAM (there is no band lowering for int8), so
    what one op reads and writes must fit beside each other in the SRAM its resident
    weights leave (weights past their share stream from off-chip memory).
    """
    need = sum(activation_bytes(shape, itemsize, cfg.lanes) for shape, itemsize in values)
    opts = CodegenOptions()
    share = min(opts.weight_budget, opts.fallback_weight_budget)
    room = cfg.sram_bytes - min(weight_bytes, int(share * cfg.sram_bytes))
    if need > room:
        shapes = ", ".join(str(_ints(shape)) for shape, _ in values)
        return (f"its activations {shapes} need {need} bytes of SRAM together, more than the {room} bytes "
                f"the {cfg.name} SRAM has beside its weights; int8 ops keep their values on chip (no bands)")
    return None


# ---- elementwise ----------------------------------------------------------------------


def constant_broadcast(tensor: tuple, const: tuple) -> "str | None":
    """How a constant of shape ``const`` combines elementwise with a value of shape
    ``tensor`` on LPX: ``"scalar"`` (one value: an immediate), ``"channel"`` (one value
    per stored channel: a row read again for every pixel), ``"full"`` (the value's own
    shape: a tensor beside it), or None (any other broadcast would move data between
    lanes or across rows).

    Shapes broadcast as numpy does, aligned at the last axis: a (C,) or (1, C) constant
    on an NCHW value varies along W, not along the channels.
    """
    tensor, const = _ints(tensor), _ints(const)
    if math.prod(const) == 1:
        return "scalar"
    if const == tensor:
        return "full"
    rank = len(tensor)
    if rank == 0:
        return None
    # Leading axes of size one beyond the value's rank only add axes to the result (the
    # binary rule refuses a result larger than the value).
    extra = len(const) - rank
    if extra > 0 and any(d != 1 for d in const[:extra]):
        return None
    aligned = (1,) * max(0, -extra) + const[max(0, extra):]
    axis = channel_axis(rank)
    if aligned[axis] == tensor[axis] and all(d == 1 for i, d in enumerate(aligned) if i != axis):
        return "channel"
    return None


def binary_operands_problem(op: str, lhs: tuple, rhs: tuple, lhs_const: bool, rhs_const: bool,
                            result: tuple, runtime_broadcasts: bool = True) -> "str | None":
    """Why an elementwise ``op`` (``add``, ``subtract``, ``multiply``, ``minimum``,
    ``maximum``) of operands of shapes ``lhs`` and ``rhs`` (constant or not) into
    ``result`` cannot be lowered, or None. (Constant minus tensor runs as the tensor
    negated plus the constant.)"""
    lhs, rhs, result = _ints(lhs), _ints(rhs), _ints(result)
    if lhs_const and rhs_const:
        return "both operands are constants (folded at compile time)"
    if runtime_broadcasts and not (lhs_const or rhs_const) and lhs != rhs:
        small, big = (lhs, rhs) if rhs == result else (rhs, lhs)
        # One runtime number (a position) against a tensor: broadcast to every lane (SXM).
        if small and math.prod(small) == 1 and big == result:  # a 0-d value is not in SRAM
            return None
        # A runtime block of rows repeated along leading dims (a RoPE table's rows for
        # every head, a mask for every head): row r reads row r % rows of the block.
        trail = small[next((i for i, d in enumerate(small) if d != 1), len(small)):]
        if len(result) != 4 and trail and big == result and tuple(big[len(big) - len(trail):]) == tuple(trail):
            return None
    runtime = rhs if lhs_const else lhs
    if runtime_broadcasts and (lhs_const or rhs_const) and runtime and math.prod(runtime) == 1 and \
            (lhs if lhs_const else rhs) == result and result != runtime:
        return None  # a runtime number and a constant tensor: the number broadcast to every lane
    tensor, other, other_const = (rhs, lhs, lhs_const) if lhs_const else (lhs, rhs, rhs_const)
    if not other_const:
        if tensor != other:
            return f"broadcast of {other} against {tensor} moves data between lanes"
    elif constant_broadcast(tensor, other) is None:
        return f"constant of shape {other} broadcast against {tensor}: only scalars, one value per channel " \
               "or a full tensor are supported"
    if result != tensor:
        return "the result is larger than the operands"
    return None


def divide_operands_problem(lhs: tuple, rhs: tuple, lhs_const: bool, rhs_const: bool,
                            result: tuple) -> "str | None":
    """Why ``lhs / rhs`` cannot be lowered, or None: a tensor divides by a tensor of its
    shape (times the reciprocal) or by a constant as a multiply does (times the
    constant's reciprocal); a constant numerator must be one value (the reciprocal of
    the tensor, scaled)."""
    if lhs_const and not rhs_const:
        if math.prod(_ints(lhs)) != 1:
            return f"constant of shape {_ints(lhs)} divided by a tensor: only a scalar numerator is supported"
        return None if _ints(rhs) == _ints(result) else "the result is larger than the operands"
    # The runtime broadcasts of add / multiply are not in the divide's lowering.
    return binary_operands_problem("multiply", lhs, rhs, lhs_const, rhs_const, result, runtime_broadcasts=False)


def prelu_slope_problem(shape: tuple, slope: tuple, axis: int, slope_const: bool) -> "str | None":
    """Why a PReLU of a value of ``shape`` with a slope of shape ``slope`` along ``axis``
    cannot be lowered, or None: the slope is a constant of one value, or of one value
    per channel along the axis kept in lanes (:func:`channel_axis`)."""
    shape, slope = _ints(shape), _ints(slope)
    if not slope_const:
        return "PReLU with a runtime slope: LPX takes a constant slope"
    n = math.prod(slope)
    if n == 1:
        return None
    rank = len(shape)
    if rank and axis % rank == channel_axis(rank) and n == shape[channel_axis(rank)]:
        return None
    return (f"PReLU slope of shape {slope} along axis {axis} of a {rank}-D value: LPX takes one slope, or one "
            "per channel (axis 1 of a 4-D value, the last axis otherwise)")


# ---- reductions and data movement --------------------------------------------------------


def spatial_mean_problem(rank: int, axes) -> "str | None":
    """Why a ``mean`` over ``axes`` of a value of ``rank`` cannot be lowered (LPX lowers
    the global average pooling: axes 2 and 3 of a 4-D NCHW value), or None."""
    axes = sorted(int(a) % rank for a in axes) if rank else list(axes)
    if rank != 4 or axes != [2, 3]:
        return (f"mean over axes {axes} of a rank-{rank} tensor: only the spatial mean "
                "(axes 2, 3 of NCHW, global average pooling) is supported")
    return None


def concat_axis_problem(axis: int, rank: int) -> "str | None":
    """Why a concat along ``axis`` of rank-``rank`` values cannot be lowered (LPX
    concatenates along the channel axis, which is in lanes), or None."""
    axis = axis + rank if axis < 0 else axis
    if axis != channel_axis(rank):
        return f"concat along axis {axis} of a rank-{rank} tensor: only the channel axis is supported"
    return None


def row_axis_problem(what: str, axis: int, rank: int) -> "str | None":
    """Why ``what`` (a concat or a slice) along ``axis`` of rank-``rank`` values cannot run
    as whole stored rows placed or picked (a value of rank 2 or 3 is stored as rows of its
    last axis, so any other axis indexes blocks of rows), or None."""
    axis = axis + rank if axis < 0 else axis
    if rank not in (2, 3):
        return f"{what} along axis {axis} of a rank-{rank} tensor: rows are placed whole for ranks 2 and 3"
    if axis == rank - 1:
        return f"{what} along the last axis moves lanes, not rows"
    return None


def row_blocks(shape: tuple, axis: int) -> tuple:
    """(outer, inner) for ``axis`` of a value stored as rows of its last axis: the axes
    before it repeat ``outer`` times, and one index along it spans ``inner`` rows."""
    shape = _ints(shape)
    return math.prod(shape[:axis]), math.prod(shape[axis + 1:-1])


def flattens_pixels(src: tuple, dst: tuple) -> bool:
    """Whether (n, c, h, w) -> (n, h*w, c) (``flatten(2)`` then ``transpose(1, 2)``, a ViT
    patch embedding) leaves every element where it is stored: a 4-D value's pixel rows
    with channels in lanes are the rows of the 3-D result."""
    src, dst = _ints(src), _ints(dst)
    return len(src) == 4 and len(dst) == 3 and dst == (src[0], src[2] * src[3], src[1])


# ---- convolutions ----------------------------------------------------------------------


def grouped_conv_problem(groups: int, cin: int, cout: int) -> "str | None":
    """Why a conv2d with ``groups`` cannot be lowered, or None.

    Depthwise convolution has its own lowering (a diagonal weight tile per tap); any other
    grouping becomes a dense convolution whose weight is block-diagonal (see
    :func:`block_diagonal`), which needs only that the groups split both channel counts."""
    if groups < 1 or cin % groups or cout % groups:
        return f"groups={groups} does not divide {cin} input and {cout} output channels"
    return None


def is_depthwise(groups: int, channels: int, w_shape: tuple) -> bool:
    """Whether a conv2d with ``groups`` over ``channels`` inputs and an OIHW weight of
    ``w_shape`` is depthwise (one input channel per group, one output channel each)."""
    return groups != 1 and groups == channels == w_shape[0] and w_shape[1] == 1


def block_diagonal(w, groups: int):
    """The dense (CO, C, KH, KW) weight of a grouped conv's (CO, C / groups, KH, KW) weight:
    output channels of group g read input channels of group g only, zeros elsewhere."""
    co, cg, kh, kw = w.shape
    og = co // groups
    dense = np.zeros((co, cg * groups, kh, kw), np.float32)
    for g in range(groups):
        dense[g * og:(g + 1) * og, g * cg:(g + 1) * cg] = w[g * og:(g + 1) * og]
    return dense


# ---- pad (lowerings/pad.py): spatial padding of 4-D values, every output pixel a
# fill or a copy of one input pixel -------------------------------------------------

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


# ---- resize (lowerings/resize.py) ---------------------------------------------------

METHODS = ("nearest_neighbor", "linear")
COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
ROUNDING = ("", "round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def resize_problem(rank: int, layout: str, method: str, coordinate_mode: str, rounding: str) -> "str | None":
    """Why a ``resize2d`` with these attributes cannot be lowered, or None."""
    if rank != 4 or layout != "NCHW":
        return f"resize of a {rank}-D {layout} value: LPX resizes H and W of a 4-D NCHW value"
    if method not in METHODS:
        return f"{method} resize: LPX resizes by nearest or bilinear (linear) sampling"
    if coordinate_mode not in COORDINATE_MODES:
        return f"coordinate transformation mode {coordinate_mode} (LPX: {', '.join(COORDINATE_MODES)})"
    if method == "nearest_neighbor" and rounding not in ROUNDING:
        return f"nearest mode {rounding}"
    return None

"""Ops that place the pixels of an image into a larger one: ``nn.pad`` of H and W
(constant, reflect and edge modes) and the zero-stuffing of a transposed convolution
(``lpx.zero_stuff``, see :mod:`lpx_tvm.relax_passes.conv_transpose`).

4-D values are stored NHWC: pixel after pixel, channels in lanes. Every output pixel
is either a fill or a copy of one input pixel, so each op is a list of row copies
(2-D windows of pixels, read from the input and written at their new place) and
fills (a constant vector repeated over a window): the channels never move between
lanes.
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..rules import pad_problem, pad_source
from ..row_passes import fill_vector
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..relax_exprs import expr_shape, int_tuple, is_const
from ..storage import Stored, chunk_of, one, runs
from ..values import new_value


def affine_runs(sources) -> list:
    """Maximal runs ``(first out index, count, out step, first source index)`` of the
    output indices with a source whose sources rise by one as the output index rises by
    a constant step (a copy window each); an index alone is a run of one."""
    pairs = [(k, s) for k, s in enumerate(sources) if s is not None]
    out, i = [], 0
    while i < len(pairs):
        k0, s0 = pairs[i]
        step, j = 1, i + 1
        if j < len(pairs) and pairs[j][1] == s0 + 1:
            step = pairs[j][0] - k0
            while j < len(pairs) and pairs[j][1] == s0 + (j - i) and pairs[j][0] == k0 + (j - i) * step:
                j += 1
        out.append((k0, j - i, step, s0))
        i = j
    return out


def _gaps(sources) -> list:
    """Runs ``(first, count)`` of consecutive output indices that take the fill."""
    return [(a, b - a) for a, b in runs(len(sources), lambda k: sources[k] is None) if sources[a] is None]


def place_pixels(ctx: LoweringContext, tag: str, x: Stored, y: Stored, rows, cols, fill: float = 0.0):
    """Write ``y`` (N, C, len(rows), len(cols)) from ``x``: output pixel (r, c) copies input
    pixel (rows[r], cols[c]), or is ``fill`` where either is None."""
    n, _, h, w = x.shape
    hp, wp = len(rows), len(cols)
    b = ctx.builder
    fill_row = None
    row_runs, col_runs = affine_runs(rows), affine_runs(cols)
    col_gaps = _gaps(cols)

    def write_fill(j, first, nrows, ncols, pitch):
        nonlocal fill_row
        fill_row = fill_row or fill_vector(ctx, fill, y.tensor.layout.dtype)
        for r0, r1 in runs(nrows, lambda r: chunk_of(y.tensor, first + r * pitch)):
            g = b.group(f"{tag}.fill")
            dst = one(y.tensor.window_segments(j, first + r0 * pitch, r1 - r0, ncols, pitch))
            g.write(g.read(fill_row.tile(0).repeat(dst.count)), dst)

    def copy(j, src, src_pitch, dst, dst_pitch, dst_step, nrows, ncols):
        for r0, r1 in runs(nrows, lambda r: (chunk_of(x.tensor, src + r * src_pitch),
                                             chunk_of(y.tensor, dst + r * dst_pitch))):
            g = b.group(f"{tag}.place")
            v = g.read(one(x.tensor.window_segments(j, src + r0 * src_pitch, r1 - r0, ncols, src_pitch)))
            g.write(v, one(y.tensor.window_segments(j, dst + r0 * dst_pitch, r1 - r0, ncols, dst_pitch, dst_step)))

    for i in range(n):
        for j in range(x.tensor.ntiles):
            for r, count in _gaps(rows):  # whole rows of fill
                write_fill(j, (i * hp + r) * wp, count, wp, wp)
            for r, nrows, rstep, sr in row_runs:
                dst_row, pitch = (i * hp + r) * wp, rstep * wp
                for c, ncols in col_gaps:
                    write_fill(j, dst_row + c, nrows, ncols, pitch)
                for c, ncols, cstep, sc in col_runs:
                    copy(j, (i * h + sr) * w + sc, w, dst_row + c, pitch, cstep, nrows, ncols)


@register_lowering("nn.pad", banding="placement")
def lower_pad(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Padding of H and W in constant, reflect or edge mode (:func:`place_pixels`)."""
    x = ctx.value(op.main.args[0])
    a = op.main.attrs
    widths, mode = [int(v) for v in a["pad_width"]], str(a["pad_mode"])
    problem = pad_problem(x.shape, widths, mode)
    if problem:
        raise UnsupportedOnLPX(problem)
    _, _, h, w = x.shape
    _, _, hp, wp = op.shape
    rows = [pad_source(mode, k, widths[4], h) for k in range(hp)]
    cols = [pad_source(mode, k, widths[6], w) for k in range(wp)]
    y = new_value(ctx, op.out, op.shape, is_output, dtype=x.tensor.layout.dtype)
    place_pixels(ctx, op.out, x, y, rows, cols, float(a.get("pad_value", 0.0)))
    ctx.values[op.out] = y


@register_lowering("lpx.zero_stuff", "lpx.zero_stuff_cropped", banding="placement")
def lower_zero_stuff(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """(N, C, H, W) -> (N, C, H*sh, W*sw), or its first rows and columns (cropped): pixel
    (r, c) goes to (r*sh, c*sw), zeros between. The strides are the zeros the pad step
    puts after each pixel's unit axes."""
    x = ctx.value(op.main.args[0])
    widths = [int(v) for v in op.epilogue[0].attrs["pad_width"]]
    sh, sw = widths[7] + 1, widths[11] + 1
    _, _, hs, ws = op.shape
    rows = [k // sh if k % sh == 0 else None for k in range(hs)]
    cols = [k // sw if k % sw == 0 else None for k in range(ws)]
    y = new_value(ctx, op.out, op.shape, is_output, dtype=x.tensor.layout.dtype)
    place_pixels(ctx, op.out, x, y, rows, cols, 0.0)
    ctx.values[op.out] = y


# ---- patterns ---------------------------------------------------------------------------


def _pad_check(a, settings):
    op = a["root"]
    problem = pad_problem(expr_shape(a["input"]), [int(w) for w in op.attrs.pad_width], str(op.attrs.pad_mode))
    return (op, problem) if problem else None


def _zero_stuff_pattern(cropped=False):
    data, shape6, shape4 = wildcard(), wildcard(), wildcard()
    split = is_op("relax.reshape")(data, shape6)
    spread = is_op("relax.nn.pad")(split)
    root = stuffed = is_op("relax.reshape")(spread, shape4)
    if cropped:
        root = is_op("relax.strided_slice")(stuffed, varg_default_wildcard=True)
    return root, {"input": data, "split": split, "pad": spread, "stuffed": stuffed, "root": root}


def _zero_stuff_check(a, settings):
    """(N, C, H, W) -> (N, C, H, 1, W, 1) -> zeros after the unit axes -> (N, C, H*sh, W*sw):
    the zero-stuffing :mod:`lpx_tvm.relax_passes.conv_transpose` writes."""
    root, spread = a["root"], a["pad"]
    src, split = expr_shape(a["input"]), expr_shape(a["split"])
    widths = [int(w) for w in spread.attrs.pad_width]
    if (len(src) != 4 or split != (*src[:3], 1, src[3], 1) or str(spread.attrs.pad_mode) != "constant"
            or float(spread.attrs.pad_value) != 0.0 or any(widths[:7]) or any(widths[8:11])):
        return root, "reshape / pad / reshape that is not the zero-stuffing of an image"
    if not root.same_as(a["stuffed"]):  # a slice of the stuffed image's first rows and columns
        ints = [int_tuple(t) for t in root.args[1:]]
        if any(t is None for t in ints) or sorted(ints[0]) != [2, 3] or any(ints[1]) or \
                (len(ints) > 3 and any(v != 1 for v in ints[3])):
            return root, "a slice of a zero-stuffed image other than its first rows and columns"
    return None


def _conv2d_transpose_check(a, settings):
    """Why a transposed convolution is still one: lpx.ConvTransposeAsConv rewrote every
    one LPX runs into zero-stuffing and a conv2d."""
    op = a["root"]
    if not is_const(op.args[1]):
        return op, ("weight is not a constant: LPX runs a transposed convolution as a convolution "
                    "with the kernel flipped at compile time")
    return op, ("layouts other than NCHW/IOHW, or pads beyond the kernel's reach (the equivalent "
                "convolution would crop)")


register_pattern(
    OpPattern("pad", lambda: unary_pattern("relax.nn.pad"), checks=(_pad_check,), priority=89, zero_d=True),
    OpPattern("zero_stuff", _zero_stuff_pattern, checks=(_zero_stuff_check,), priority=90, zero_d=True),
    OpPattern("zero_stuff_cropped", lambda: _zero_stuff_pattern(cropped=True), checks=(_zero_stuff_check,),
              priority=91, zero_d=True),
    OpPattern("conv2d_transpose", lambda: unary_pattern("relax.nn.conv2d_transpose"),
              checks=(_conv2d_transpose_check,), priority=92, lowered=False),
)

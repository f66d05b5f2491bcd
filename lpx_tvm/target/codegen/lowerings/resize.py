"""``image.resize2d`` (ONNX Resize, torch interpolate / Upsample) over H and W of an NCHW
value: nearest and bilinear, as copies and weighted sums of whole pixel rows.

A 4-D value is stored one row per pixel with the channels in lanes, so each output
pixel is a copy of one input pixel (nearest) or a weighted sum of input pixels with
weights known at compile time (bilinear). The source indices and weights of each axis
are computed here in float32 as TVM's own ``resize2d`` computes them. Output pixels
whose sources advance in equal steps are one strided window (:func:`axis_runs`), so a
resize is a few groups per image: nearest copies 2-D windows of input rows into 2-D
windows of output rows; bilinear is separable, along W into an fp32 temporary, then
along H, one group per tap (multiply by the weight, add to what is there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..lowering_context import LoweringContext
from ..graph import RegionOp, UnsupportedOnLPX
from ..row_passes import finish, rowwise
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..relax_exprs import expr_shape
from ..rules import resize_problem
from ..storage import Stored, chunk_of, one, runs
from ..values import new_value

# ---- compile-time sampling of one axis ---------------------------------------------


def source_coordinates(size_in: int, size_out: int, mode: str) -> np.ndarray:
    """The input coordinate of each output index (float32, as TOPI's ``get_inx``)."""
    f32 = np.float32
    x = np.arange(size_out, dtype=f32)
    scale = f32(size_in) / f32(size_out)
    if mode == "align_corners":
        return (f32(size_in - 1) / f32(size_out - 1) * x).astype(f32) if size_out > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return scale * x
    if mode == "pytorch_half_pixel" and size_out == 1:
        return np.zeros_like(x)
    return (x + f32(0.5)) * scale - f32(0.5)  # half_pixel, pytorch_half_pixel


def nearest_indices(coords: np.ndarray, rounding: str, mode: str, size_in: int) -> np.ndarray:
    """The input index each output index copies (TOPI's ``get_closest_index``, clamped)."""
    f32 = np.float32
    if rounding == "":
        rounding = "round" if mode == "align_corners" else "floor"
    if rounding == "round":  # half away from zero
        idx = np.sign(coords) * np.floor(np.abs(coords) + f32(0.5))
    elif rounding == "round_prefer_floor":
        idx = np.ceil(coords - f32(0.5))
    elif rounding == "round_prefer_ceil":
        idx = np.floor(coords + f32(0.5))
    elif rounding == "floor":
        idx = np.floor(coords + f32(1e-5))
    else:  # ceil
        idx = np.ceil(coords - f32(1e-5))
    return np.clip(idx.astype(np.int64), 0, size_in - 1)


def axis_taps(size_in: int, size_out: int, method: str, mode: str, rounding: str) -> list:
    """Per output index, its taps: a tuple of (input index, weight), zero weights left out."""
    coords = source_coordinates(size_in, size_out, mode)
    if method == "nearest_neighbor":
        return [((int(i), 1.0),) for i in nearest_indices(coords, rounding, mode, size_in)]
    low = np.floor(coords)
    frac = (coords - low).astype(np.float32)
    low = low.astype(np.int64)
    out = []
    for i0, t in zip(low, frac):
        taps = ((int(np.clip(i0, 0, size_in - 1)), float(np.float32(1) - t)),
                (int(np.clip(i0 + 1, 0, size_in - 1)), float(t)))
        out.append(tuple(tap for tap in taps if tap[1] != 0.0))
    return out


@dataclass(frozen=True)
class AxisRun:
    """Output indices ``out0 + k * out_step`` (k < count), each the weighted sum of its
    taps: input index ``first + k * step`` with ``weight``, one (first, step, weight)
    per tap."""

    out0: int
    out_step: int
    count: int
    taps: tuple


def axis_runs(taps: list, max_step: int = 16) -> list:
    """The output indices of one axis as runs whose taps advance in equal steps.

    From the first output index not yet in a run, the longest run over output steps
    1 .. ``max_step`` of indices with the same weights whose input indices advance
    evenly: an upsample by k gives k runs of step k (a few more at clamped edges)."""
    n = len(taps)
    weights = [tuple(w for _, w in t) for t in taps]
    index = [[i for i, _ in t] for t in taps]
    free = [True] * n
    out = []
    for o0 in range(n):
        if not free[o0]:
            continue
        best = (1, 1, [0] * len(index[o0]))
        for d in range(1, min(max_step, n - o0 - 1) + 1):
            o1 = o0 + d
            if not free[o1] or weights[o1] != weights[o0]:
                continue
            steps = [b - a for a, b in zip(index[o0], index[o1])]
            if min(steps) < 0:
                continue
            count = 2
            while o0 + count * d < n:
                o = o0 + count * d
                if not free[o] or weights[o] != weights[o0] or \
                        any(i != i0 + count * st for i, i0, st in zip(index[o], index[o0], steps)):
                    break
                count += 1
            if count > best[0]:
                best = (count, d, steps)
        count, d, steps = best
        for k in range(count):
            free[o0 + k * d] = False
        out.append(AxisRun(o0, d, count, tuple(zip(index[o0], steps, weights[o0]))))
    return out


def resize_band_rows(attrs: dict, size_in: int, size_out: int):
    """For a resize run by bands of output rows: (h0, rows) -> (first input row, input
    rows, None), the input rows the band's taps read."""
    taps = axis_taps(size_in, size_out, attrs.get("method", "linear"),
                     attrs.get("coordinate_transformation_mode", "half_pixel"), attrs.get("rounding_method", ""))

    def rows(h0, nrows):
        read = [i for t in taps[h0:h0 + nrows] for i, _ in t]
        return min(read), max(read) + 1 - min(read), None
    return rows


def is_identity(taps: list, size_in: int) -> bool:
    """True when an axis keeps its size and every output index copies its own input."""
    return len(taps) == size_in and all(t == ((o, 1.0),) for o, t in enumerate(taps))


# ---- windows of pixel rows -----------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Where a job's window (its rows x cols pixel rows) sits in a value: from pixel row
    ``first``, window row k starts ``k * pitch`` rows on, its pixels ``step`` rows apart."""

    first: int
    pitch: int
    step: int


def _sample(ctx: LoweringContext, tag: str, src: Stored, dst: Stored, jobs: list):
    """For each job ``(rows, cols, [(src window, weight)], dst window)``: the weighted sum
    of the source windows into the destination window, one group per tap and run of
    window rows that sits in one chunk of every window (a copy when the only weight is 1
    and the dtypes agree)."""
    acc = ctx.acc
    for rows, cols, taps, out in jobs:
        windows = [w for w, _ in taps] + [out]
        tensors = [src.tensor] * len(taps) + [dst.tensor]

        def key(k):
            return tuple(chunk_of(t, w.first + k * w.pitch) for t, w in zip(tensors, windows))
        for k0, k1 in runs(rows, key):
            for j in range(dst.tensor.ntiles):
                def region(t, w):
                    return one(t.window_segments(j, w.first + k0 * w.pitch, k1 - k0, cols, w.pitch, w.step))
                target = region(dst.tensor, out)
                for n, (w, weight) in enumerate(taps):
                    g = ctx.builder.group(tag)
                    v = g.read(region(src.tensor, w))
                    if weight != 1.0 or n or v.dtype != target.dtype:
                        if v.dtype != acc:
                            v = g.vxm("vxm.cvt", v, to=acc)
                        if weight != 1.0:
                            v = g.vxm("vxm.mul", v, imm=weight)
                        if n:
                            v = g.vxm("vxm.add", v, g.read(target))
                    finish(g, v, target)


def _along_w(src_shape: tuple, out_w: int, wruns: list) -> list:
    """Jobs of a pass over W: every image row of an image at once, per run of W."""
    n, _, h, w = src_shape
    return [(h, run.count, [(Window((i * h) * w + first, w, step), weight) for first, step, weight in run.taps],
             Window((i * h) * out_w + run.out0, out_w, run.out_step))
            for i in range(n) for run in wruns]


def _along_h(src_shape: tuple, out_h: int, hruns: list) -> list:
    """Jobs of a pass over H: whole image rows, per run of H."""
    n, _, h, w = src_shape
    return [(run.count, w, [(Window((i * h + first) * w, step * w, 1), weight) for first, step, weight in run.taps],
             Window((i * out_h + run.out0) * w, run.out_step * w, 1))
            for i in range(n) for run in hruns]


def _nearest(src_shape: tuple, out_hw: tuple, hruns: list, wruns: list) -> list:
    """Jobs of a nearest resize: a 2-D window per run of H and run of W."""
    n, _, h, w = src_shape
    oh, ow = out_hw
    jobs = []
    for i in range(n):
        for hr in hruns:
            for wr in wruns:
                (hf, hs, _), (wf, ws, _) = hr.taps[0], wr.taps[0]
                jobs.append((hr.count, wr.count, [(Window((i * h + hf) * w + wf, hs * w, ws), 1.0)],
                             Window((i * oh + hr.out0) * ow + wr.out0, hr.out_step * ow, wr.out_step)))
    return jobs


@register_lowering("image.resize2d", band_rows=resize_band_rows)
def lower_resize2d(ctx: LoweringContext, op: RegionOp, is_output: bool):
    a = op.main.attrs
    x = ctx.value(op.main.args[0])
    method, mode = a.get("method", "linear"), a.get("coordinate_transformation_mode", "half_pixel")
    rounding = a.get("rounding_method", "")
    problem = resize_problem(len(x.shape), a.get("layout", "NCHW"), method, mode, rounding)
    if problem:
        raise UnsupportedOnLPX(problem)
    n, c, h, w = x.shape
    oh, ow = op.shape[2], op.shape[3]
    wtaps = axis_taps(w, ow, method, mode, rounding)
    if "band" in a:  # output rows out0 .. of a resize of full_h rows to full_oh, from input row in0 on
        out0, in0, full_h, full_oh = a["band"]
        htaps = [tuple((i - in0, wt) for i, wt in t)
                 for t in axis_taps(full_h, full_oh, method, mode, rounding)[out0:out0 + oh]]
    else:
        htaps = axis_taps(h, oh, method, mode, rounding)
    hruns, wruns = axis_runs(htaps), axis_runs(wtaps)
    tag = f"{op.out}.resize"
    if method == "nearest_neighbor":
        y = new_value(ctx, op.out, op.shape, is_output, dtype=x.tensor.layout.dtype)
        _sample(ctx, tag, x, y, _nearest(x.shape, (oh, ow), hruns, wruns))
        ctx.values[op.out] = y
        return
    # Bilinear: along W, then along H (a pass that changes nothing is left out), in fp32.
    passes = []
    if not is_identity(wtaps, w):
        passes.append(((n, c, h, ow), lambda s: _along_w(s, ow, wruns)))
    if not is_identity(htaps, h):
        passes.append(((n, c, oh, ow), lambda s: _along_h(s, oh, hruns)))
    cur, y = x, None
    for k, (shape, jobs) in enumerate(passes):
        if k == len(passes) - 1 and ctx.dtype == ctx.acc:
            dst = y = new_value(ctx, op.out, op.shape, is_output, avoid=[cur])
        else:
            dst = ctx.temp(new_value(ctx, f"{op.out}.pass{k}", shape, avoid=[cur], dtype=ctx.acc))
        _sample(ctx, tag, cur, dst, jobs(cur.shape))
        cur = dst
    if y is None:  # convert (or copy, for a resize to the same size) into the result
        y = new_value(ctx, op.out, op.shape, is_output, avoid=[cur])
        rowwise(ctx, tag, [cur], y, lambda g, vs: vs[0])
    ctx.values[op.out] = y


# ---- patterns ---------------------------------------------------------------------------


def _resize_check(a, settings):
    op = a["root"]
    attrs = op.attrs
    if attrs.out_dtype is not None and str(attrs.out_dtype) not in ("", "void", str(op.args[0].ty.dtype)):
        return op, f"resize to dtype {attrs.out_dtype}: LPX resizes within one dtype"
    problem = resize_problem(len(expr_shape(a["input"])), str(attrs.layout), str(attrs.method),
                             str(attrs.coordinate_transformation_mode), str(attrs.rounding_method))
    return (op, problem) if problem else None


register_pattern(OpPattern("resize2d", lambda: unary_pattern("relax.image.resize2d"), checks=(_resize_check,),
                           priority=88, zero_d=True))

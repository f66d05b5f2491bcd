"""Vector lowerings: elementwise ops, pools, global pooling, concat, reshape, padded copies."""

from __future__ import annotations

import numpy as np

from .graph import RegionOp, UnsupportedOnLPX
from .storage import Stored, _chunk_of, _one, _row_align, _runs, _slices, stored_shape
from .support import reshape_keeps_storage


def permute_steps(axes) -> list:
    """The shortest chain of swaps ("last": the last two axes, "first": the first two of
    three) that permutes axes as ``axes`` does: [] for the identity."""
    rank, target = len(axes), tuple(axes)
    moves = {"last": list(range(rank - 2)) + [rank - 1, rank - 2]}
    if rank == 3:
        moves["first"] = [1, 0, 2]
    seen, frontier = {tuple(range(rank)): []}, [tuple(range(rank))]
    while frontier and target not in seen:
        nxt = []
        for order in frontier:
            for name, p in moves.items():
                new = tuple(order[i] for i in p)
                if new not in seen:
                    seen[new] = seen[order] + [name]
                    nxt.append(new)
        frontier = nxt
    return seen[target]


# Relax unary ops that are one VXM transcendental each.
UNARY_VXM = {"sigmoid": "vxm.sigmoid", "tanh": "vxm.tanh", "erf": "vxm.erf", "nn.gelu": "vxm.gelu",
             "nn.gelu_tanh": "vxm.gelu_tanh"}


class VectorLowering:
    """Methods of :class:`~lpx_tvm.target.codegen.region.RegionCompiler` for VXM/SXM ops."""

    def _padded(self, x: Stored, pads, tag: str, fill: float = 0.0, spread: bool = False) -> Stored:
        """A spatially padded copy of an NHWC value (the value itself when no padding).

        The border is written explicitly with ``fill`` (a reused buffer holds old data).
        ``spread``: over several slices (row-wise passes then read through several ports)."""
        pt, pl, pb, pr = pads
        if not any(pads):
            return x
        n, c, h, w = x.shape
        hp, wp = h + pt + pb, w + pl + pr
        # A slice has a read and a write port: the copy may share slices with ``x``.
        dtype = x.tensor.layout.dtype
        # int8: the planes multiply one vector per cycle each, more than one slice's read port
        # feeds, so the padded copy is spread over slices like the values themselves.
        xp = Stored(self._temp(self.b.tensor(f"{tag}.padded", (n * hp * wp, c), dtype, row_align=wp,
                                             spread=self.spread if self.int8 or spread else 1)), (n, c, hp, wp))
        fill_row = self._fill_vector(fill, dtype)
        border = [(0, pt, 0, wp), (pt + h, pb, 0, wp), (pt, h, 0, pl), (pt, h, pl + w, pr)]  # rows, cols
        for i in range(n):
            for r_first, nrows, c_first, ncols in border:
                if not nrows or not ncols:
                    continue
                base = (i * hp + r_first) * wp + c_first
                for r0, r1 in _runs(nrows, lambda r: _chunk_of(xp.tensor, base + r * wp)):
                    for j in range(x.tensor.ntiles):
                        g = self.b.group(f"{tag}.border")
                        dst = _one(xp.tensor.window_segments(j, base + r0 * wp, r1 - r0, ncols, wp))
                        g.write(g.read(fill_row.tile(0).repeat(dst.count)), dst)
            for r0, r1 in _runs(h, lambda r: (_chunk_of(x.tensor, (i * h + r) * w),
                                              _chunk_of(xp.tensor, (i * hp + pt + r) * wp))):
                for j in range(x.tensor.ntiles):
                    g = self.b.group(f"{tag}.pad")
                    src = _one(x.tensor.segments(j, (i * h + r0) * w, (i * h + r1) * w))
                    dst = _one(xp.tensor.window_segments(j, (i * hp + pt + r0) * wp + pl, r1 - r0, w, wp))
                    g.write(g.read(src), dst)
        return xp

    def _fill_vector(self, value: float, dtype=None):
        """A constant vector of ``value`` in every lane (one per value, dtype and region)."""
        dtype = dtype or self.dtype
        if dtype.is_int and not np.isfinite(value):  # -inf of a max pooling: the dtype's least value
            value = float(np.iinfo(dtype.np).min if value < 0 else np.iinfo(dtype.np).max)
        key = (float(value), dtype)
        if key not in self._fills:
            self._fills[key] = self.b.constant(f"fill{len(self._fills)}", np.full((1, self.cfg.lanes), key[0],
                                                                                  np.float32), dtype)
        return self._fills[key]

    def _binary(self, op: RegionOp, is_output: bool):
        a, b = op.main.args
        if a.is_const and not b.is_const:
            if op.main.op == "subtract":
                raise UnsupportedOnLPX("constant minus tensor")
            a, b = b, a
        x = self._value(a)
        if tuple(x.shape) != tuple(op.shape):
            raise UnsupportedOnLPX("broadcast that enlarges the first operand")
        vop = {"add": "vxm.add", "subtract": "vxm.sub", "multiply": "vxm.mul"}[op.main.op]
        clips = [e for e in self._epilogue_consts(op, x.tensor.layout.cols) if e[0] == "clip"]
        y = self._new(op.out, op.shape, is_output, avoid=[x])
        if not b.is_const:
            other = self._value(b)
            if tuple(other.shape) != tuple(x.shape):
                raise UnsupportedOnLPX(f"broadcast of {other.shape} to {x.shape}")
            other = self._apart(other, x, op.out)
            self._rowwise(f"{op.out}.{op.main.op}", [x, other], y,
                          lambda g, vs: self._apply_epilogue(g, g.vxm(vop, vs[0], vs[1]), clips, 0, 0))
            self.values[op.out] = y
            return
        cv = np.asarray(b.const, np.float32)
        if cv.size == 1:
            imm = float(cv.reshape(-1)[0])
            body = lambda g, vs: self._apply_epilogue(g, g.vxm(vop, vs[0], imm=imm), clips, 0, 0)  # noqa: E731
            self._rowwise(f"{op.out}.{op.main.op}", [x], y, body)
        elif self._per_channel(cv, x.shape):
            row = self._temp(self.b.constant(f"{op.out}.operand", cv.reshape(1, -1), self.dtype,
                                             avoid=_slices([x, y])))
            rows = x.tensor.layout.rows
            tensors = [x.tensor, y.tensor]
            for j in range(x.tensor.ntiles):
                for r0, r1 in _runs(rows, lambda r: tuple(_chunk_of(t, r) for t in tensors)):
                    g = self.b.group(f"{op.out}.{op.main.op}")
                    v = g.vxm(vop, g.read(_one(x.tensor.segments(j, r0, r1))), g.read(row.tile(j).repeat(r1 - r0)))
                    self._finish(g, self._apply_epilogue(g, v, clips, j, r1 - r0), _one(y.tensor.segments(j, r0, r1)))
        elif cv.shape == tuple(x.shape):
            arr = cv.transpose(0, 2, 3, 1) if x.nhwc else cv
            full = Stored(self._temp(self.b.tensor(f"{op.out}.operand", stored_shape(cv.shape), self.dtype,
                                                   data=arr, avoid=_slices([x]), row_align=_row_align(cv.shape))),
                          cv.shape)
            self._rowwise(f"{op.out}.{op.main.op}", [x, full], y,
                          lambda g, vs: self._apply_epilogue(g, g.vxm(vop, vs[0], vs[1]), clips, 0, 0))
        else:
            raise UnsupportedOnLPX(f"broadcast of a constant of shape {cv.shape} to {x.shape}")
        self.values[op.out] = y

    @staticmethod
    def _per_channel(cv: np.ndarray, shape: tuple) -> bool:
        """True when ``cv`` broadcasts along the stored channel axis only."""
        if len(shape) == 4:
            return cv.size == shape[1] and (cv.ndim < 3 or cv.shape[-1] == cv.shape[-2] == 1)
        return cv.size == shape[-1] and cv.shape[-1] == shape[-1]

    def _unary(self, op: RegionOp, is_output: bool):
        x = self._value(op.main.args[0])
        y = self._new(op.out, op.shape, is_output, avoid=[x])

        def body(g, vs):
            v = vs[0]
            for s in [op.main] + op.epilogue:
                if s.op == "nn.relu":
                    v = g.vxm("vxm.max", v, imm=0.0)
                elif s.op == "clip":
                    lo, hi = (float(np.asarray(a.const)) for a in s.args[1:3])
                    if np.isfinite(lo):
                        v = g.vxm("vxm.max", v, imm=lo)
                    if np.isfinite(hi):
                        v = g.vxm("vxm.min", v, imm=hi)
                elif s.op in UNARY_VXM:
                    v = g.vxm(UNARY_VXM[s.op], v)
                elif s.op == "nn.silu":  # x * sigmoid(x)
                    v = g.vxm("vxm.mul", v, g.vxm("vxm.sigmoid", v))
                else:
                    raise UnsupportedOnLPX(f"{s.op} after {op.main.op}")
            return v

        self._rowwise(f"{op.out}.{op.main.op}", [x], y, body)
        self.values[op.out] = y

    def _pool(self, op: RegionOp, is_output: bool):
        """Max or average pooling: fold the window taps into an fp32 accumulator one tap per
        group (the taps of one image share a slice, so they cannot stream together), then
        scale (average) and convert."""
        a = op.main.attrs
        if a.get("layout", "NCHW") != "NCHW" or a.get("ceil_mode", False):
            raise UnsupportedOnLPX("pooling with ceil_mode or a layout other than NCHW")
        is_max = op.main.op == "nn.max_pool2d"
        x = self._value(op.main.args[0])
        n, c, h, w = x.shape
        kh, kw = a["pool_size"]
        (sh, sw), (dh, dw) = a["strides"], a["dilation"]
        pads = tuple(a["padding"])
        xp = self._padded(x, pads, op.out, fill=-np.inf if is_max else 0.0)
        hp, wp = xp.shape[2], xp.shape[3]
        oh, ow = op.shape[2], op.shape[3]
        total = self._temp(self._new(f"{op.out}.acc", op.shape, avoid=[xp], dtype=self.acc))
        y = self._new(op.out, op.shape, is_output, avoid=[total], dtype=x.tensor.layout.dtype if self.int8 else None)
        lanes = self.cfg.lanes
        scale_t = None
        if not is_max:
            if a.get("count_include_pad", False) or not any(pads):
                scale = np.full(oh * ow, 1.0 / (kh * kw), np.float32)
            else:  # taps that fall on padding do not count
                inside = np.zeros((hp, wp), np.float32)
                inside[pads[0]:pads[0] + h, pads[1]:pads[1] + w] = 1
                counts = [[inside[i * sh:i * sh + (kh - 1) * dh + 1:dh, j * sw:j * sw + (kw - 1) * dw + 1:dw].sum()
                           for j in range(ow)] for i in range(oh)]
                scale = 1.0 / np.array(counts, np.float32).reshape(-1)
            scale_map = np.repeat(np.tile(scale, n)[:, None], lanes, axis=1)
            scale_t = Stored(self._temp(self.b.tensor(f"{op.out}.scale", (n * oh * ow, lanes), self.acc,
                                                      data=scale_map, avoid=_slices([total]), row_align=ow)),
                             (n, lanes, oh, ow))
        combine = "vxm.max" if is_max else "vxm.add"
        if scale_t is not None:
            scale_t = self._apart(scale_t, total, op.out)
        for i in range(n):
            firsts = [(t, (i * hp + (t // kw) * dh) * wp + (t % kw) * dw) for t in range(kh * kw)]

            # Run by run of output rows, all taps then the result: the next layer can start
            # on the first rows while later ones are pooled.
            def chunks(o):
                row = (i * oh + o) * ow
                key = [_chunk_of(xp.tensor, f + o * sh * wp) for _, f in firsts]
                key += [_chunk_of(total.tensor, row), _chunk_of(y.tensor, row)]
                return tuple(key + ([_chunk_of(scale_t.tensor, row)] if scale_t is not None else []))
            for o0, o1 in _runs(oh, chunks):
                r0, r1 = (i * oh + o0) * ow, (i * oh + o1) * ow
                for j in range(x.tensor.ntiles):
                    out = _one(total.tensor.segments(j, r0, r1))
                    for t, first in firsts:
                        g = self.b.group(f"{op.out}.pool")
                        win = _one(xp.tensor.window_segments(j, first + o0 * sh * wp, o1 - o0, ow, sh * wp, sw))
                        v = g.read(win)
                        if v.dtype != self.acc:
                            v = g.vxm("vxm.cvt", v, to=self.acc)
                        if t:
                            v = g.vxm(combine, v, g.read(out))
                        g.write(v, out)
                    g = self.b.group(f"{op.out}.pool")
                    v = g.read(out)
                    if scale_t is not None:
                        v = g.vxm("vxm.mul", v, g.read(_one(scale_t.tensor.segments(0, r0, r1))))
                    self._finish(g, v, _one(y.tensor.segments(j, r0, r1)))
        self.values[op.out] = y

    def _reduce_tiles(self, tag: str, x: Stored, acc: Stored, r0: int, r1: int, reduce: str, combine: str,
                      each=None, scale=None):
        """Reduce rows r0 .. r1 of ``x`` across all its lanes into ``acc`` (fp32, one tile;
        the reduction fills each vector), one group per lane tile: the tile in fp32,
        transformed by ``each(group, tile, value)`` when given, reduced over its valid
        lanes, combined with the tiles before it, and multiplied by ``scale`` at the last."""
        lanes, f32, ntiles = self.cfg.lanes, self.acc, x.tensor.ntiles
        dst = _one(acc.tensor.segments(0, r0, r1))
        for j in range(ntiles):
            g = self.b.group(tag)
            v = g.read(_one(x.tensor.segments(j, r0, r1)))
            v = v if v.dtype == f32 else g.vxm("vxm.cvt", v, to=f32)
            if each is not None:
                v = each(g, j, v)
            v = g.vxm(reduce, v, width=min(x.tensor.layout.cols - j * lanes, lanes))
            if j:
                v = g.vxm(combine, v, g.read(dst))
            if scale is not None and j == ntiles - 1:
                v = g.vxm("vxm.mul", v, imm=scale)
            g.write(v, dst)

    def _softmax(self, op: RegionOp, is_output: bool):
        """Softmax over the last axis, numerically stable, in fp32 on the VXM: per run of
        rows, the row maximum over every lane tile (``reduce_max`` fills its vector with
        it), then exp(x - max) kept in fp32 with its running row sum, then the scaling by
        the sum's reciprocal."""
        x = self._value(op.main.args[0])
        if x.nhwc:
            raise UnsupportedOnLPX("softmax of a 4-D value (its last axis is stored across vectors)")
        lay = x.tensor.layout
        rows, cols, lanes, f32 = lay.rows, lay.cols, self.cfg.lanes, self.acc
        mx = self._temp(self._new(f"{op.out}.max", (rows, lanes), avoid=[x], dtype=f32))
        ex = self._temp(self._new(f"{op.out}.exp", (rows, cols), avoid=[x, mx], dtype=f32))
        sm = self._temp(self._new(f"{op.out}.sum", (rows, lanes), avoid=[x, mx, ex], dtype=f32))
        y = self._new(op.out, op.shape, is_output, avoid=[ex, sm])
        tag = op.out
        tensors = [x.tensor, mx.tensor, ex.tensor, sm.tensor, y.tensor]
        seg = lambda v, j, r0, r1: _one(v.tensor.segments(j, r0, r1))  # noqa: E731
        for r0, r1 in _runs(rows, lambda r: tuple(_chunk_of(t, r) for t in tensors)):
            self._reduce_tiles(f"{tag}.max", x, mx, r0, r1, "vxm.reduce_max", "vxm.max")

            def exp(g, j, v):  # exp(x - max), kept for the scaling
                e = g.vxm("vxm.exp", g.vxm("vxm.sub", v, g.read(seg(mx, 0, r0, r1))))
                g.write(e, seg(ex, j, r0, r1))
                return e
            self._reduce_tiles(f"{tag}.exp", x, sm, r0, r1, "vxm.reduce_sum", "vxm.add", each=exp)
            g = self.b.group(f"{tag}.sum")
            g.write(g.vxm("vxm.recip", g.read(seg(sm, 0, r0, r1))), seg(sm, 0, r0, r1))
            for j in range(x.tensor.ntiles):
                g = self.b.group(f"{tag}.scale")
                v = g.vxm("vxm.mul", g.read(seg(ex, j, r0, r1)), g.read(seg(sm, 0, r0, r1)))
                self._finish(g, v, seg(y, j, r0, r1))
        self.values[op.out] = y

    def _layer_norm(self, op: RegionOp, is_output: bool):
        """LayerNorm over the last axis in fp32 on the VXM, per run of rows: the mean (lane
        sums of every tile), the centered values kept in fp32 with their running sum of
        squares, then 1 / sqrt(var + eps) and the per-column gamma and beta. RMSNorm
        (``nn.rms_norm``) is the same without the mean and beta."""
        x = self._value(op.main.args[0])
        a = op.main.attrs
        rms = op.main.op == "nn.rms_norm"
        if x.nhwc or [int(v) % len(x.shape) for v in a.get("axes", [-1])] != [len(x.shape) - 1]:
            raise UnsupportedOnLPX(f"{op.main.op} over axes other than the last of a value that is not 4-D")
        lay = x.tensor.layout
        rows, cols, lanes, f32 = lay.rows, lay.cols, self.cfg.lanes, self.acc
        eps = float(a.get("epsilon", 1e-5))
        mean = None if rms else self._temp(self._new(f"{op.out}.mean", (rows, lanes), avoid=[x], dtype=f32))
        cen = self._temp(self._new(f"{op.out}.centered", (rows, cols), avoid=[x] + ([mean] if mean else []),
                                   dtype=f32))
        var = self._temp(self._new(f"{op.out}.var", (rows, lanes), avoid=[x, cen] + ([mean] if mean else []),
                                   dtype=f32))
        # gamma and beta, each read beside the centered values (none when 1 and 0)
        affine = []
        params = [(op.main.args[1], True, 1.0, "vxm.mul")] if rms else \
            [(op.main.args[1], a.get("scale", True), 1.0, "vxm.mul"),
             (op.main.args[2], a.get("center", True), 0.0, "vxm.add")]
        for arg, use, neutral, vop in params:
            v = np.broadcast_to(np.asarray(arg.const, np.float32).reshape(-1), (cols,)) if use else None
            if v is not None and np.any(v != neutral):
                t = self._temp(self.b.constant(f"{op.out}.{'gamma' if neutral else 'beta'}", v.reshape(1, cols),
                                               f32, avoid=_slices([cen])))
                affine.append((vop, t))
        y = self._new(op.out, op.shape, is_output, avoid=[cen, var])
        tag = op.out
        tensors = [t.tensor for t in (x, mean, cen, var, y) if t is not None]
        seg = lambda v, j, r0, r1: _one(v.tensor.segments(j, r0, r1))  # noqa: E731
        for r0, r1 in _runs(rows, lambda r: tuple(_chunk_of(t, r) for t in tensors)):
            n = r1 - r0
            if not rms:
                self._reduce_tiles(f"{tag}.mean", x, mean, r0, r1, "vxm.reduce_sum", "vxm.add", scale=1.0 / cols)

            def squares(g, j, v):  # x - mean (x for RMSNorm), kept; its square, summed
                if rms:  # through the VXM (x * 1, exact) when read as is: it flows one way from there
                    d = v if v.node.op.startswith("vxm.") else g.vxm("vxm.mul", v, imm=1.0)
                else:
                    d = g.vxm("vxm.sub", v, g.read(seg(mean, 0, r0, r1)))
                g.write(d, seg(cen, j, r0, r1))
                return g.vxm("vxm.mul", d, d)
            self._reduce_tiles(f"{tag}.var", x, var, r0, r1, "vxm.reduce_sum", "vxm.add", each=squares,
                               scale=1.0 / cols)
            g = self.b.group(f"{tag}.var")
            v = g.vxm("vxm.add", g.read(seg(var, 0, r0, r1)), imm=eps)
            g.write(g.vxm("vxm.rsqrt", v), seg(var, 0, r0, r1))
            for j in range(x.tensor.ntiles):
                # One read beside the centered values per group: each pass writes them back.
                steps = [("vxm.mul", seg(var, 0, r0, r1))] + [(vop, t.tile(j).repeat(n)) for vop, t in affine]
                for k, (vop, other) in enumerate(steps):
                    g = self.b.group(f"{tag}.affine")
                    v = g.vxm(vop, g.read(seg(cen, j, r0, r1)), g.read(other))
                    if k == len(steps) - 1:
                        self._finish(g, v, seg(y, j, r0, r1))
                    else:
                        g.write(v, seg(cen, j, r0, r1))
        self.values[op.out] = y

    def _transpose(self, op: RegionOp, is_output: bool):
        """Any permutation of a 2-D or 3-D value, as a chain of the two swaps LPX does:
        the last two axes (:meth:`_swap_last`, through the SXM) and, for 3-D, the first
        two (:meth:`_swap_first`, rows moved whole)."""
        x = self._value(op.main.args[0])
        rank = len(x.shape)
        if x.nhwc or rank not in (2, 3):
            raise UnsupportedOnLPX(f"permute_dims of a {rank}-D value")
        axes = op.main.attrs.get("axes")
        axes = list(range(rank))[::-1] if axes in (None, []) else [int(a) % rank for a in axes]
        steps = permute_steps(axes)
        if not steps:  # the identity
            self.values[op.out] = self._copy(x, op.out, is_output)
            return
        for k, step in enumerate(steps):
            last = k == len(steps) - 1
            shape = tuple(x.shape[:-2]) + (x.shape[-1], x.shape[-2]) if step == "last" else \
                (x.shape[1], x.shape[0], x.shape[2])
            y = self._new(op.out if last else f"{op.out}.{k}", shape, is_output and last)
            (self._swap_last if step == "last" else self._swap_first)(x, y, op.out)
            if not last:
                self._temp(y)
            x = y
        self.values[op.out] = x

    def _swap_last(self, x: Stored, y: Stored, tag: str):
        """Swap the last two axes: per batch, blocks of up to ``lanes`` rows by one column
        tile go through an SXM transpose (one vector out per column) into the matching
        rows of the result's column tile."""
        lanes = self.cfg.lanes
        m, n = x.shape[-2:]
        batches = x.shape[0] if len(x.shape) == 3 else 1
        x = self._whole_groups(x, m, f"{tag}.rows")  # blocks of rows are read whole
        for i in range(batches):
            for r0 in range(0, m, lanes):
                r1 = min(m, r0 + lanes)
                for cb in range(x.tensor.ntiles):
                    c0, c1 = cb * lanes, min(n, (cb + 1) * lanes)
                    g = self.b.group(f"{tag}.transpose")
                    v = g.sxm("sxm.transpose", g.read(_one(x.tensor.segments(cb, i * m + r0, i * m + r1))),
                              out=c1 - c0)
                    self._write_rows(g, v, y, r0 // lanes, i * n + c0, i * n + c1)

    def _swap_first(self, x: Stored, y: Stored, tag: str):
        """Swap the first two axes of a 3-D value (a, b, c): row i*b + j moves to row j*a + i,
        whole (the last axis stays in lanes)."""
        a, b, c = x.shape
        self._move_lanes(f"{tag}.swap", x, y, [(i * b + j, j * a + i, 1, 0, 0, c) for i in range(a) for j in range(b)])

    def _concat(self, op: RegionOp, is_output: bool):
        """Concatenate along channels: move each input's lanes into place with one SXM
        permute (the other lanes become zero) and add the disjoint pieces of each output tile."""
        axis = op.main.attrs.get("axis", 1)
        axis = axis[0] if isinstance(axis, list) else axis
        parts = [self._value(v) for v in op.main.args]
        rank = len(op.shape)
        axis = axis + rank if axis < 0 else axis
        if axis != (1 if rank == 4 else rank - 1):
            raise UnsupportedOnLPX(f"concat along axis {axis} of a rank-{rank} tensor")
        lanes = self.cfg.lanes
        y = self._new(op.out, op.shape, is_output, avoid=parts)
        rows = y.tensor.layout.rows
        written = set()
        offset = 0
        for x in parts:
            cx = x.shape[1] if rank == 4 else x.shape[-1]
            for ch0 in range(0, cx, lanes):
                done, width_in = 0, min(lanes, cx - ch0)
                while done < width_in:
                    tile, b = divmod(offset + ch0 + done, lanes)
                    length = min(width_in - done, lanes - b)
                    for r0, r1 in _runs(rows, lambda r: (_chunk_of(x.tensor, r), _chunk_of(y.tensor, r))):
                        g = self.b.group(f"{op.out}.concat")
                        v = g.read(_one(x.tensor.segments(ch0 // lanes, r0, r1)))
                        v = g.sxm("sxm.permute", v, map=self._lane_map(done, b, length))
                        out = _one(y.tensor.segments(tile, r0, r1))
                        if tile in written:
                            v = g.vxm("vxm.add", v, g.read(out))
                        g.write(v, out)
                    written.add(tile)
                    done += length
            offset += cx
        self.values[op.out] = y

    def _move_lanes(self, tag: str, x: Stored, y: Stored, moves):
        """``y[yr:yr+n, yc:yc+w] = x[xr:xr+n, xc:xc+w]`` for each (xr, yr, n, xc, yc, w) of
        ``moves``, which together cover every element of ``y``: per piece within one column
        tile of each, an SXM permute moves the lanes into place (the other lanes become
        zero) and pieces landing on rows already written are added to them."""
        lanes = self.cfg.lanes
        ycols = y.tensor.layout.cols
        written = np.zeros((y.tensor.ntiles, y.tensor.layout.rows), bool)
        for xr, yr, n, xc, yc, w in moves:
            done = 0
            while done < w:
                xt, xb = divmod(xc + done, lanes)
                yt, yb = divmod(yc + done, lanes)
                length = min(w - done, lanes - xb, lanes - yb)
                seen = written[yt]
                key = lambda r: (_chunk_of(x.tensor, xr + r), _chunk_of(y.tensor, yr + r), bool(seen[yr + r]))  # noqa: E731
                for r0, r1 in _runs(n, key):
                    g = self.b.group(tag)
                    v = g.read(_one(x.tensor.segments(xt, xr + r0, xr + r1)))
                    if (xb, yb, length) != (0, 0, lanes):
                        v = g.sxm("sxm.permute", v, map=self._lane_map(xb, yb, length))
                    out = _one(y.tensor.segments(yt, yr + r0, yr + r1))
                    if seen[yr + r0]:
                        v = g.vxm("vxm.add", v, g.read(out))
                    g.write(v, out)
                seen[yr:yr + n] = True
                done += length
        if not written.all() or ycols > len(written) * lanes:
            raise UnsupportedOnLPX(f"{tag}: the lane moves leave part of the result unwritten")

    def _where(self, op: RegionOp, is_output: bool):
        """``where(c, x, y)`` with a runtime bool c (stored as 0 / 1): m = (c - 1/2) * inf is
        +inf where c holds and -inf elsewhere, and max(min(x, m), min(y, -m)) picks x or y
        exactly, infinities included (a NaN in the branch not taken comes through: the
        VXM's min and max propagate NaN)."""
        cond, a, b = op.main.args
        ins = [self._value(cond)]  # read side by side: on different slices
        branches = []  # a scalar constant, or None for the next tensor of ins
        for arg in (a, b):
            if arg.is_const:
                branches.append(float(np.asarray(arg.const).reshape(-1)[0]))
                continue
            v = self._value(arg)
            if len(ins) == 2 and any(self._clashes(v, other) for other in ins):
                v = self._temp(self._copy(v, f"{op.out}.apart", avoid=ins))  # one copy clear of both
            else:
                v = self._apart(v, ins[0], op.out)
            ins.append(v)
            branches.append(None)
        y = self._new(op.out, op.shape, is_output)

        def body(g, vs):
            c, tensors = vs[0], iter(vs[1:])
            half = g.vxm("vxm.sub", c, imm=0.5)  # both masks one op from here: their paths line up
            masks = [g.vxm("vxm.mul", half, imm=inf) for inf in (float("inf"), float("-inf"))]
            picks = [g.vxm("vxm.min", mask, imm=branch) if branch is not None else g.vxm("vxm.min", next(tensors), mask)
                     for branch, mask in zip(branches, masks)]
            return g.vxm("vxm.max", picks[0], picks[1])

        self._rowwise(f"{op.out}.where", ins, y, body)
        self.values[op.out] = y

    def _split_heads(self, op: RegionOp, is_output: bool):
        """(s, h*d) -> (h, s, d): head i is lanes i*d .. of every row, moved to rows i*s .."""
        x = self._value(op.main.args[0])
        h, s, d = op.shape
        y = self._new(op.out, op.shape, is_output, avoid=[x])
        self._move_lanes(f"{op.out}.split_heads", x, y, [(0, i * s, s, i * d, 0, d) for i in range(h)])
        self.values[op.out] = y

    def _merge_heads(self, op: RegionOp, is_output: bool):
        """(h, s, d) -> (s, h*d): the inverse of :meth:`_split_heads`."""
        x = self._value(op.main.args[0])
        h, s, d = x.shape
        y = self._new(op.out, op.shape, is_output, avoid=[x])
        self._move_lanes(f"{op.out}.merge_heads", x, y, [(i * s, 0, s, 0, i * d, d) for i in range(h)])
        self.values[op.out] = y

    def _slice(self, op: RegionOp, is_output: bool):
        """Elements begin .. end - 1 of the last axis (stride 1), moved to lane 0 on."""
        x = self._value(op.main.args[0])
        _, begin, end = (int(np.asarray(a.const).reshape(-1)[0]) for a in op.main.args[1:4])
        width = x.shape[-1]
        begin, end = (b + width if b < 0 else b for b in (begin, end))
        end = min(end, width)
        y = self._new(op.out, op.shape, is_output, avoid=[x])
        self._move_lanes(f"{op.out}.slice", x, y, [(0, 0, x.tensor.layout.rows, begin, 0, end - begin)])
        self.values[op.out] = y

    def _lane_map(self, src: int, dst: int, length: int) -> int:
        """A permutation table moving lanes src..src+length-1 to dst.., zero elsewhere."""
        key = (src, dst, length)
        if key not in self._maps:
            table = np.full(self.cfg.lanes, -1, np.int32)
            table[dst:dst + length] = np.arange(src, src + length)
            self._maps[key] = self.b.table(table)
        return self._maps[key]

    def _global_avg_pool(self, op: RegionOp, is_output: bool):
        """Mean over H and W: the pixel sums of :meth:`_pixel_sums` against a column of 1/(H*W)."""
        a = op.main.attrs
        x = self._value(op.main.args[0])
        if len(x.shape) != 4 or sorted(ax % 4 for ax in a.get("axis", [])) != [2, 3]:
            raise UnsupportedOnLPX("mean over axes other than the spatial ones of a 4-D tensor")
        hw = x.shape[2] * x.shape[3]
        column = self._temp(self.b.constant(f"{op.out}.scale", np.full((self.cfg.lanes, 1), 1.0 / hw, np.float32),
                                            self.dtype))
        y = self._new(op.out, op.shape, is_output)
        for g, v, i, j in self._pixel_sums(op.out, x, column, self.acc):
            self._write_rows(g, v, y, j, i, i + 1)
        self.values[op.out] = y

    def _pixel_sums(self, tag: str, x: Stored, column, acc_dtype):
        """For each image i and channel tile j of a 4-D ``x``: transpose its pixel chunks on
        the SXM so channels become vectors, multiply them on the MXM into one accumulator
        against ``column`` (a (lanes, 1) weight), drain and transpose the result back into
        one vector. Yields (group, vector, i, j), the group still open for the caller."""
        n, c, h, w = x.shape
        lanes = self.cfg.lanes
        hw = h * w
        for i in range(n):
            for j in range(x.tensor.ntiles):
                cv = min(c - j * lanes, lanes)
                plane, acc = self.planes.new_block(cv)
                pieces = [seg for p0 in range(0, hw, lanes)
                          for seg in x.tensor.segments(j, i * hw + p0, i * hw + min(hw, p0 + lanes))]
                for q, (_, region) in enumerate(pieces):
                    buf = self.planes.buffer(plane)
                    g = self.b.group(f"{tag}.install")
                    g.install(plane, buf, g.read(column.tile(0).rows(0, region.count)), width=1)
                    g = self.b.group(f"{tag}.sum")
                    t = g.sxm("sxm.transpose", g.read(region), out=cv)
                    g.mul(plane, buf, t, acc=acc, accumulate=q > 0)
                g = self.b.group(f"{tag}.drain")
                yield g, g.sxm("sxm.transpose", g.drain(plane, acc, cv, acc_dtype), out=1), i, j
        self.macs += n * c * hw

    def _reshape(self, op: RegionOp):
        x = self._value(op.main.args[0])
        if not reshape_keeps_storage(x.shape, op.shape):
            raise UnsupportedOnLPX(f"reshape {x.shape} -> {op.shape} moves data between lanes")
        self.values[op.out] = Stored(x.tensor, tuple(op.shape))

"""MXM lowerings: conv2d (dense, depthwise, grouped, im2col stems) and dense/matmul through
their scheduled TensorIR tiles, and the weight matrices they install."""

from __future__ import annotations

import functools
import math

import numpy as np

from ...errors import SchedulingError
from ...tir_schedules import (Conv2dWorkload, DenseTiling, DenseWorkload, DepthwiseWorkload, default_tiling, round_up,
                              schedule, tile_steps)
from ...tir_schedules.schedules import Conv2dTiling, k_split_rule, taps_per_tile
from ...machine.config import LPXConfig
from ...machine.isa import DType, Unit
from ...machine.timing import unit_count
from .graph import RegionOp, UnsupportedOnLPX
from .storage import Stored, StreamedWeights, _chunk_of, _one, _runs
from .support import block_diagonal, grouped_conv_problem

TVM_DTYPE = {DType.FP32: "float32", DType.FP16: "float16", DType.BF16: "bfloat16", DType.INT8: "int8"}


@functools.lru_cache(maxsize=512)
def _scheduled_steps(work, tiling) -> tuple:
    """The tile steps of a workload's schedule (a region's bands and repeated layers ask
    for the same ones)."""
    return tuple(tile_steps(schedule(work, tiling).mod["main"]))


class _Planes:
    """Round-robin plane choice, alternating weight buffers and accumulator halves."""

    def __init__(self, cfg: LPXConfig):
        self.cfg = cfg
        self.next = 0
        self.installs = [0] * cfg.mxm_planes
        self.blocks = [0] * cfg.mxm_planes

    def start_layer(self):
        """The next block goes to plane 0: row block k of consecutive layers share a plane."""
        self.next = 0

    def new_block(self, rows: int) -> tuple:
        p = self.next
        self.next = (self.next + 1) % self.cfg.mxm_planes
        half = self.cfg.mxm_acc_rows // 2
        base = (self.blocks[p] % 2) * half if rows <= half else 0
        if rows > self.cfg.mxm_acc_rows:
            raise UnsupportedOnLPX(f"an output block of {rows} rows exceeds the {self.cfg.mxm_acc_rows} accumulators")
        self.blocks[p] += 1
        return p, base

    def buffer(self, plane: int) -> int:
        b = self.installs[plane] % self.cfg.mxm_weight_buffers
        self.installs[plane] += 1
        return b


class MxmLowering:
    """Methods of :class:`~lpx_tvm.target.codegen.region.RegionCompiler` for MXM ops."""

    layer_ops: dict = {}  # op.out -> the composite a lowering was given, when it lowers a view of it

    def _tiling(self, op: RegionOp, work, batches: int = 1):
        """The tiling of one MXM layer: its tuned one if the tuning log has it, else the default."""
        # The task is the whole composite (an int8 op's MXM view lacks the epilogue its
        # lowering reads); off-chip bands are not tuning tasks.
        return self.policy.tiling((work, op.composite, batches), self.layer_ops.get(op.out, op),
                                  lambda: default_tiling(self.cfg, work), record=not self.offchip)

    def _weight_tensor(self, op: RegionOp):
        """The MXM weight matrix of an op, as its lowering reads it (None for vector ops):
        resident in SRAM while the constants' budget lasts, else streamed from off-chip memory."""
        lanes = self.cfg.lanes
        op = self._mxm_view(op)  # an int8 composite as its integer conv2d / matmul
        kind, args, a = op.main.op, op.main.args, op.main.attrs
        matrix, align = None, lanes
        if kind == "nn.conv2d" and len(args) > 1 and args[1].is_const:
            w = np.asarray(args[1].const, np.float32)
            co, cg, kh, kw = w.shape
            c, groups = args[0].shape[1], a.get("groups", 1)
            depthwise = groups != 1 and groups == c == co and cg == 1
            if groups != 1 and not depthwise:
                w = block_diagonal(w, groups)  # other groupings are lowered as a dense conv
                co, cg, kh, kw = w.shape
            if depthwise:
                cpad = round_up(c, lanes)
                # Row (tap * cpad + ch) holds w[ch, tap] at lane ch % lanes: a diagonal tile per tap.
                diag = np.zeros((kh * kw, cpad, lanes), np.float32)
                diag[:, np.arange(c), np.arange(c) % lanes] = w.reshape(c, kh * kw).T
                matrix = diag.reshape(-1, lanes)
            else:
                # Row (tap * c + ci): whole taps per chunk (or lane tiles) so no K tile straddles slices.
                matrix = w.transpose(2, 3, 1, 0).reshape(-1, co)
                im2col = args[0].name in self.im2col_values  # one matmul: whole lane tiles
                align = lanes if cg % lanes == 0 or kh * kw == 1 or im2col else cg
                work = None if im2col else self._conv_workload(args[0].shape, w.shape, a)
                pack = "" if im2col else self._tuned_pack(op, work)
                if pack == "rows":
                    align = kw * c  # a kernel row's taps (one reduction tile, or two) never straddle slices
                elif pack == "taps":
                    # Reduction tile t holds taps t*T .. side by side, c rows each (the lanes
                    # of the on-chip im2col), zero rows after the last tap.
                    per, taps = taps_per_tile(work, lanes, pack), kh * kw
                    tiles = np.zeros((-(-taps // per) * per, c, co), np.float32)
                    tiles[:taps] = matrix.reshape(taps, c, co)
                    tiles = tiles.reshape(-1, per * c, co)
                    matrix = np.zeros((len(tiles), lanes, co), np.float32)
                    matrix[:, :per * c] = tiles
                    matrix, align = matrix.reshape(-1, co), lanes
        elif kind == "matmul" and len(args) > 1 and args[1].is_const and len(args[1].shape) == 2:
            matrix = np.asarray(args[1].const, np.float32)
        if matrix is None:
            return None
        rows, cols = matrix.shape
        lines = -(-cols // lanes) * rows * self.dtype.itemsize
        share = self.offchip_weight_budget if self.offchip else self.weight_budget
        budget = share * self.cfg.mem_slices * self.cfg.lines_per_slice
        if self.b.constant_lines + lines <= budget:
            try:
                # Reduction tiles spread over slices: planes installing different parts of one
                # weight matrix at once read through different slices' ports.
                return self.b.tensor(f"{op.out}.weight", matrix.shape, self.dtype, data=matrix, row_align=align,
                                     spread=self.weight_spread)
            except SchedulingError:
                pass
        return StreamedWeights.place(self.b, matrix, self.dtype, lanes)

    def _conv2d(self, op: RegionOp, is_output: bool, q=None):
        a = op.main.attrs
        if a.get("data_layout", "NCHW") != "NCHW" or a.get("kernel_layout", "OIHW") != "OIHW":
            raise UnsupportedOnLPX("conv2d layouts other than NCHW/OIHW")
        x = self._value(op.main.args[0])
        w = np.asarray(op.main.args[1].const, np.float32)
        if op.main.args[0].name in self.im2col_values:
            return self._conv_from_im2col(op, x, w, is_output, q)
        groups = a.get("groups", 1)
        if groups != 1:
            if groups == x.shape[1] == w.shape[0] and w.shape[1] == 1:
                return self._depthwise(op, x, w, is_output, q)
            # Any other grouping runs as a dense conv with a block-diagonal weight
            # (built by _weight_tensor): the MXM also multiplies the zeros between groups.
            problem = grouped_conv_problem(groups, x.shape[1], w.shape[0])
            if problem:
                raise UnsupportedOnLPX(problem)
        n, c, h, wd = x.shape
        co, cg, kh, kw = w.shape
        lanes = self.cfg.lanes
        work = self._conv_workload(x.shape, w.shape, a)
        oh, ow = work.OH, work.OW
        t = self._tiling(op, work)
        pack = self._tuned_pack(op, work)
        xp = self._padded(x, tuple(a["padding"]), op.out, fill=q.fill if q else 0.0, spread=bool(pack))
        self.macs += n * oh * ow * co * cg * kh * kw  # useful MACs: cg = c / groups
        if pack == "taps":
            return self._conv_taps_packed(op, xp, work, t, c, co, is_output, q)
        per = taps_per_tile(work, lanes, pack) if pack == "rows" else 1
        image = self._row_image(op, xp, work, t, c, per) if pack == "rows" else None
        steps, window, block, k_split = self._conv_tiles(work, t, xp, per, image)

        def weights(step):
            # Row (tap * c + ci) of the weight matrix: input channel ci at one tap.
            kh0, kw0, ci0, co0 = (step.reads["W"][d][0] for d in range(4))
            base = (kh0 * kw + kw0) * c + ci0
            return co0 // lanes, base, base + min(c - ci0, lanes) * min(per, kw - kw0)  # rows packing: the row's taps

        self._emit_mxm(op, steps, window, weights, block, co, is_output, q=q, k_split=k_split)

    def _conv_workload(self, x_shape, w_shape, attrs) -> Conv2dWorkload:
        """The TensorIR workload of a dense convolution, in storage shapes."""
        n, c, h, wd = x_shape
        co, _, kh, kw = w_shape
        pt, pl, pb, pr = attrs["padding"]
        lanes = self.cfg.lanes
        return Conv2dWorkload(n, h + pt + pb, wd + pl + pr, round_up(c, lanes), kh, kw, round_up(co, lanes),
                              tuple(attrs["strides"]), tuple(attrs["dilation"]), TVM_DTYPE[self.dtype],
                              channels=c if attrs.get("groups", 1) == 1 else 0)

    def _tuned_pack(self, op: RegionOp, work: Conv2dWorkload) -> str:
        """The tap packing of a convolution's tuned tiling ("": none; a grouped convolution,
        whose workload has no channel count, and off-chip bands never pack). The weight
        placement and the lowering both ask here, so they agree."""
        if self.offchip or not work.channels:
            return ""
        t = self.policy.peek((work, op.composite, 1))
        return getattr(t, "pack", "") if t is not None else ""

    def _conv_taps_packed(self, op: RegionOp, xp: Stored, work, t, c: int, co: int, is_output: bool, q=None):
        """A convolution with its taps packed into reduction tiles: an im2col built on chip
        (one row per output pixel; tile k holds taps k*T .. side by side, ``c`` lanes
        each), then one matmul with the packed weight matrix (:meth:`_weight_tensor`).

        Each im2col tile is written one tap at a time (:meth:`_lane_pass`): an SXM moves
        the tap's channels to its lanes (``sxm.pad``: zeros elsewhere, so the lanes past
        the channels, unspecified in the image, never reach the sum), and the VXM adds the
        tile written so far; the passes alternate between the SXMs. The padded image is spread over
        slices so that passes of different row blocks read through different ports."""
        lanes = self.cfg.lanes
        (sh, sw), (dh, dw) = work.stride, work.dilation
        hp, wp, oh, ow = work.Hp, work.Wp, work.OH, work.OW
        taps = [(a, b) for a in range(work.KH) for b in range(work.KW)]
        per = taps_per_tile(work, lanes, "taps")
        tiles = [taps[i:i + per] for i in range(0, len(taps), per)]
        rows = work.N * oh * ow
        n_sxm = unit_count(self.cfg, Unit.SXM)
        cols = self._temp(self.b.tensor(f"{op.out}.im2col", (rows, len(tiles) * lanes), xp.tensor.layout.dtype,
                                        row_align=ow, spread=self.spread,
                                        avoid=[sl for sl, _ in xp.tensor.layout.tiles]))  # read side by side

        def first(i, r, tap):  # the image vector tap ``tap`` reads for output row r, column 0
            return (i * hp + r * sh + tap[0] * dh) * wp + tap[1] * dw

        passes = 0
        for i in range(work.N):
            for r0 in range(0, oh, t.oh):  # the matmul's blocks: a block's rows are ready early
                r1 = min(oh, r0 + t.oh)
                for k, tile in enumerate(tiles):
                    for slot, tap in enumerate(tile):
                        def key(r):
                            return _chunk_of(cols, (i * oh + r) * ow), _chunk_of(xp.tensor, first(i, r, tap))

                        for ra, rb in _runs(r1 - r0, lambda r: key(r0 + r)):
                            ra, rb = r0 + ra, r0 + rb
                            src = _one(xp.tensor.window_segments(0, first(i, ra, tap), rb - ra, ow, sh * wp, sw))
                            dst = _one(cols.segments(k, (i * oh + ra) * ow, (i * oh + rb) * ow))
                            self._lane_pass(f"{op.out}.im2col", src, dst, slot * c, c, passes % n_sxm, add=slot > 0)
                            passes += 1
        order = {"noc": "mnk", "nco": "nmk"}[t.order]
        tiling = DenseTiling(m=t.oh * ow, k=lanes, n=lanes, order=order, k_split=t.k_split)
        self._matmul(op, Stored(cols, (rows, len(tiles) * lanes)), rows, len(tiles) * lanes, co, is_output, q=q,
                     tiling=tiling)

    def _row_image(self, op: RegionOp, xp: Stored, work, t, c: int, per: int):
        """The image of a convolution whose kernel rows are packed: R
        whose pixel p holds the padded image's pixels p, p + d, .. p + (P-1) d side by side
        (``c`` lanes each; d the horizontal dilation), with the padded image's layout. Each
        reduction tile then multiplies P taps of one kernel row by reading R at that row's
        offset (:meth:`_conv_tiles`; a last tap of the row left alone reads the image itself).

        R is built in passes, one per neighbour: an SXM moves the neighbour's channels to
        its lanes (``sxm.pad``, zeros elsewhere) and the VXM adds what earlier passes
        wrote; passes alternate between the SXMs, band by band of image rows in the order
        the output blocks need them."""
        lanes = self.cfg.lanes
        (sh, _), (dh, dw) = work.stride, work.dilation
        hp, wp, oh = work.Hp, work.Wp, work.OH
        n_sxm = unit_count(self.cfg, Unit.SXM)
        image = self._temp(self.b.tensor(f"{op.out}.rows", (work.N * hp * wp, lanes), xp.tensor.layout.dtype,
                                         row_align=wp, spread=self.spread,
                                         avoid=[sl for sl, _ in xp.tensor.layout.tiles]))  # read side by side
        passes = 0
        for i in range(work.N):
            built = 0
            for r0 in range(0, oh, t.oh):
                need = min(hp, (min(oh, r0 + t.oh) - 1) * sh + (work.KH - 1) * dh + 1)
                for s in range(per):  # neighbour s of every pixel of image rows built .. need
                    width = wp - s * dw  # pixels whose neighbour s is on their own image row

                    def key(r):
                        return _chunk_of(xp.tensor, (i * hp + r) * wp), _chunk_of(image, (i * hp + r) * wp)

                    for ra, rb in _runs(need - built, lambda r: key(built + r)):
                        ra, rb = built + ra, built + rb
                        src = _one(xp.tensor.window_segments(0, (i * hp + ra) * wp + s * dw, rb - ra, width, wp))
                        dst = _one(image.window_segments(0, (i * hp + ra) * wp, rb - ra, width, wp))
                        self._lane_pass(f"{op.out}.rows", src, dst, s * c, c, passes % n_sxm, add=s > 0)
                        passes += 1
                built = need
        return image

    def _lane_pass(self, tag: str, src, dst, before: int, width: int, sxm: int, add: bool):
        """One pass of a packing: the first ``width`` lanes of ``src`` go to lanes
        ``before ..`` of ``dst`` (``sxm.pad`` on SXM ``sxm``: zeros in every other lane),
        added to what ``dst`` holds when ``add``."""
        g = self.b.group(tag)
        v = g.sxm("sxm.pad", g.read(src), unit=sxm, before=before, width=width)
        if add:
            v = g.vxm("vxm.add", v, g.read(dst))
        g.write(v, dst)

    def _conv_tiles(self, work, t, xp: Stored, per: int = 1, image=None):
        """The tile steps of a (dense or depthwise) convolution's tiling ``t``, with the
        activation window each step multiplies, the output block it accumulates into and
        the tiling's K split. ``per`` > 1: kernel rows packed ``per`` taps per tile, read
        from ``image`` (:meth:`_row_image`): one step per tile, at its first tap."""
        lanes = self.cfg.lanes
        (sh, sw), (dh, dw) = work.stride, work.dilation
        hp, wp, oh, ow = work.Hp, work.Wp, work.OH, work.OW
        steps = _scheduled_steps(work, Conv2dTiling(oh=t.oh, ci=lanes, co=lanes, order=t.order))
        if per > 1:
            steps = [s for s in steps if s.reads["W"][1][0] % per == 0]

        def window(step):
            n0, (oh0, ohe) = step.writes["mxm"][0][0], step.writes["mxm"][1]
            kh0, kw0, c0 = (step.reads["W"][d][0] for d in range(3))
            first = (n0 * hp + oh0 * sh + kh0 * dh) * wp + kw0 * dw
            src = image if per > 1 and min(per, work.KW - kw0) > 1 else xp.tensor
            return src.window_segments(c0 // lanes, first, ohe, ow, sh * wp, sw)

        def block(step):
            n0, (oh0, ohe), c0 = step.writes["mxm"][0][0], step.writes["mxm"][1], step.writes["mxm"][3][0]
            return c0, (n0 * oh + oh0) * ow, ohe * ow

        return steps, window, block, t.k_split

    def _depthwise(self, op: RegionOp, x: Stored, w: np.ndarray, is_output: bool, q=None):
        """Depthwise conv on the MXM: each tap of a channel tile is a diagonal weight tile."""
        a = op.main.attrs
        n, c, h, wd = x.shape
        kh, kw = w.shape[2], w.shape[3]
        (sh, sw), (dh, dw) = a["strides"], a["dilation"]
        lanes = self.cfg.lanes
        xp = self._padded(x, tuple(a["padding"]), op.out, fill=q.fill if q else 0.0)
        hp, wp = xp.shape[2], xp.shape[3]
        cpad = round_up(c, lanes)
        work = DepthwiseWorkload(n, hp, wp, cpad, kh, kw, (sh, sw), (dh, dw), TVM_DTYPE[self.dtype])
        oh, ow = work.OH, work.OW
        steps, window, block, k_split = self._conv_tiles(work, self._tiling(op, work), xp)

        def weights(step):
            kh0, kw0, c0 = (step.reads["W"][d][0] for d in range(3))
            base = (kh0 * kw + kw0) * cpad + c0
            return 0, base, base + min(c - c0, lanes)

        self.macs += n * oh * ow * c * kh * kw
        self._emit_mxm(op, steps, window, weights, block, c, is_output, q=q, k_split=k_split)

    def _conv_from_im2col(self, op: RegionOp, x: Stored, w: np.ndarray, is_output: bool, q=None):
        """A convolution whose input arrives as im2col rows: a dense matmul with the
        (taps x channels, out channels) weight matrix."""
        co, cg, kh, kw = w.shape
        self._matmul(op, x, x.tensor.layout.rows, kh * kw * cg, co, is_output, q=q)

    def _dense(self, op: RegionOp, is_output: bool):
        x = self._value(op.main.args[0])
        b = op.main.args[1]
        if b.is_const:
            if len(b.shape) != 2:
                raise UnsupportedOnLPX("matmul with a constant weight that is not 2-D")
            k, nn = b.shape
            return self._matmul(op, x, math.prod(x.shape[:-1]), k, nn, is_output)
        # Activation x activation: B is installed from its SRAM tensor like a weight
        # matrix (rows = K, lane tiles = N), batch by batch.
        w = self._value(b)
        if len(w.shape) != len(x.shape) or len(x.shape) not in (2, 3) or tuple(w.shape[:-2]) != tuple(x.shape[:-2]):
            raise UnsupportedOnLPX(f"matmul of {x.shape} by a runtime {w.shape}")
        batches = x.shape[0] if len(x.shape) == 3 else 1
        k, nn = w.shape[-2:]
        self._matmul(op, x, x.shape[-2], k, nn, is_output, W=self._whole_groups(w, k, f"{op.out}.rhs").tensor,
                     batches=batches)

    def _matmul(self, op: RegionOp, x: Stored, rows: int, k: int, nn: int, is_output: bool, W=None,
                batches: int = 1, q=None, tiling=None):
        """(rows, k) activations times a (k, nn) matrix — the op's weights, or ``W`` — through
        DenseWorkload tiles; with ``batches``, batch i multiplies rows i * rows .. of ``x``
        by rows i * k .. of ``W``. ``tiling``: a convolution's packed im2col, tiled by the
        convolution's schedule (its MACs are counted there)."""
        lanes = self.cfg.lanes
        work = DenseWorkload(rows, round_up(k, lanes), round_up(nn, lanes), TVM_DTYPE[self.dtype])
        t = tiling or self._tiling(op, work, batches)
        tile_steps = _scheduled_steps(work, DenseTiling(m=t.m, k=lanes, n=lanes, order=t.order))
        steps = [(i, s) for i in range(batches) for s in tile_steps]

        def window(step):
            i, step = step
            (m0, me), (k0, _) = step.reads["A"]
            first_row = i * rows + m0
            return [(first - first_row, r) for first, r in x.tensor.segments(k0 // lanes, first_row, first_row + me)]

        def weights(step):
            i, step = step
            (k0, _), (n0, _) = step.reads["B"]
            return n0 // lanes, i * k + k0, i * k + min(k, k0 + lanes)

        def block(step):
            i, step = step
            (m0, me), (n0, _) = step.writes["mxm"]
            return n0, i * rows + m0, me

        if tiling is None:
            self.macs += batches * rows * k * nn
        self._emit_mxm(op, steps, window, weights, block, nn, is_output, W=W, q=q, k_split=t.k_split)

    def _k_parts(self, keys: list, split: "int | None" = None) -> list:
        """For each tile step, which part of its block's reduction it belongs to. A layer
        with fewer output blocks than MXM planes splits each block's reduction tiles into
        parts on different planes (each accumulates its own partial sum; the drains add
        them), so every plane multiplies. A tuned tiling sets ``split`` (parts per block)."""
        count = {}
        for k in keys:
            count[k] = count.get(k, 0) + 1
        if split is None:
            split = k_split_rule(self.cfg, len(count))
        seen, out = {}, []
        for k in keys:
            n = count[k]
            s = min(split, n)
            out.append(seen.get(k, 0) * s // n)
            seen[k] = seen.get(k, 0) + 1
        return out

    def _emit_mxm(self, op: RegionOp, steps, window, weights, block, channels: int, is_output: bool, W=None,
                  q=None, k_split=None):
        """Install / multiply groups per tile, a drain group (with the epilogue) per output block.

        ``window(step)`` -> [(row offset in the block, Region)]; ``weights(step)`` -> (column
        tile, first row, end row) of the op's weight matrix; ``block(step)`` -> (first channel,
        first output row, rows). Streamed weights come over the off-chip path, one tile at a
        time, into two staging buffers that alternate so the next load overlaps this install.
        ``q`` (int8 ops): the epilogue (int32 bias, requantization) and the output dtype.
        """
        lanes = self.cfg.lanes
        W = self._weights[op.out] if W is None else W
        staging = None
        if isinstance(W, StreamedWeights):
            staging = [self._temp(self.b.tensor(f"{op.out}.staging{i}", (lanes, lanes), self.dtype))
                       for i in range(2)]
        y = self._new(op.out, op.shape, is_output, dtype=q.out_dtype if q else None)
        epi = q.epilogue if q else self._epilogue_consts(op, channels)
        tag = op.out
        # Each layer's first block on plane 0: row block k of consecutive layers share a
        # plane, so a plane that finished its rows early goes on with the same rows.
        self.planes.start_layer()
        parts = self._k_parts([block(s) for s in steps], k_split)
        last = {(block(s), parts[i]): i for i, s in enumerate(steps)}
        nparts = {key: part + 1 for key, part in last}
        live = {}  # (output block, K part) -> (plane, first accumulator row)
        partial = {}  # output block -> fp32 SRAM sum of the K parts drained so far
        for i, s in enumerate(steps):
            key = block(s)
            col0, first_row, nrows = key
            part = (key, parts[i])
            first = part not in live
            if first:
                live[part] = self.planes.new_block(nrows)
            plane, acc = live[part]
            buf = self.planes.buffer(plane)
            j, row0, row1 = weights(s)
            if staging is None:
                src = _one(W.segments(j, row0, row1))
            else:
                src = staging[i % 2].tile(0).rows(0, row1 - row0)
                self.b.group(f"{tag}.stream").dma_load(W.offset(j, row0), src)
            g = self.b.group(f"{tag}.install")
            g.install(plane, buf, g.read(src), width=min(channels - col0, lanes))
            for offset, region in window(s):
                g = self.b.group(f"{tag}.mul")
                g.mul(plane, buf, g.read(region), acc=acc + offset, accumulate=not first)
            if last[part] != i:
                continue
            g = self.b.group(f"{tag}.drain")
            v = g.drain(plane, acc, nrows, self.acc)
            del live[part]
            if key in partial:
                v = g.vxm("vxm.add", v, g.read(partial[key].tile(0)))
            if parts[i] + 1 < nparts[key]:  # more K parts to come: keep the fp32 sum
                if key not in partial:
                    # The last part's drain also reads the bias (int8: and the requantization scale) rows.
                    avoid = [sl for e in epi if e[0] in ("bias", "requant") for sl, _ in e[1].layout.tiles]
                    partial[key] = self.b.tensor(f"{tag}.partial", (nrows, lanes), self.acc, avoid=avoid)
                g.write(v, partial[key].tile(0))
                continue
            if key in partial:
                self.b.free(partial.pop(key))
            v = self._apply_epilogue(g, v, epi, col0 // lanes, nrows)
            self._write_rows(g, v, y, col0 // lanes, first_row, first_row + nrows)
        self.values[op.out] = y

"""MXM accumulator contents, computed lazily so that K splits cost one BLAS call.

A tiled matmul multiplies every K tile of a row block into the same accumulator rows:
``mul`` then ``mac``, ``mac``, ... Computing each split as it issues means one small
matmul and one full pass over the rows per split. Instead, float accumulators keep the
splits of a row block pending (a *block*) and compute them together when the rows are
read (a drain) or partly overwritten: one concatenated matmul, the way the fp32 sum
over all of K would be written in numpy. Integer accumulators are computed at once
(int32 sums wrap, so their order must be the hardware's; they are exact either way).

Which splits form a block and when it is computed follows from the instructions alone:
the schedule checker decides it (``checks/mxm.py``) and records the steps
``split`` and ``settle`` that this class carries out. Operands stay in their dtype until
the settle, and are converted to fp32 while being concatenated (one pass). When another
block of the run concatenates the same operands (the other N tiles reuse a row block's
activations, the other row blocks a layer's weights), the checker marks the first settle
to keep its concatenation and the last to drop it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import blas
from . import numerics as nx


@dataclass
class _Pending:
    width: int
    xs: list = field(default_factory=list)  # activations per split, (n, K_i), original dtype
    ws: list = field(default_factory=list)  # weight rows per split, (K_i, lanes), original dtype


class Accumulators:
    # What a settle does with a concatenated operand, given as (id, how): compute and keep
    # it, use the kept one, use it and drop it. None: compute it for this settle only.
    PUT, GET, POP = 0, 1, 2

    def __init__(self, planes: int, rows: int, lanes: int):
        self.acc_i = np.zeros((planes, rows, lanes), np.int32)
        self.acc_f = np.zeros((planes, rows, lanes), np.float32)
        self.blocks = {}  # block id -> _Pending
        self.kept = ({}, {})  # concatenated activations, weights: id -> fp32 array
        self.early = {}  # block id -> its rows, computed with an earlier block's (see settle)
        self._int_weights = {}  # integer weight matrices by where they were read

    def start_run(self):
        """Forget pending blocks and kept operands. The rows need no clearing: every row
        is written by a mul before it is read (the simulator checks)."""
        self.blocks.clear()
        self.early.clear()
        for kept in self.kept:
            kept.clear()
        self._int_weights.clear()

    def touch(self):
        """Write every row once (fresh memory is slow to touch the first time)."""
        self.acc_i.fill(0)
        self.acc_f.fill(0)

    def split(self, block: int, x: np.ndarray, rows: np.ndarray, width: int):
        """Add the split x[:, :K] @ rows[:, :width] to a block (K = len(rows), the installed rows)."""
        b = self.blocks.get(block)
        if b is None:
            b = self.blocks[block] = _Pending(width)
        b.xs.append(x[..., :len(rows)])
        b.ws.append(rows)

    def settle(self, plane: int, block: int, addr: int, n: int, xkeep, wkeep, batch=()):
        """Rows addr .. addr + n - 1 of ``plane`` = the block's sum over its splits. The
        blocks of ``batch`` ((id, activations' keep action), ...) have the same weights and
        all their splits: they are computed in the same matmul, for their own settles."""
        b = self.blocks.pop(block)
        width = b.width
        x = self._concat(0, b.xs, None, 1, xkeep)
        w = self._concat(1, b.ws, width, 0, wkeep)
        target = self.acc_f[plane, addr:addr + n]
        if batch:
            xs = [x] + [self._concat(0, self.blocks.pop(bid).xs, None, 1, keep) for bid, keep in batch]
            rows = np.concatenate(xs)
            with blas.threads_for(len(rows) * w.shape[0] * width):
                y = rows @ w
            target[:, :width] = y[:n]
            target[:, width:] = 0
            start = n
            for (bid, _), xb in zip(batch, xs[1:]):
                self.early[bid] = y[start:start + len(xb)]
                start += len(xb)
            return
        with blas.threads_for(n * w.shape[0] * width):
            if width == target.shape[1]:
                np.matmul(x, w, out=target)
            else:
                np.matmul(x, w, out=target[:, :width])
                target[:, width:] = 0

    def settle_early(self, plane: int, block: int, addr: int, n: int, xdrop, wdrop):
        """The settle of a block computed with an earlier one (see settle); drops the kept
        operands whose last use this is."""
        y = self.early.pop(block)
        target = self.acc_f[plane, addr:addr + n]
        target[:, :y.shape[1]] = y
        target[:, y.shape[1]:] = 0
        if xdrop is not None:
            self.kept[0].pop(xdrop)
        if wdrop is not None:
            self.kept[1].pop(wdrop)

    def _concat(self, which: int, parts: list, width, axis: int, keep) -> np.ndarray:
        """The parts joined along ``axis`` in fp32 (weights: their first ``width`` lanes)."""
        if keep is not None:
            cid, how = keep
            if how == self.GET:
                return self.kept[which][cid]
            if how == self.POP:
                return self.kept[which].pop(cid)
        if width is not None:
            parts = [p[:, :width] for p in parts]
        if len(parts) == 1:
            # Row-major whatever the part's strides (a stream read with stride 0 is a
            # broadcast view): BLAS orders a row's sum by the operands' layout, and the
            # reference's operands are row-major.
            out = parts[0].astype(np.float32, order="C")
            out = out.reshape(-1, out.shape[-1])
        elif all(p.ndim == 2 for p in parts):
            # (np.concatenate lays its result out like its parts: a part that repeats one
            # line would make it column-major.)
            out = np.ascontiguousarray(np.concatenate(parts, axis=axis, dtype=np.float32))
        else:  # activations with rows in groups, (groups, inner, K_i): copied in place
            n = parts[0].shape[0] * parts[0].shape[1] if parts[0].ndim == 3 else len(parts[0])
            out = np.empty((n, sum(p.shape[-1] for p in parts)), np.float32)
            k0 = 0
            for p in parts:
                dst = out[:, k0:k0 + p.shape[-1]]
                np.copyto(dst.reshape(p.shape) if p.ndim == 3 else dst, p, casting="unsafe")
                k0 += p.shape[-1]
        if keep is not None:
            self.kept[which][keep[0]] = out
        return out

    def now(self, plane: int, addr: int, x: np.ndarray, rows: np.ndarray, width: int, wkey, kind: int,
            accumulate: bool):
        """rows addr.. (+)= x[:, :K] @ rows[:, :width], computed at once."""
        n, k = len(x), len(rows)
        if kind == nx.ACC_INT:
            w = self._int_matrix(rows, width, wkey)
        else:
            # Row-major, as the reference's operands (see _concat): installed rows read
            # with stride 0 are a broadcast view, whose astype keeps a column-major layout,
            # and BLAS (a gemv for one row) then orders a row's fp32 sum differently.
            w = rows[:, :width].astype(np.float32, order="C")
        y = x[:, :k].astype(w.dtype, order="C") @ w
        sl = slice(addr, addr + n)
        if kind == nx.ACC_INT:
            y = y.astype(np.int32)
            if accumulate:
                self.acc_i[plane, sl, :width] += y
            else:
                self.acc_i[plane, sl, :width] = y
                self.acc_i[plane, sl, width:] = 0
        elif accumulate:
            self.acc_f[plane, sl, :width] += y
        else:
            self.acc_f[plane, sl, :width] = y
            self.acc_f[plane, sl, width:] = 0

    def _int_matrix(self, rows, width, wkey):
        # A layer installs each weight tile once per output block: convert it once.
        if wkey is None:
            return nx.weights_matrix(rows, width)
        key = (wkey, width)
        w = self._int_weights.get(key)
        if w is None:
            if len(self._int_weights) >= 256:
                self._int_weights.pop(next(iter(self._int_weights)))
            w = self._int_weights[key] = nx.weights_matrix(rows, width)
        return w

    def read(self, plane: int, addr: int, n: int, kind: int) -> np.ndarray:
        acc = self.acc_i if kind == nx.ACC_INT else self.acc_f
        return acc[plane, addr:addr + n].copy()

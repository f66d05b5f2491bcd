"""MXM accumulator contents, computed lazily so that K splits cost one BLAS call.

A tiled matmul multiplies every K tile of a row block into the same accumulator rows:
``mul`` then ``mac``, ``mac``, ... Computing each split as it issues means one small
matmul and one full pass over the rows per split. Instead, float accumulators keep the
splits of a row block pending and compute them together when the rows are read (a
drain) or partly overwritten: one concatenated matmul, the way the fp32 sum over all of
K would be written in numpy. Integer accumulators are computed at once (int32 sums
wrap, so their order must be the hardware's; they are exact either way).

When the activations of the splits come straight from SRAM reads that are unchanged
since, the concatenated activations are reused by the next row block with the same
sources (the other N tiles of a GEMM), so they are converted and copied only once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import numerics as nx


@dataclass
class _Pending:
    width: int
    xs: list = field(default_factory=list)  # activations per split, (n, K_i), original dtype
    ws: list = field(default_factory=list)  # weights per split, (K_i, width)
    sources: list = field(default_factory=list)  # where each split's activations were read, or None


class Accumulators:
    def __init__(self, planes: int, rows: int, lanes: int):
        self.acc_i = np.zeros((planes, rows, lanes), np.int32)
        self.acc_f = np.zeros((planes, rows, lanes), np.float32)
        self._pending = [dict() for _ in range(planes)]  # (addr, count) -> _Pending
        self._concat = {}  # sources -> concatenated fp32 activations (the last few)

    def start_run(self):
        """Forget pending sums and cached activations. The rows need no clearing: every row
        is written by a mul before it is read (the simulator checks)."""
        for pend in self._pending:
            pend.clear()
        self._concat.clear()

    def multiply(self, plane: int, addr: int, x: np.ndarray, source, w: np.ndarray, width: int, kind: int,
                 accumulate: bool):
        """rows addr.. (+)= x[:, :K] @ w for the ``len(x)`` rows from ``addr``."""
        n, k = len(x), w.shape[0]
        key = (addr, n)
        pend = self._pending[plane]
        if kind == nx.ACC_FLOAT and w.dtype == np.float32:
            entry = pend.get(key)
            if not accumulate:
                self.settle(plane, addr, n)
                pend[key] = _Pending(width, [x[:, :k]], [w], [source])
                return
            if entry is not None and entry.width == width:
                entry.xs.append(x[:, :k])
                entry.ws.append(w)
                entry.sources.append(source)
                return
        self.settle(plane, addr, n)
        y = x[:, :k].astype(w.dtype) @ w
        rows = slice(addr, addr + n)
        if kind == nx.ACC_INT:
            y = y.astype(np.int32)
            if accumulate:
                self.acc_i[plane, rows, :width] += y
            else:
                self.acc_i[plane, rows, :width] = y
                self.acc_i[plane, rows, width:] = 0
        elif accumulate:
            self.acc_f[plane, rows, :width] += y
        else:
            self.acc_f[plane, rows, :width] = y
            self.acc_f[plane, rows, width:] = 0

    def read(self, plane: int, addr: int, n: int, kind: int) -> np.ndarray:
        self.settle(plane, addr, n)
        acc = self.acc_i if kind == nx.ACC_INT else self.acc_f
        return acc[plane, addr:addr + n].copy()

    def settle(self, plane: int, addr: int, n: int):
        """Compute every pending row block overlapping rows ``addr .. addr + n - 1``."""
        pend = self._pending[plane]
        for (a, m) in [key for key in pend if key[0] < addr + n and addr < key[0] + key[1]]:
            entry = pend.pop((a, m))
            x = self._activations(entry)
            w = entry.ws[0] if len(entry.ws) == 1 else np.concatenate(entry.ws, axis=0)
            target = self.acc_f[plane, a:a + m]
            if entry.width == target.shape[1]:
                np.matmul(x, w, out=target)
            else:
                target[:, :entry.width] = x @ w
                target[:, entry.width:] = 0

    def _activations(self, entry: _Pending) -> np.ndarray:
        # Each split uses the first K_i lanes of its activations: K_i is part of the key.
        sources = tuple((s, x.shape[1]) for s, x in zip(entry.sources, entry.xs))
        cacheable = all(s is not None for s in entry.sources)
        if cacheable and sources in self._concat:
            return self._concat[sources]
        x = np.concatenate(entry.xs, axis=1, dtype=np.float32) if len(entry.xs) > 1 \
            else entry.xs[0].astype(np.float32)
        if cacheable:
            if len(self._concat) >= 4:
                self._concat.pop(next(iter(self._concat)))
            self._concat[sources] = x
        return x

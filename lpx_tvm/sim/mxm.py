"""MXM accumulator contents, computed lazily so that K splits cost one BLAS call.

A tiled matmul multiplies every K tile of a row block into the same accumulator rows:
``mul`` then ``mac``, ``mac``, ... Computing each split as it issues means one small
matmul and one full pass over the rows per split. Instead, float accumulators keep the
splits of a row block pending and compute them together when the rows are read (a
drain) or partly overwritten: one concatenated matmul, the way the fp32 sum over all of
K would be written in numpy. Integer accumulators are computed at once (int32 sums
wrap, so their order must be the hardware's; they are exact either way).

Activations and weights stay in their own dtype until then, and are converted to fp32
while being concatenated (one pass). When the splits' operands come straight from
SRAM reads that are unchanged since, they carry a key naming those lines; the
concatenations are kept by key, so the next row block with the same weights (the
other row blocks of a layer) or the same activations (the other N tiles) reuses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import blas
from . import numerics as nx

# Bytes of concatenated fp32 operands kept for reuse (each cache).
_CACHE_BYTES = 64 << 20


@dataclass
class _Pending:
    width: int
    xs: list = field(default_factory=list)  # activations per split, (n, K_i), original dtype
    ws: list = field(default_factory=list)  # weight rows per split, (K_i, lanes), original dtype
    xkeys: list = field(default_factory=list)  # where each split's activations were read, or None
    wkeys: list = field(default_factory=list)  # where each split's weights were read, or None


class _Cache:
    """Arrays by key, the most recently used kept up to a byte budget."""

    def __init__(self, budget: int):
        self.budget = budget
        self.items = {}
        self.nbytes = 0

    def get(self, key):
        a = self.items.pop(key, None)
        if a is not None:
            self.items[key] = a  # most recent last
        return a

    def put(self, key, a: np.ndarray):
        self.items[key] = a
        self.nbytes += a.nbytes
        while self.nbytes > self.budget and len(self.items) > 1:
            self.nbytes -= self.items.pop(next(iter(self.items))).nbytes

    def clear(self):
        self.items.clear()
        self.nbytes = 0


class Accumulators:
    def __init__(self, planes: int, rows: int, lanes: int):
        self.acc_i = np.zeros((planes, rows, lanes), np.int32)
        self.acc_f = np.zeros((planes, rows, lanes), np.float32)
        self._pending = [dict() for _ in range(planes)]  # (addr, count) -> _Pending
        self._acts = _Cache(_CACHE_BYTES)  # concatenated fp32 activations by keys
        self._weights = _Cache(_CACHE_BYTES)  # concatenated fp32 weights by keys
        self._int_weights = {}  # integer weight matrices by key

    def start_run(self):
        """Forget pending sums and cached operands. The rows need no clearing: every row
        is written by a mul before it is read (the simulator checks)."""
        for pend in self._pending:
            pend.clear()
        self._acts.clear()
        self._weights.clear()
        self._int_weights.clear()

    def multiply(self, plane: int, addr: int, x: np.ndarray, xkey, rows: np.ndarray, width: int, wkey, kind: int,
                 accumulate: bool):
        """rows addr.. (+)= x[:, :K] @ rows[:, :width] for the ``len(x)`` rows from ``addr``
        (K = len(rows): the installed weight rows)."""
        n, k = len(x), len(rows)
        key = (addr, n)
        pend = self._pending[plane]
        if kind == nx.ACC_FLOAT:
            if not accumulate:
                self.settle(plane, addr, n)
                pend[key] = _Pending(width, [x[:, :k]], [rows], [xkey], [wkey])
                return
            entry = pend.get(key)
            if entry is not None and entry.width == width:
                entry.xs.append(x[:, :k])
                entry.ws.append(rows)
                entry.xkeys.append(xkey)
                entry.wkeys.append(wkey)
                return
        self.settle(plane, addr, n)
        w = self._int_matrix(rows, width, wkey) if kind == nx.ACC_INT else rows[:, :width].astype(np.float32)
        y = x[:, :k].astype(w.dtype) @ w
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
        self.settle(plane, addr, n)
        acc = self.acc_i if kind == nx.ACC_INT else self.acc_f
        return acc[plane, addr:addr + n].copy()

    def settle(self, plane: int, addr: int, n: int):
        """Compute every pending row block overlapping rows ``addr .. addr + n - 1``."""
        pend = self._pending[plane]
        if not pend:
            return
        for (a, m) in [key for key in pend if key[0] < addr + n and addr < key[0] + key[1]]:
            entry = pend.pop((a, m))
            width = entry.width
            x = self._concat(self._acts, entry.xs, entry.xkeys, None, 1)
            w = self._concat(self._weights, entry.ws, entry.wkeys, width, 0)
            target = self.acc_f[plane, a:a + m]
            with blas.threads_for(m * w.shape[0] * width):
                if width == target.shape[1]:
                    np.matmul(x, w, out=target)
                else:
                    np.matmul(x, w, out=target[:, :width])
                    target[:, width:] = 0

    @staticmethod
    def _concat(cache: _Cache, parts: list, keys: list, width, axis: int) -> np.ndarray:
        """The parts joined along ``axis`` in fp32 (weights: their first ``width`` lanes),
        reused by keys when every part has one."""
        cacheable = all(k is not None for k in keys)
        if cacheable:
            # A split's activations are the first K_i lanes of its vectors: K_i is part of the key.
            ckey = (tuple(keys), tuple(p.shape[axis] for p in parts), width)
            got = cache.get(ckey)
            if got is not None:
                return got
        if width is not None:
            parts = [p[:, :width] for p in parts]
        if len(parts) == 1:
            out = parts[0].astype(np.float32)
        else:
            out = np.concatenate(parts, axis=axis, dtype=np.float32)
        if cacheable:
            cache.put(ckey, out)
        return out

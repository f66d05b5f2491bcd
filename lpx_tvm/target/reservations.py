"""Reservation tables of the static scheduler: busy intervals of every port, stream
register and piece of state (SRAM line ranges, MXM weight buffers, accumulator rows,
links) with the read/write windows the simulator checks. :mod:`lpx_tvm.target.placer`
asks them where a group fits and records it once placed.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

import numpy as np


class IntervalSet:
    """Disjoint half-open busy intervals on one resource."""

    __slots__ = ("_starts", "_ends")

    def __init__(self):
        self._starts = []
        self._ends = []

    def conflict(self, a: int, b: int):
        """End of an interval overlapping ``[a, b)``, or None when it is free."""
        i = bisect.bisect_right(self._starts, a) - 1
        if i >= 0 and self._ends[i] > a:
            return self._ends[i]
        if i + 1 < len(self._starts) and self._starts[i + 1] < b:
            return self._ends[i + 1]
        return None

    def add(self, a: int, b: int):
        i = bisect.bisect_right(self._starts, a)
        self._starts.insert(i, a)
        self._ends.insert(i, b)


class _LineStamps:
    """Per unit of one piece of state (an SRAM line, an accumulator row, a block of
    off-chip bytes): the latest write end, write issue, read end and read issue of any
    access that touched it. A dependency query is then a max over the units it touches —
    the same answer as scanning every earlier access window that overlaps, in time
    independent of how many there were."""

    __slots__ = ("unit", "wend", "wissue", "rend", "rissue")

    def __init__(self, unit: int):
        self.unit = unit  # how many state indices share one stamp (coarser is only stricter)
        self.wend = np.full(64, -(1 << 60), np.int64)
        self.wissue = self.wend.copy()
        self.rend = self.wend.copy()
        self.rissue = self.wend.copy()

    def _span(self, lo: int, hi: int) -> slice:
        a, b = lo // self.unit, hi // self.unit + 1
        if b > len(self.wend):
            grow = max(b, 2 * len(self.wend)) - len(self.wend)
            pad = np.full(grow, -(1 << 60), np.int64)
            self.wend, self.wissue, self.rend, self.rissue = (
                np.concatenate([x, pad]) for x in (self.wend, self.wissue, self.rend, self.rissue))
        return slice(a, b)

    def _walked(self, e):
        """(units, cycles from the origin) of effect ``e``'s walk, or None where it has none
        or the stamps are coarser than its indices."""
        if e.walk is None or self.unit != 1:
            return None
        return e.walk.offsets + e.lo, e.walk.cycles + e.start

    def bound(self, e) -> int:
        """Earliest origin of effect ``e`` (:class:`~lpx_tvm.machine.effects.Effect`) after
        every earlier access of its units."""
        sl = self._span(e.lo, e.hi)
        walked = self._walked(e)
        if walked is None:
            if e.kind == "r":
                return int(self.wend[sl].max()) - e.start  # read once the last write landed
            # A write lands after earlier writes and reads, and issues after earlier reads issue.
            return max(int(self.wend[sl].max()) + 1 - e.start, int(self.rend[sl].max()) + 1 - e.start,
                       int(self.rissue[sl].max()) + 1 - e.issue)
        # Unit by unit: each is touched at its own cycle. The simulator runs instructions in
        # issue order, so an access also issues after the writes it follows (and a write
        # after the reads it follows), which the whole-range rule above implies.
        idx, at = walked
        order = int(self.wissue[sl].max()) + 1 - e.issue
        if e.kind == "r":
            return max(int((self.wend[idx] - at).max()), order)
        return max(int((self.wend[idx] - at).max()) + 1, int((self.rend[idx] - at).max()) + 1, order,
                   int(self.rissue[sl].max()) + 1 - e.issue)

    def record(self, e, t: int):
        """Stamp effect ``e`` placed with its origin at cycle ``t``."""
        sl = self._span(e.lo, e.hi)
        walked = self._walked(e)
        end, issue = (self.rend, self.rissue) if e.kind == "r" else (self.wend, self.wissue)
        np.maximum(issue[sl], t + e.issue, out=issue[sl])
        if walked is None:
            np.maximum(end[sl], t + e.end, out=end[sl])
            return
        idx, at = walked
        at = at + t
        if e.walk.unique:
            end[idx] = np.maximum(end[idx], at)
        else:
            np.maximum.at(end, idx, at)


class Reservations:
    """Busy intervals of ports and stream registers, plus state accesses for dependencies."""

    # Off-chip memory is tracked in blocks of this many bytes (a false dependency between
    # two buffers sharing a block only delays; it never reorders).
    HOST_UNIT = 64

    def __init__(self):
        self.ports = defaultdict(IntervalSet)
        self.streams = defaultdict(IntervalSet)  # (dir, id) -> busy D-intervals
        self.accesses = {}  # state key -> _LineStamps

    def _stamps(self, key) -> _LineStamps:
        st = self.accesses.get(key)
        if st is None:
            st = self.accesses[key] = _LineStamps(self.HOST_UNIT if key[0] == "host" else 1)
        return st

    def lower_bound(self, effects) -> int:
        """Earliest group start meeting every dependency.

        Effects (:class:`~lpx_tvm.machine.effects.Effect`) carry windows relative to the
        group start: start..end is when the access happens and ``issue`` when its
        instruction issues. A write lands after earlier accesses of its lines, and also
        *issues* after the earlier reads issue: the simulator runs instructions in issue
        order, so a write issued before a read it lands after would be applied too early
        (and is reported as a race)."""
        lb = 0
        for e in effects:
            st = self.accesses.get(e.key)
            if st is not None:
                lb = max(lb, st.bound(e))
        return lb

    def record(self, effects, t: int):
        for e in effects:
            self._stamps(e.key).record(e, t)

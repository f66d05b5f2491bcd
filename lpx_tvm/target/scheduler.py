"""The static list scheduler: places rigid instruction groups at exact cycles.

A group is a small dataflow graph whose instructions are tied together by streams.
Streams do not buffer, so once the group's first instruction issues, every other one
issues at a fixed offset (producer issue + latency + hops). The scheduler therefore
places whole groups: in program order, each at the earliest cycle where

- its dependencies through state (SRAM lines, MXM weight buffers, accumulator rows,
  links) are met, with the exact read/write windows the simulator checks,
- every port it uses is free (a choice among equivalent units, e.g. VXM ALUs),
- each of its stream values finds a free stream register in its direction.

Later groups fill gaps left by earlier ones (backfilling), which is what overlaps weight
installs with streaming and keeps the MXM planes busy.
"""

from __future__ import annotations

import bisect
from collections import defaultdict


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


class Reservations:
    """Busy intervals of ports and stream registers, plus state accesses for dependencies."""

    def __init__(self):
        self.ports = defaultdict(IntervalSet)
        self.streams = defaultdict(IntervalSet)  # (dir, id) -> busy D-intervals
        # state key -> {(lo, hi, kind): [latest end, latest issue]}. Dependencies only
        # need the latest access of each window: repeated accesses of the same lines (an
        # accumulator block, a weight buffer) collapse into one entry (14k -> 1.6k on
        # ResNet-50), which lower_bound scans once per effect.
        self.accesses = defaultdict(dict)

    def lower_bound(self, effects) -> int:
        """Earliest group start meeting every dependency.

        Effects carry windows relative to the group start: ``(key, lo, hi, kind, start, end,
        issue)`` where start..end is when the access happens and ``issue`` when its
        instruction issues. A write lands after earlier accesses of its lines, and also
        *issues* after the earlier reads issue: the simulator runs instructions in issue
        order, so a write issued before a read it lands after would be applied too early
        (and is reported as a race)."""
        lb = 0
        for key, lo, hi, kind, rel_start, _, rel_issue in effects:
            for (plo, phi, pkind), (pend, pissue) in self.accesses.get(key, {}).items():
                if plo > hi or lo > phi:
                    continue
                if kind == "r" and pkind == "w":
                    lb = max(lb, pend - rel_start)  # read once the last write landed
                elif kind == "w" and pkind == "w":
                    lb = max(lb, pend + 1 - rel_start)  # land after the earlier write
                elif kind == "w":
                    lb = max(lb, pend + 1 - rel_start, pissue + 1 - rel_issue)
        return lb

    def record(self, effects, t: int):
        for key, lo, hi, kind, _, rel_end, rel_issue in effects:
            window = self.accesses[key]
            latest = window.get((lo, hi, kind))
            if latest is None:
                window[(lo, hi, kind)] = [t + rel_end, t + rel_issue]
            else:
                latest[0] = max(latest[0], t + rel_end)
                latest[1] = max(latest[1], t + rel_issue)

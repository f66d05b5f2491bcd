"""SRAM allocation: free lists per slice, best fit, freeing for reuse by liveness.

Reusing lines is always safe for the program: the scheduler orders every write after
the earlier reads of the same lines (it tracks SRAM line ranges), so a freed tensor's
lines are overwritten only once its last reader is done. That order is a dependency the
program did not need, though: a value written into lines just freed waits for their last
reader, and a decode step, a chain of small values, then runs its ops one after another
(on tsp a 4-layer Llama's step took 34,308 cycles reusing the latest lines first, 15,914
this way). So lines freed by the last ``RECENT`` frees are taken last, as long as the
working space has room in the lower half of each slice under the constants, and among
equal holes the one freed longest ago.

Within each of those tiers, a small value (``NEAR_LINES``) goes to the slice nearest the
VXM: a decode step is a chain of small values that each cross from their slice to the VXM
and back, so a value ~35 hops away costs ~70 cycles of stream travel per op where a near
one costs a few (on tsp a 107M Llama's int8 step took 42,009 cycles with the lowest slice
index winning ties, 28,697 nearest first). Lines never used are not recent: counting them
so ordered cache writes behind unrelated reads.
"""

from __future__ import annotations

import bisect

from ..errors import SramFull

# Slices whose distances to the VXM differ by less than this many hops count as equally
# near: closer than that, reuse order (``RECENT``, the mark) matters more than a few cycles
# of stream travel (on tsp 1, 3, 6 and 12 hops gave decode steps within 4% of each other).
HOP_BUCKET = 3
# Only values of at most this many lines a slice go near the VXM: an op on a few rows is
# all latency, while a large tile streams for as many cycles as it has rows and wants its
# slices spread out for their ports (nearest-first for every size cost an int8 ResNet-50
# 46% and a 64-row int8 GEMM 53%; at 4 lines both are unchanged).
NEAR_LINES = 4


class SramAllocator:
    """Working space is allocated bottom-up from free lists and freed by liveness;
    constants (the initial SRAM image) are carved from the top of a slice, below nothing
    working space has ever touched, and never freed: an image is in place before the first
    instruction, so its lines must hold nothing else during the whole program."""

    def __init__(self, slices: int, lines: int, hops=None):
        self.lines = lines
        # Each slice's distance to the VXM, in buckets of HOP_BUCKET hops (0: nearest).
        self.near = [h // HOP_BUCKET for h in hops] if hops is not None else [0] * slices
        # Sorted (start, length, freed) per slice; ``freed``: when the hole's lines were last
        # freed (a count of frees; 0: never used).
        self._free = [[(0, lines, 0)] for _ in range(slices)]
        self._frees = 0
        self.used = [0] * slices
        self.peak = 0
        self.floor = [lines] * slices  # constants occupy [floor, lines) of each slice
        self.high = [0] * slices  # working space ever used: [0, high) (even if freed since)

    def alloc_constant(self, lines: int, avoid=(), among=None) -> tuple:
        """(slice, addr) at the top of the least-used slice (of ``among`` if given) whose
        topmost lines are free."""
        pool = range(len(self._free)) if among is None else among
        for s in sorted((s for s in pool if s not in avoid), key=lambda s: (self.used[s], s)):
            if self._top_room(s, lines):
                holes = self._free[s]
                start, length, freed = holes.pop()
                if length > lines:
                    holes.append((start, length - lines, freed))
                self.used[s] += lines
                self.floor[s] -= lines
                self.peak = max(self.peak, sum(self.used))
                return s, self.floor[s]
        raise SramFull(f"SRAM full: no slice has {lines} free lines at its top for constants "
                              f"({sum(self.used)} of {len(self._free) * self.lines} lines in use)")

    def constant_fits(self, lines: int) -> bool:
        """Whether some slice has ``lines`` free lines at its top for a constant."""
        return any(self._top_room(s, lines) for s in range(len(self._free)))

    def _top_room(self, s: int, lines: int) -> bool:
        # Never lines that working space has used: the image is in place from cycle 0.
        holes = self._free[s]
        return bool(holes) and holes[-1][0] + holes[-1][1] == self.floor[s] and self.floor[s] - lines >= self.high[s]

    def alloc(self, lines: int, slice: "int | None" = None, avoid=()) -> tuple:
        """(slice, addr) of ``lines`` free lines: in ``slice`` if given, else (not in ``avoid``)
        the lowest hole of the slice nearest the VXM where it raises the working-space mark
        least — keeping the tops of slices free for constants — then the least-used slice."""
        candidates = [slice] if slice is not None else [s for s in range(len(self._free)) if s not in avoid]
        small = lines <= NEAR_LINES
        best, best_key = None, None
        for s in candidates:
            for a, length, freed in self._free[s]:
                if length < lines:
                    continue
                # First lines not freed by the last RECENT frees (their readers may still be
                # at work), as long as the working space stays in the lower half of the
                # room under the constants; then recent lines below the mark; then the
                # least raise of the mark. Within each, the slice nearest the VXM first;
                # among equals, the hole freed longest ago. Lines never used are not recent.
                mark = max(self.high[s], a + lines)
                raises = mark > max(self.high[s], self.floor[s] // 2)
                recent = freed > 0 and freed > self._frees - self.RECENT
                key = (2 if raises else int(recent), self.near[s] if small else 0, mark, freed, self.used[s], s, a)
                if best_key is None or key < best_key:
                    best, best_key = (s, a), key
        if best is None:
            if slice is None and any(length >= lines for s in avoid for _, length, _ in self._free[s]):
                raise SramFull(f"SRAM full: {lines} free lines in one piece only on slices to keep clear of "
                               f"({sorted(set(avoid))}; {sum(self.used)} of "
                               f"{len(self._free) * self.lines} lines in use)")
            where = f"slice {slice}" if slice is not None else "any slice"
            raise SramFull(f"SRAM full: {where} has no {lines} free lines in one piece "
                                  f"({sum(self.used)} of {len(self._free) * self.lines} lines in use)")
        s, start = best
        holes = self._free[s]
        i = next(k for k, (a, _, _) in enumerate(holes) if a == start)
        a, length, freed = holes.pop(i)
        if length > lines:
            holes.insert(i, (a + lines, length - lines, freed))
        self.used[s] += lines
        self.high[s] = max(self.high[s], a + lines)
        self.peak = max(self.peak, sum(self.used))
        return s, start

    def reserve(self, slice: int, addr: int, lines: int, constant: bool = False):
        """Take exactly lines ``addr .. addr + lines - 1`` of ``slice`` (lines another
        program of the session holds: pinned state, shared weights). ``constant``: they
        join the constants at the slice's top, which must reach down to them."""
        holes = self._free[slice]
        i = next((k for k, (a, n, _) in enumerate(holes) if a <= addr and addr + lines <= a + n), None)
        if i is None:
            raise SramFull(f"lines {addr}..{addr + lines - 1} of slice {slice} are not free to reserve")
        a, n, freed = holes.pop(i)
        for piece in ((addr + lines, a + n - addr - lines, freed), (a, addr - a, freed)):
            if piece[1] > 0:
                holes.insert(i, piece)
        self.used[slice] += lines
        self.peak = max(self.peak, sum(self.used))
        if constant:
            if addr + lines != self.floor[slice]:
                raise SramFull(f"constant lines {addr}..{addr + lines - 1} of slice {slice} are not at the top of "
                               f"its constants (line {self.floor[slice]})")
            self.floor[slice] = addr
        else:
            self.high[slice] = max(self.high[slice], addr + lines)

    RECENT = 64

    def free(self, slice: int, addr: int, lines: int):
        self._frees += 1
        holes = self._free[slice]
        i = bisect.bisect_left(holes, (addr, 0, 0))
        holes.insert(i, (addr, lines, self._frees))
        # Merge with the neighbours (the merged hole counts as freed now: its newest part).
        if i + 1 < len(holes) and holes[i][0] + holes[i][1] == holes[i + 1][0]:
            nxt = holes.pop(i + 1)
            holes[i] = (holes[i][0], holes[i][1] + nxt[1], self._frees)
        if i > 0 and holes[i - 1][0] + holes[i - 1][1] == holes[i][0]:
            cur = holes.pop(i)
            holes[i - 1] = (holes[i - 1][0], holes[i - 1][1] + cur[1], self._frees)
        self.used[slice] -= lines

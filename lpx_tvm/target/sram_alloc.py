"""SRAM allocation: free lists per slice, best fit, freeing for reuse by liveness.

Reusing lines is always safe for the program: the scheduler orders every write after
the earlier reads of the same lines (it tracks SRAM line ranges), so a freed tensor's
lines are overwritten only once its last reader is done.
"""

from __future__ import annotations

import bisect

from ..errors import SramFull


class SramAllocator:
    """Working space is allocated bottom-up from free lists and freed by liveness;
    constants (the initial SRAM image) are carved from the top of a slice, below nothing
    working space has ever touched, and never freed: an image is in place before the first
    instruction, so its lines must hold nothing else during the whole program."""

    def __init__(self, slices: int, lines: int):
        self.lines = lines
        self._free = [[(0, lines)] for _ in range(slices)]  # sorted (start, length) per slice
        self.used = [0] * slices
        self.peak = 0
        self.floor = [lines] * slices  # constants occupy [floor, lines) of each slice
        self.high = [0] * slices  # working space ever used: [0, high) (even if freed since)

    def alloc_constant(self, lines: int, avoid=(), among=None) -> tuple:
        """(slice, addr) at the top of the least-used slice (of ``among`` if given) whose
        topmost lines are free."""
        pool = range(len(self._free)) if among is None else among
        for s in sorted((s for s in pool if s not in avoid), key=lambda s: (self.used[s], s)):
            holes = self._free[s]
            # Never lines that working space has used: the image is in place from cycle 0.
            if holes and holes[-1][0] + holes[-1][1] == self.floor[s] and self.floor[s] - lines >= self.high[s]:
                start, length = holes.pop()
                if length > lines:
                    holes.append((start, length - lines))
                self.used[s] += lines
                self.floor[s] -= lines
                self.peak = max(self.peak, sum(self.used))
                return s, self.floor[s]
        raise SramFull(f"SRAM full: no slice has {lines} free lines at its top for constants "
                              f"({sum(self.used)} of {len(self._free) * self.lines} lines in use)")

    def alloc(self, lines: int, slice: "int | None" = None, avoid=()) -> tuple:
        """(slice, addr) of ``lines`` free lines: in ``slice`` if given, else (not in ``avoid``)
        the lowest hole of the slice where it raises the working-space mark least — keeping
        the tops of slices free for constants — then the least-used slice."""
        candidates = [slice] if slice is not None else [s for s in range(len(self._free)) if s not in avoid]
        best, best_key = None, None
        for s in candidates:
            start = next((a for a, length in self._free[s] if length >= lines), None)
            if start is None:
                continue
            key = (max(self.high[s], start + lines), self.used[s], s)
            if best_key is None or key < best_key:
                best, best_key = (s, start), key
        if best is None:
            if slice is None and any(length >= lines for s in avoid for _, length in self._free[s]):
                raise SramFull(f"SRAM full: {lines} free lines in one piece only on slices to keep clear of "
                               f"({sorted(set(avoid))}; {sum(self.used)} of "
                               f"{len(self._free) * self.lines} lines in use)")
            where = f"slice {slice}" if slice is not None else "any slice"
            raise SramFull(f"SRAM full: {where} has no {lines} free lines in one piece "
                                  f"({sum(self.used)} of {len(self._free) * self.lines} lines in use)")
        s, start = best
        holes = self._free[s]
        i = next(k for k, (a, _) in enumerate(holes) if a == start)
        a, length = holes.pop(i)
        if length > lines:
            holes.insert(i, (a + lines, length - lines))
        self.used[s] += lines
        self.high[s] = max(self.high[s], a + lines)
        self.peak = max(self.peak, sum(self.used))
        return s, start

    def reserve(self, slice: int, addr: int, lines: int, constant: bool = False):
        """Take exactly lines ``addr .. addr + lines - 1`` of ``slice`` (lines another
        program of the session holds: pinned state, shared weights). ``constant``: they
        join the constants at the slice's top, which must reach down to them."""
        holes = self._free[slice]
        i = next((k for k, (a, n) in enumerate(holes) if a <= addr and addr + lines <= a + n), None)
        if i is None:
            raise SramFull(f"lines {addr}..{addr + lines - 1} of slice {slice} are not free to reserve")
        a, n = holes.pop(i)
        for piece in ((addr + lines, a + n - addr - lines), (a, addr - a)):
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

    def free(self, slice: int, addr: int, lines: int):
        holes = self._free[slice]
        i = bisect.bisect_left(holes, (addr, 0))
        holes.insert(i, (addr, lines))
        # Merge with the neighbours.
        if i + 1 < len(holes) and holes[i][0] + holes[i][1] == holes[i + 1][0]:
            holes[i] = (holes[i][0], holes[i][1] + holes.pop(i + 1)[1])
        if i > 0 and holes[i - 1][0] + holes[i - 1][1] == holes[i][0]:
            holes[i - 1] = (holes[i - 1][0], holes[i - 1][1] + holes.pop(i)[1])
        self.used[slice] -= lines

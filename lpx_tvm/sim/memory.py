"""SRAM and accumulator storage with per-line timestamps for race checks.

A vector of dtype width ``w`` bytes occupies ``w`` consecutive lines holding its
little-endian bytes in order, lane 0 first (see ``machine/layout.py``). Every line remembers the cycle it was last written and last read,
and by which instruction, so the simulator can tell when running instructions in
issue order would differ from the hardware's cycle-by-cycle order: such a schedule is
a race, reported as a hazard instead of giving a silently different answer.
"""

from __future__ import annotations

import numpy as np

NEVER = -(2**62)


class Race(Exception):
    """A memory access that breaks the schedule; the simulator adds the instruction context."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


class _PerBank:
    """A (banks, lines) int64 table whose rows are allocated on first use.

    Indexed like the 2-D array it stands for (``t[bank, lines]``, ``t[bank]``); a run
    that touches few of the 88 slices pays only for those.
    """

    def __init__(self, banks: int, lines: int, fill: int):
        self._rows = [None] * banks
        self._lines = lines
        self._fill = fill

    def row(self, bank: int) -> np.ndarray:
        r = self._rows[bank]
        if r is None:
            r = self._rows[bank] = np.full(self._lines, self._fill, np.int64)
        return r

    def __getitem__(self, key):
        if isinstance(key, tuple):
            return self.row(key[0])[key[1]]
        return self.row(key)

    def __setitem__(self, key, value):
        self.row(key[0])[key[1]] = value


def _index(addr: int, stride: int, count: int, width: int, inner: int = 0, outer: int = 0):
    """Lines touched by ``count`` vectors of ``width`` lines.

    Vector ``k`` starts at ``addr + k * stride``, or with a 2-D pattern (``inner > 0``)
    at ``addr + (k // inner) * outer + (k % inner) * stride``. A slice for the contiguous
    case (cheap views), else an (n, w) index array.
    """
    k = np.arange(count, dtype=np.int64)
    if inner and outer != inner * stride:
        starts = addr + (k // inner) * outer + (k % inner) * stride
    elif stride == width:
        return slice(addr, addr + count * width)
    else:
        starts = addr + k * stride
    return starts[:, None] + np.arange(width, dtype=np.int64)[None, :]


def _bounds(index) -> tuple:
    if isinstance(index, slice):
        return index.start, index.stop - 1
    return int(index.min()), int(index.max())


class Banked:
    """Storage of ``banks`` x ``lines`` lines of ``lanes`` bytes with timestamps.

    Used for SRAM (a bank is a slice) and for MXM accumulator rows (a bank is a plane;
    only timestamps). One object serves a Simulator's successive runs: its arrays are
    large, and fresh ones page-fault on every touch. Each run stamps cycles offset by a
    ``base`` above every stamp of earlier runs, so old stamps never look recent and no
    table needs resetting. The data keeps the last program's initial image loaded: the
    next run of that program restores only the lines its run changed (:meth:`load_image`),
    and a run may keep lines as the previous run left them (a KV cache across programs).
    """

    def __init__(self, name: str, banks: int, lines: int, lanes: int):
        self.name = name
        self.banks = banks
        self.lines = lines
        self.lanes = lanes
        self.data = None
        self.functional = False
        self.base = 0
        self.high = 0  # highest absolute stamp so far
        self.dirty = {}  # bank -> (lowest, highest) line that may be nonzero
        self.image = None  # what identifies the initial image loaded (see load_image)
        self.touched = {}  # bank -> (lowest, highest) line changed since the image was loaded
        self.written_at = _PerBank(banks, lines, NEVER)
        self.written_by = _PerBank(banks, lines, -1)
        self.read_at = _PerBank(banks, lines, NEVER)
        self.read_by = _PerBank(banks, lines, -1)
        self.generation = np.zeros(banks, np.int64)  # bumped by every write to a bank
        self._ramps = {}  # (count, width, per vector, contiguous) -> cycle offsets of an access's lines

    def start_run(self, functional: bool):
        """Begin a run: no access on record. A functional run then loads its initial image."""
        if functional and self.data is None:
            self.data = np.zeros((self.banks, self.lines, self.lanes), np.uint8)
        self.functional = functional
        self.base = self.high + 1

    def load_image(self, key, images, keep=None):
        """Make the data the initial image ``images`` ([(bank, first line, (n, lanes) bytes)])
        and zero elsewhere. When the image ``key`` names is the one loaded, only the lines
        changed since are restored; ``key`` None always loads afresh (and keeps nothing).

        ``keep``, {bank: [(lowest, highest line), ...]} sorted and disjoint, are lines left
        as they are (state a previous run left for this one, e.g. a KV cache); no image may
        overlap them (the simulator checks)."""
        data = self.data
        keep = keep or {}
        restore = key is not None and key is self.image
        cleared = self.touched if restore else self.dirty
        for bank, (lo, hi) in cleared.items():
            for a, b in _gaps(lo, hi, keep.get(bank)):
                data[bank, a:b + 1] = 0
        if restore:
            for bank, addr, raw in images:
                t = cleared.get(bank)
                if t is not None:
                    lo, hi = max(t[0], addr), min(t[1], addr + len(raw) - 1)
                    if lo <= hi:
                        data[bank, lo:hi + 1] = raw[lo - addr:hi - addr + 1]
        else:
            self.dirty = {}
            for bank, addr, raw in images:
                data[bank, addr:addr + len(raw)] = raw
                self._mark(bank, addr, addr + len(raw) - 1)
        self.image = key
        self.touched = {}
        # Kept lines that were due for clearing may differ from the image: a later run that
        # does not keep them restores them.
        for bank, spans in keep.items():
            r = cleared.get(bank)
            if r is not None:
                for lo, hi in spans:
                    lo, hi = max(lo, r[0]), min(hi, r[1])
                    if lo <= hi:
                        self._mark(bank, lo, hi)

    # -- checks ------------------------------------------------------------
    def check_range(self, bank: int, addr: int, stride: int, count: int, width: int, what: str = "line"):
        last = addr + (count - 1) * stride
        lo, hi = min(addr, last), max(addr, last) + width - 1
        if lo < 0 or hi >= self.lines:
            raise Race("address-out-of-range",
                       f"{self.name} {bank}: {what}s {lo}..{hi} outside 0..{self.lines - 1}")

    def _check_index(self, bank: int, index):
        lo, hi = _bounds(index)
        if lo < 0 or hi >= self.lines:
            raise Race("address-out-of-range",
                       f"{self.name} {bank}: lines {lo}..{hi} outside 0..{self.lines - 1}")

    def _cycles(self, first: int, count: int, width: int, index, per_vector: bool):
        """The cycle of each line of an access (vector k at ``first + k``, or all at ``first``),
        shaped like the lines ``index`` picks."""
        key = (count, width, per_vector, isinstance(index, slice))
        ramp = self._ramps.get(key)
        if ramp is None:
            k = np.arange(count, dtype=np.int64) if per_vector else np.zeros(count, np.int64)
            ramp = np.repeat(k, width) if key[3] else np.repeat(k[:, None], width, axis=1)
            if len(self._ramps) > 4096:
                self._ramps.clear()
            self._ramps[key] = ramp
        return ramp + int(first + self.base)

    def _check_read(self, bank, index, cycles):
        written = self.written_at.row(bank)[index]
        bad = written > cycles
        if bad.any():
            j = np.flatnonzero(bad.ravel())[0]
            line = _line_at(index, j)
            raise Race("sram-read-before-write" if self.name == "slice" else "acc-read-before-write",
                       f"{self.name} {bank} {self._unit} {line} is read at cycle "
                       f"{int(cycles.ravel()[j]) - self.base} but its write by instruction "
                       f"#{int(self.written_by[bank, line])} lands at cycle {int(written.ravel()[j]) - self.base}")

    def _check_write(self, bank, index, cycles):
        for stamp, by, what in ((self.read_at, self.read_by, "read"), (self.written_at, self.written_by, "written")):
            prev = stamp.row(bank)[index]
            bad = prev >= cycles
            if bad.any():
                j = np.flatnonzero(bad.ravel())[0]
                line = _line_at(index, j)
                raise Race("sram-write-race" if self.name == "slice" else "acc-write-race",
                           f"{self.name} {bank} {self._unit} {line} is written at cycle "
                           f"{int(cycles.ravel()[j]) - self.base}, not after it was {what} at cycle "
                           f"{int(prev.ravel()[j]) - self.base} by instruction #{int(by[bank, line])}")

    @property
    def _unit(self) -> str:
        return "line" if self.name == "slice" else "row"

    # -- access ------------------------------------------------------------
    # The checks record accesses and return the lines touched (a slice, or an index
    # array for strided patterns); the data moves through load/store (functional runs).
    def read(self, bank, addr, stride, count, width, first_cycle, me, *, per_vector=True, inner=0, outer=0):
        """Check and record a read of ``count`` vectors of ``width`` lines; returns the lines."""
        index = _index(addr, stride, count, width, inner, outer)
        self._check_index(bank, index)
        cycles = self._cycles(first_cycle, count, width, index, per_vector)
        self._check_read(bank, index, cycles)
        self._stamp(self.read_at, self.read_by, bank, index, cycles, me)
        return index

    def write(self, bank, addr, stride, count, width, first_cycle, me, *, per_vector=True, inner=0, outer=0):
        """Check and record a write of ``count`` vectors of ``width`` lines; returns the lines."""
        index = _index(addr, stride, count, width, inner, outer)
        self._check_index(bank, index)
        cycles = self._cycles(first_cycle, count, width, index, per_vector)
        self._check_write(bank, index, cycles)
        self._stamp(self.written_at, self.written_by, bank, index, cycles, me)
        self.generation[bank] += 1
        if self.functional:
            self._mark(bank, *_bounds(index))
        return index

    def gather(self, bank, addrs: np.ndarray, width: int, first_cycle, me):
        """Check and record one vector read at each line address in ``addrs`` (data-dependent
        addresses); returns the lines, (len(addrs), width)."""
        _, _, index, cycles = self._data_lines(bank, addrs, width, first_cycle, "gathered")
        self._check_read(bank, index, cycles)
        self._stamp(self.read_at, self.read_by, bank, index, cycles, me)
        return index

    def scatter(self, bank, addrs: np.ndarray, width: int, first_cycle, me):
        """Check and record one vector write at each line address in ``addrs`` (data-dependent
        addresses), vector k at ``first_cycle + k``; returns the lines, (len(addrs), width)."""
        lo, hi, index, cycles = self._data_lines(bank, addrs, width, first_cycle, "scattered")
        # Two vectors to one line: the later one's cycle is later, so the check passes and it wins.
        self._check_write(bank, index, cycles)
        self._stamp(self.written_at, self.written_by, bank, index, cycles, me)
        self.generation[bank] += 1
        if self.functional:
            self._mark(bank, lo, hi)
        return index

    def _data_lines(self, bank, addrs: np.ndarray, width: int, first_cycle, verb: str) -> tuple:
        """``(lowest, highest line, lines (len(addrs), width), their cycles)`` of one vector
        at each address of ``addrs``, vector k at ``first_cycle + k``; an address outside
        the bank is an ``address-out-of-range`` race."""
        lo, hi = int(addrs.min()), int(addrs.max()) + width - 1
        if lo < 0 or hi >= self.lines:
            raise Race("address-out-of-range",
                       f"{self.name} {bank}: {verb} lines {lo}..{hi} outside 0..{self.lines - 1}")
        index = addrs.astype(np.int64)[:, None] + np.arange(width, dtype=np.int64)[None, :]
        return lo, hi, index, self._cycles(first_cycle, len(addrs), width, index, True)

    def access_rows(self, bank, rows: slice, first: int, step: int, me, *, read: bool):
        """Check and record one access per row, row k at cycle ``first + step * k`` (accumulator rows)."""
        count = rows.stop - rows.start
        key = (count, step, "rows")
        ramp = self._ramps.get(key)
        if ramp is None:
            ramp = self._ramps[key] = step * np.arange(count, dtype=np.int64)
        cycles = ramp + int(first + self.base)
        if read:
            self._check_read(bank, rows, cycles)
            self._stamp(self.read_at, self.read_by, bank, rows, cycles, me)
        else:
            self._check_write(bank, rows, cycles)
            self._stamp(self.written_at, self.written_by, bank, rows, cycles, me)

    def poke(self, bank, lines, raw: np.ndarray):
        """Load lines before the program starts (initial image, inputs): no timing."""
        self._mark(bank, *_bounds(lines))
        self.data[bank, lines] = raw

    # -- data (functional runs) ----------------------------------------------
    def vectors_spec(self, bank, addr, stride, count, width, itemsize, inner=0, outer=0, *, write=False):
        """How ``count`` vectors of ``width`` lines each sit in the SRAM bytes: ``(shape, offset,
        strides)`` of an ndarray over :attr:`flat` whose rows are the vectors, each as
        ``width * lanes // itemsize`` elements of ``itemsize`` bytes (a 2-D pattern gives
        shape ``(groups, inner, elements)``). None when no such view exists: a 2-D pattern
        with a partial last group, or, for writes, vectors that overlap."""
        lane_bytes = self.lanes
        shape_row = width * lane_bytes // itemsize
        offset = (bank * self.lines + addr) * lane_bytes
        if inner and outer != inner * stride:
            if count % inner or (write and (stride < width or outer < (inner - 1) * stride + width)):
                return None
            return (count // inner, inner, shape_row), offset, (outer * lane_bytes, stride * lane_bytes, itemsize)
        if write and stride < width:
            return None
        return (count, shape_row), offset, (stride * lane_bytes, itemsize)

    @property
    def flat(self) -> np.ndarray:
        """All SRAM bytes, one dimension (a view of :attr:`data`)."""
        return self.data.reshape(-1)

    def load(self, bank, index, count: int, dtype) -> np.ndarray:
        """A copy of the ``count`` vectors of ``dtype`` stored on lines ``index``: (count, lanes)."""
        v = self.data[bank, index].view(dtype).reshape(count, self.lanes)
        return v.copy() if isinstance(index, slice) else v

    def store(self, bank, index, vectors: np.ndarray):
        """Store (count, lanes) ``vectors`` on lines ``index`` (each vector on ``itemsize`` lines;
        where vectors overlap, the later one's lines win)."""
        raw = np.ascontiguousarray(vectors).view(np.uint8)
        if isinstance(index, slice):
            self.data[bank, index] = raw.reshape(-1, self.lanes)
        else:
            self.data[bank, index] = raw.reshape(index.shape + (self.lanes,))

    def mark(self, ranges: dict):
        """Note lines about to be changed, {bank: (lowest, highest)}, for the next run."""
        for bank, (lo, hi) in ranges.items():
            self._mark(bank, lo, hi)

    def _mark(self, bank, lo, hi):
        for ranges in (self.dirty, self.touched):
            old = ranges.get(bank)
            ranges[bank] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))

    def peek(self, bank, lines: np.ndarray) -> np.ndarray:
        return self.data[bank, lines]

    def _stamp(self, stamp, by, bank, index, cycles, me):
        last = int(cycles.flat[-1])  # cycles grow along an access
        if last > self.high:
            self.high = last
        row = stamp.row(bank)
        if isinstance(index, slice):
            # Keep the latest cycle: a DMA on its own port may touch a line earlier than
            # a longer access issued before it.
            view = row[index]
            np.maximum(view, cycles, out=view)
            by.row(bank)[index] = me
        else:
            # Strides smaller than a vector revisit lines: keep the latest cycle of each.
            flat_idx, flat_cyc = index.ravel(), cycles.ravel()
            np.maximum.at(row, flat_idx, flat_cyc)
            by.row(bank)[flat_idx] = me


def _gaps(lo: int, hi: int, spans):
    """The parts of lines ``lo .. hi`` outside ``spans`` (sorted, disjoint (lo, hi) ranges)."""
    for a, b in spans or ():
        if b < lo:
            continue
        if a > hi:
            break
        if a > lo:
            yield lo, a - 1
        lo = b + 1
        if lo > hi:
            return
    if lo <= hi:
        yield lo, hi


def _line_at(index, j):
    if isinstance(index, slice):
        return index.start + j
    return int(index.ravel()[j])

"""The stream network: values moving one floorplan position per cycle.

A producer at position ``p`` emitting vector ``k`` at cycle ``c0 + k`` puts it on the
stream; an eastward value is at position ``x >= p`` at cycle ``c0 + k + (x - p)``, a
westward one at ``x <= p`` at ``c0 + k + (p - x)``. Values flow on to the chip's edge.
Along such a trajectory ``D = cycle - sign * position`` is constant, so each producer
owns an interval of ``D`` on its stream, and two producers whose intervals overlap
would meet on some stream segment: that is a conflict. A consumer at ``x`` reading
``n`` vectors from cycle ``c`` needs ``[c - sign*x, c - sign*x + n)`` to lie inside one
producer's interval, downstream of the producer.

A stream register carries ``lanes`` bytes a cycle, so a vector of a ``w``-byte dtype
travels as ``w`` byte-planes on the ``w`` registers ``s .. s + w - 1`` of a group whose
first register ``s`` is a multiple of ``w`` (an fp16 value on ``E2`` holds ``E2`` and
``E3``). Each register of the group carries the value's ``D`` interval, so a conflict on
any byte-plane is a conflict, and a reader names the group's first register.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ...machine.isa import DType, Stream


class StreamFault(Exception):
    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


@dataclass
class Emission:
    d0: int
    d1: int  # exclusive
    position: int
    dtype: DType
    producer: int  # instruction index
    last_cycle: int  # cycle at which its last vector leaves the chip
    source: "tuple | None" = None  # (slice, addr, stride, dtype, generation) for values read from SRAM


def group_problem(stream: Stream, dtype: DType, registers: int) -> "str | None":
    """Why ``stream`` cannot carry a ``dtype`` value on a machine with ``registers`` streams
    in its direction (None if it can)."""
    w = dtype.itemsize
    if stream.id % w or stream.id + w > registers:
        first = stream.id - stream.id % w
        return (f"stream {stream}: a value of {dtype.short} ({w} bytes) takes {w} stream registers (its byte-planes), "
                f"a group {stream.dir}{first}..{stream.dir}{first + w - 1} starting at a multiple of {w}"
                + ("" if stream.id % w else f", but there are only {registers} {stream.dir} streams"))
    return None


def _plane_of(register: Stream, dtype: DType) -> str:
    """Which byte-plane of a ``dtype`` value ``register`` carries, in words ('' for 1 byte)."""
    w = dtype.itemsize
    return "" if w == 1 else f", byte-plane {register.id % w} of a {w}-byte {dtype.short} value"


class StreamNetwork:
    def __init__(self, positions: int, east: int, west: int):
        self.positions = positions
        self.registers = {"E": east, "W": west}
        self._starts: dict = {}  # Stream -> sorted list of d0
        self._emissions: dict = {}  # Stream -> list of Emission, same order

    def emit(self, stream: Stream, position: int, first_cycle: int, dtype: DType, count: int, producer: int,
             source=None):
        self._check_group(stream, dtype)
        d0 = first_cycle - stream.sign * position
        d1 = d0 + count
        planes = [Stream(stream.dir, stream.id + b) for b in range(dtype.itemsize)]
        slots = []
        for plane in planes:
            starts = self._starts.setdefault(plane, [])
            ems = self._emissions.setdefault(plane, [])
            i = bisect.bisect_left(starts, d0)
            for j in (i - 1, i):
                if 0 <= j < len(ems) and ems[j].d0 < d1 and d0 < ems[j].d1:
                    other = ems[j]
                    raise StreamFault(
                        "stream-conflict",
                        f"stream {plane}{_plane_of(plane, dtype)}: its values would meet those of instruction "
                        f"#{other.producer} (emitted from position {other.position}"
                        f"{_plane_of(plane, other.dtype)}) on one stream segment")
            slots.append((starts, ems, i))
        edge = self.positions - 1 if stream.sign > 0 else 0
        last = d1 - 1 + stream.sign * edge
        em = Emission(d0, d1, position, dtype, producer, last, source)
        for starts, ems, i in slots:
            starts.insert(i, d0)
            ems.insert(i, em)

    def _check_group(self, stream: Stream, dtype: DType):
        problem = group_problem(stream, dtype, self.registers[stream.dir])
        if problem:
            raise StreamFault("stream-group", problem)

    def read(self, stream: Stream, position: int, first_cycle: int, count: int, dtype: DType):
        """Return (emission, offset) of the vectors passing ``position`` from ``first_cycle``: they are
        vectors ``offset ..`` of what instruction ``emission.producer`` emitted."""
        self._check_group(stream, dtype)
        d0 = first_cycle - stream.sign * position
        starts = self._starts.get(stream, ())
        i = bisect.bisect_right(starts, d0) - 1
        if i < 0 or not (self._emissions[stream][i].d0 <= d0 < self._emissions[stream][i].d1):
            raise StreamFault("stream-empty",
                              f"stream {stream}: nothing is passing position {position} at cycle {first_cycle}")
        em = self._emissions[stream][i]
        if (position - em.position) * stream.sign < 0:
            raise StreamFault("stream-empty",
                              f"stream {stream}: position {position} is upstream of the producer "
                              f"(instruction #{em.producer} at position {em.position})")
        if d0 + count > em.d1:
            raise StreamFault("stream-misaligned",
                              f"stream {stream}: reading {count} vectors from cycle {first_cycle} at position "
                              f"{position} runs {d0 + count - em.d1} past the end of the value emitted by "
                              f"instruction #{em.producer}")
        if em.dtype != dtype:
            raise StreamFault("dtype-mismatch",
                              f"stream {stream}: expects {dtype.short} but carries {em.dtype.short} "
                              f"(from instruction #{em.producer})")
        return em, d0 - em.d0

    def prune(self, now: int) -> list:
        """Forget values that have left the chip before cycle ``now``; returns their producers
        (once each, though a multi-byte value was on several registers)."""
        gone = {}
        for stream, ems in self._emissions.items():
            if ems and any(e.last_cycle < now for e in ems):
                keep = []
                for e in ems:
                    if e.last_cycle >= now:
                        keep.append(e)
                    else:
                        gone[id(e)] = e
                self._emissions[stream] = keep
                self._starts[stream] = [e.d0 for e in keep]
        return [e.producer for e in gone.values()]

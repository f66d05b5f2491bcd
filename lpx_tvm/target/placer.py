"""The static list scheduler: places rigid instruction groups at exact cycles.

A group (:class:`lpx_tvm.target.builder.Group`) is a small dataflow graph whose
instructions are tied together by streams. Streams do not buffer, so once the group's
first instruction issues, every other one issues at a fixed offset (producer issue +
latency + hops), which :meth:`Placer._solve` works out. The placer then puts whole
groups, in program order, each at the earliest cycle where

- its dependencies through state (SRAM lines, MXM weight buffers, accumulator rows,
  links) are met, with the exact read/write windows the simulator checks,
- every port it uses is free (a choice among equivalent units, e.g. VXM ALUs),
- each of its stream values finds free stream registers in its direction (a ``w``-byte
  value takes an aligned group of ``w``, its byte-planes).

Later groups fill gaps left by earlier ones (backfilling), which is what overlaps weight
installs with streaming and keeps the MXM planes busy. The busy intervals themselves are
kept in :mod:`lpx_tvm.target.reservations`.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import TYPE_CHECKING

from ..errors import SchedulingError
from ..machine.config import LPXConfig
from ..machine.isa import Instr, Stream, Unit
from ..machine.timing import timing, unit_position
from .reservations import Reservations

if TYPE_CHECKING:
    from .builder import Group, Node, Value

# The unit kind an opcode's prefix names.
UNIT_OF_PREFIX = {"mem": Unit.MEM, "dma": Unit.DMA, "mxm": Unit.MXM, "vxm": Unit.VXM, "sxm": Unit.SXM,
            "c2c": Unit.C2C, "icu": Unit.ICU}


class Placer:
    """Places groups one after another at their earliest valid cycle.

    Beside the schedule it keeps its dependency floor (``dependency_cycles``): the same
    groups, in the same order on the same units, each placed at the earliest cycle its
    dependencies through state allow, as if every port and stream register were free.
    No placement of this program's groups ends earlier; how far the schedule is from it
    is what ports and streams cost, and the rest is the program's chain of dependencies
    (docs/profile.md)."""

    def __init__(self, cfg: LPXConfig):
        self.cfg = cfg
        self.res = Reservations()
        self.barrier = 0
        self.max_done = 0
        self.free = Reservations()  # the dependency floor's placement: state only
        self.free_barrier = 0
        self.dependency_cycles = 0

    def sync(self) -> int:
        t = max(self.max_done, self.barrier)
        self.barrier = t
        self.free_barrier = max(self.free_barrier, self.dependency_cycles)
        return t

    def arrival(self, effect):
        """Data arriving from a link: a dependency of the schedule and of its floor."""
        self.res.record([effect], 0)
        self.free.record([effect], 0)

    def _timing(self, node: Node, unit: int):
        tm = node.timings.get(unit)
        if tm is None:
            tm = node.timings[unit] = timing(self.cfg, node.probe(unit), mxm_weights=node.weights)
        return tm

    def _position(self, node: Node) -> int:
        return unit_position(self.cfg, UNIT_OF_PREFIX[node.op.split(".")[0]], node.units[0])

    def _solve(self, g: Group):
        """Fix every node's offset from the stream timing equalities; check consistency."""
        nodes = g.nodes
        adj = defaultdict(list)
        for c in nodes:
            pc = self._position(c)
            for _, v in c.inputs:
                p = v.node
                d = self._timing(p, p.units[0]).emit + abs(pc - self._position(p)) + v.offset
                adj[p].append((c, d))
                adj[c].append((p, -d))
        off = {nodes[0]: 0}
        queue = deque([nodes[0]])
        while queue:
            a = queue.popleft()
            for b, d in adj[a]:
                if b not in off:
                    off[b] = off[a] + d
                    queue.append(b)
                elif off[b] != off[a] + d:
                    raise SchedulingError(
                        f"group {g.tag!r}: {b.op} would need its operands at two different cycles "
                        f"(paths differ by {off[b] - off[a] - d} cycles); read the operand again instead")
        if len(off) != len(nodes):
            raise SchedulingError(f"group {g.tag!r}: instructions not connected by streams belong in "
                                  "separate groups")
        base = min(off.values())
        for n in nodes:
            n.offset = off[n] - base

    def _direction(self, v: Value) -> "str | None":
        pp = self._position(v.node)
        dirs = {"E" if self._position(c) > pp else "W" for c, _ in v.consumers if self._position(c) != pp}
        if len(dirs) > 1:
            raise SchedulingError(f"{v.node.op}: its value has consumers both east and west of it")
        return dirs.pop() if dirs else None

    def place(self, g: Group) -> list:
        self._solve(g)
        effects = [e.after(n.offset) for n in g.nodes for e in n.effects]
        values = [n.out for n in g.nodes if n.out is not None]
        dirs = {id(v): self._direction(v) for v in values}
        t = max(self.res.lower_bound(effects), self.barrier)
        while True:
            plan, bump = self._try(g, values, dirs, t)
            if plan is not None:
                break
            t = max(t + 1, bump)
        units, streams = plan
        free_t = max(self.free.lower_bound(effects), self.free_barrier)
        self.free.record(effects, free_t)
        self.dependency_cycles = max([self.dependency_cycles] + [free_t + n.offset + self._timing(n, units[n]).done
                                                                 for n in g.nodes])
        return self._commit(g, effects, values, units, streams, t)

    def _try(self, g: Group, values, dirs, t: int):
        """Units and streams for the group at ``t``, or (None, next cycle worth trying)."""
        local = defaultdict(list)
        units = {}
        for n in g.nodes:
            best = None
            for u in n.units:
                tm_ = self._timing(n, u)
                a, b = t + n.offset, t + n.offset + tm_.occupancy
                if any(la < b and a < lb for port in tm_.ports for la, lb in local[port]):
                    continue  # taken by another instruction of this group whatever t is
                ends = [e for port in tm_.ports if tm_.occupancy
                        for e in [self.res.ports[port].conflict(a, b)] if e is not None]
                if not ends:
                    units[n] = u
                    for port in tm_.ports:
                        local[port].append((a, b))
                    break
                best = max(ends) if best is None else min(best, max(ends))
            else:
                if best is None:
                    raise SchedulingError(
                        f"group {g.tag!r}: {n.op} on unit {n.units[0]} overlaps another instruction of the "
                        "same group on the same port; read from another slice or split the group")
                return None, best - n.offset
        try:
            streams, bump = self._streams(g, values, dirs, units, t)
        except SchedulingError:
            # Values free to go either way took the streams a value bound to one direction
            # needs: give the bound values theirs first.
            bound = [v for v in values if dirs[id(v)]] + [v for v in values if not dirs[id(v)]]
            streams, bump = self._streams(g, bound, dirs, units, t)
        if streams is None:
            return None, bump
        return (units, streams), None

    def _streams(self, g: Group, values, dirs, units, t: int):
        """A stream group for each value, taken in the order of ``values``, or (None, next
        cycle worth trying). A ``w``-byte value needs the ``w`` registers of an aligned group
        (its byte-planes), each free over the value's ``D`` interval."""
        streams = {}
        local_s = defaultdict(list)
        for v in values:
            best = None
            w = v.dtype.itemsize
            for dr in ([dirs[id(v)]] if dirs[id(v)] else ["E", "W"]):
                d0, n = self._dinterval(v, units, t, dr)
                count = self.cfg.streams_east if dr == "E" else self.cfg.streams_west
                for first in range(0, count - w + 1, w):
                    keys = [(dr, first + b) for b in range(w)]
                    if any(la < d0 + n and d0 < lb for key in keys for la, lb in local_s[key]):
                        continue
                    ends = [e for key in keys for e in [self.res.streams[key].conflict(d0, d0 + n)] if e is not None]
                    if not ends:
                        streams[id(v)] = Stream(dr, first)
                        for key in keys:
                            local_s[key].append((d0, d0 + n))
                        break
                    best = (max(ends) - d0) if best is None else min(best, max(ends) - d0)
                if id(v) in streams:
                    break
            if id(v) not in streams:
                if best is None:
                    raise SchedulingError(f"group {g.tag!r} needs more simultaneous streams than the machine has")
                return None, t + best
        return streams, None

    def _dinterval(self, v: Value, units, t: int, direction: str):
        p = v.node
        tm_ = self._timing(p, units[p])
        first = t + p.offset + tm_.emit
        sign = 1 if direction == "E" else -1
        return first - sign * tm_.position, tm_.emit_count

    def _commit(self, g, effects, values, units, streams, t) -> list:
        out = []
        for n in g.nodes:
            u = units[n]
            tm_ = self._timing(n, u)
            start = t + n.offset
            for port in tm_.ports:
                if tm_.occupancy:
                    self.res.ports[port].add(start, start + tm_.occupancy)
            self.max_done = max(self.max_done, tm_.done + start)
            kw = dict(n.fields)
            for f, v in n.inputs:
                kw[f] = streams[id(v.base or v)]
            if n.out is not None:
                kw["dst"] = streams[id(n.out)]
            out.append(Instr(n.op, start, unit=u, count=n.count, tag=g.tag, **kw))
        for v in values:
            s = streams[id(v)]
            d0, cnt = self._dinterval(v, units, t, s.dir)
            for b in range(v.dtype.itemsize):
                self.res.streams[(s.dir, s.id + b)].add(d0, d0 + cnt)
        self.res.record(effects, t)
        return out

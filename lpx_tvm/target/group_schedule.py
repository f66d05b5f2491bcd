"""The group schedule: a program's groups in program order, with barriers and arrivals
between them, hoisted where their effects allow and placed in that order by
:class:`~lpx_tvm.target.placer.Placer`."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SchedulingError
from ..machine.config import LPXConfig
from ..machine.effects import arrival_effect
from ..machine.isa import Instr
from .placer import Placer


@dataclass(frozen=True)
class Barrier:
    """A schedule entry: later groups start after everything before it has completed."""


@dataclass(frozen=True)
class Arrival:
    """A schedule entry: data arrives on ``link`` from another chip at ``cycle`` (an int, or
    a function asked when the program is built)."""

    link: int
    cycle: object


class GroupSchedule:
    """Groups (:class:`~lpx_tvm.target.builder.Group`), :class:`Barrier` and :class:`Arrival`
    entries in program order."""

    def __init__(self):
        self.entries = []
        self.dependency_cycles = 0  # set by place()

    def add(self, entry):
        self.entries.append(entry)

    def hoist(self, groups: list, limit: int = 2000):
        """Move ``groups`` (the last ones added, in order) as early in program order as
        their state allows: to just after the last earlier group that touches what they
        touch (a write against any access of the same lines), never across a barrier nor
        more than ``limit`` groups back. The placer gives earlier groups first pick of
        ports and streams, so a hoisted group goes before the work it passed."""
        n = len(groups)
        if self.entries[len(self.entries) - n:] != groups:
            raise SchedulingError("only the groups added last can be hoisted")
        del self.entries[len(self.entries) - n:]
        for g in groups:
            mine = [e for node in g.nodes for e in node.effects]
            keys = {e.key for e in mine}
            pos = len(self.entries)
            stop = max(0, pos - limit)
            while pos > stop:
                h = self.entries[pos - 1]
                if isinstance(h, (Barrier, Arrival)) or any(e.key in keys and any(e.conflicts(m) for m in mine)
                                                   for node in h.nodes for e in node.effects):
                    break
                pos -= 1
            self.entries.insert(pos, g)

    def place(self, config: LPXConfig):
        """Place the entries in order: yields (entry, its instructions) for each barrier
        (its sync) and each group with instructions. Afterwards ``dependency_cycles`` is
        the schedule's dependency floor (:class:`~lpx_tvm.target.placer.Placer`)."""
        placer = Placer(config)
        for g in self.entries:
            if isinstance(g, Barrier):
                yield g, [Instr("icu.sync", placer.sync())]
            elif isinstance(g, Arrival):
                cycle = g.cycle() if callable(g.cycle) else g.cycle
                placer.arrival(arrival_effect(g.link, cycle))
            elif g.nodes:
                yield g, placer.place(g)
        self.dependency_cycles = placer.dependency_cycles

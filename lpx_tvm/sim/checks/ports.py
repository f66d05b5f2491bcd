"""Ports: an instruction holds its ports over [issue, issue + occupancy); none may overlap."""

from __future__ import annotations

from ...errors import ScheduleHazard
from ...machine.isa import queue_name
from ..counters import port_name

_PORT_NAMES = {}  # ("mxm.compute", 2) -> "mxm2.compute"


class Ports:
    """Who holds each port until when; counts busy cycles (and traces them)."""

    def __init__(self, counters, trace=None):
        self.counters = counters
        self.trace = trace
        self.busy_until = {}
        self.busy_by = {}

    def occupy(self, i, ins, t):
        c = self.counters
        tagc = c.by_tag[ins.tag]
        for port in t.ports:
            busy = self.busy_until.get(port, -1)
            if ins.cycle < busy:
                raise ScheduleHazard(
                    "unit-overlap",
                    f"{port_name(port)} is still busy until cycle {busy} with instruction #{self.busy_by[port]}",
                    index=i, instr=str(ins), unit=queue_name(ins.queue), cycle=ins.cycle)
            self.busy_until[port] = ins.cycle + t.occupancy
            self.busy_by[port] = i
            pname = _PORT_NAMES.get(port) or _PORT_NAMES.setdefault(port, port_name(port))
            c.port_busy_cycles[pname] += t.occupancy
            tagc.busy_cycles += t.occupancy
            if self.trace is not None:
                self.trace.add(queue_name(ins.queue), pname, ins.op, ins.cycle, t.occupancy, i, ins.tag)

"""C2C: chip-to-chip links; on one chip each link loops back, so a receive takes what
was sent on its link, oldest first, once it has arrived."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ...machine.isa import DType
from ..memory import Race
from ..steps import C2cRecv, C2cSend


@dataclass
class _Message:
    arrival: int
    dtype: DType
    count: int
    sender: int
    taken: int = 0


def links(cfg) -> list:
    """Every link's messages in flight: [deque of _Message]."""
    return [deque() for _ in range(cfg.c2c_links)]


def c2c_send(run, i, ins, t, _):
    src = run.read_stream(ins, ins.src0, ins.dtype, t.position)
    run.links[ins.unit].append(_Message(t.done, ins.dtype, ins.count, i))
    run.counters.c2c_bytes_sent += ins.count * run.cfg.lanes * ins.dtype.itemsize
    run.record(C2cSend(i, src, ins.count), (src.producer,), i)
    run.notes.views.append((i, src.producer))


def c2c_recv(run, i, ins, t, _):
    link, need, parts = run.links[ins.unit], ins.count, []
    while need:
        if not link:
            raise Race("c2c-empty", f"link {ins.unit} has {ins.count - need} of the {ins.count} vectors "
                                    "to receive: nothing more was sent")
        m = link[0]
        if m.arrival > ins.cycle:
            raise Race("c2c-not-arrived", f"link {ins.unit}: the data sent by instruction #{m.sender} "
                                          f"arrives only at cycle {m.arrival}")
        if m.dtype != ins.dtype:
            raise Race("dtype-mismatch", f"link {ins.unit} carries {m.dtype.short}, receive expects "
                                         f"{ins.dtype.short}")
        k = min(need, m.count - m.taken)
        parts.append((m.sender, m.taken, k))
        m.taken += k
        need -= k
        if m.taken == m.count:
            link.popleft()
    run.record(C2cRecv(i, tuple(parts)), tuple(s for s, _, _ in parts), i)
    run.emit(i, ins, t, ins.dtype)


HANDLERS = {"c2c.send": c2c_send, "c2c.recv": c2c_recv}

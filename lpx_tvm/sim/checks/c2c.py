"""C2C: chip-to-chip links. On one chip each link loops back, so a receive takes what
was sent on its link, oldest first, once it has arrived; in a system of chips
(sim/multichip.py) a link's messages are those the linked chip sent."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ...machine.isa import DType
from ..memory import Race
from ..replay_steps import C2cRecv, C2cRecvRemote, C2cSend


@dataclass
class Message:
    """Vectors sent on a link: ``sender`` is the sending instruction's index, on chip
    ``chip`` (None: this chip); ``source`` the sending chip's executor in a functional
    system run (the receive reads the sent values from it)."""

    arrival: int
    dtype: DType
    count: int
    sender: int
    taken: int = 0
    chip: "int | None" = None
    source: object = None

    def who(self) -> str:
        return f"instruction #{self.sender}" if self.chip is None else f"chip {self.chip}'s instruction #{self.sender}"


def links(cfg) -> list:
    """Every link's messages in flight: [deque of Message]."""
    return [deque() for _ in range(cfg.c2c_links)]


def c2c_send(run, i, ins, t, _):
    src = run.read_stream(ins, ins.src0, ins.dtype, t.position)
    if run.loopback:
        run.links[ins.unit].append(Message(t.done, ins.dtype, ins.count, i))
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
            raise Race("c2c-not-arrived", f"link {ins.unit}: the data sent by {m.who()} "
                                          f"arrives only at cycle {m.arrival}")
        if m.dtype != ins.dtype:
            raise Race("dtype-mismatch", f"link {ins.unit} carries {m.dtype.short}, receive expects "
                                         f"{ins.dtype.short}")
        k = min(need, m.count - m.taken)
        parts.append((m.sender, m.taken, k, m))
        m.taken += k
        need -= k
        if m.taken == m.count:
            link.popleft()
    if any(m.chip is not None for *_, m in parts):  # from other chips: their executors hold the values
        run.record(C2cRecvRemote(i, tuple((m.source, s, a, k) for s, a, k, m in parts)), (), i)
    else:
        run.record(C2cRecv(i, tuple((s, a, k) for s, a, k, _ in parts)), tuple(s for s, _, _, _ in parts), i)
    run.emit(i, ins, t, ins.dtype)


HANDLERS = {"c2c.send": c2c_send, "c2c.recv": c2c_recv}

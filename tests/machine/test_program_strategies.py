"""The random-program generator of program_strategies.py makes valid schedules.

``valid_programs`` relies on the scheduler for the order *between* groups; inside one
group the offsets are fixed, so the generator itself must keep a group from writing
SRAM lines that the same group reads. A drain group whose VXM op reads a second operand
once wrote its result over that very operand: with a backwards read (stride -w) the
write landed on line 0 in the cycle the read reached it, an ``sram-write-race``.
"""

from __future__ import annotations

import re

from hypothesis import given, settings

from lpx_tvm.sim import Simulator

from program_strategies import _ProgramMaker, valid_programs


def _lines(ins) -> set:
    w, inner = ins.dtype.itemsize, ins.aux0 or 0
    out = set()
    for k in range(ins.count):
        a = ins.addr + (k * ins.stride if inner == 0 else (k // inner) * ins.aux1 + (k % inner) * ins.stride)
        out.update((ins.unit, line) for line in range(a, a + w))
    return out


def group_overlaps(program) -> list:
    """(group tag, lines) for each group that writes SRAM lines it also reads."""
    read, written = {}, {}
    for ins in program.instrs:
        if ins.op in ("mem.read", "mem.write"):
            (read if ins.op == "mem.read" else written).setdefault(ins.tag, set()).update(_lines(ins))
    return [(tag, sorted(lines & read.get(tag, set()))) for tag, lines in written.items()
            if lines & read.get(tag, set())]


class _Scripted:
    """A ``draw`` that picks without randomness: True, the least integer (or a fixed one
    for some ranges), and the first preferred element of a ``sampled_from``."""

    def __init__(self, ints: dict, prefer):
        self.ints, self.prefer = ints, prefer

    def __call__(self, strategy):
        text = repr(strategy)
        if text == "booleans()":
            return True
        m = re.fullmatch(r"integers\(min_value=(-?[\d_]+), max_value=(-?[\d_]+)\)", text)
        if m:
            lo, hi = int(m[1]), int(m[2])
            return self.ints.get((lo, hi), lo)
        elements = list(strategy.elements)  # sampled_from
        return next((e for e in elements if self.prefer(e)), elements[0])


def _prefer(e) -> bool:
    # An int matmul, a drain followed by a vxm.add of a second operand read backwards,
    # that operand being an output written before (the drain in the middle wrote one).
    return e in ("int", "binary", "vxm.add", "backwards") or getattr(e, "name", "").startswith("out")


def test_drain_group_does_not_write_what_it_reads():
    # matmul_groups drains twice; the second drain's vxm.add reads the output the first
    # one wrote, backwards. Before the fix the second drain wrote its result over it
    # (sram-write-race: line 0 written at 62, after the read of it at 66).
    m = _ProgramMaker(_Scripted({(1, 20): 13}, _prefer), "mini")
    m.matmul_groups()
    program = m.b.build()
    drains = sorted({ins.tag for ins in program.instrs if ins.op == "mxm.drain"})
    assert len(drains) == 2
    last = [ins for ins in program.instrs if ins.tag == drains[-1]]
    assert [ins.op for ins in last] == ["mxm.drain", "mem.read", "vxm.add", "mem.write"]
    assert last[1].stride < 0  # the scenario above
    assert group_overlaps(program) == []
    Simulator("mini").run(program, m.inputs)  # no ScheduleHazard


@settings(max_examples=50, deadline=None)
@given(valid_programs("mini"))
def test_random_groups_do_not_write_what_they_read(made):
    program, _ = made
    assert group_overlaps(program) == []

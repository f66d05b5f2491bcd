"""The scheduler's windows are the simulator's: for random valid programs built with the
builder, every SRAM and accumulator access the simulator stamps (from the placed
instruction alone) is one of the effects the builder placed that instruction by
(machine.effects.instr_effects, shifted to its group's start), and every such effect the
simulator checks is stamped. Where an effect gives the cycle of each line or row (its
walk, which the scheduler meets line by line), those are the cycles the simulator stamps.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpx_tvm.machine.effects import Effect, instr_effects
from lpx_tvm.sim import Simulator
from lpx_tvm.sim.memory import Banked
from lpx_tvm.target.placer import Placer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "machine"))
from program_strategies import _ProgramMaker  # noqa: E402

# The ops whose SRAM and accumulator accesses the simulator stamps from the instruction
# (gathers and scatters touch lines that are data: the builder counts the whole table).
STAMPED = {"mem.read", "mem.write", "dma.load", "dma.store", "mxm.mul", "mxm.mac", "mxm.drain"}
KEYS = {"slice": "sram", "accumulator of plane": "acc"}


def _stamps(monkeypatch) -> list:
    """(instruction index, Effect) of each access the simulator stamps, as it runs."""
    seen = []

    def lines(self, me, bank, index, first, last, kind, cycles):
        if isinstance(index, slice):
            index = np.arange(index.start, index.stop, index.step or 1)
        index = np.asarray(index)
        seen.append((me, Effect((KEYS[self.name], bank), int(index.min()), int(index.max()), kind, first, last,
                                first), set(zip(index.ravel().tolist(), np.ravel(cycles).tolist()))))

    def wrap(method, kind):
        real = getattr(Banked, method)

        def spy(self, bank, addr, stride, count, width, first_cycle, me, *, per_vector=True, inner=0, outer=0):
            index = real(self, bank, addr, stride, count, width, first_cycle, me, per_vector=per_vector,
                         inner=inner, outer=outer)
            cycles = self._cycles(first_cycle, count, width, index, per_vector) - self.base
            lines(self, me, bank, index, first_cycle, first_cycle + (count - 1 if per_vector else 0), kind, cycles)
            return index
        monkeypatch.setattr(Banked, method, spy)

    wrap("read", "r")
    wrap("write", "w")
    real_rows = Banked.access_rows

    def rows_spy(self, bank, rows, first, step, me, *, read):
        real_rows(self, bank, rows, first, step, me, read=read)
        k = np.arange(rows.stop - rows.start)
        lines(self, me, bank, rows.start + k, first, first + step * k[-1], "r" if read else "w", first + step * k)
    monkeypatch.setattr(Banked, "access_rows", rows_spy)
    return seen


def _placed(monkeypatch) -> dict:
    """id(placed instruction) -> the builder's effects of its node, at the group's cycles."""
    windows = {}
    real = Placer.place

    def place(self, g):
        instrs = real(self, g)
        for node, ins in zip(g.nodes, instrs):
            # The node's effects were worked out on a probe at cycle 0; the placed
            # instruction alone must give the same ones.
            lines = None if node.effects == [] or ins.op not in ("mem.gather", "mem.scatter") else \
                (node.effects[0].lo, node.effects[0].hi)  # the table's lines, not the instruction's
            assert instr_effects(self.cfg, ins, weights=node.weights, lines=lines) == node.effects, ins
            windows[id(ins)] = [e.after(ins.cycle) for e in node.effects]
        return instrs
    monkeypatch.setattr(Placer, "place", place)
    return windows


def _key(e: Effect) -> tuple:
    return (e.key, e.lo, e.hi, e.kind, e.start, e.end)


def _walked(e: Effect) -> set:
    """(line or row, cycle) of each index the effect's walk touches."""
    return set(zip((e.lo + e.walk.offsets).tolist(), (e.start + e.walk.cycles).tolist()))


@pytest.mark.parametrize("preset", ["mini", "tsp"])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_builder_windows_are_the_simulators(preset, data):
    with pytest.MonkeyPatch.context() as mp:
        windows = _placed(mp)
        m = _ProgramMaker(data.draw, preset)
        makers = [m.stream_group] * 3 + [m.matmul_groups] * 3 + [m.dma_groups, m.c2c_groups, m.gather_group]
        for _ in range(data.draw(st.integers(1, 5))):
            data.draw(st.sampled_from(makers))()
            if data.draw(st.integers(0, 5)) == 0:
                m.b.sync()
        program = m.b.build()
        seen = _stamps(mp)
        Simulator(preset).run(program, m.inputs)
    stamped, touched = {}, {}
    for i, e, at in seen:
        stamped.setdefault(i, set()).add(_key(e))
        touched[i, _key(e)] = at
    walked = 0
    for i, ins in enumerate(program.instrs):
        if ins.op not in STAMPED:
            continue
        placed = [e for e in windows[id(ins)] if e.key[0] in ("sram", "acc")]
        assert stamped.get(i, set()) == {_key(e) for e in placed}, (ins, stamped.get(i), placed)
        for e in placed:
            if e.walk is not None:
                assert _walked(e) == touched[i, _key(e)], ins
                walked += 1
    assert walked or not any(ins.op in ("mem.read", "mem.write", "mxm.drain") for ins in program.instrs)

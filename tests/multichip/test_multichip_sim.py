"""The system simulator: sends reach the linked chip cycle-exactly, values cross chips
both ways, and every cross-chip fault names the chip, the link, the instruction and the
cycle. Hand-timed programs on two mini chips (mini: MEM0-3 at positions 2..5, VXM and
the links at 6, MEM4-7 at 7..10; fp32 takes 5 cycles a vector on a link, 450 of latency)."""

import math

import numpy as np
import pytest

from lpx_tvm.errors import ProgramError, ScheduleHazard
from lpx_tvm.machine.config import load_config
from lpx_tvm.machine.isa import DType, Instr, Stream
from lpx_tvm.machine.program import Binding, Program, TensorLayout
from lpx_tvm.sim.multichip import SystemSimulator
from lpx_tvm.machine.system import parse_system

CFG = load_config("mini")
LANES = CFG.lanes
PAIR = parse_system({"name": "pair", "preset": "mini", "chips": 2, "links": [[0, 2, 1, 3]]})
N = 4  # vectors sent
CPV = math.ceil(LANES * 4 / CFG.c2c_bytes_per_cycle)  # fp32 on a mini link
SEND = 6  # a read of slice 0 (position 2) at 0 reaches the links (position 6) at 2 + 4
ARRIVAL = SEND + N * CPV + CFG.c2c_latency


def E(i):
    return Stream("E", i)


def program(instrs, inputs=(), outputs=()):
    binds = [Binding(n, "input", TensorLayout((N, LANES), DType.FP32, ((s, 0),), 4)) for n, s in inputs]
    binds += [Binding(n, "output", TensorLayout((N, LANES), DType.FP32, ((s, 0),), 4)) for n, s in outputs]
    return Program(CFG.hash, instrs, bindings=binds, name="hand")


def sender(link=2, cycle=SEND, dtype=DType.FP32):
    return program([Instr("mem.read", cycle - 6, unit=0, count=N, addr=0, stride=4, dtype=DType.FP32, dst=E(0)),
                    Instr("c2c.send", cycle, unit=link, count=N, dtype=dtype, src0=E(0))], inputs=[("X", 0)])


def receiver(cycle=ARRIVAL, link=3, dtype=DType.FP32, count=N):
    # recv emits at cycle + 1 at position 6; slice 4 (position 7) writes it at cycle + 2
    return program([Instr("c2c.recv", cycle, unit=link, count=count, dtype=dtype, dst=E(4)),
                    Instr("mem.write", cycle + 2, unit=4, count=count, addr=0, stride=4, dtype=DType.FP32,
                          src0=E(4))], outputs=[("Y", 4)])


X = np.random.default_rng(0).standard_normal((N, LANES)).astype(np.float32)


def test_send_arrives_on_the_linked_chip():
    sim = SystemSimulator(PAIR)
    r = sim.run({0: sender(), 1: receiver()}, {0: {"X": X}})
    np.testing.assert_array_equal(r.chips[1].outputs["Y"], X)
    t = sim.run({0: sender(), 1: receiver()}, timing_only=True)
    assert r.cycles == t.cycles == ARRIVAL + 2 + N - 1 + CFG.latency["mem_write"]
    assert r.chips[0].counters.c2c_bytes_sent == X.nbytes
    assert r.link_bytes == {(0, 2): X.nbytes}


def test_received_value_goes_back():
    """Chip 1 adds 1 to what chip 0 sent and sends it back: each chip's values are
    computed when the other reads them."""
    back = ARRIVAL + 1 + CFG.latency["vxm_alu"]  # the add's result at the links
    one = program([Instr("c2c.recv", ARRIVAL, unit=3, count=N, dtype=DType.FP32, dst=E(4)),
                   Instr("vxm.add", ARRIVAL + 1, unit=0, count=N, dtype=DType.FP32, src0=E(4), imm=1.0, dst=E(8)),
                   Instr("c2c.send", back, unit=3, count=N, dtype=DType.FP32, src0=E(8))])
    home = back + N * CPV + CFG.c2c_latency
    zero = program(list(sender().instrs) + list(receiver(home, link=2).instrs), inputs=[("X", 0)],
                   outputs=[("Y", 4)])
    r = SystemSimulator(PAIR).run({0: zero, 1: one}, {0: {"X": X}})
    np.testing.assert_array_equal(r.chips[0].outputs["Y"], X + np.float32(1))


def _hazard(programs, timing_only, **kw):
    with pytest.raises(ScheduleHazard) as e:
        SystemSimulator(PAIR).run(programs, {} if timing_only else {0: {"X": X}}, timing_only=timing_only, **kw)
    return e.value


@pytest.mark.parametrize("timing_only", [False, True])
def test_receive_before_arrival(timing_only):
    e = _hazard({0: sender(), 1: receiver(ARRIVAL - 1)}, timing_only)
    assert e.kind == "c2c-not-arrived" and e.chip == 1 and e.cycle == ARRIVAL - 1 and e.index == 0
    assert f"chip 0's instruction #1 arrives only at cycle {ARRIVAL}" in str(e)
    assert "chip 1" in str(e) and "unit c2c3" in str(e)


@pytest.mark.parametrize("timing_only", [False, True])
def test_nothing_arriving(timing_only):
    e = _hazard({0: program([], inputs=[("X", 0)]), 1: receiver()}, timing_only)
    assert e.kind == "c2c-empty" and e.chip == 1 and "link 3" in str(e)


@pytest.mark.parametrize("timing_only", [False, True])
def test_unlinked_port(timing_only):
    e = _hazard({0: sender(link=1), 1: receiver()}, timing_only)
    assert e.kind == "c2c-unlinked" and e.chip == 0 and e.index == 1 and e.cycle == SEND
    assert "link 1 of chip 0 is not connected in system pair" in str(e)


@pytest.mark.parametrize("timing_only", [False, True])
def test_sizes_that_do_not_match(timing_only):
    e = _hazard({0: sender(), 1: receiver(count=N - 1)}, timing_only)
    assert e.kind == "c2c-unreceived" and e.chip == 1
    assert "link 3 of chip 1: 1 vector(s) sent by chip 0's instruction #1" in str(e)
    e = _hazard({0: sender(dtype=DType.FP32), 1: receiver(dtype=DType.INT32)}, timing_only)
    assert e.kind == "dtype-mismatch" and e.chip == 1


def test_programs_checked():
    with pytest.raises(ProgramError, match="system pair has chips 0..1"):
        SystemSimulator(PAIR).run({2: sender()}, timing_only=True)
    with pytest.raises(ProgramError, match="inputs for chip"):
        SystemSimulator(PAIR).run({0: sender()}, {1: {"X": X}})


def test_timing_in_worker_processes():
    """Each chip's check is independent once its peers' sends are timed: two workers give
    the inline counters."""
    progs = {0: sender(), 1: receiver()}
    inline = SystemSimulator(PAIR).run(progs, timing_only=True)
    pooled = SystemSimulator(PAIR).run(progs, timing_only=True, workers=2)
    assert {c: r.counters.cycles for c, r in pooled.chips.items()} == \
        {c: r.counters.cycles for c, r in inline.chips.items()}
    e = _hazard({0: sender(), 1: receiver(ARRIVAL - 1)}, True, workers=2)
    assert e.kind == "c2c-not-arrived" and e.chip == 1

"""A system of LPX chips, each running its own program, their C2C links joined.

A ``c2c.send`` on chip ``a`` link ``la`` arrives, cycle-exactly, on the chip and link
the system joins it to (:class:`~lpx_tvm.machine.system.System`), where a ``c2c.recv`` takes it:
the same rules as one chip's loopback (docs/isa.md, C2C), with the link's far end on
another chip. Because the schedule is static, a message's arrival cycle depends only on
its sender's program, not on any data: every chip's sends are timed first, and each
chip's run is then checked on its own against the messages that reach it. So a
timing-only run checks its chips independently, in worker processes or on Ray
(``workers``, ``ray_address``, as tuning does). A functional run computes the chips
together, interleaved by cycle, so that a received value was computed when it is read.

The checks across chips: a send on a port the system leaves unconnected
(``c2c-unlinked``), a receive with nothing arriving (``c2c-empty``), a message that has
not arrived (``c2c-not-arrived``), a dtype other than the one sent (``dtype-mismatch``),
and vectors sent that no receive takes by the end (``c2c-unreceived``). Each error names
the chip, the instruction, the link and the cycle; a link's transmit port held by two
sends at once is the sending chip's port conflict.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass, field

from ..errors import ProgramError, ScheduleHazard
from ..machine import timing as tm
from ..machine.isa import queue_name
from ..machine.program import Program
from ..machine.system import System, load_system
from .checks.c2c import Message
from .simulator import SimResult, Simulator, _coerce_inputs, _names, _Run


@dataclass
class SystemResult:
    """Each chip's result; ``cycles`` is the last chip's."""

    chips: dict  # chip -> SimResult
    link_bytes: dict = field(default_factory=dict)  # (chip, link) -> bytes it sent

    @property
    def cycles(self) -> int:
        return max((r.cycles for r in self.chips.values()), default=0)


class SystemSimulator:
    """Run one program per chip of ``system`` (a :class:`~lpx_tvm.machine.system.System` or a
    preset name).

    >>> sim = SystemSimulator("groqnode")                              # doctest: +SKIP
    >>> r = sim.run({0: prog0, 1: prog1}, {0: {"X": x0}, 1: {"X": x1}})  # doctest: +SKIP
    >>> r.chips[1].outputs["Y"], r.cycles                                # doctest: +SKIP
    """

    def __init__(self, system):
        self.system: System = load_system(system)
        self._chips = {}  # chip -> Simulator (its SRAM), made on first use

    def chip(self, c: int) -> Simulator:
        if c not in self._chips:
            self._chips[c] = Simulator(self.system.config)
        return self._chips[c]

    def run(self, programs: dict, inputs: "dict | None" = None, *, timing_only: bool = False, workers: int = 0,
            ray_address: "str | None" = None, keep: "dict | None" = None) -> SystemResult:
        """Run ``programs`` ({chip: Program}; chips without one stay idle) with ``inputs``
        ({chip: {name: array}}). A timing-only run checks every chip; with ``workers``
        (or ``ray_address``) it checks them in parallel. ``keep``: {chip: names of SRAM
        inputs} whose lines hold what that chip's previous run left (a KV cache: see
        :meth:`Simulator.run <lpx_tvm.sim.Simulator.run>`); each chip keeps its SRAM
        from run to run."""
        inputs, keep = inputs or {}, keep or {}
        self._check_programs(programs, inputs)
        inbound = self._messages(programs)
        if timing_only:
            results = self._timing(programs, inbound, workers, ray_address)
        else:
            results = self._functional(programs, inputs, inbound, keep)
        return SystemResult(results, self._link_bytes(programs))

    # ---- what each chip receives ------------------------------------------------------
    def _check_programs(self, programs: dict, inputs: dict):
        s = self.system
        for c, prog in programs.items():
            if not isinstance(c, int) or not 0 <= c < s.chips:
                raise ProgramError(f"chip {c!r}: system {s.name} has chips 0..{s.chips - 1}")
            if not isinstance(prog, Program):
                raise ProgramError(f"chip {c}: expected a Program, got {type(prog).__name__}")
        extra = sorted(set(inputs) - set(programs))
        if extra:
            raise ProgramError(f"inputs for chip(s) {extra}, which run no program")

    def _messages(self, programs: dict) -> dict:
        """{(chip, link): [Message]} each link's arriving messages in the order sent, from
        the senders' programs alone (their send timing is static)."""
        s, cfg = self.system, self.system.config
        inbound = defaultdict(list)
        for c, prog in programs.items():
            for i, ins in enumerate(prog.instrs):
                if ins.op != "c2c.send":
                    continue
                far = s.peer(c, ins.unit)
                if far is None:
                    raise ScheduleHazard("c2c-unlinked", f"link {ins.unit} of chip {c} is not connected in system "
                                                         f"{s.name}", index=i, instr=str(ins),
                                         unit=queue_name(ins.queue), cycle=ins.cycle, chip=c)
                if not 0 < ins.count:
                    continue  # the sender's own checks refuse it
                t = tm.timing(cfg, ins)
                inbound[far].append((ins.cycle, c, i, Message(t.done, ins.dtype, ins.count, i, chip=c)))
        return {key: [m for *_, m in sorted(ms, key=lambda x: x[:3])] for key, ms in inbound.items()}

    def _link_bytes(self, programs: dict) -> dict:
        lanes, out = self.system.config.lanes, defaultdict(int)
        for c, prog in programs.items():
            for ins in prog.instrs:
                if ins.op == "c2c.send":
                    out[c, ins.unit] += ins.count * lanes * ins.dtype.itemsize
        return dict(out)

    # ---- running ----------------------------------------------------------------------
    def _timing(self, programs, inbound, workers, ray_address) -> dict:
        jobs = {c: (self.system.config, prog, c, _inbound_of(inbound, c)) for c, prog in programs.items()}
        if not workers and not ray_address:
            return {c: _check_chip(*job) for c, job in jobs.items()}
        from .workers import make_pool

        pool = make_pool(workers, ray_address)
        try:
            futures = {c: pool.submit(_check_chip, *job) for c, job in jobs.items()}
            return {c: f.result() for c, f in futures.items()}
        finally:
            pool.shutdown()

    def _functional(self, programs, inputs, inbound, keep) -> dict:
        from .executor import Executor

        runs, executors = {}, {}
        for c, prog in programs.items():
            sim = self.chip(c)
            names = _names(keep.get(c, ()))
            kept = sim._kept_lines(prog, names)
            arrays = _coerce_inputs(prog, inputs.get(c, {}), True, names)
            run = _chip_run(sim, prog, functional=True)
            ex = Executor(sim.config, prog, sim._sram, sim._accs_for_run())
            ex.load_image(None, kept)
            ex.load_inputs(arrays)
            run.ex, executors[c], runs[c] = ex, ex, run
        for (c, link), messages in inbound.items():
            if c in runs:
                for m in messages:
                    m.source = executors[m.chip]
        for c, run in runs.items():
            run.links = _link_queues(run.cfg, _inbound_of(inbound, c))
        # Every chip's instructions in one issue order: a value is sent before it arrives.
        issuing = {c: run.issue() for c, run in runs.items()}
        heap = [(cycle, c) for c, it in issuing.items() if (cycle := _advance(c, it)) is not _DONE]
        heapq.heapify(heap)
        while heap:
            _, c = heapq.heappop(heap)
            nxt = _advance(c, issuing[c])  # issues chip c's instruction of that cycle
            if nxt is not _DONE:
                heapq.heappush(heap, (nxt, c))
        results = {}
        for c, run in runs.items():
            _check_all_received(run, c)
            results[c] = run.finish()
        return results


_DONE = object()


def _advance(c: int, issuing) -> object:
    """Issue chip ``c``'s pending instruction (none at the start); the cycle of the next,
    or _DONE after its last."""
    try:
        return next(issuing)
    except StopIteration:
        return _DONE
    except ScheduleHazard as e:
        raise _on_chip(e, c) from None


def _on_chip(e: ScheduleHazard, chip: int) -> ScheduleHazard:
    return ScheduleHazard(e.kind, e.message, index=e.index, instr=e.instr, unit=e.unit, cycle=e.cycle, chip=chip)


def _inbound_of(inbound: dict, chip: int) -> dict:
    return {link: ms for (c, link), ms in inbound.items() if c == chip}


def _link_queues(cfg, messages: dict) -> list:
    queues = [deque() for _ in range(cfg.c2c_links)]
    for link, ms in messages.items():
        queues[link].extend(ms)
    return queues


def _chip_run(sim: Simulator, program: Program, functional: bool) -> _Run:
    """A schedule check of ``program`` on ``sim``'s state, its links reaching other chips."""
    sim._sram.start_run(functional)
    sim._acc_stamps.start_run(False)
    return _Run(sim.config, program, False, sim._sram, sim._acc_stamps, sim._timings, loopback=False)


def _check_chip(cfg, program: Program, chip: int, messages: dict) -> SimResult:
    """One chip's timing-only check against the messages that reach it (a worker's job)."""
    messages = {link: [Message(m.arrival, m.dtype, m.count, m.sender, chip=m.chip) for m in ms]
                for link, ms in messages.items()}  # fresh: the check consumes them
    run = _chip_run(Simulator(cfg), program, functional=False)
    run.links = _link_queues(cfg, messages)
    try:
        run.execute()
    except ScheduleHazard as e:
        raise _on_chip(e, chip) from None
    _check_all_received(run, chip)
    return run.finish()


def _check_all_received(run, chip: int):
    for link, queue in enumerate(run.links):
        if queue:
            m = queue[0]
            left = sum(x.count - x.taken for x in queue)
            raise ScheduleHazard("c2c-unreceived", f"link {link} of chip {chip}: {left} vector(s) sent by chip "
                                                   f"{m.chip}'s instruction #{m.sender} (arriving at cycle "
                                                   f"{m.arrival}) are never received",
                                 unit=f"c2c{link}", cycle=m.arrival, chip=chip)


__all__ = ["SystemSimulator", "SystemResult"]

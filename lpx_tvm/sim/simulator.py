"""The LPX simulator: runs a Program, checks its static schedule, counts cycles.

Instructions execute in issue-cycle order, each on a whole tile with one numpy call,
so the cost grows with instructions, not cycles or elements. Because the machine has
no stalls, arbiters or caches, the schedule either is valid — then this order gives
exactly the hardware's results and cycle counts — or breaks a rule, and the run stops
with a :class:`~lpx_tvm.errors.ScheduleHazard` naming the instruction, unit and cycle.

This module is the orchestration. The checks live in :mod:`lpx_tvm.sim.checks`, one
module per unit kind, driven in issue order by :class:`_Run`; checking a program
records the steps its arithmetic takes (:mod:`lpx_tvm.sim.replay_steps`), which the
:class:`~lpx_tvm.sim.executor.Executor` carries out, and a Simulator replays the
finalized steps (:mod:`lpx_tvm.sim.replay_plan`) of a program it has verified without
checking it again (docs/design.md, "Verify once, replay"). What each instruction
computes is defined plainly by the reference interpreter, :mod:`lpx_tvm.sim.reference`.
"""

from __future__ import annotations

import gc
import weakref
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..errors import ProgramError, ScheduleHazard
from ..machine import timing as tm
from ..machine.config import LPXConfig, load_config
from ..machine.isa import ISA_VERSION, DType, Instr, queue_name
from ..machine.layout import check_layout, coerce
from ..machine.program import Program
from . import blas
from . import numerics as nx
from .checks import c2c, dma, icu, mem, mxm, sxm, vxm
from .checks.operands import validate
from .checks.ports import Ports
from .checks.streams import StreamFault, StreamNetwork
from .counters import Counters
from .executor import Executor, read_binding
from .memory import Banked, Race, _bounds
from .mxm import Accumulators
from .replay_plan import ReplayPlan, PlanNotes, addresses_from_data
from .replay_steps import StreamOperand
from .trace import TraceRecorder


@dataclass
class SimResult:
    outputs: dict
    counters: Counters
    config: LPXConfig
    trace: "TraceRecorder | None" = None

    @property
    def cycles(self) -> int:
        return self.counters.cycles

    @property
    def latency_s(self) -> float:
        return self.config.seconds(self.cycles)


class Simulator:
    """Run programs on one machine config.

    >>> sim = Simulator("mini")
    >>> result = sim.run(program, {"A": a, "B": b})        # doctest: +SKIP
    >>> result.outputs["C"], result.cycles                  # doctest: +SKIP
    """

    def __init__(self, config="tsp"):
        self.config = load_config(config)
        cfg = self.config
        # Machine state kept from run to run (hundreds of megabytes on tsp).
        self._sram = Banked("slice", cfg.mem_slices, cfg.lines_per_slice, cfg.lanes)
        self._acc_stamps = Banked("accumulator of plane", cfg.mxm_planes, cfg.mxm_acc_rows, 1)
        self._accs = None
        self._plans = {}  # id(program) -> ReplayPlan of a program whose schedule passed every check
        # Pure functions of an (immutable) instruction and the config, computed once per instruction
        # object: id(instr) -> instr once it passed the operand checks; (id(instr), weights' dtype)
        # -> (instr, its Timing).
        self._timings = {}
        self._kept = {}  # (id(program), kept names) -> (its ReplayPlan, kept lines): checked once per program

    def run(self, program: Program, inputs: "dict | None" = None, *, timing_only: bool = False,
            trace: bool = False, keep=(), outputs=None) -> SimResult:
        """Execute ``program``. In ``timing_only`` mode no arithmetic is done and ``inputs``
        may be omitted; every timing check still runs and the counters are identical.

        ``keep``: names of SRAM inputs of ``program`` whose lines hold what the previous run
        on this Simulator (of this or any other program) left there, e.g. a KV cache that
        a prefill and a decode program both bind at the same lines: they are not fed (it
        is an error to give them in ``inputs``) and neither zeroed nor restored before the
        run. The program's initial image must not overlap them. A timing-only run only
        checks the names.

        ``outputs``: names of the outputs to read back into :attr:`SimResult.outputs`
        (None: all); :meth:`read` reads any binding later.

        The first run of a program checks its whole schedule. A functional run of a
        program that this Simulator has already run through without a hazard (and that
        has not been changed since) replays the verified instruction steps without
        repeating the checks, and reports the verified run's counters: the schedule is
        static, so the checks would find the same. Timing-only and traced runs always
        check; so does every run of a program with ``mem.gather`` (its addresses are data).

        A Simulator reuses its SRAM and accumulator arrays from run to run; use one
        Simulator per thread.
        """
        # The checks make many small objects and no reference cycles: the cyclic garbage
        # collector would only walk the process's other objects, over and over.
        collect = gc.isenabled()
        gc.disable()
        try:
            with blas.one_thread():
                return self._run(program, inputs or {}, timing_only, trace, keep, outputs)
        finally:
            if collect:
                gc.enable()

    def _run(self, program, inputs, timing_only, trace, keep, outputs):
        cfg = self.config
        kept_names = _names(keep)
        kept = self._kept_lines(program, kept_names)
        if outputs is not None:
            outputs = _names(outputs)
            unknown = outputs - {b.name for b in program.outputs}
            if unknown:
                raise ProgramError(f"unknown output(s) {sorted(unknown)}; the program's outputs are "
                                   f"{sorted(b.name for b in program.outputs)}")
        plan = None if timing_only or trace else self._plan_of(program)
        if plan is not None and plan.replayable:
            return self._replay(plan, _coerce_inputs(program, inputs, True, kept_names), kept, outputs)
        lockstep = not timing_only and addresses_from_data(program)
        self._sram.start_run(lockstep)
        self._acc_stamps.start_run(False)
        if len(self._timings) > 1 << 20:
            self._timings.clear()
        run = _Run(cfg, program, trace, self._sram, self._acc_stamps, self._timings)
        arrays = _coerce_inputs(program, inputs, not timing_only, kept_names)
        if lockstep:
            ex = Executor(cfg, program, self._sram, self._accs_for_run())
            ex.load_image(None, kept)
            ex.load_inputs(arrays)
            run.ex = ex
            run.wanted = outputs
            return run.execute()
        result = run.execute()
        plan = self._plan_of(program) or self._remember(program, run)  # the same steps if checked before
        if timing_only:
            return result
        return self._replay(plan, arrays, kept, outputs, result.trace)

    def _accs_for_run(self) -> Accumulators:
        cfg = self.config
        if self._accs is None:
            self._accs = Accumulators(cfg.mxm_planes, cfg.mxm_acc_rows, cfg.lanes)
        self._accs.start_run()
        return self._accs

    def verify(self, program: Program) -> SimResult:
        """Check ``program``'s whole schedule now (a timing-only run), so that its functional
        runs on this Simulator replay it; raises :class:`ScheduleHazard` if it breaks a rule."""
        return self.run(program, timing_only=True)

    # ---- verified programs --------------------------------------------------
    def _plan_of(self, program: Program) -> "ReplayPlan | None":
        plan = self._plans.get(id(program))
        if plan is None or not plan.matches(program):
            return None
        return plan

    def _remember(self, program: Program, run: "_Run") -> "ReplayPlan":
        key = id(program)
        plan = ReplayPlan.record(program, run,
                            weakref.ref(program, lambda _, plans=self._plans, k=key: plans.pop(k, None)))
        self._plans[key] = plan
        return plan

    def load(self, program: Program, keep=()):
        """Verify ``program`` (unless done) and load its initial SRAM image, as a chip
        loads a program before running it: its functional runs then start from the loaded
        image, restoring only the lines the previous run changed.

        ``keep``: names of SRAM inputs whose lines are left as they are (see :meth:`run`)."""
        kept = self._kept_lines(program, _names(keep))
        plan = self._plan_of(program)
        if plan is None:
            self.verify(program)
            plan = self._plan_of(program)
        self._sram.start_run(True)
        # Fault in the memory the runs write (fresh pages are slow to touch the first time):
        # the image load zeroes (or restores) the lines marked changed, except the kept ones.
        self._sram.mark(plan.written)
        for _, bank, lo, hi in _binding_lines(program.inputs, self.config.lanes):
            self._sram.mark({bank: (lo, hi)})
        self._accs_for_run().touch()
        Executor(self.config, program, self._sram, None).load_image(plan, kept)

    def read(self, program: Program, name: str) -> np.ndarray:
        """What SRAM binding ``name`` (an input or output) of ``program`` holds now, after the
        runs so far (e.g. a kept KV cache), read as an output is: a new array."""
        cfg = self.config
        b = program.binding(name)
        if getattr(b, "offchip", None) is not None:
            raise ProgramError(f"binding {name!r} is in off-chip memory, which belongs to a single run: "
                               f"only SRAM bindings can be read after it")
        if program.config_hash != cfg.hash:
            raise ProgramError(f"program {program.name or ''!s} was built for machine config "
                               f"{program.config_hash}, but this machine ({cfg.name}) is {cfg.hash}")
        check_layout(b.layout, cfg.lanes, cfg.mem_slices, cfg.lines_per_slice, f"binding {name!r}")
        if self._sram.data is None:
            raise ProgramError(f"cannot read {name!r}: nothing has run on this Simulator yet")
        return read_binding(self._sram, b.layout, cfg.lanes)

    def _kept_lines(self, program: Program, names: frozenset) -> dict:
        """{slice: sorted, disjoint [(lowest, highest line)]} of the inputs ``names`` keeps,
        checked (see :func:`_kept_lines`); computed once per verified program."""
        if not names:
            return {}
        plan = self._plan_of(program)
        key = (id(program), names)
        known = self._kept.get(key)
        if known is not None and plan is not None and known[0] is plan:
            return known[1]
        kept = _kept_lines(program, names, self.config.lanes)
        if plan is not None:
            if len(self._kept) > 1024:
                self._kept.clear()
            self._kept[key] = (plan, kept)
        return kept

    def _replay(self, plan: "ReplayPlan", arrays: dict, kept: dict, outputs=None, trace=None) -> SimResult:
        cfg, program = self.config, plan.program()
        self._sram.start_run(True)
        ex = Executor(cfg, program, self._sram, self._accs_for_run())
        ex.load_image(plan, kept)
        ex.load_inputs(arrays)
        self._sram.mark(plan.written)
        ex.replay(plan.steps)
        return SimResult(ex.read_outputs(outputs), plan.counters.copy(), cfg, trace)


def _names(names) -> frozenset:
    """A collection of binding names (one name alone also)."""
    return frozenset((names,) if isinstance(names, str) else names)


def _binding_lines(bindings, lanes: int):
    """(binding, slice, lowest line, highest line) of each chunk of the SRAM ``bindings``
    (the lines between the vectors of a strided layout included)."""
    for b in bindings:
        lay = b.layout
        if getattr(b, "offchip", None) is not None:
            continue
        for j in range(-(-lay.cols // lanes)):
            for q in range(lay.nchunks):
                (sl, addr), _, n = lay.chunk(j, q)
                last = addr + (n - 1) * lay.row_stride
                yield b, sl, min(addr, last), max(addr, last) + lay.dtype.itemsize - 1


def _kept_lines(program: Program, names: frozenset, lanes: int) -> dict:
    """The lines of the inputs ``names`` of ``program``, {slice: sorted, disjoint [(lowest,
    highest line)]}, after checking that they are SRAM inputs that its initial image leaves
    alone (an image over them would overwrite the state they keep)."""
    inputs = {b.name: b for b in program.inputs}
    unknown = names - inputs.keys()
    if unknown:
        raise ProgramError(f"cannot keep {sorted(unknown)}: not inputs of the program; its inputs are "
                           f"{sorted(inputs)}")
    off = sorted(n for n in names if getattr(inputs[n], "offchip", None) is not None)
    if off:
        raise ProgramError(f"cannot keep {off}: off-chip inputs, whose memory each run starts afresh; only "
                           f"SRAM inputs can be kept")
    spans = defaultdict(list)
    chunks = list(_binding_lines([inputs[n] for n in sorted(names)], lanes))
    if program.sram_init:
        # Every image against each kept chunk, one numpy pass over the images per chunk.
        img = np.array([(m.slice, m.addr, m.addr + len(m.data) // lanes - 1) for m in program.sram_init],
                       np.int64).reshape(-1, 3)
        for b, sl, lo, hi in chunks:
            hit = np.flatnonzero((img[:, 0] == sl) & (img[:, 1] <= hi) & (img[:, 2] >= lo))
            if len(hit):
                _, a, z = (int(x) for x in img[hit[0]])
                raise ProgramError(f"the initial SRAM image at slice {sl} lines {a}..{z} overlaps kept input "
                                   f"{b.name!r} (slice {sl} lines {lo}..{hi}) at lines {max(a, lo)}..{min(z, hi)}: "
                                   f"a program whose image overwrites the state cannot keep it")
    for _, sl, lo, hi in chunks:
        spans[sl].append((lo, hi))
    kept = {}
    for sl, ranges in spans.items():
        merged = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        kept[sl] = merged
    return kept


def _coerce_inputs(program: Program, inputs: dict, functional: bool, kept: frozenset = frozenset()) -> dict:
    """Check the input names (and, for a functional run, that each is there unless kept);
    returns the inputs converted to their layouts' dtypes."""
    names = {b.name for b in program.inputs}
    unknown = set(inputs) - names
    if unknown:
        raise ProgramError(f"unknown input(s) {sorted(unknown)}; the program's inputs are {sorted(names)}")
    fed = sorted(kept & set(inputs))
    if fed:
        raise ProgramError(f"input(s) {fed} are both given and kept (a kept input holds what the previous run "
                           f"left in its lines): give them or keep them")
    if not functional:
        return {}
    arrays = {}
    for b in program.inputs:
        if b.name in kept:
            continue
        if b.name not in inputs:
            raise ProgramError(f"missing input {b.name!r} (shape {tuple(b.layout.shape)}, "
                               f"{b.layout.dtype.short})")
        arrays[b.name] = coerce(b.name, inputs[b.name], b.layout)
    return arrays


@dataclass
class _Run:
    """The schedule checker: drives the unit checks (:mod:`lpx_tvm.sim.checks`) over the
    instructions in issue order. Each instruction's checks resolve where its operands come
    from; what remains, the arithmetic, is recorded as a step (:mod:`lpx_tvm.sim.replay_steps`)
    and, in a functional run (``ex`` set), executed at once."""

    cfg: LPXConfig
    program: Program
    want_trace: bool
    sram: Banked = None
    acc_stamps: Banked = None
    timings: dict = None
    counters: Counters = field(default_factory=Counters)
    wanted: "frozenset | None" = None  # the outputs a functional run reads (None: all)
    # One chip alone: each link loops back. In a system the links' messages come from the
    # other chips (sim/multichip.py fills ``links``), and a send leaves this chip.
    loopback: bool = True

    def __post_init__(self):
        cfg, prog = self.cfg, self.program
        if self.timings is None:
            self.timings = {}
        if prog.isa_version != ISA_VERSION:
            raise ProgramError(f"program uses ISA version {prog.isa_version}; this simulator runs {ISA_VERSION}")
        if prog.config_hash != cfg.hash:
            raise ProgramError(f"program {prog.name or ''!s} was built for machine config {prog.config_hash}, "
                               f"but this machine ({cfg.name}) is {cfg.hash}; rebuild it for {cfg.name}")
        self.trace = TraceRecorder(cfg.clock_hz, prog.name) if self.want_trace else None
        self.ports = Ports(self.counters, self.trace)
        self.streams = StreamNetwork(len(cfg.floorplan), cfg.streams_east, cfg.streams_west)
        self.mxm = mxm.MxmState(cfg)
        self.links = c2c.links(cfg)
        self.host_size = max(prog.host_bytes, len(prog.host_init))
        self.ex = None  # an Executor computing each step as it is recorded
        self.steps = []  # steps (sim/replay_steps.py), in execution order
        self.notes = PlanNotes()  # what the steps read and make, for the replay plan
        self.written = {}  # bank -> (lowest, highest) line written
        for img in prog.sram_init:
            nlines = len(img.data) // cfg.lanes
            if len(img.data) % cfg.lanes or not 0 <= img.slice < cfg.mem_slices or img.addr < 0 \
                    or img.addr + nlines > cfg.lines_per_slice:
                raise ProgramError(f"initial SRAM image at slice {img.slice} line {img.addr} "
                                   f"({len(img.data)} bytes) does not fit the SRAM")
        for b in prog.bindings:
            off = getattr(b, "offchip", None)
            if off is None:
                check_layout(b.layout, cfg.lanes, cfg.mem_slices, cfg.lines_per_slice, f"binding {b.name!r}")
                continue
            lay = b.layout
            nbytes = -(-lay.cols // cfg.lanes) * lay.rows * cfg.lanes * lay.dtype.itemsize
            if off < 0 or off + nbytes > self.host_size:
                raise ProgramError(f"binding {b.name!r}: off-chip bytes {off}..{off + nbytes - 1} outside the "
                                   f"program's {self.host_size} bytes of off-chip memory")

    # ---- driver -----------------------------------------------------------
    def execute(self) -> SimResult:
        """Check every instruction (with an executor ``self.ex``: and compute)."""
        for _ in self.issue():
            pass
        return self.finish()

    def issue(self):
        """Check the instructions in issue order (with an executor ``self.ex``: and
        compute), yielding each one's cycle before it issues: a system of chips
        interleaves its chips' runs by cycle (sim/multichip.py)."""
        cfg, prog, ex = self.cfg, self.program, self.ex
        instrs = prog.instrs
        valid = self.timings  # instructions that passed validate: a pure function of them and the config
        for i, ins in enumerate(instrs):
            if valid.get(id(ins)) is not ins:
                validate(cfg, prog, i, ins)
                if ins.op != "sxm.permute":  # its map is in the program's tables, which may change
                    valid[id(ins)] = ins
        order = sorted(range(len(instrs)), key=lambda i: (instrs[i].cycle, instrs[i].op != "icu.sync"))
        c = self.counters
        max_done, done_before, current = 0, 0, -1
        for n, i in enumerate(order):
            ins = instrs[i]
            yield ins.cycle
            if ins.cycle != current:
                done_before, current = max_done, ins.cycle
            try:
                done = self._step(i, ins, done_before)
            except (Race, StreamFault, nx.NumericsError) as e:
                kind = getattr(e, "kind", "bad-operand")
                raise ScheduleHazard(kind, str(e), index=i, instr=str(ins), unit=queue_name(ins.queue),
                                     cycle=ins.cycle) from None
            max_done = max(max_done, done)
            tagc = c.by_tag[ins.tag]
            tagc.instructions += 1
            tagc.first_cycle = ins.cycle if tagc.first_cycle < 0 else min(tagc.first_cycle, ins.cycle)
            tagc.last_cycle = max(tagc.last_cycle, done)
            if n % 512 == 511:
                gone = self.streams.prune(ins.cycle)
                if gone and ex is not None:
                    ex.free(gone)  # values that left the chip: nothing reads them again
        c.cycles = max_done
        c.instructions = len(instrs)

    def finish(self) -> SimResult:
        outputs = {} if self.ex is None else self.ex.read_outputs(self.wanted)
        return SimResult(outputs, self.counters, self.cfg, self.trace)

    def _step(self, i: int, ins: Instr, done_before: int) -> int:
        op = ins.op
        weights = self.mxm.weights_dtype(ins) if op in ("mxm.mul", "mxm.mac") else None
        key = (id(ins), weights)
        known = self.timings.get(key)
        if known is not None and known[0] is ins:
            t = known[1]
        else:
            t = tm.timing(self.cfg, ins, mxm_weights=weights)
            self.timings[key] = (ins, t)
        self.ports.occupy(i, ins, t)
        handler = _HANDLERS.get(op) or _HANDLERS[op.split(".")[0] + ".*"]
        handler(self, i, ins, t, done_before)
        return t.done

    # ---- what the unit checks call ---------------------------------------------
    def record(self, step, uses: tuple = (), makes: int = None) -> int:
        """Record ``step``, which reads the values of ``uses`` (producers) and makes the
        value of ``makes``; with an executor, run it now. Returns its index."""
        k = len(self.steps)
        self.steps.append(step)
        if uses:
            self.notes.uses.append((k, uses))
        if makes is not None:
            self.notes.made[makes] = k
        if self.ex is not None:
            step.run(self.ex)
        return k

    def read_stream(self, ins: Instr, stream, dtype: DType, position: int, count: int = None) -> StreamOperand:
        """Where the vectors a stream operand reads come from, after the stream checks."""
        em, off = self.streams.read(stream, position, ins.cycle, count or ins.count, dtype)
        return StreamOperand(em.producer, off)

    @staticmethod
    def operand(emission, offset: int) -> StreamOperand:
        return StreamOperand(emission.producer, offset)

    def emit(self, i: int, ins: Instr, t: tm.Timing, dtype: DType, source=None):
        self.streams.emit(ins.dst, t.position, t.emit, dtype, t.emit_count, i, source)

    def note_write(self, bank: int, index):
        lo, hi = _bounds(index)
        self.notes.writes.append((len(self.steps), bank, lo, hi))
        old = self.written.get(bank)
        self.written[bank] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))


_HANDLERS = {**mem.HANDLERS, **dma.HANDLERS, **mxm.HANDLERS, **vxm.HANDLERS, **sxm.HANDLERS, **c2c.HANDLERS,
             **icu.HANDLERS}

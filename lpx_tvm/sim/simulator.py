"""The LPX simulator: runs a Program, checks its static schedule, counts cycles.

Instructions execute in issue-cycle order, each on a whole tile with one numpy call,
so the cost grows with instructions, not cycles or elements. Because the machine has
no stalls, arbiters or caches, the schedule either is valid — then this order gives
exactly the hardware's results and cycle counts — or breaks a rule, and the run stops
with a :class:`~lpx_tvm.errors.ScheduleHazard` naming the instruction, unit and cycle.

The checks (:class:`_Run`) and the arithmetic (:class:`~lpx_tvm.sim.executor.Executor`)
are separate: checking a program records the steps its arithmetic takes, and a
Simulator replays the steps of a program it has verified without checking it again
(docs/design.md, "Verify once, replay").
"""

from __future__ import annotations

import bisect
import gc
import operator
import weakref
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import ProgramError, ScheduleHazard
from ..machine import timing as tm
from ..machine.config import MXM_DTYPES, LPXConfig, load_config
from ..machine.isa import ISA_VERSION, NOPS, VXM_BINARY, VXM_REDUCE, VXM_TRANSCENDENTAL, DType, Instr, Unit, queue_name
from ..machine.layout import check_layout, coerce
from ..machine.program import Program
from . import blas
from . import numerics as nx
from .counters import Counters, port_name
from .executor import Executor
from .memory import Banked, Race, _bounds
from .mxm import Accumulators
from .streams import StreamFault, StreamNetwork
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
        self._plans = {}  # id(program) -> _Plan of a program whose schedule passed every check
        # Pure functions of an (immutable) instruction and the config, computed once per instruction
        # object: id(instr) -> instr once it passed the operand checks; (id(instr), weights' dtype)
        # -> (instr, its Timing).
        self._timings = {}

    def run(self, program: Program, inputs: "dict | None" = None, *, timing_only: bool = False,
            trace: bool = False) -> SimResult:
        """Execute ``program``. In ``timing_only`` mode no arithmetic is done and ``inputs``
        may be omitted; every timing check still runs and the counters are identical.

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
                return self._run(program, inputs or {}, timing_only, trace)
        finally:
            if collect:
                gc.enable()

    def _run(self, program, inputs, timing_only, trace):
        cfg = self.config
        plan = None if timing_only or trace else self._plan_of(program)
        if plan is not None:
            return self._replay(plan, _coerce_inputs(program, inputs, True))
        # mem.gather reads addresses from data: its programs compute while they are checked.
        lockstep = not timing_only and any(ins.op == "mem.gather" for ins in program.instrs)
        self._sram.start_run(lockstep)
        self._acc_stamps.start_run(False)
        if len(self._timings) > 1 << 20:
            self._timings.clear()
        run = _Run(cfg, program, trace, self._sram, self._acc_stamps, self._timings)
        arrays = _coerce_inputs(program, inputs, not timing_only)
        if lockstep:
            ex = Executor(cfg, program, self._sram, self._accs_for_run())
            ex.load_image()
            ex.load_inputs(arrays)
            run.ex = ex
            return run.execute()
        result = run.execute()
        plan = self._plan_of(program) or self._remember(program, run)  # the same steps if checked before
        if timing_only:
            return result
        return self._replay(plan, arrays, result.trace)

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
    def _plan_of(self, program: Program) -> "_Plan | None":
        plan = self._plans.get(id(program))
        if plan is None or not plan.matches(program):
            return None
        return plan

    def _remember(self, program: Program, run: "_Run") -> "_Plan":
        key = id(program)
        plan = _Plan.record(program, run,
                            weakref.ref(program, lambda _, plans=self._plans, k=key: plans.pop(k, None)))
        self._plans[key] = plan
        return plan

    def load(self, program: Program):
        """Verify ``program`` (unless done) and load its initial SRAM image, as a chip
        loads a program before running it: its functional runs then start from the loaded
        image, restoring only the lines the previous run changed."""
        plan = self._plan_of(program)
        if plan is None:
            self.verify(program)
            plan = self._plan_of(program)
        self._sram.start_run(True)
        # Fault in the memory the runs write (fresh pages are slow to touch the first time).
        data = self._sram.data
        for bank, (lo, hi) in plan.written.items():
            data[bank, lo:hi + 1] = 0
        for bank, lo, hi in _input_lines(program, self.config.lanes):
            data[bank, lo:hi + 1] = 0
        self._accs_for_run().touch()
        Executor(self.config, program, self._sram, None).load_image(plan)

    def _replay(self, plan: "_Plan", arrays: dict, trace=None) -> SimResult:
        cfg, program = self.config, plan.program()
        self._sram.start_run(True)
        ex = Executor(cfg, program, self._sram, self._accs_for_run())
        ex.load_image(plan)
        ex.load_inputs(arrays)
        self._sram.mark(plan.written)
        ex.replay(plan.steps)
        return SimResult(ex.read_outputs(), plan.counters.copy(), cfg, trace)


@dataclass
class _Plan:
    """A verified program's steps, with what identifies the program they were made from."""

    program: weakref.ref
    parts: tuple  # the program's fields when it was verified (instructions, images, ...)
    tables: list  # copies of its permutation tables
    steps: list
    written: dict  # bank -> (lowest, highest) line its instructions write
    counters: Counters

    @staticmethod
    def _parts(p: Program) -> tuple:
        return (p.config_hash, p.isa_version, p.host_bytes, p.host_init, tuple(p.instrs), tuple(p.sram_init),
                tuple(p.bindings))

    @classmethod
    def record(cls, program: Program, run: "_Run", ref) -> "_Plan":
        return cls(ref, cls._parts(program), [np.array(t, copy=True) for t in program.tables], run.finalize(),
                   dict(run.written), run.counters.copy())

    def matches(self, p: Program) -> bool:
        """Whether ``p`` is still the program verified (instructions are immutable: compared by identity)."""
        if self.program() is not p:
            return False
        mine = self.parts
        now = self._parts(p)
        return mine[:3] == now[:3] and (mine[3] is now[3] or mine[3] == now[3]) \
            and all(len(a) == len(b) and all(map(operator.is_, a, b)) for a, b in zip(mine[4:], now[4:])) \
            and len(self.tables) == len(p.tables) \
            and all(np.array_equal(a, b) for a, b in zip(self.tables, p.tables))


_PORT_NAMES = {}  # ("mxm.compute", 2) -> "mxm2.compute"


def _input_lines(program: Program, lanes: int):
    """(slice, lowest line, highest line) of each chunk of the program's SRAM inputs."""
    for b in program.inputs:
        lay = b.layout
        if getattr(b, "offchip", None) is not None:
            continue
        for j in range(-(-lay.cols // lanes)):
            for q in range(lay.nchunks):
                (sl, addr), _, n = lay.chunk(j, q)
                last = addr + (n - 1) * lay.row_stride
                yield sl, min(addr, last), max(addr, last) + lay.dtype.itemsize - 1


def _coerce_inputs(program: Program, inputs: dict, functional: bool) -> dict:
    """Check the input names (and, for a functional run, that each is there); returns the
    inputs converted to their layouts' dtypes."""
    names = {b.name for b in program.inputs}
    unknown = set(inputs) - names
    if unknown:
        raise ProgramError(f"unknown input(s) {sorted(unknown)}; the program's inputs are {sorted(names)}")
    if not functional:
        return {}
    arrays = {}
    for b in program.inputs:
        if b.name not in inputs:
            raise ProgramError(f"missing input {b.name!r} (shape {tuple(b.layout.shape)}, "
                               f"{b.layout.dtype.short})")
        arrays[b.name] = coerce(b.name, inputs[b.name], b.layout)
    return arrays


@dataclass
class _WeightBuffer:
    dtype: DType = DType.NONE
    rows: int = 0
    width: int = 0
    ready: "int | None" = None  # cycle from which a multiply may use the weights
    busy_until: int = -1  # last cycle (exclusive) an install or multiply touches it
    installer: int = -1
    producer: int = -1  # the instruction whose values were installed
    key: "tuple | None" = None  # the SRAM lines they came from (see _mxm_install)


@dataclass
class _Block:
    """Float accumulator rows whose K splits wait for one concatenated matmul."""

    width: int
    splits: list = field(default_factory=list)  # (activation producer, weight producer, xkey, K, wkey)
    last_split: int = -1  # step of its last split


def _concat_keys(block: _Block) -> tuple:
    """Keys naming a block's concatenated activations and weights; None where a split's
    operand did not come straight from SRAM lines (unchanged since)."""
    xs = tuple((xkey, k) for _, _, xkey, k, _ in block.splits)
    ws = tuple(wkey for *_, wkey in block.splits)
    return (None if any(x is None for x, _ in xs) else xs,
            None if any(w is None for w in ws) else (ws, block.width))


@dataclass
class _Message:
    arrival: int
    dtype: DType
    count: int
    sender: int
    taken: int = 0


@dataclass
class _Run:
    """The schedule checker. Each instruction's checks resolve where its operands come
    from; what remains, the arithmetic, is recorded as a step (see executor.py) and, in a
    functional run, executed at once."""

    cfg: LPXConfig
    program: Program
    want_trace: bool
    sram: Banked = None
    acc_stamps: Banked = None
    timings: dict = None
    counters: Counters = field(default_factory=Counters)

    def __post_init__(self):
        cfg, prog = self.cfg, self.program
        if self.timings is None:
            self.timings = {}
        if prog.isa_version != ISA_VERSION:
            raise ProgramError(f"program uses ISA version {prog.isa_version}; this simulator runs {ISA_VERSION}")
        if prog.config_hash != cfg.hash:
            raise ProgramError(f"program {prog.name or ''!s} was built for machine config {prog.config_hash}, "
                               f"but this machine ({cfg.name}) is {cfg.hash}; rebuild it for {cfg.name}")
        self.acc_kind = np.zeros((cfg.mxm_planes, cfg.mxm_acc_rows), np.int8)
        self.wbuf = [[_WeightBuffer() for _ in range(cfg.mxm_weight_buffers)] for _ in range(cfg.mxm_planes)]
        self.streams = StreamNetwork(len(cfg.floorplan))
        self.links = [deque() for _ in range(cfg.c2c_links)]
        self.host_size = max(prog.host_bytes, len(prog.host_init))
        self.busy_until = {}
        self.busy_by = {}
        self.ex = None  # an Executor computing each step as it is recorded
        self.steps = []  # (Executor method, arguments), in execution order
        self.written = {}  # bank -> (lowest, highest) line written
        # For finalize(): what each step reads and where values come from.
        self._uses = []  # (step, producers whose values it reads)
        self._made = {}  # producer -> step that makes its value
        self._reads = []  # (step, instruction, slice, lowest line, highest line) of mem.reads that may share
        self._writes = []  # (step, slice, lowest line, highest line) of every SRAM write
        self._fresh = {}  # producer -> vector count, for values made as new arrays (drains, VXM results)
        self._views = []  # (producer, producer whose value it is a view of)
        self._vxm = []  # (step, producer, a, b) of fp32 binary VXM steps, which may compute in place
        self._pending = [dict() for _ in range(cfg.mxm_planes)]  # (addr, count) -> block id
        self._blocks = {}  # block id -> _Block
        self._settles = []  # (step, block id)

        self.trace = TraceRecorder(cfg.clock_hz, prog.name) if self.want_trace else None
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
        cfg, prog, ex = self.cfg, self.program, self.ex
        instrs = prog.instrs
        valid = self.timings  # instructions that passed _validate: a pure function of them and the config
        for i, ins in enumerate(instrs):
            if valid.get(id(ins)) is not ins:
                self._validate(i, ins)
                if ins.op != "sxm.permute":  # its map is in the program's tables, which may change
                    valid[id(ins)] = ins
        order = sorted(range(len(instrs)), key=lambda i: (instrs[i].cycle, instrs[i].op != "icu.sync"))
        c = self.counters
        max_done, done_before, current = 0, 0, -1
        for n, i in enumerate(order):
            ins = instrs[i]
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
        outputs = {} if ex is None else ex.read_outputs()
        return SimResult(outputs, c, cfg, self.trace)

    def _do(self, fn, args: tuple, uses: tuple = (), makes: int = None) -> int:
        """Record a step that reads the values of ``uses`` (producers) and makes the value of
        ``makes``; with an executor, run it now."""
        k = len(self.steps)
        self.steps.append((fn, args))
        if uses:
            self._uses.append((k, uses))
        if makes is not None:
            self._made[makes] = k
        if self.ex is not None:
            fn(self.ex, *args)
        return k

    # ---- the steps of a replay ------------------------------------------------
    def finalize(self) -> list:
        """The steps for replays of this (verified) program, with what only the whole run
        tells: when each value is read for the last time (it is dropped then), which
        concatenated MXM operands a later block reuses (kept until then), and which
        mem.reads may hand out views of the SRAM (no write to their lines while any of
        their values is still read)."""
        steps = list(self.steps)
        last = {}  # producer -> last step reading its value directly
        live = {}  # producer -> last step reading it or a view of it (MXM operands, at the settle)
        for k, ps in self._uses:
            for p in ps:
                last[p] = live[p] = k
        # Concatenated operands: the same key at several settles is computed once.
        at = (defaultdict(list), defaultdict(list))  # activations, weights: key -> settle steps
        for k, bid in self._settles:
            for which, key in enumerate(_concat_keys(self._blocks[bid])):
                if key is not None:
                    at[which][key].append(k)
        action = {}  # (step, 0 for activations / 1 for weights) -> (id, how)
        put_at = {}  # (0 or 1, id) -> the step that computes and keeps it
        for which in (0, 1):
            for cid, ks in enumerate(at[which].values()):
                if len(ks) > 1:
                    action[ks[0], which] = (cid, Accumulators.PUT)
                    put_at[which, cid] = ks[0]
                    for k in ks[1:-1]:
                        action[k, which] = (cid, Accumulators.GET)
                    action[ks[-1], which] = (cid, Accumulators.POP)
        early, batches = self._batch_settles(at[1], action, put_at)
        for k, bid in self._settles:
            xa, wa = action.get((k, 0)), action.get((k, 1))
            fn, args = steps[k]
            if k in early:  # computed at step early[k] with an earlier block that has the same weights
                pop = Accumulators.POP
                steps[k] = (Executor.mxm_settle_early, args[:4] + (xa[0] if xa and xa[1] == pop else None,
                                                                  wa[0] if wa and wa[1] == pop else None))
                for xp, wp, *_ in self._blocks[bid].splits:
                    live[xp] = max(live.get(xp, k), early[k])
                    live[wp] = max(live.get(wp, k), early[k])
                continue
            steps[k] = (fn, args[:-3] + (xa, wa, batches.get(bid, ())))
            for xp, wp, *_ in self._blocks[bid].splits:
                if xa is None or xa[1] == Accumulators.PUT:
                    live[xp] = max(live.get(xp, k), k)
                if wa is None or wa[1] == Accumulators.PUT:
                    live[wp] = max(live.get(wp, k), k)
        for i, p in self._views:
            live[p] = max(live.get(p, -1), live.get(i, -1))
        # In place: an fp32 binary VXM step whose first operand is a whole new array that
        # nothing reads after it.
        for k, i, a, b in self._vxm:
            p, off = a
            if self._fresh.get(p) == steps[k][1][4] and off == 0 and last.get(p) == k == live.get(p) \
                    and (b is None or b[0] != p):
                _, args = steps[k]
                steps[k] = (Executor.vxm_inplace, (i, args[1], p, b, args[7]))
        # Views: a read whose lines no write changes while any of its values is read.
        writes = defaultdict(list)
        for k, bank, lo, hi in self._writes:
            writes[bank].append((k, lo, hi))
        starts = {bank: [w[0] for w in ws] for bank, ws in writes.items()}
        for k, i, bank, lo, hi in self._reads:
            end = live.get(i, k)
            ws = writes.get(bank, ())
            j, stop = bisect.bisect_right(starts.get(bank, ()), k), bisect.bisect_right(starts.get(bank, ()), end)
            if any(wlo <= hi and lo <= whi for _, wlo, whi in ws[j:stop]):
                continue
            fn, args = steps[k]
            steps[k] = (fn, args[:-1] + (False,))
        # Drop each value after its last direct read (at once when nothing reads it).
        drop = defaultdict(list)
        for p, k in self._made.items():
            drop[last.get(p, k)].append(p)
        return [(fn, args, tuple(drop[k]) if k in drop else None) for k, (fn, args) in enumerate(steps)]

    def _batch_settles(self, by_weights: dict, action: dict, put_at: dict) -> tuple:
        """Blocks with the same weights whose splits are all in by the time the first of
        them settles are computed with it, in one matmul of all their rows (a layer's row
        blocks: small ones make slow matmuls). Returns ({step of a block computed early:
        the step computing it}, {id of a first block: ((block id, its activations' action), ...)})."""
        settle_of = dict(self._settles)
        early, batches = {}, {}
        for ks in by_weights.values():
            lead = ks[0]
            batch = []
            for k in ks[1:]:
                bid = settle_of[k]
                if self._blocks[bid].last_split > lead:
                    continue
                xa = action.get((k, 0))
                if xa is not None and xa[1] != Accumulators.PUT:
                    if put_at[0, xa[0]] > lead:
                        continue  # its activations are kept only later
                    xa = (xa[0], Accumulators.GET)  # the block's own step drops them
                batch.append((bid, xa))
                early[k] = lead
            if batch:
                batches[settle_of[lead]] = tuple(batch)
        return early, batches

    def _note_write(self, bank: int, index):
        lo, hi = _bounds(index)
        self._writes.append((len(self.steps), bank, lo, hi))
        old = self.written.get(bank)
        self.written[bank] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))

    # ---- static operand checks ---------------------------------------------
    def _validate(self, i: int, ins: Instr):
        cfg = self.cfg
        unit, idx = ins.queue
        problems = []
        if not 0 <= idx < tm.unit_count(cfg, unit):
            problems.append(f"{unit.name} index {idx} out of range 0..{tm.unit_count(cfg, unit) - 1}")
        for name in ("src0", "src1", "dst"):
            s = getattr(ins, name)
            if s is not None and s.id >= (cfg.streams_east if s.dir == "E" else cfg.streams_west):
                problems.append(f"stream {s} does not exist ({cfg.streams_east} east, {cfg.streams_west} west)")
        spec = ins.spec
        for f in ("src0", "dst"):
            if f in spec.field_names and f not in spec.optional and getattr(ins, f) is None:
                problems.append(f"missing {dict((b, a) for a, b in spec.fields)[f]} stream")
        if "dtype" in spec.field_names and ins.dtype is DType.NONE:
            problems.append("missing dtype")
        op = ins.op
        if op in ("mem.read", "mem.write") and ins.aux0 < 0:
            problems.append(f"inner count {ins.aux0} must be >= 0")
        if op == "dma.load" or op == "dma.store":
            if not 0 <= ins.slice < cfg.mem_slices:
                problems.append(f"slice {ins.slice} out of range 0..{cfg.mem_slices - 1}")
        if unit is Unit.MXM and op not in NOPS:
            if ins.buf >= cfg.mxm_weight_buffers and op != "mxm.drain":
                problems.append(f"weight buffer {ins.buf} out of range 0..{cfg.mxm_weight_buffers - 1}")
            if op == "mxm.install":
                if ins.count > cfg.mxm_rows:
                    problems.append(f"installs {ins.count} rows but a plane has {cfg.mxm_rows}")
                if not 1 <= ins.aux0 <= cfg.mxm_cols:
                    problems.append(f"width {ins.aux0} out of range 1..{cfg.mxm_cols}")
            if op != "mxm.drain" and ins.dtype.short not in MXM_DTYPES:
                problems.append(f"the MXM does not multiply {ins.dtype.short}")
            if op == "mxm.drain" and ins.dtype not in (DType.INT32, DType.FP32):
                problems.append(f"accumulators drain as int32 or fp32, not {ins.dtype.short}")
        if op in VXM_REDUCE and not 1 <= ins.aux0 <= cfg.lanes:
            problems.append(f"width {ins.aux0} out of range 1..{cfg.lanes}")
        if op == "vxm.requant" and (ins.dtype is not DType.INT32 or ins.out_dtype not in (DType.INT8, DType.UINT8)):
            problems.append("requant converts int32 to int8 or uint8")
        if op == "vxm.cvt" and ins.out_dtype is DType.NONE:
            problems.append("missing target dtype")
        if op == "sxm.transpose" and (ins.count > cfg.lanes or not 1 <= ins.aux0 <= cfg.lanes):
            problems.append(f"transpose takes at most {cfg.lanes} vectors and emits 1..{cfg.lanes}")
        if op == "sxm.broadcast" and not 0 <= ins.aux0 < cfg.lanes:
            problems.append(f"lane {ins.aux0} out of range")
        if op == "sxm.permute":
            if not 0 <= ins.aux0 < len(self.program.tables):
                problems.append(f"permutation map {ins.aux0} not in the program's {len(self.program.tables)} tables")
            else:
                t = np.asarray(self.program.tables[ins.aux0])
                if t.shape != (cfg.lanes,) or t.min() < -1 or t.max() >= cfg.lanes:
                    problems.append(f"permutation map {ins.aux0} must have {cfg.lanes} entries in -1..{cfg.lanes - 1}")
        if problems:
            raise ScheduleHazard("bad-operand", "; ".join(problems), index=i, instr=str(ins),
                                 unit=queue_name(ins.queue), cycle=ins.cycle)

    # ---- one instruction ----------------------------------------------------
    def _occupy(self, i: int, ins: Instr, t: tm.Timing):
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

    def _read_stream(self, ins: Instr, stream, dtype: DType, position: int, count: int = None):
        """(producer, offset) of the vectors a stream operand reads, after the stream checks."""
        em, off = self.streams.read(stream, position, ins.cycle, count or ins.count, dtype)
        return em.producer, off

    def _emit(self, i: int, ins: Instr, t: tm.Timing, dtype: DType, source=None):
        self.streams.emit(ins.dst, t.position, t.emit, dtype, t.emit_count, i, source)

    def _step(self, i: int, ins: Instr, done_before: int) -> int:
        op = ins.op
        weights = None
        if op in ("mxm.mul", "mxm.mac"):
            weights = self.wbuf[ins.unit][ins.buf].dtype or None
            if weights is DType.NONE:
                weights = None
        key = (id(ins), weights)
        known = self.timings.get(key)
        if known is not None and known[0] is ins:
            t = known[1]
        else:
            t = tm.timing(self.cfg, ins, mxm_weights=weights)
            self.timings[key] = (ins, t)
        self._occupy(i, ins, t)
        handler = _HANDLERS.get(op) or _HANDLERS[op.split(".")[0] + ".*"]
        handler(self, i, ins, t, done_before)
        return t.done

    # MEM
    def _mem_read(self, i, ins, t, _):
        w = ins.dtype.itemsize
        index = self.sram.read(ins.unit, ins.addr, ins.stride, ins.count, w, ins.cycle, i,
                               inner=ins.aux0, outer=ins.aux1)
        self._count_sram(ins, read=True)
        source = (ins.unit, ins.addr, ins.stride, ins.aux0, ins.aux1, ins.dtype, int(self.sram.generation[ins.unit]))
        self._emit(i, ins, t, ins.dtype, source)
        spec = self.sram.vectors_spec(ins.unit, ins.addr, ins.stride, ins.count, w, w, ins.aux0, ins.aux1)
        if spec is None:
            self._do(Executor.mem_read_lines, (i, ins.unit, index, ins.count, ins.dtype.np), makes=i)
            return
        self._reads.append((len(self.steps), i, ins.unit, *_bounds(index)))  # a replay may share it (finalize)
        self._do(Executor.mem_read, (i, spec, ins.count, ins.dtype.np, True), makes=i)

    def _mem_write(self, i, ins, t, _):
        p, off = self._read_stream(ins, ins.src0, ins.dtype, t.position)
        w = ins.dtype.itemsize
        index = self.sram.write(ins.unit, ins.addr, ins.stride, ins.count, w,
                                ins.cycle + self.cfg.latency["mem_write"], i, inner=ins.aux0, outer=ins.aux1)
        self._note_write(ins.unit, index)
        self._count_sram(ins, read=False)
        spec = self.sram.vectors_spec(ins.unit, ins.addr, ins.stride, ins.count, w, w, ins.aux0, ins.aux1,
                                      write=True)
        if spec is None:
            self._do(Executor.mem_write_lines, (ins.unit, index, p, off, ins.count), (p,))
        else:
            self._do(Executor.mem_write, (spec, p, off, ins.count), (p,))

    def _mem_gather(self, i, ins, t, _):
        # The addresses are data: only a run that computes can check them (see Simulator._run).
        p, off = self._read_stream(ins, ins.src0, DType.INT32, t.position)
        if self.ex is not None:
            idx = self.ex.operand(p, off, ins.count)
            addrs = ins.addr + idx[:, 0].astype(np.int64) * ins.stride
            index = self.sram.gather(ins.unit, addrs, ins.dtype.itemsize, ins.cycle, i)
            self._do(Executor.mem_read_lines, (i, ins.unit, index, ins.count, ins.dtype.np), (p,), i)
        self._count_sram(ins, read=True)
        self._emit(i, ins, t, ins.dtype)

    def _count_sram(self, ins, read: bool):
        nbytes = ins.count * self.cfg.lanes * ins.dtype.itemsize
        tagc = self.counters.by_tag[ins.tag]
        if read:
            self.counters.sram_bytes_read += nbytes
            tagc.sram_bytes_read += nbytes
        else:
            self.counters.sram_bytes_written += nbytes
            tagc.sram_bytes_written += nbytes

    # DMA
    def _host_range(self, ins):
        nbytes = ins.count * self.cfg.lanes * ins.dtype.itemsize
        if ins.aux0 < 0 or ins.aux0 + nbytes > self.host_size:
            raise Race("address-out-of-range", f"off-chip bytes {ins.aux0}..{ins.aux0 + nbytes - 1} outside "
                                               f"the program's {self.host_size} bytes of off-chip memory")
        return ins.aux0, nbytes

    def _dma_load(self, i, ins, t, _):
        lo, nbytes = self._host_range(ins)
        index = self.sram.write(ins.slice, ins.addr, ins.stride, ins.count, ins.dtype.itemsize, t.done, i,
                                per_vector=False)
        self._note_write(ins.slice, index)
        self.counters.offchip_bytes_read += nbytes
        self.counters.sram_bytes_written += nbytes
        self.counters.by_tag[ins.tag].offchip_bytes += nbytes
        self.counters.by_tag[ins.tag].sram_bytes_written += nbytes
        spec = self.sram.vectors_spec(ins.slice, ins.addr, ins.stride, ins.count, ins.dtype.itemsize, 1, write=True)
        if spec is None:
            self._do(Executor.dma_load_lines, (ins.slice, index, lo, lo + nbytes))
        else:
            self._do(Executor.dma_load, (spec, lo, lo + nbytes))

    def _dma_store(self, i, ins, t, _):
        lo, nbytes = self._host_range(ins)
        self.sram.read(ins.slice, ins.addr, ins.stride, ins.count, ins.dtype.itemsize, ins.cycle, i,
                       per_vector=False)
        self.counters.offchip_bytes_written += nbytes
        self.counters.sram_bytes_read += nbytes
        self.counters.by_tag[ins.tag].offchip_bytes += nbytes
        self.counters.by_tag[ins.tag].sram_bytes_read += nbytes
        spec = self.sram.vectors_spec(ins.slice, ins.addr, ins.stride, ins.count, ins.dtype.itemsize, 1)
        self._do(Executor.dma_store, (spec, lo, lo + nbytes))

    # MXM
    def _mxm_install(self, i, ins, t, _):
        buf = self.wbuf[ins.unit][ins.buf]
        if ins.cycle < buf.busy_until:
            raise Race("weights-in-use", f"weight buffer {ins.buf} of plane {ins.unit} is in use until cycle "
                                         f"{buf.busy_until}")
        em, off = self.streams.read(ins.src0, t.position, ins.cycle, ins.count, ins.dtype)
        buf.dtype, buf.rows, buf.width, buf.installer = ins.dtype, ins.count, ins.aux0, i
        buf.ready = t.done
        buf.busy_until = t.done
        buf.producer = em.producer
        # The same SRAM rows, unchanged since, give the same weights: the key says which.
        buf.key = None if em.source is None else em.source + (off, ins.count)
        self._do(Executor.mxm_install, (ins.unit, ins.buf, em.producer, off, ins.count, ins.aux0), (em.producer,))

    def _mxm_multiply(self, i, ins, t, _):
        plane, cfg = ins.unit, self.cfg
        buf = self.wbuf[plane][ins.buf]
        if buf.ready is None:
            raise Race("weights-missing", f"weight buffer {ins.buf} of plane {plane} was never installed")
        if ins.cycle < buf.ready:
            raise Race("weights-not-ready", f"weight buffer {ins.buf} of plane {plane} is installed by "
                                            f"instruction #{buf.installer} only at cycle {buf.ready}")
        kind = nx.acc_kind(ins.dtype)
        if kind != nx.acc_kind(buf.dtype) or (kind == nx.ACC_FLOAT and ins.dtype != buf.dtype):
            raise Race("dtype-mismatch", f"{ins.dtype.short} activations cannot multiply {buf.dtype.short} "
                                         f"weights in buffer {ins.buf}")
        em, off = self.streams.read(ins.src0, t.position, ins.cycle, ins.count, ins.dtype)
        rate = tm.mxm_rate(cfg, ins.dtype, buf.dtype)
        n, rows = ins.count, slice(ins.addr, ins.addr + ins.count)
        self.acc_stamps.check_range(plane, ins.addr, 1, n, 1, "accumulator row")
        land = tm.mxm_row_landing(cfg, ins, rate, 0)
        if ins.op == "mxm.mac":
            kinds = self.acc_kind[plane, rows]
            if (kinds != kind).any():
                bad = int(np.flatnonzero(kinds != kind)[0])
                what = "never written" if kinds[bad] == 0 else "of the other accumulator type"
                raise Race("dtype-mismatch" if kinds[bad] else "acc-read-before-write",
                           f"mac onto accumulator row {ins.addr + bad} of plane {plane}, which is {what}")
            self._acc_access(plane, ins, rate, land - 1, i, read=True)
        self._acc_access(plane, ins, rate, land, i, read=False)
        self.acc_kind[plane, rows] = kind
        buf.busy_until = max(buf.busy_until, ins.cycle + t.occupancy)
        macs = n * buf.rows * buf.width
        self.counters.macs += macs
        self.counters.by_tag[ins.tag].macs += macs
        xkey = None if em.source is None else em.source + (off, n)
        self._mxm_arith(plane, ins.buf, buf, ins.addr, n, em.producer, off, xkey, kind, ins.op == "mxm.mac")

    def _mxm_arith(self, plane, b, buf, addr, n, xp, off, xkey, kind, accumulate):
        """The multiply's arithmetic. Float accumulators keep a row block's splits pending
        until its rows are read or partly overwritten (see mxm.py), the rest is computed at once."""
        key = (addr, n)
        pending = self._pending[plane]
        if kind == nx.ACC_FLOAT:
            bid = None if not accumulate else pending.get(key)
            if bid is not None and self._blocks[bid].width != buf.width:
                bid = None
            if bid is None and not accumulate:
                self._settle(plane, addr, n)
                bid = pending[key] = len(self._blocks)
                self._blocks[bid] = _Block(buf.width)
            if bid is not None:
                self._blocks[bid].splits.append((xp, buf.producer, xkey, buf.rows, buf.key))
                self._blocks[bid].last_split = self._do(Executor.mxm_split, (plane, b, bid, xp, off, n), (xp,))
                return
        self._settle(plane, addr, n)
        self._do(Executor.mxm_now, (plane, b, addr, xp, off, n, buf.key, kind, accumulate), (xp, buf.producer))

    def _settle(self, plane, addr, n):
        """Compute the pending blocks overlapping rows ``addr .. addr + n - 1``."""
        pending = self._pending[plane]
        for key in [k for k in pending if k[0] < addr + n and addr < k[0] + k[1]]:
            bid = pending.pop(key)
            self._settles.append((len(self.steps), bid))
            self._do(Executor.mxm_settle, (plane, bid, key[0], key[1], None, None, ()))

    def _acc_access(self, plane, ins, rate, first, i, read):
        # Accumulator rows land one every `rate` cycles: stamp each row with its own cycle.
        self.acc_stamps.access_rows(plane, slice(ins.addr, ins.addr + ins.count), first, rate, i, read=read)

    def _mxm_drain(self, i, ins, t, _):
        plane = ins.unit
        self.acc_stamps.check_range(plane, ins.addr, 1, ins.count, 1, "accumulator row")
        rows = slice(ins.addr, ins.addr + ins.count)
        want = nx.ACC_INT if ins.dtype is DType.INT32 else nx.ACC_FLOAT
        kinds = self.acc_kind[plane, rows]
        if (kinds != want).any():
            bad = int(np.flatnonzero(kinds != want)[0])
            raise Race("dtype-mismatch" if kinds[bad] else "acc-read-before-write",
                       f"drain as {ins.dtype.short} of accumulator row {ins.addr + bad} of plane {plane}, which "
                       + ("was never written" if kinds[bad] == 0 else "holds the other accumulator type"))
        self._acc_access(plane, ins, 1, ins.cycle, i, read=True)
        self._settle(plane, ins.addr, ins.count)
        self._do(Executor.mxm_drain, (i, plane, ins.addr, ins.count, want), makes=i)
        self._fresh[i] = ins.count
        self._emit(i, ins, t, ins.dtype)

    # VXM
    def _vxm(self, i, ins, t, _):
        op, dt = ins.op, ins.dtype
        a = self._read_stream(ins, ins.src0, dt, t.position)
        b = imm = None
        out_dt = dt
        if op in VXM_BINARY or op == "vxm.requant":
            if ins.src1 is not None:
                b = self._read_stream(ins, ins.src1, DType.FP32 if op == "vxm.requant" else dt, t.position)
            else:
                imm = float(np.float32(ins.imm)) if op == "vxm.requant" else nx.imm_value(ins.imm, dt)
        if op in VXM_TRANSCENDENTAL and not dt.is_float:
            raise nx.NumericsError(f"{op} needs a float dtype, got {dt.short}")
        if op in ("vxm.cvt", "vxm.requant"):
            out_dt = ins.out_dtype
        if op == "vxm.reduce_sum" and dt in (DType.INT8, DType.UINT8):
            raise nx.NumericsError("reduce_sum of int8/uint8 would overflow; convert to int32 first")
        k = self._do(Executor.vxm, (i, op, dt, out_dt, ins.count, a, b, imm, ins.aux0),
                     (a[0],) if b is None else (a[0], b[0]), i)
        self._fresh[i] = ins.count
        if op in VXM_BINARY and dt is DType.FP32:
            self._vxm.append((k, i, a, b))
        self._emit(i, ins, t, out_dt)

    # SXM
    def _sxm(self, i, ins, t, _):
        a = self._read_stream(ins, ins.src0, ins.dtype, t.position)
        self._do(Executor.sxm, (i, ins.op, ins.count, a, ins.aux0, ins.aux1), (a[0],), i)
        self._emit(i, ins, t, ins.dtype)

    # C2C: each link loops back to this chip.
    def _c2c_send(self, i, ins, t, _):
        p, off = self._read_stream(ins, ins.src0, ins.dtype, t.position)
        self.links[ins.unit].append(_Message(t.done, ins.dtype, ins.count, i))
        nbytes = ins.count * self.cfg.lanes * ins.dtype.itemsize
        self.counters.c2c_bytes_sent += nbytes
        self._do(Executor.c2c_send, (i, p, off, ins.count), (p,), i)
        self._views.append((i, p))

    def _c2c_recv(self, i, ins, t, _):
        link, need, parts = self.links[ins.unit], ins.count, []
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
        self._do(Executor.c2c_recv, (i, tuple(parts)), tuple(s for s, _, _ in parts), i)
        self._emit(i, ins, t, ins.dtype)

    def _sync(self, i, ins, t, done_before):
        if done_before > ins.cycle:
            raise Race("sync-in-flight", f"sync at cycle {ins.cycle} while earlier instructions complete "
                                         f"only at cycle {done_before}")

    def _nop(self, i, ins, t, _):
        pass


_HANDLERS = {
    "mem.read": _Run._mem_read,
    "mem.write": _Run._mem_write,
    "mem.gather": _Run._mem_gather,
    "dma.load": _Run._dma_load,
    "dma.store": _Run._dma_store,
    "mxm.install": _Run._mxm_install,
    "mxm.mul": _Run._mxm_multiply,
    "mxm.mac": _Run._mxm_multiply,
    "mxm.drain": _Run._mxm_drain,
    "vxm.*": _Run._vxm,
    "sxm.*": _Run._sxm,
    "c2c.send": _Run._c2c_send,
    "c2c.recv": _Run._c2c_recv,
    "icu.sync": _Run._sync,
    **{op: _Run._nop for op in NOPS},
}

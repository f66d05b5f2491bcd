"""The LPX simulator: runs a Program, checks its static schedule, counts cycles.

Instructions execute in issue-cycle order, each on a whole tile with one numpy call,
so the cost grows with instructions, not cycles or elements. Because the machine has
no stalls, arbiters or caches, the schedule either is valid — then this order gives
exactly the hardware's results and cycle counts — or breaks a rule, and the run stops
with a :class:`~lpx_tvm.errors.ScheduleHazard` naming the instruction, unit and cycle.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import ProgramError, ScheduleHazard
from ..target import timing as tm
from ..target.config import MXM_DTYPES, LPXConfig, load_config
from ..target.isa import ISA_VERSION, NOPS, VXM_BINARY, VXM_REDUCE, VXM_TRANSCENDENTAL, DType, Instr, Unit, queue_name
from ..target.layout import check_layout, coerce, read_tensor, tensor_tiles
from ..target.program import Program
from . import numerics as nx
from .counters import Counters, port_name
from .memory import Banked, Race
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

    def run(self, program: Program, inputs: "dict | None" = None, *, timing_only: bool = False,
            trace: bool = False) -> SimResult:
        """Execute ``program``. In ``timing_only`` mode no arithmetic is done and ``inputs``
        may be omitted; every timing check still runs and the counters are identical.

        A Simulator reuses its SRAM and accumulator arrays from run to run; use one
        Simulator per thread.
        """
        cfg = self.config
        if not timing_only and self._accs is None:
            self._accs = Accumulators(cfg.mxm_planes, cfg.mxm_acc_rows, cfg.lanes)
        self._sram.start_run(not timing_only)
        self._acc_stamps.start_run(False)
        if self._accs is not None:
            self._accs.start_run()
        run = _Run(cfg, program, timing_only, trace, self._sram, self._acc_stamps,
                   None if timing_only else self._accs)
        return run.execute(inputs or {})


@dataclass
class _WeightBuffer:
    dtype: DType = DType.NONE
    rows: int = 0
    width: int = 0
    matrix: "np.ndarray | None" = None
    ready: "int | None" = None  # cycle from which a multiply may use the weights
    busy_until: int = -1  # last cycle (exclusive) an install or multiply touches it
    installer: int = -1


@dataclass
class _Message:
    arrival: int
    dtype: DType
    data: "np.ndarray | None"
    count: int
    sender: int
    taken: int = 0


@dataclass
class _Run:
    cfg: LPXConfig
    program: Program
    timing_only: bool
    want_trace: bool
    sram: Banked = None
    acc_stamps: Banked = None
    accs: "Accumulators | None" = None
    counters: Counters = field(default_factory=Counters)

    def __post_init__(self):
        cfg, prog = self.cfg, self.program
        if prog.isa_version != ISA_VERSION:
            raise ProgramError(f"program uses ISA version {prog.isa_version}; this simulator runs {ISA_VERSION}")
        if prog.config_hash != cfg.hash:
            raise ProgramError(f"program {prog.name or ''!s} was built for machine config {prog.config_hash}, "
                               f"but this machine ({cfg.name}) is {cfg.hash}; rebuild it for {cfg.name}")
        functional = not self.timing_only
        self.acc_kind = np.zeros((cfg.mxm_planes, cfg.mxm_acc_rows), np.int8)
        self.wbuf = [[_WeightBuffer() for _ in range(cfg.mxm_weight_buffers)] for _ in range(cfg.mxm_planes)]
        self.streams = StreamNetwork(len(cfg.floorplan))
        self.links = [deque() for _ in range(cfg.c2c_links)]
        self.host = np.zeros(max(prog.host_bytes, len(prog.host_init)), np.uint8)
        if prog.host_init:
            self.host[:len(prog.host_init)] = np.frombuffer(prog.host_init, np.uint8)
        self.busy_until = {}
        self.busy_by = {}
        self._installed = {}  # converted weight matrices by SRAM source

        self.trace = TraceRecorder(cfg.clock_hz, prog.name) if self.want_trace else None
        for img in prog.sram_init:
            nlines = len(img.data) // cfg.lanes
            if len(img.data) % cfg.lanes or not 0 <= img.slice < cfg.mem_slices or img.addr < 0 \
                    or img.addr + nlines > cfg.lines_per_slice:
                raise ProgramError(f"initial SRAM image at slice {img.slice} line {img.addr} "
                                   f"({len(img.data)} bytes) does not fit the SRAM")
            raw = np.frombuffer(img.data, np.uint8).reshape(nlines, cfg.lanes)
            self.sram.poke(img.slice, np.arange(img.addr, img.addr + nlines), raw)
        for b in prog.bindings:
            check_layout(b.layout, cfg.lanes, cfg.mem_slices, cfg.lines_per_slice, f"binding {b.name!r}")

    # ---- driver -----------------------------------------------------------
    def execute(self, inputs: dict) -> SimResult:
        cfg, prog = self.cfg, self.program
        self._load_inputs(inputs)
        instrs = prog.instrs
        for i, ins in enumerate(instrs):
            self._validate(i, ins)
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
                self.streams.prune(ins.cycle)
        c.cycles = max_done
        c.instructions = len(instrs)
        outputs = {} if self.timing_only else self._read_outputs()
        return SimResult(outputs, c, cfg, self.trace)

    def _load_inputs(self, inputs: dict):
        names = {b.name for b in self.program.inputs}
        unknown = set(inputs) - names
        if unknown:
            raise ProgramError(f"unknown input(s) {sorted(unknown)}; the program's inputs are {sorted(names)}")
        if self.timing_only:
            return
        for b in self.program.inputs:
            if b.name not in inputs:
                raise ProgramError(f"missing input {b.name!r} (shape {tuple(b.layout.shape)}, "
                                   f"{b.layout.dtype.short})")
            arr = coerce(b.name, inputs[b.name], b.layout)
            for sl, lines, raw in tensor_tiles(b.layout, arr, self.cfg.lanes):
                self.sram.poke(sl, lines, raw)

    def _read_outputs(self) -> dict:
        return {b.name: read_tensor(b.layout, self.sram.peek, self.cfg.lanes) for b in self.program.outputs}

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
            pname = port_name(port)
            c.port_busy_cycles[pname] += t.occupancy
            tagc.busy_cycles += t.occupancy
            if self.trace is not None:
                self.trace.add(queue_name(ins.queue), pname, ins.op, ins.cycle, t.occupancy, i, ins.tag)

    def _take(self, ins: Instr, stream, dtype: DType, position: int, count: int = None):
        return self.streams.read(stream, position, ins.cycle, count or ins.count, dtype)[2]

    def _emit(self, i: int, ins: Instr, t: tm.Timing, dtype: DType, data):
        self.streams.emit(ins.dst, t.position, t.emit, dtype, data, t.emit_count, i)

    def _step(self, i: int, ins: Instr, done_before: int) -> int:
        op = ins.op
        weights = None
        if op in ("mxm.mul", "mxm.mac"):
            weights = self.wbuf[ins.unit][ins.buf].dtype or None
            if weights is DType.NONE:
                weights = None
        t = tm.timing(self.cfg, ins, mxm_weights=weights)
        self._occupy(i, ins, t)
        handler = _HANDLERS.get(op) or _HANDLERS[op.split(".")[0] + ".*"]
        handler(self, i, ins, t, done_before)
        return t.done

    # MEM
    def _mem_read(self, i, ins, t, _):
        data = self.sram.read(ins.unit, ins.addr, ins.stride, ins.count, ins.dtype.np, ins.cycle, i,
                              inner=ins.aux0, outer=ins.aux1)
        self._count_sram(ins, read=True)
        source = (ins.unit, ins.addr, ins.stride, ins.aux0, ins.aux1, ins.dtype, int(self.sram.generation[ins.unit]))
        self.streams.emit(ins.dst, t.position, t.emit, ins.dtype, data, t.emit_count, i, source)

    def _mem_write(self, i, ins, t, _):
        data = self._take(ins, ins.src0, ins.dtype, t.position)
        self.sram.write(ins.unit, ins.addr, ins.stride, ins.count, data, ins.dtype.np,
                        ins.cycle + self.cfg.latency["mem_write"], i, inner=ins.aux0, outer=ins.aux1)
        self._count_sram(ins, read=False)

    def _mem_gather(self, i, ins, t, _):
        idx = self._take(ins, ins.src0, DType.INT32, t.position)
        data = None
        if idx is not None:
            addrs = ins.addr + idx[:, 0].astype(np.int64) * ins.stride
            data = self.sram.gather(ins.unit, addrs, ins.dtype.np, ins.cycle, i)
        self._count_sram(ins, read=True)
        self._emit(i, ins, t, ins.dtype, data)

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
        if ins.aux0 < 0 or ins.aux0 + nbytes > len(self.host):
            raise Race("address-out-of-range", f"off-chip bytes {ins.aux0}..{ins.aux0 + nbytes - 1} outside "
                                               f"the program's {len(self.host)} bytes of off-chip memory")
        return slice(ins.aux0, ins.aux0 + nbytes), nbytes

    def _dma_load(self, i, ins, t, _):
        rng, nbytes = self._host_range(ins)
        data = None
        if not self.timing_only:
            data = self.host[rng].view(ins.dtype.np).reshape(ins.count, self.cfg.lanes)
        self.sram.write(ins.slice, ins.addr, ins.stride, ins.count, data, ins.dtype.np, t.done, i,
                        per_vector=False)
        self.counters.offchip_bytes_read += nbytes
        self.counters.sram_bytes_written += nbytes
        self.counters.by_tag[ins.tag].offchip_bytes += nbytes
        self.counters.by_tag[ins.tag].sram_bytes_written += nbytes

    def _dma_store(self, i, ins, t, _):
        rng, nbytes = self._host_range(ins)
        data = self.sram.read(ins.slice, ins.addr, ins.stride, ins.count, ins.dtype.np, ins.cycle, i,
                              per_vector=False)
        if data is not None:
            self.host[rng] = np.ascontiguousarray(data).view(np.uint8).ravel()
        self.counters.offchip_bytes_written += nbytes
        self.counters.sram_bytes_read += nbytes
        self.counters.by_tag[ins.tag].offchip_bytes += nbytes
        self.counters.by_tag[ins.tag].sram_bytes_read += nbytes

    # MXM
    def _mxm_install(self, i, ins, t, _):
        buf = self.wbuf[ins.unit][ins.buf]
        if ins.cycle < buf.busy_until:
            raise Race("weights-in-use", f"weight buffer {ins.buf} of plane {ins.unit} is in use until cycle "
                                         f"{buf.busy_until}")
        em, off, rows = self.streams.read(ins.src0, t.position, ins.cycle, ins.count, ins.dtype)
        buf.dtype, buf.rows, buf.width, buf.installer = ins.dtype, ins.count, ins.aux0, i
        buf.matrix = None if rows is None else self._weights_matrix(em, off, rows, ins.aux0)
        buf.ready = t.done
        buf.busy_until = t.done

    def _weights_matrix(self, em, off, rows, width):
        """The installed matrix; the same SRAM rows (unchanged since) convert only once, as a
        layer installs each weight tile once per output block."""
        if em.source is None:
            return nx.weights_matrix(rows, width)
        key = (em.source, off, len(rows), width)
        matrix = self._installed.get(key)
        if matrix is None:
            if len(self._installed) >= 256:
                self._installed.pop(next(iter(self._installed)))
            matrix = self._installed[key] = nx.weights_matrix(rows, width)
        return matrix

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
        em, off, x = self.streams.read(ins.src0, t.position, ins.cycle, ins.count, ins.dtype)
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
        if x is None:
            return
        source = None if em.source is None else em.source + (off, n)
        self.accs.multiply(plane, ins.addr, x, source, buf.matrix, buf.width, kind, ins.op == "mxm.mac")

    def _acc_access(self, plane, ins, rate, first, i, read):
        # Accumulator rows land one every `rate` cycles: stamp each row with its own cycle.
        rows = slice(ins.addr, ins.addr + ins.count)
        cycles = first + rate * np.arange(ins.count, dtype=np.int64)
        self.acc_stamps.access_rows(plane, rows, cycles, i, read=read)

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
        data = None
        if not self.timing_only:
            data = self.accs.read(plane, ins.addr, ins.count, want)
        self._emit(i, ins, t, ins.dtype, data)

    # VXM
    def _vxm(self, i, ins, t, _):
        op, dt = ins.op, ins.dtype
        a = self._take(ins, ins.src0, dt, t.position)
        b = None
        out_dt = dt
        if op in VXM_BINARY or op == "vxm.requant":
            if ins.src1 is not None:
                b = self._take(ins, ins.src1, DType.FP32 if op == "vxm.requant" else dt, t.position)
            else:
                b = float(np.float32(ins.imm)) if op == "vxm.requant" else nx.imm_value(ins.imm, dt)
        if op in VXM_TRANSCENDENTAL and not dt.is_float:
            raise nx.NumericsError(f"{op} needs a float dtype, got {dt.short}")
        if op in ("vxm.cvt", "vxm.requant"):
            out_dt = ins.out_dtype
        if op == "vxm.reduce_sum" and dt in (DType.INT8, DType.UINT8):
            raise nx.NumericsError("reduce_sum of int8/uint8 would overflow; convert to int32 first")
        self._emit(i, ins, t, out_dt, None if a is None else self._vxm_compute(ins, a, b, out_dt))

    @staticmethod
    def _vxm_compute(ins, a, b, out_dt):
        op, dt = ins.op, ins.dtype
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are the hardware's, not errors
            if op in VXM_BINARY:
                return nx.binary(op, a, b, dt)
            if op in VXM_TRANSCENDENTAL:
                return nx.unary(op, a, dt)
            if op == "vxm.cvt":
                return nx.to_dtype(a.astype(np.float64) if dt.is_float else a, out_dt)
            if op == "vxm.requant":
                return nx.requant(a, b, ins.aux0, out_dt)
            return nx.reduce(op, a, ins.aux0, dt)

    # SXM
    def _sxm(self, i, ins, t, _):
        op, dt = ins.op, ins.dtype
        a = self._take(ins, ins.src0, dt, t.position)
        out = None
        if a is not None:
            if op == "sxm.shift":
                out = nx.shift(a, ins.aux0)
            elif op == "sxm.rotate":
                out = nx.rotate(a, ins.aux0)
            elif op == "sxm.permute":
                out = nx.permute(a, np.asarray(self.program.tables[ins.aux0]))
            elif op == "sxm.transpose":
                out = nx.transpose(a, ins.aux0)
            elif op == "sxm.broadcast":
                out = nx.broadcast(a, ins.aux0)
            else:
                out = nx.pad(a, ins.aux0, ins.aux1)
        self._emit(i, ins, t, dt, out)

    # C2C: each link loops back to this chip.
    def _c2c_send(self, i, ins, t, _):
        data = self._take(ins, ins.src0, ins.dtype, t.position)
        self.links[ins.unit].append(_Message(t.done, ins.dtype, data, ins.count, i))
        nbytes = ins.count * self.cfg.lanes * ins.dtype.itemsize
        self.counters.c2c_bytes_sent += nbytes

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
            if m.data is not None:
                parts.append(m.data[m.taken:m.taken + k])
            m.taken += k
            need -= k
            if m.taken == m.count:
                link.popleft()
        data = np.concatenate(parts) if parts else None
        self._emit(i, ins, t, ins.dtype, data)

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

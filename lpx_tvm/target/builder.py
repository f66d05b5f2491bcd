"""ProgramBuilder: write LPX kernels as small dataflow groups; the scheduler times them.

Example: copy a tensor through the VXM, adding one::

    b = ProgramBuilder("mini")
    x = b.input("x", (64, 16), "fp32")
    y = b.output("y", (64, 16), "fp32")
    g = b.group("add_one")
    g.write(g.vxm("vxm.add", g.read(x.tile(0)), imm=1.0), y.tile(0))
    program = b.build()

Each ``group`` is rigid (its instructions are tied by streams); ``build`` places the
groups at exact cycles with :mod:`lpx_tvm.target.placer` and allocates streams.

The builder is a facade over three jobs, each a module of its own: SRAM planning
(:mod:`.sram_plan`), the program image and its bindings (:mod:`.program_image`) and the
group schedule (:mod:`.group_schedule`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import SchedulingError
from ..machine.config import LPXConfig, load_config
from ..machine.effects import instr_effects
from ..machine.isa import DType, Instr, Unit
from ..machine.program import Program, TensorLayout
from ..machine.timing import install_lanes, unit_count, unit_position
from .group_schedule import Arrival, Barrier, GroupSchedule
from .placer import UNIT_OF_PREFIX, Placer
from .program_image import OffchipTensor, ProgramImage
from .sram_plan import SharedSram, SramPlan, SramSpan, SramTensor, chunk_lines

__all__ = ["Arrival", "Barrier", "Group", "Node", "OffchipTensor", "ProgramBuilder", "SharedSram", "SramSpan",
           "SramTensor", "Value", "chunk_lines", "install_parts"]


@dataclass(eq=False)
class Value:
    """A stream value: ``count`` vectors of ``dtype`` emitted by ``node``; a part of one
    (:meth:`part`) is read ``offset`` vectors into it."""

    node: "Node"
    count: int
    dtype: DType
    consumers: list = field(default_factory=list)
    base: "Value | None" = None
    offset: int = 0

    def part(self, offset: int, count: int) -> "Value":
        root = self.base or self
        if offset < 0 or self.offset + offset + count > root.count:
            raise SchedulingError(f"part {offset}:{offset + count} of a value of {self.count} vectors")
        return Value(self.node, count, self.dtype, base=root, offset=self.offset + offset)


@dataclass(eq=False)
class Node:
    op: str
    count: int
    units: tuple  # alternative unit indices (equivalent, same floorplan position)
    fields: dict
    inputs: list  # [(instr field, Value)]
    effects: list  # [Effect] relative to the node's issue (machine.effects.instr_effects)
    out: "Value | None" = None
    weights: "DType | None" = None
    offset: int = 0
    timings: dict = field(default_factory=dict)  # unit -> Timing (the node never changes)

    def probe(self, unit: int) -> Instr:
        return Instr(self.op, 0, unit=unit, count=self.count, **self.fields)


def install_parts(segments, per: int) -> list:
    """[(segment's first row, its SramSpan, offset in it, rows)]: each segment cut into parts
    of at most ``per`` rows."""
    return [(row0, region, a, min(region.count, a + per) - a) for row0, region in segments
            for a in range(0, region.count, per)]


def _lane_load(parts, lanes: int) -> int:
    """Rows the busiest install lane takes when ``parts`` go to lanes in turn."""
    load = [0] * lanes
    for i, part in enumerate(parts):
        load[i % lanes] += part[-1]
    return max(load)


class Group:
    """A rigid set of instructions connected by streams, tagged with the op it implements."""

    def __init__(self, builder: "ProgramBuilder", tag: str):
        self.b = builder
        self.cfg = builder.config
        self.tag = tag
        self.nodes = []

    # -- helpers -------------------------------------------------------------
    def _node(self, op, count, units, fields, inputs=(), out_dtype=None, out_count=None, weights=None,
              lines=None) -> Node:
        node = Node(op, count, tuple(units), fields, list(inputs), [], weights=weights)
        node.effects = instr_effects(self.cfg, node.probe(node.units[0]), weights=weights, lines=lines,
                                     loopback=self.b.loopback)
        for f, v in node.inputs:
            if v.node not in self.nodes:
                raise SchedulingError(f"{op}: its {f} operand comes from another group; values do not "
                                      "cross groups (write it to SRAM and read it again)")
            (v.base or v).consumers.append((node, f))
        if out_dtype is not None:
            node.out = Value(node, out_count or count, DType.parse(out_dtype))
        self.nodes.append(node)
        return node

    @staticmethod
    def _check_count(v: Value, n: int, what: str):
        if v.count != n:
            raise SchedulingError(f"{what}: the value has {v.count} vectors but {n} are expected")

    def again(self, v: Value) -> Value:
        """Compute ``v`` a second time (same op, same operands) on another unit, e.g. to
        send it both east and west: one stream value flows one way only."""
        n = v.node
        if n.op.split(".")[0] not in ("vxm", "sxm"):
            raise SchedulingError(f"only VXM and SXM values can be recomputed, not {n.op}")
        twin = self._node(n.op, n.count, n.units, dict(n.fields), list(n.inputs), out_dtype=n.out.dtype, out_count=n.out.count)
        out = twin.out
        return out if v.base is None else out.part(v.offset, v.count)

    # -- MEM -----------------------------------------------------------------
    def read(self, region: SramSpan) -> Value:
        node = self._node("mem.read", region.count, (region.slice,), region._fields(), out_dtype=region.dtype)
        return node.out

    def write(self, v: Value, region: SramSpan):
        self._check_count(v, region.count, "write")
        if v.dtype != region.dtype:
            raise SchedulingError(f"write: value is {v.dtype.short}, region is {region.dtype.short}")
        self._node("mem.write", region.count, (region.slice,), region._fields(), inputs=[("src0", v)])

    def gather(self, index: Value, table: SramSpan) -> Value:
        """Rows of ``table`` picked by lane 0 of each int32 vector of ``index``."""
        node = self._node("mem.gather", index.count, (table.slice,), dict(addr=table.addr, stride=table.stride,
                                                                          dtype=table.dtype),
                          inputs=[("src0", index)], out_dtype=table.dtype, lines=table.lines)
        return node.out

    def scatter(self, values: Value, index: Value, table: SramSpan):
        """Each vector of ``values`` to the row of ``table`` that lane 0 of the same vector
        of ``index`` (int32) names. The lines are data: the whole table counts as written."""
        self._check_count(values, index.count, "scatter")
        if values.dtype != table.dtype:
            raise SchedulingError(f"scatter: values are {values.dtype.short}, the table is {table.dtype.short}")
        self._node("mem.scatter", index.count, (table.slice,), dict(addr=table.addr, stride=table.stride,
                                                                    dtype=table.dtype),
                   inputs=[("src0", values), ("src1", index)], lines=table.lines)

    def dma_load(self, host: int, region: SramSpan, engine: int = 0):
        self._node("dma.load", region.count, (engine,), dict(slice=region.slice, addr=region.addr,
                                                              stride=region.stride, dtype=region.dtype, aux0=host))

    def dma_store(self, region: SramSpan, host: int, engine: int = 0):
        self._node("dma.store", region.count, (engine,), dict(slice=region.slice, addr=region.addr,
                                                               stride=region.stride, dtype=region.dtype, aux0=host))

    # -- MXM -----------------------------------------------------------------
    def install(self, plane: int, buf: int, v: Value, width: int, row: int = 0, lane: int = 0):
        """Install ``v.count`` weight rows of ``width`` columns (N) into rows ``row ..`` of a
        weight buffer through install lane ``lane``. The installs into a buffer between two
        multiplies together fill its rows 0..K-1 (see :meth:`ProgramBuilder.install`)."""
        self._node("mxm.install", v.count, (plane,), dict(buf=buf, dtype=v.dtype, aux0=width, addr=row, aux1=lane),
                   inputs=[("src0", v)])
        self.b._installed[(plane, buf)] = v.dtype

    def mul(self, plane: int, buf: int, v: Value, acc: int, accumulate: bool = False):
        """Multiply each vector of ``v`` by the installed weights into accumulator rows ``acc..``."""
        weights = self.b._installed.get((plane, buf))
        if weights is None:
            raise SchedulingError(f"mul on plane {plane} buffer {buf} before any install into it")
        self._node("mxm.mac" if accumulate else "mxm.mul", v.count, (plane,), dict(buf=buf, addr=acc, dtype=v.dtype),
                   inputs=[("src0", v)], weights=weights)

    def drain(self, plane: int, acc: int, count: int, dtype) -> Value:
        node = self._node("mxm.drain", count, (plane,), dict(addr=acc, dtype=DType.parse(dtype)), out_dtype=dtype)
        return node.out

    # -- VXM -----------------------------------------------------------------
    def vxm(self, op: str, a: Value, b: "Value | None" = None, *, imm: float = 0.0, to=None, zp: int = 0,
            width: int = 0, alu: "int | None" = None) -> Value:
        """One VXM op on the whole value; ``b`` is a second stream operand or ``imm`` a scalar."""
        fields = dict(dtype=a.dtype)
        inputs = [("src0", a)]
        if b is not None:
            self._check_count(b, a.count, op)
            inputs.append(("src1", b))
        elif op in ("vxm.add", "vxm.sub", "vxm.mul", "vxm.max", "vxm.min", "vxm.requant"):
            fields["imm"] = float(imm)
        out = a.dtype
        if op in ("vxm.cvt", "vxm.requant"):
            out = DType.parse(to)
            fields["out_dtype"] = out
        if op == "vxm.requant":
            fields["aux0"] = int(zp)
        if op in ("vxm.reduce_sum", "vxm.reduce_max"):
            fields["aux0"] = int(width or self.cfg.lanes)
        units = (alu,) if alu is not None else tuple(range(self.cfg.vxm_alus))
        return self._node(op, a.count, units, fields, inputs, out_dtype=out).out

    # -- SXM -----------------------------------------------------------------
    def sxm(self, op: str, a: Value, *, unit: "int | None" = None, by: int = 0, map: int = 0, out: int = 0,
            lane: int = 0, before: int = 0, width: int = 0) -> Value:
        aux0 = {"sxm.shift": by, "sxm.rotate": by, "sxm.permute": map, "sxm.transpose": out,
                "sxm.broadcast": lane, "sxm.pad": before}[op]
        fields = dict(dtype=a.dtype, aux0=int(aux0))
        if op == "sxm.pad":
            fields["aux1"] = int(width)
        if unit is None:
            unit = self.b.nearest_sxm(a.node)
        count_out = out if op == "sxm.transpose" else a.count
        return self._node(op, a.count, (unit,), fields, [("src0", a)], out_dtype=a.dtype, out_count=count_out).out

    # -- C2C -----------------------------------------------------------------
    def send(self, link: int, v: Value):
        self._node("c2c.send", v.count, (link,), dict(dtype=v.dtype), [("src0", v)])

    def recv(self, link: int, count: int, dtype) -> Value:
        node = self._node("c2c.recv", count, (link,), dict(dtype=DType.parse(dtype)), out_dtype=dtype)
        return node.out


class BuildObserver(Protocol):
    """Told when a program's build starts and of each group's instructions as they are
    placed: the chips of a system built side by side post their sends' arrivals to each
    other (target.system_programs.build_together)."""

    def started(self) -> None: ...

    def placed(self, instrs: list) -> None: ...


class ProgramBuilder:
    def __init__(self, config="tsp", name: str = "", loopback: bool = True,
                 observer: "BuildObserver | None" = None):
        self.config: LPXConfig = load_config(config)
        self.name = name
        # One chip alone, its links loop back: a receive waits for the send on its link. A
        # chip of a system (loopback=False) sends to another chip and receives what
        # arrives from one (:meth:`arrival`).
        self.loopback = loopback
        self.observer = observer
        self.image = ProgramImage(self.config)
        self.sram = SramPlan(self.config, self.image)
        self.schedule = GroupSchedule()
        self._installed = {}  # (plane, buffer) -> the dtype of the weights installed last

    # -- SRAM (sram_plan.SramPlan) ----------------------------------------------
    def share(self, shared: SharedSram):
        self.sram.share(shared)

    def pinned(self, name: str) -> "TensorLayout | None":
        return self.sram.pinned(name)

    def input_at(self, name: str, layout: TensorLayout) -> SramTensor:
        return self.sram.input_at(name, layout)

    @property
    def peak_lines(self) -> int:
        return self.sram.peak_lines

    @property
    def dependency_cycles(self) -> int:
        """The built schedule's dependency floor (:class:`~lpx_tvm.target.placer.Placer`)."""
        return self.schedule.dependency_cycles

    @property
    def shareable_constants(self) -> tuple:
        return self.sram.shareable_constants

    def alloc_lines(self, lines: int, slice: "int | None" = None, avoid=()) -> tuple:
        return self.sram.alloc_lines(lines, slice, avoid)

    @property
    def slice_lines_used(self) -> tuple:
        return self.sram.slice_lines_used

    def resident(self, shape, dtype, data, row_align: int = 1, install_align: int = 0) -> "SramTensor | None":
        return self.sram.resident(shape, dtype, data, row_align, install_align)

    @property
    def constant_lines(self) -> int:
        return self.sram.constant_lines

    def free(self, tensor: SramTensor):
        self.sram.free(tensor)

    def tensor(self, name: str, shape, dtype, **kw) -> SramTensor:
        return self.sram.tensor(name, shape, dtype, **kw)

    def input(self, name, shape, dtype, **kw) -> SramTensor:
        return self.sram.input(name, shape, dtype, **kw)

    def output(self, name, shape, dtype, **kw) -> SramTensor:
        return self.sram.output(name, shape, dtype, **kw)

    def constant(self, name, array, dtype, **kw) -> SramTensor:
        return self.sram.constant(name, array, dtype, **kw)

    # -- image and bindings (program_image.ProgramImage) -------------------------
    def bindings(self, role: "str | None" = None) -> list:
        return self.image.bindings(role)

    def host_buffer(self, array: np.ndarray) -> int:
        return self.image.host_buffer(array)

    def offchip(self, name: str, shape, dtype, *, role: "str | None" = None) -> OffchipTensor:
        return self.image.offchip(name, shape, dtype, role=role)

    def bind(self, name: str, t: OffchipTensor, shape=None, role: str = "output"):
        self.image.bind(name, t, shape, role)

    def bind_sram(self, name: str, t: SramTensor, role: str = "output"):
        self.image.bind_sram(name, t, role)

    def table(self, entries) -> int:
        return self.image.table(entries)

    # -- groups (group_schedule.GroupSchedule) -----------------------------------
    def install(self, tag: str, plane: int, buf: int, segments, width: int):
        """Install the weight rows ``segments`` hold, ``[(first row, SramSpan)]`` covering rows
        0..K-1, into a weight buffer at the plane's install rate: the rows are cut into one
        part per install lane (:func:`~lpx_tvm.machine.timing.install_lanes`), each part
        within one region, and each part is a group of its own (a read and an install), so
        parts from different slices stream in side by side, each as early as its slice,
        its stream and its hop distance to the plane allow."""
        segments = list(segments)
        k = sum(r.count for _, r in segments)
        lanes = install_lanes(self.config, segments[0][1].dtype)
        cut = install_parts(segments, -(-k // lanes))
        if len(segments) <= lanes:
            # Whole segments, one lane each, when that is no slower (a short last tile whose
            # chunks are as long as a full tile's parts: 13 chunks of 20 rows take 20
            # cycles whole, 36 cut into 16-row parts that need a second round).
            whole = [(row0, region, 0, region.count) for row0, region in segments]
            if max(region.count for _, region in segments) <= _lane_load(cut, lanes):
                cut = whole
        out = []
        for lane, (row0, region, a, n) in enumerate(cut):
            g = self.group(tag)
            g.install(plane, buf, g.read(region.rows(a, a + n)), width, row=row0 + a, lane=lane % lanes)
            out.append(g)
        return out

    def install_by_index(self, tag: str, plane: int, buf: int, segments, entries: int, entry_rows: int,
                         base: SramSpan, counting: SramSpan, width: int):
        """Install one of ``entries`` weight matrices that lie side by side, the one a
        runtime index names (an expert of a mixture-of-experts layer): ``segments``,
        ``[(first row, SramSpan)]`` covering rows 0..K-1, are entry 0's rows, and entry
        ``e``'s lie ``e * entry_rows`` vectors further in each region. ``base`` is one
        int32 vector holding ``e * entry_rows`` in lane 0, computed on chip; ``counting``
        int32 vectors holding 0, 1, 2, .. in lane 0.

        Rows are cut into parts per install lane as :meth:`install` cuts them; the parts
        that share no slice and no lane form one group, which reads ``counting`` and
        ``base`` once, adds them on the VXM (the indices ``e * entry_rows + k``) and sends
        the indices to every part's ``mem.gather``, each streaming its rows into its
        lane's install. The program, and so every cycle, is the same whatever ``e`` is
        (docs/moe.md, "Experts installed by address")."""
        segments = list(segments)
        dtype = segments[0][1].dtype
        k = sum(r.count for _, r in segments)
        lanes = install_lanes(self.config, dtype)
        parts = install_parts(segments, -(-k // lanes))
        rounds = []  # [(slices, lanes, parts)]: parts that can run side by side
        for i, part in enumerate(parts):
            sl, lane = part[1].slice, i % lanes
            for r in rounds:
                if sl not in r[0] and lane not in r[1]:
                    break
            else:
                r = (set(), set(), [])
                rounds.append(r)
            r[0].add(sl)
            r[1].add(lane)
            r[2].append((lane, part))
        out = []
        for _, _, members in rounds:
            n = max(p[3] for _, p in members)
            if n > counting.count:
                raise SchedulingError(f"{tag}: a part of {n} rows, but {counting.count} counting rows")
            g = self.group(tag)
            index = g.vxm("vxm.add", g.read(counting.rows(0, n)), g.read(base.repeat(n)))
            for lane, (row0, region, a, rows) in members:
                stride = region.stride
                # The table the gather reads: this part's rows of every entry.
                table = SramSpan(region.slice, region.addr + a * stride, (entries - 1) * entry_rows + rows,
                                 stride, dtype)
                g.install(plane, buf, g.gather(index.part(0, rows), table), width, row=row0 + a, lane=lane)
            out.append(g)
        return out

    def hoist(self, groups: list, limit: int = 2000):
        self.schedule.hoist(groups, limit)

    def group(self, tag: str = "") -> Group:
        g = Group(self, tag)
        self.schedule.add(g)
        return g

    def trial_group(self, tag: str = "") -> Group:
        """A group outside the program, to be tried (:meth:`fits_alone`), then kept
        (:meth:`keep`) or dropped."""
        return Group(self, tag)

    def fits_alone(self, g: Group) -> bool:
        """Whether group ``g`` can be placed at all: its own instructions find ports and
        stream registers on an idle machine (a group too wide for the streams never can)."""
        try:
            Placer(self.config).place(g)
        except SchedulingError:
            return False
        return True

    def keep(self, g: Group) -> Group:
        """Add a trial group to the program, in program order from here."""
        self.schedule.add(g)
        return g

    def sync(self):
        """A barrier: later groups start after everything before it has completed."""
        self.schedule.add(Barrier())

    def arrival(self, link: int, cycle):
        """Data arrives on ``link`` from another chip at ``cycle`` (its sender's schedule):
        a later group's receive on that link issues no earlier. ``cycle`` may be a
        function, asked when the program is built (the sender's program being built
        beside this one: target.system_programs.build_together)."""
        self.schedule.add(Arrival(link, cycle))

    def nearest_sxm(self, node: Node) -> int:
        pos = unit_position(self.config, UNIT_OF_PREFIX[node.op.split(".")[0]], node.units[0])
        if pos is None:
            return 0
        return min(range(unit_count(self.config, Unit.SXM)), key=lambda u: abs(self.config.position("SXM", u) - pos))

    # -- scheduling ------------------------------------------------------------
    def build(self) -> Program:
        instrs = []
        if self.observer is not None:
            self.observer.started()
        for entry, placed in self.schedule.place(self.config):
            instrs.extend(placed)
            if isinstance(entry, Group) and self.observer is not None:
                self.observer.placed(placed)
        instrs.sort(key=lambda i: (i.cycle, i.op, i.unit))
        im = self.image
        return Program(self.config.hash, instrs, sram_init=list(im.images), host_init=bytes(im.host),
                       host_bytes=im.host_end, bindings=im.bindings(), tables=list(im.tables),
                       symbols=dict(im.symbols), name=self.name)

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
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import SchedulingError, SramFull
from ..machine.config import LPXConfig, load_config
from ..machine.isa import DType, Instr, Unit
from ..machine.layout import coerce, tensor_tiles
from ..machine.program import Binding, Program, SramImage, TensorLayout
from .placer import UNIT_OF_PREFIX, Placer
from .sram_alloc import SramAllocator
from ..machine.effects import arrival_effect, instr_effects
from ..machine.timing import install_lanes, unit_count, unit_position


@dataclass(frozen=True)
class SramSpan:
    """``count`` vectors of ``dtype`` in one slice, vector ``k`` at ``addr + k * stride``,
    or with a 2-D pattern (``inner > 0``) at ``addr + (k // inner) * outer + (k % inner) * stride``
    (e.g. a window of pixel rows inside a padded image)."""

    slice: int
    addr: int
    count: int
    stride: int
    dtype: DType
    inner: int = 0
    outer: int = 0

    @property
    def lines(self) -> tuple:
        k = np.arange(self.count)
        starts = self.addr + ((k // self.inner) * self.outer + (k % self.inner) * self.stride if self.inner
                              else k * self.stride)
        return int(starts.min()), int(starts.max()) + self.dtype.itemsize - 1

    def rows(self, start: int, stop: int) -> "SramSpan":
        if not 0 <= start < stop <= self.count:
            raise SchedulingError(f"rows {start}:{stop} outside a region of {self.count} vectors")
        if self.inner:
            raise SchedulingError("rows of a 2-D region: build the sub-window with window() instead")
        return SramSpan(self.slice, self.addr + start * self.stride, stop - start, self.stride, self.dtype)

    def window(self, first: int, rows: int, cols: int, row_pitch: int, col_step: int = 1) -> "SramSpan":
        """A 2-D window of a 1-D region seen as rows of ``row_pitch`` vectors: ``rows`` rows of
        ``cols`` vectors from vector ``first``, every ``col_step``-th vector within a row."""
        if self.inner:
            raise SchedulingError("window() of a region that is already 2-D")
        last = first + (rows - 1) * row_pitch + (cols - 1) * col_step
        if not (0 <= first and 0 <= last < self.count):
            raise SchedulingError(f"window reaches vector {last} of a region of {self.count}")
        return SramSpan(self.slice, self.addr + first * self.stride, rows * cols, col_step * self.stride,
                      self.dtype, inner=cols, outer=row_pitch * self.stride)

    def repeat(self, count: int) -> "SramSpan":
        """The region's first vector read ``count`` times (stride 0), e.g. a bias row."""
        return SramSpan(self.slice, self.addr, count, 0, self.dtype)

    def _fields(self) -> dict:
        f = dict(addr=self.addr, stride=self.stride, dtype=self.dtype)
        if self.inner:
            f.update(aux0=self.inner, aux1=self.outer)
        return f


@dataclass(frozen=True)
class SramTensor:
    name: str
    layout: TensorLayout

    @property
    def ntiles(self) -> int:
        return len(self.layout.tiles) // self.layout.nchunks

    def tile(self, j: int = 0) -> SramSpan:
        """Column tile ``j`` as one region (the tensor must fit one chunk)."""
        if self.layout.nchunks != 1:
            raise SchedulingError(f"tensor {self.name} spans {self.layout.nchunks} slices: use segments()")
        (sl, addr), _, n = self.layout.chunk(j, 0)
        return SramSpan(sl, addr, n, self.layout.row_stride, self.layout.dtype)

    def segments(self, j: int, r0: int, r1: int) -> list:
        """Rows ``r0 .. r1 - 1`` of column tile ``j`` as [(first row, SramSpan)], one per chunk."""
        out = []
        R, lay = self.layout.rows_per_chunk, self.layout
        r = r0
        while r < r1:
            q = r // R
            (sl, addr), c0, n = lay.chunk(j, q)
            end = min(r1, c0 + n)
            out.append((r, SramSpan(sl, addr + (r - c0) * lay.row_stride, end - r, lay.row_stride, lay.dtype)))
            r = end
        return out

    def window_segments(self, j: int, first: int, rows: int, cols: int, row_pitch: int, col_step: int = 1) -> list:
        """A 2-D window (``rows`` rows of ``cols`` vectors, see :meth:`SramSpan.window`) of tile
        ``j`` as [(first vector index, SramSpan)], split where it crosses chunks."""
        R, lay = self.layout.rows_per_chunk, self.layout
        out, i = [], 0
        while i < rows:
            start = first + i * row_pitch
            q = start // R
            i1 = i + 1
            while i1 < rows and (first + i1 * row_pitch) // R == q:
                i1 += 1
            (sl, addr), c0, n = lay.chunk(j, q)
            if start + (cols - 1) * col_step >= c0 + n:
                raise SchedulingError(f"a window row of {self.name} crosses a chunk boundary (chunks must hold "
                                      "whole image rows)")
            base = SramSpan(sl, addr, n, lay.row_stride, lay.dtype)
            out.append((i * cols, base.window(start - c0, i1 - i, cols, row_pitch, col_step)))
            i = i1
        return out


@dataclass(frozen=True)
class OffchipTensor:
    """A tensor in off-chip memory from byte ``offset``, column tile after column tile:
    row ``r`` of tile ``j`` is the vector at ``offset + (j * rows + r) * vector_bytes``
    (the layout of an off-chip :class:`~lpx_tvm.machine.program.Binding`)."""

    name: str
    layout: TensorLayout
    offset: int
    lanes: int

    @property
    def ntiles(self) -> int:
        return -(-self.layout.cols // self.lanes)

    @property
    def vector_bytes(self) -> int:
        return self.lanes * self.layout.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.ntiles * self.layout.rows * self.vector_bytes

    def at(self, j: int, row: int) -> int:
        """Byte offset of row ``row`` of column tile ``j``."""
        return self.offset + (j * self.layout.rows + row) * self.vector_bytes


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


@dataclass(frozen=True)
class Barrier:
    """A schedule entry: later groups start after everything before it has completed."""


@dataclass(frozen=True)
class Arrival:
    """A schedule entry: data arrives on ``link`` from another chip at ``cycle`` (an int, or
    a function asked when the program is built)."""

    link: int
    cycle: object


def chunk_lines(layout: TensorLayout):
    """(slice, first line, lines) of each chunk of each column tile of ``layout``."""
    for j in range(len(layout.tiles) // layout.nchunks):
        for q in range(layout.nchunks):
            (sl, addr), _, n = layout.chunk(j, q)
            yield sl, addr, n * layout.row_stride


@dataclass(frozen=True, eq=False)
class SharedSram:
    """SRAM that a program holds in common with another program of a session (an LLM's
    prefill and decode steps, docs/llm.md): ``inputs``, ((name, TensorLayout), ...), state
    pinned to the lines the other program bound it to (a KV cache, kept across runs);
    ``images``, the other program's initial SRAM image (resident weights), and
    ``constants``, ((key, SramTensor), ...), the constants in it by content
    (:attr:`ProgramBuilder.shareable_constants`)."""

    inputs: tuple = ()
    images: tuple = ()
    constants: tuple = ()


class ProgramBuilder:
    def __init__(self, config="tsp", name: str = "", loopback: bool = True):
        self.config: LPXConfig = load_config(config)
        self.name = name
        # One chip alone, its links loop back: a receive waits for the send on its link. A
        # chip of a system (loopback=False) sends to another chip and receives what
        # arrives from one (:meth:`arrival`).
        self.loopback = loopback
        # Told when a build starts and of each group's instructions as it is placed (a
        # system's chips built side by side post their sends' arrivals to each other).
        self.on_start = None
        self.on_placed = None
        self._sram = SramAllocator(self.config.mem_slices, self.config.lines_per_slice)
        self._constants = set()
        self._groups = []
        self._images = []
        self._bindings = []
        self._tables = []
        self._symbols = {}
        self._host = bytearray()  # initial off-chip memory (streamed weights)
        self._host_end = 0  # off-chip bytes in use: initial data and working buffers
        self._const_cache = {}  # (shape, dtype, row_align, bytes) -> SramTensor
        self._installed = {}
        self._pinned = {}  # input name -> the layout another program of the session gave it

    def share(self, shared: "SharedSram"):
        """Hold what another program of the session holds, before anything is allocated:
        its state inputs at their lines (:meth:`pinned`), and its initial image (resident
        weights) at its lines, whose constants this program then finds by content instead
        of placing copies."""
        alloc, lanes = self._sram, self.config.lanes
        for name, layout in shared.inputs:
            for sl, addr, lines in chunk_lines(layout):
                alloc.reserve(sl, addr, lines)
            self._pinned[name] = layout
        # An image reaching down from a slice's top joins this program's constants there;
        # any other image (data placed in working space) is reserved where it lies.
        for img in sorted(shared.images, key=lambda m: (m.slice, -m.addr)):
            lines = len(img.data) // lanes
            alloc.reserve(img.slice, img.addr, lines, constant=img.addr + lines == alloc.floor[img.slice])
        self._images.extend(shared.images)
        for key, t in shared.constants:
            self._const_cache[key] = t
            self._constants.add(t.name)
            self._symbols[t.name] = t.layout.to_json()

    def pinned(self, name: str) -> "TensorLayout | None":
        """The layout input ``name`` must have (see :meth:`share`), or None."""
        return self._pinned.get(name)

    def input_at(self, name: str, layout: TensorLayout) -> SramTensor:
        """Bind input ``name`` at the lines :meth:`share` reserved for it."""
        if self._pinned.get(name) != layout:
            raise SchedulingError(f"input {name!r} was not pinned to these lines")
        self._bindings.append(Binding(name, "input", layout))
        self._symbols[name] = layout.to_json()
        return SramTensor(name, layout)

    @property
    def peak_lines(self) -> int:
        """The most SRAM lines in use at once so far."""
        return self._sram.peak

    @property
    def shareable_constants(self) -> tuple:
        """((key, SramTensor), ...) of the constants placed so far, for :class:`SharedSram`."""
        return tuple(self._const_cache.items())

    # -- storage -------------------------------------------------------------
    def alloc_lines(self, lines: int, slice: "int | None" = None, avoid=()) -> tuple:
        """Lines in the least-used slice (not one of ``avoid``, slices this data is read beside)."""
        return self._sram.alloc(lines, slice, avoid)

    @property
    def slice_lines_used(self) -> tuple:
        """SRAM lines in use in each slice right now (working space and constants)."""
        return tuple(self._sram.used)

    def bindings(self, role: "str | None" = None) -> list:
        """The program's bindings so far (of ``role`` only, when given), in binding order."""
        return [b for b in self._bindings if role is None or b.role == role]

    @staticmethod
    def _constant_key(shape, dt: DType, data, row_align: int, install_align: int) -> tuple:
        # keyed by a digest: the cache must not hold a second copy of every weight
        raw = np.ascontiguousarray(data, dt.np).reshape(-1).view(np.uint8)
        return (tuple(int(s) for s in shape), dt, row_align, install_align, hashlib.sha256(raw).digest())

    def resident(self, shape, dtype, data, row_align: int = 1, install_align: int = 0) -> "SramTensor | None":
        """The constant of this content and layout already in the initial image (placed by
        this program, or shared from another: :meth:`share`), or None."""
        return self._const_cache.get(self._constant_key(shape, DType.parse(dtype), data, row_align, install_align))

    @property
    def constant_lines(self) -> int:
        """SRAM lines the initial image (constants) takes so far."""
        return sum(self.config.lines_per_slice - f for f in self._sram.floor)

    def free(self, tensor: SramTensor):
        """Give a tensor's lines back for reuse (after its last use in program order).
        Constants (initial-image data) stay: see :class:`SramAllocator`."""
        if tensor.name in self._constants:
            return
        for sl, addr, lines in chunk_lines(tensor.layout):
            self._sram.free(sl, addr, lines)

    def tensor(self, name: str, shape, dtype, *, role: "str | None" = None, data=None, slices=None,
               avoid=(), tile_avoid=None, row_align: int = 1, spread: int = 1, install_align: int = 0,
               install_pools=None) -> SramTensor:
        """Allocate a tensor in SRAM, one column tile of ``lanes`` columns per allocation.

        ``avoid``: slices to keep clear of, e.g. those of a tensor this one is read beside
        in one group (a slice has one read port); ``tile_avoid`` instead gives the slices
        each column tile keeps clear of (tile j: ``tile_avoid[j]``). A tile larger than a slice is cut into
        chunks of a multiple of ``row_align`` rows (e.g. whole image rows); ``spread`` asks
        for that many chunks even when a slice would hold the tile.

        ``install_align`` lays out MXM weights (see :meth:`install`): the matrix is installed
        in row tiles that start at multiples of ``install_align`` rows, and each such tile is
        cut into one chunk per install lane, the chunks of a tile on different slices, so
        that all lanes read at once (a slice reads one line per cycle). ``install_pools(j,
        q)`` may name the slices chunk ``q`` of column tile ``j`` is best kept in (those of
        the plane and lane that install it), or None; a full pool falls back to any slice."""
        dt = DType.parse(dtype)
        shape = tuple(int(s) for s in shape)
        key = None
        if data is not None and role is None and slices is None and tile_avoid is None:
            # Identical constants (a bias or fill row asked for again) share one image.
            key = self._constant_key(shape, dt, data, row_align, install_align)
            hit = self._const_cache.get(key)
            if hit is not None and not {sl for sl, _ in hit.layout.tiles} & set(avoid):
                return hit
        rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
        ntiles = -(-shape[-1] // self.config.lanes)
        w = dt.itemsize
        fit = self.config.lines_per_slice // w  # rows one slice holds
        chunk_rows = 0 if rows <= fit else fit // row_align * row_align
        distinct = 1
        if install_align:
            distinct = install_lanes(self.config, dt)
            per = -(-min(install_align, rows) // distinct)
            if per < rows:
                chunk_rows, row_align = per, per
        if spread > 1 and rows > row_align:
            # Several chunks (on different slices) let row-wise passes run side by side.
            even = -(-(-(-rows // spread)) // row_align) * row_align
            if even < rows:
                chunk_rows = min(chunk_rows or even, even)
        while True:
            if rows > fit and chunk_rows == 0:
                raise SramFull(f"tensor {name}: a row group of {row_align} vectors does not fit one slice")
            try:
                tiles = self._alloc_chunks(rows, ntiles, w, chunk_rows, slices, avoid, constant=data is not None,
                                           tile_avoid=tile_avoid, distinct=distinct, pools=install_pools)
                break
            except SchedulingError as e:
                # No hole holds a whole chunk: try chunks half as long (whole row groups).
                smaller = ((chunk_rows or rows) // 2) // row_align * row_align
                if smaller == 0 or smaller == (chunk_rows or rows):
                    raise type(e)(f"tensor {name} {shape} {dt.short}: {e}") from None
                chunk_rows = smaller
        layout = TensorLayout(shape, dt, tuple(tiles), w, chunk_rows)
        if data is not None:
            self._constants.add(name)
            arr = coerce(name, data, layout)
            for sl, lines, raw in tensor_tiles(layout, arr, self.config.lanes):
                self._images.append(SramImage(sl, lines.start, raw.tobytes()))
        if role is not None:
            self._bindings.append(Binding(name, role, layout))
        self._symbols[name] = layout.to_json()
        out = SramTensor(name, layout)
        if key is not None:
            self._const_cache[key] = out
        return out

    def _alloc_chunks(self, rows, ntiles, w, chunk_rows, slices, avoid, constant=False, tile_avoid=None,
                      distinct=1, pools=None) -> list:
        per = chunk_rows or rows
        nchunks = -(-rows // per)
        tiles = []
        try:
            for j in range(ntiles):
                if tile_avoid is not None:
                    avoid = tile_avoid[j]
                for q in range(nchunks):
                    n = min(rows, (q + 1) * per) - q * per
                    want = None if slices is None else slices[(j * nchunks + q) % len(slices)]
                    # Chunks read at once (by the install lanes) keep to different slices.
                    near = tuple(avoid) + tuple(sl for sl, _, _ in tiles[len(tiles) - min(q, distinct - 1):]) \
                        if distinct > 1 and q else tuple(avoid)
                    if constant and want is None:
                        pool = pools(j, q) if pools is not None else None
                        placed = self._alloc_among(n * w, near, pool) if pool else None
                        tiles.append((*(placed or self._alloc_near(self._sram.alloc_constant, n * w, near, avoid)),
                                      n * w))
                    else:
                        tiles.append((*self._alloc_near(lambda k, a: self.alloc_lines(k, want, a), n * w, near,
                                                        avoid), n * w))
        except SchedulingError:
            for sl, addr, lines in tiles:
                self._sram.free(sl, addr, lines)
            raise
        return [(sl, addr) for sl, addr, _ in tiles]

    def _alloc_among(self, lines, avoid, pool) -> "tuple | None":
        """Constant lines on a slice of ``pool`` (not of ``avoid``), or None when it is full."""
        try:
            return self._sram.alloc_constant(lines, avoid, among=pool)
        except SramFull:
            return None

    @staticmethod
    def _alloc_near(alloc, lines, near, avoid):
        """``alloc`` away from the slices ``near`` (a wish), else away from ``avoid`` only."""
        if len(near) > len(tuple(avoid)):
            try:
                return alloc(lines, near)
            except SchedulingError:
                pass
        return alloc(lines, avoid)

    def input(self, name, shape, dtype, **kw) -> SramTensor:
        return self.tensor(name, shape, dtype, role="input", **kw)

    def output(self, name, shape, dtype, **kw) -> SramTensor:
        return self.tensor(name, shape, dtype, role="output", **kw)

    def constant(self, name, array, dtype, **kw) -> SramTensor:
        array = np.asarray(array)
        return self.tensor(name, array.shape, dtype, data=array, **kw)

    def host_buffer(self, array: np.ndarray) -> int:
        """Place an array in off-chip memory (row-major vectors); returns its byte offset."""
        off = self._host_end
        self._host += bytes(off - len(self._host))  # past any working buffers placed before
        self._host += np.ascontiguousarray(array).tobytes()
        self._host_end = len(self._host)
        return off

    def offchip(self, name: str, shape, dtype, *, role: "str | None" = None) -> OffchipTensor:
        """Working space (or an input / output binding) in off-chip memory, never reused:
        off-chip memory is large next to one region's activations."""
        dt = DType.parse(dtype)
        shape = tuple(int(s) for s in shape) or (1,)
        layout = TensorLayout(shape, dt, (), dt.itemsize)
        off = -(-self._host_end // 64) * 64
        t = OffchipTensor(name, layout, off, self.config.lanes)
        self._host_end = off + t.nbytes
        if role is not None:
            self._bindings.append(Binding(name, role, layout, offchip=off))
        self._symbols[name] = {**layout.to_json(), "offchip": off}
        return t

    def bind(self, name: str, t: OffchipTensor, shape=None, role: str = "output"):
        """Bind an existing off-chip tensor under another name, seen as ``shape`` of the
        same rows and columns (e.g. an output that is a reshape of another value)."""
        layout = t.layout if shape is None else replace(t.layout, shape=tuple(int(s) for s in shape))
        if (layout.rows, layout.cols) != (t.layout.rows, t.layout.cols):
            raise SchedulingError(f"binding {name}: shape {layout.shape} is not stored like {t.layout.shape}")
        self._bindings.append(Binding(name, role, layout, offchip=t.offset))

    def bind_sram(self, name: str, t: SramTensor, role: str = "output"):
        """Bind an existing SRAM tensor under another name (an input updated in place,
        returned as an output: the same lines)."""
        self._bindings.append(Binding(name, role, t.layout))

    def table(self, entries) -> int:
        t = np.asarray(entries, np.int32)
        if t.shape != (self.config.lanes,):
            raise SchedulingError(f"a permutation map needs {self.config.lanes} entries, got {t.shape}")
        self._tables.append(t)
        return len(self._tables) - 1

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

    def hoist(self, groups: list, limit: int = 2000):
        """Move ``groups`` (the last ones added, in order) as early in program order as
        their state allows: to just after the last earlier group that touches what they
        touch (a write against any access of the same lines), never across a barrier nor
        more than ``limit`` groups back. The placer gives earlier groups first pick of
        ports and streams, so a hoisted group goes before the work it passed."""
        n = len(groups)
        if self._groups[len(self._groups) - n:] != groups:
            raise SchedulingError("only the groups added last can be hoisted")
        del self._groups[len(self._groups) - n:]
        for g in groups:
            mine = [e for node in g.nodes for e in node.effects]
            keys = {e.key for e in mine}
            pos = len(self._groups)
            stop = max(0, pos - limit)
            while pos > stop:
                h = self._groups[pos - 1]
                if not isinstance(h, Group) or any(e.key in keys and any(e.conflicts(m) for m in mine)
                                                   for node in h.nodes for e in node.effects):
                    break
                pos -= 1
            self._groups.insert(pos, g)

    def group(self, tag: str = "") -> Group:
        g = Group(self, tag)
        self._groups.append(g)
        return g

    def sync(self):
        """A barrier: later groups start after everything before it has completed."""
        self._groups.append(Barrier())

    def arrival(self, link: int, cycle):
        """Data arrives on ``link`` from another chip at ``cycle`` (its sender's schedule):
        a later group's receive on that link issues no earlier. ``cycle`` may be a
        function, asked when the program is built (the sender's program being built
        beside this one: target.system_programs.build_together)."""
        self._groups.append(Arrival(link, cycle))

    def nearest_sxm(self, node: Node) -> int:
        pos = unit_position(self.config, UNIT_OF_PREFIX[node.op.split(".")[0]], node.units[0])
        if pos is None:
            return 0
        return min(range(unit_count(self.config, Unit.SXM)), key=lambda u: abs(self.config.position("SXM", u) - pos))

    # -- scheduling ------------------------------------------------------------
    def build(self) -> Program:
        placer = Placer(self.config)
        instrs = []
        if self.on_start is not None:
            self.on_start()
        for g in self._groups:
            if isinstance(g, Barrier):
                instrs.append(Instr("icu.sync", placer.sync()))
            elif isinstance(g, Arrival):
                cycle = g.cycle() if callable(g.cycle) else g.cycle
                placer.res.record([arrival_effect(g.link, cycle)], 0)
            elif g.nodes:
                placed = placer.place(g)
                instrs.extend(placed)
                if self.on_placed is not None:
                    self.on_placed(placed)
        instrs.sort(key=lambda i: (i.cycle, i.op, i.unit))
        return Program(self.config.hash, instrs, sram_init=list(self._images), host_init=bytes(self._host),
                       host_bytes=self._host_end, bindings=list(self._bindings), tables=list(self._tables),
                       symbols=dict(self._symbols), name=self.name)

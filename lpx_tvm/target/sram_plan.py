"""SRAM planning: where a program's tensors live (working space and constants, column
tile by column tile, chunked across slices), the SRAM it shares with another program of
a session, and constants found again by content."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import SchedulingError, SramFull
from ..machine.config import LPXConfig
from ..machine.effects import line_span
from ..machine.isa import DType
from ..machine.layout import coerce, tensor_tiles
from ..machine.program import Binding, SramImage, TensorLayout
from ..machine.timing import install_lanes
from .program_image import ProgramImage
from .sram_alloc import SramAllocator


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
        return line_span(self.addr, self.stride, self.count, self.dtype.itemsize, self.inner, self.outer)

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

    @property
    def base(self) -> "SramTensor":
        """The tensor whose lines these are (itself; a :class:`TileView`'s, its base's)."""
        return self

    def column_tiles(self, first: int, shape: tuple, lanes: int) -> "TileView":
        """Column tiles ``first`` .. of this tensor's lines seen as a tensor of stored
        ``shape`` (a slice of the last axis that starts on a tile: no copy)."""
        lay, n = self.layout, -(-int(shape[-1]) // lanes)
        if first + n > self.ntiles:
            raise SchedulingError(f"tiles {first} .. {first + n - 1} of {self.name}, which has {self.ntiles}")
        tiles = lay.tiles[first * lay.nchunks:(first + n) * lay.nchunks]
        view = TensorLayout(tuple(shape), lay.dtype, tiles, lay.row_stride, lay.chunk_rows, lay.margin)
        return TileView(f"{self.name}[{first}:]", view, self.base)

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
class TileView(SramTensor):
    """Column tiles of another tensor, on its lines: freed with it, never alone."""

    of: SramTensor = None

    @property
    def base(self) -> SramTensor:
        return self.of


SPREAD_MARGIN = 1  # spare rows either side of a spread value's chunk (TensorLayout.margin)


class Spread(NamedTuple):
    """How a value laid out for installs is spread (:func:`spread_chunks`)."""

    rows: int
    slices: int
    per: int  # rows a chunk
    chunks: int
    fullest: int  # lines on the fullest slice (at most, every chunk full), spare rows included

    @property
    def rows_held(self) -> int:
        """Rows as stored: the value's and its chunks' spare rows."""
        return self.rows + 2 * SPREAD_MARGIN * self.chunks


def spread_chunks(config: LPXConfig, rows: int, itemsize: int) -> Spread:
    """How a value of ``rows`` rows laid out for installs is spread (a step's value cache,
    docs/llm.md): a weight tile's rows cut into one chunk per install lane, the chunks
    dealt over as many slices as a plane has install lanes, or a multiple of that when
    they would overflow them (a batch's long cache), each chunk with SPREAD_MARGIN spare
    rows either side."""
    lanes = max(1, config.mxm_install_streams // itemsize)
    per = -(-min(config.lanes, rows) // lanes)
    chunks = -(-rows // per)

    def fullest(slices):
        return -(-chunks // slices) * (per + 2 * SPREAD_MARGIN) * itemsize

    slices = lanes
    while slices + lanes <= config.mem_slices and fullest(slices) > config.lines_per_slice:
        slices += lanes
    return Spread(rows, slices, per, chunks, fullest(slices))


def chunk_lines(layout: TensorLayout):
    """(slice, first line, lines) of each chunk of each column tile of ``layout``, its
    margins included."""
    m = layout.margin * layout.row_stride
    for j in range(len(layout.tiles) // layout.nchunks):
        for q in range(layout.nchunks):
            (sl, addr), _, n = layout.chunk(j, q)
            yield sl, addr - m, n * layout.row_stride + 2 * m


def chunk_span(layout: TensorLayout, j: int, q: int) -> "SramSpan":
    """Chunk ``q`` of column tile ``j`` with its margins, one row a vector: row ``r`` of
    the chunk is vector ``layout.margin + r``."""
    (sl, addr), _, n = layout.chunk(j, q)
    m = layout.margin
    return SramSpan(sl, addr - m * layout.row_stride, n + 2 * m, layout.row_stride, layout.dtype)


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


class SramPlan:
    """The SRAM of a program being built: its allocator and its constants; tensors' images
    and bindings go to ``image``."""

    def __init__(self, config: LPXConfig, image: ProgramImage):
        self.config = config
        self.image = image
        vxm = config.position("VXM")
        self.allocator = SramAllocator(config.mem_slices, config.lines_per_slice,
                                       [abs(config.position("MEM", s) - vxm) for s in range(config.mem_slices)])
        self._constants = set()
        self._const_cache = {}  # (shape, dtype, row_align, bytes) -> SramTensor
        self._pinned = {}  # input name -> the layout another program of the session gave it

    def share(self, shared: "SharedSram"):
        """Hold what another program of the session holds, before anything is allocated:
        its state inputs at their lines (:meth:`pinned`), and its initial image (resident
        weights) at its lines, whose constants this program then finds by content instead
        of placing copies."""
        alloc, lanes = self.allocator, self.config.lanes
        for name, layout in shared.inputs:
            for sl, addr, lines in chunk_lines(layout):
                alloc.reserve(sl, addr, lines)
            self._pinned[name] = layout
        # An image reaching down from a slice's top joins this program's constants there;
        # any other image (data placed in working space) is reserved where it lies.
        for img in sorted(shared.images, key=lambda m: (m.slice, -m.addr)):
            lines = len(img.data) // lanes
            alloc.reserve(img.slice, img.addr, lines, constant=img.addr + lines == alloc.floor[img.slice])
        self.image.images.extend(shared.images)
        for key, t in shared.constants:
            self._const_cache[key] = t
            self._constants.add(t.name)
            self.image.symbols[t.name] = t.layout.to_json()

    def pinned(self, name: str) -> "TensorLayout | None":
        """The layout input ``name`` must have (see :meth:`share`), or None."""
        return self._pinned.get(name)

    def input_at(self, name: str, layout: TensorLayout) -> SramTensor:
        """Bind input ``name`` at the lines :meth:`share` reserved for it."""
        if self._pinned.get(name) != layout:
            raise SchedulingError(f"input {name!r} was not pinned to these lines")
        self.image.declare(Binding(name, "input", layout))
        self.image.symbols[name] = layout.to_json()
        return SramTensor(name, layout)

    @property
    def peak_lines(self) -> int:
        """The most SRAM lines in use at once so far."""
        return self.allocator.peak

    @property
    def shareable_constants(self) -> tuple:
        """((key, SramTensor), ...) of the constants placed so far, for :class:`SharedSram`."""
        return tuple(self._const_cache.items())

    # -- storage -------------------------------------------------------------
    def alloc_lines(self, lines: int, slice: "int | None" = None, avoid=()) -> tuple:
        """Lines in the least-used slice (not one of ``avoid``, slices this data is read beside)."""
        return self.allocator.alloc(lines, slice, avoid)

    @property
    def slice_lines_used(self) -> tuple:
        """SRAM lines in use in each slice right now (working space and constants)."""
        return tuple(self.allocator.used)

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
        return sum(self.config.lines_per_slice - f for f in self.allocator.floor)

    def free(self, tensor: SramTensor):
        """Give a tensor's lines back for reuse (after its last use in program order).
        Constants (initial-image data) stay: see :class:`SramAllocator`."""
        if tensor.name in self._constants:
            return
        for sl, addr, lines in chunk_lines(tensor.layout):
            self.allocator.free(sl, addr, lines)

    def tensor(self, name: str, shape, dtype, *, role: "str | None" = None, data=None, slices=None,
               avoid=(), tile_avoid=None, row_align: int = 1, spread: int = 1, install_align: int = 0,
               install_pools=None, margin: int = 0, tiles_apart: bool = False) -> SramTensor:
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
        q)`` names pools of slices chunk ``q`` of column tile ``j`` is best kept in (those of
        the plane and lane that install it), in the order to try; when all are full (or
        none is named), any slice.
        ``margin``: rows of spare lines held before and after each chunk (TensorLayout).
        ``tiles_apart``: each chunk (a column tile, or a row chunk of one) kept off the slices
        of the chunks before it where there is room (a matrix product reads its input a
        column tile at a time, once per column block of the product, and the planes read
        their rows side by side: on one slice those reads queue on its one read port)."""
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
                                           tile_avoid=tile_avoid, distinct=distinct, pools=install_pools,
                                           margin=margin, tiles_apart=tiles_apart)
                break
            except SchedulingError as e:
                # No hole holds a whole chunk: try chunks half as long (whole row groups).
                smaller = ((chunk_rows or rows) // 2) // row_align * row_align
                if smaller == 0 or smaller == (chunk_rows or rows):
                    raise type(e)(f"tensor {name} {shape} {dt.short}: {e}") from None
                chunk_rows = smaller
        layout = TensorLayout(shape, dt, tuple(tiles), w, chunk_rows, margin)
        if data is not None:
            self._constants.add(name)
            arr = coerce(name, data, layout)
            for sl, lines, raw in tensor_tiles(layout, arr, self.config.lanes):
                self.image.images.append(SramImage(sl, lines.start, raw.tobytes()))
            # Spare rows of zeros: a gather that a chunk does not serve reads one (take).
            m = margin * w  # lines of a chunk's spare rows on either side
            for sl, addr, lines in chunk_lines(layout) if margin else ():
                spare = bytes(m * self.config.lanes)
                self.image.images += [SramImage(sl, addr, spare), SramImage(sl, addr + lines - m, spare)]
        if role is not None:
            self.image.declare(Binding(name, role, layout))
        self.image.symbols[name] = layout.to_json()
        out = SramTensor(name, layout)
        if key is not None:
            self._const_cache[key] = out
        return out

    def _alloc_chunks(self, rows, ntiles, w, chunk_rows, slices, avoid, constant=False, tile_avoid=None,
                      distinct=1, pools=None, margin: int = 0, tiles_apart: bool = False) -> list:
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
                    if tiles_apart:
                        near = near + tuple(sl for sl, _, _ in tiles)
                    lines = (n + 2 * margin) * w
                    if constant and want is None:
                        placed = None
                        for pool in pools(j, q) if pools is not None else ():
                            placed = self._alloc_among(lines, near, pool) if pool else None
                            if placed:
                                break
                        tiles.append((*(placed or self._alloc_near(self.allocator.alloc_constant, lines, near, avoid)),
                                      lines))
                    else:
                        tiles.append((*self._alloc_near(lambda k, a: self.alloc_lines(k, want, a), lines, near,
                                                        avoid), lines))
        except SchedulingError:
            for sl, addr, lines in tiles:
                self.allocator.free(sl, addr, lines)
            raise
        return [(sl, addr + margin * w) for sl, addr, _ in tiles]

    def _alloc_among(self, lines, avoid, pool) -> "tuple | None":
        """Constant lines on a slice of ``pool`` (not of ``avoid``), or None when it is full."""
        try:
            return self.allocator.alloc_constant(lines, avoid, among=pool)
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

"""The Program container: instructions, initial SRAM image, tensor bindings, symbols.

A Program is what codegen produces and what the simulator (and later the chip) runs.
It is tied to one machine config by its hash and to one ISA version.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..errors import ProgramError
from .isa import ISA_VERSION, DType


@dataclass(frozen=True)
class TensorLayout:
    """Where a logical tensor lives in SRAM.

    The tensor is viewed as a matrix ``(rows, cols)``: ``rows`` is the product of all
    but the last dimension and ``cols`` the last one. Its columns are cut into tiles of
    ``lanes`` columns, and a tile's rows into chunks of ``chunk_rows`` rows (0: one chunk
    holds every row) so a tensor larger than one slice spreads over several. Chunk
    ``q`` of tile ``j`` is ``tiles[j * nchunks + q] = (slice, addr)``; its row ``r`` sits
    at line ``addr + r * row_stride``. Lanes past the last column are unspecified.

    ``margin`` rows of spare lines sit before and after each chunk (at ``addr - k *
    row_stride`` and past its last row), held with it: the target a chunk's scatter gives
    the rows another chunk holds (a value cache spread over slices, docs/llm.md).
    """

    shape: tuple
    dtype: DType
    tiles: tuple  # ((slice, addr), ...): one per column tile and row chunk, tile-major
    row_stride: int  # lines between consecutive vectors of a chunk
    chunk_rows: int = 0
    margin: int = 0

    @property
    def rows(self) -> int:
        return int(math.prod(self.shape[:-1])) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return int(self.shape[-1]) if self.shape else 1

    @property
    def rows_per_chunk(self) -> int:
        return self.chunk_rows or self.rows

    @property
    def nchunks(self) -> int:
        return -(-self.rows // self.rows_per_chunk)

    def chunk(self, j: int, q: int) -> tuple:
        """((slice, addr), first row, row count) of chunk ``q`` of column tile ``j``."""
        r0 = q * self.rows_per_chunk
        return self.tiles[j * self.nchunks + q], r0, min(self.rows, r0 + self.rows_per_chunk) - r0

    def to_json(self) -> dict:
        d = {"shape": list(self.shape), "dtype": self.dtype.short,
             "tiles": [list(t) for t in self.tiles], "row_stride": self.row_stride}
        if self.chunk_rows:
            d["chunk_rows"] = self.chunk_rows
        if self.margin:
            d["margin"] = self.margin
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TensorLayout":
        return cls(tuple(int(x) for x in d["shape"]), DType.parse(d["dtype"]),
                   tuple((int(s), int(a)) for s, a in d["tiles"]), int(d["row_stride"]), int(d.get("chunk_rows", 0)),
                   int(d.get("margin", 0)))


@dataclass(frozen=True)
class Binding:
    """A program input or output: a named tensor and its SRAM layout, or (``offchip`` set)
    a tensor in off-chip memory from that byte offset, stored tile by tile: row ``r`` of
    column tile ``j`` is the vector at ``offchip + (j * rows + r) * lanes * itemsize``
    (``layout.tiles`` is empty)."""

    name: str
    role: str  # "input" or "output"
    layout: TensorLayout
    offchip: "int | None" = None

    def __post_init__(self):
        if self.role not in ("input", "output"):
            raise ProgramError(f"binding {self.name!r}: role must be 'input' or 'output', not {self.role!r}")


@dataclass(frozen=True)
class SramImage:
    """Initial contents of lines ``addr ..`` of one slice (weights, constants)."""

    slice: int
    addr: int
    data: bytes  # a whole number of lines


@dataclass
class Program:
    config_hash: str
    instrs: list = field(default_factory=list)
    sram_init: list = field(default_factory=list)  # [SramImage]
    host_init: bytes = b""  # initial off-chip memory (weights streamed over DMA)
    host_bytes: int = 0  # size of the off-chip memory the program uses
    bindings: list = field(default_factory=list)  # [Binding]
    tables: list = field(default_factory=list)  # permutation maps for sxm.permute: int32 arrays
    symbols: dict = field(default_factory=dict)  # name -> JSON-able description (regions, ops)
    name: str = ""
    isa_version: int = ISA_VERSION

    def queues(self) -> dict:
        """Per-queue instruction streams, each in issue order: {(unit, index): [Instr]}."""
        q = defaultdict(list)
        for ins in sorted(self.instrs, key=lambda i: i.cycle):
            q[ins.queue].append(ins)
        return dict(q)

    def binding(self, name: str) -> Binding:
        for b in self.bindings:
            if b.name == name:
                return b
        raise ProgramError(f"program has no input or output named {name!r} "
                           f"(it has: {', '.join(b.name for b in self.bindings) or 'none'})")

    @property
    def inputs(self) -> list:
        return [b for b in self.bindings if b.role == "input"]

    @property
    def outputs(self) -> list:
        return [b for b in self.bindings if b.role == "output"]

    def __eq__(self, other):
        if not isinstance(other, Program):
            return NotImplemented
        return (self.config_hash == other.config_hash and self.isa_version == other.isa_version
                and self.name == other.name and self.instrs == other.instrs
                and self.sram_init == other.sram_init and self.host_init == other.host_init
                and self.host_bytes == other.host_bytes and self.bindings == other.bindings
                and len(self.tables) == len(other.tables)
                and all(np.array_equal(a, b) for a, b in zip(self.tables, other.tables))
                and self.symbols == other.symbols)

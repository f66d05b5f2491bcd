"""How region values live in SRAM: the stored matrix of a value, row runs and chunks,
weights kept off chip."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..builder import ProgramBuilder, SramTensor
from ...machine.isa import DType
from .graph import UnsupportedOnLPX


@dataclass
class Stored:
    """A region value in SRAM: its logical shape and the matrix that holds it."""

    tensor: SramTensor
    shape: tuple  # logical (Relax) shape

    @property
    def nhwc(self) -> bool:
        return len(self.shape) == 4


def stored_shape(shape: tuple) -> tuple:
    """The tensor shape a Relax value is stored as (NCHW -> NHWC)."""
    if len(shape) == 4:
        n, c, h, w = shape
        return (n, h, w, c)
    return tuple(shape) if shape else (1,)


def slices_of(values) -> list:
    """Every slice the stored ``values`` occupy (to keep a tensor read beside them clear)."""
    return [sl for v in values for sl, _ in v.tensor.layout.tiles]


def runs(n: int, key) -> list:
    """Maximal runs [i0, i1) of 0..n-1 over which ``key(i)`` stays the same."""
    out, i = [], 0
    while i < n:
        k, j = key(i), i + 1
        while j < n and key(j) == k:
            j += 1
        out.append((i, j))
        i = j
    return out


def chunk_of(t: SramTensor, row: int) -> int:
    """The chunk of ``t`` that holds row ``row``."""
    return row // t.layout.rows_per_chunk


@dataclass
class StreamedWeights:
    """A weight matrix kept in off-chip memory: column tile ``j`` is ``rows`` vectors of
    ``lanes`` lanes from byte ``offsets[j]``, loaded over the DMA path tile by tile."""

    offsets: list
    rows: int
    vector_bytes: int
    nbytes: int

    @classmethod
    def place(cls, builder: ProgramBuilder, matrix: np.ndarray, dtype: DType, lanes: int) -> "StreamedWeights":
        rows, cols = matrix.shape
        offsets = []
        for j in range(-(-cols // lanes)):
            tile = np.zeros((rows, lanes), dtype.np)
            part = matrix[:, j * lanes:(j + 1) * lanes]
            tile[:, :part.shape[1]] = part
            offsets.append(builder.host_buffer(tile))
        vb = lanes * dtype.itemsize
        return cls(offsets, rows, vb, len(offsets) * rows * vb)

    def offset(self, j: int, row: int) -> int:
        return self.offsets[j] + row * self.vector_bytes


def row_align(shape: tuple) -> int:
    """Chunks of a 4-D value hold whole image rows, so a window row never straddles two."""
    return int(shape[3]) if len(shape) == 4 else 1


def one(segments: list):
    """The region of a run known to sit in one chunk."""
    if len(segments) != 1:
        raise UnsupportedOnLPX("an access expected in one SRAM chunk spans several")
    return segments[0][1] if isinstance(segments[0], tuple) else segments[0]

"""Host tensors <-> SRAM lines, following a :class:`TensorLayout`.

Used by the program builder (constants into the initial SRAM image) and by the
simulator (inputs in, outputs out), so both agree on every byte.
"""

from __future__ import annotations

import numpy as np

from ..errors import ProgramError
from .isa import DType
from .program import TensorLayout


def vectors_to_lines(vectors: np.ndarray) -> np.ndarray:
    """(n, lanes) array of any dtype -> (n, w, lanes) uint8 lines.

    A vector of ``w``-byte elements fills ``w`` consecutive lines with its bytes in
    order (little-endian elements, lane 0 first). Only the simulator's storage depends
    on this: the ISA never reinterprets a vector as another dtype.
    """
    n, lanes = vectors.shape
    return np.ascontiguousarray(vectors).view(np.uint8).reshape(n, vectors.dtype.itemsize, lanes)


def lines_to_vectors(lines: np.ndarray, dtype) -> np.ndarray:
    """(n, w, lanes) or (n * w, lanes) uint8 lines -> a new (n, lanes) array of ``dtype``."""
    lanes = lines.shape[-1]
    return np.array(lines, copy=True).view(dtype).reshape(-1, lanes)


def coerce(name: str, array, layout: TensorLayout) -> np.ndarray:
    """Check shape and convert to the layout's dtype, refusing lossy integer casts."""
    a = np.asarray(array)
    if tuple(a.shape) != tuple(layout.shape):
        raise ProgramError(f"tensor {name!r}: expected shape {tuple(layout.shape)}, got {tuple(a.shape)}")
    out = a.astype(layout.dtype.np)
    if layout.dtype.is_int and not np.array_equal(out.astype(np.float64), a.astype(np.float64)):
        raise ProgramError(f"tensor {name!r}: values do not fit dtype {layout.dtype.short} exactly")
    return out


def tensor_tiles(layout: TensorLayout, array: np.ndarray, lanes: int):
    """Yield ``(slice, line_index, raw_lines)`` for each column tile of ``array``.

    ``line_index`` is an array of line numbers, ``raw_lines`` the uint8 lines for them.
    """
    w = layout.dtype.itemsize
    mat = np.asarray(array).reshape(layout.rows, layout.cols)
    for j, (sl, addr) in enumerate(layout.tiles):
        part = mat[:, j * lanes:(j + 1) * lanes]
        vec = np.zeros((layout.rows, lanes), layout.dtype.np)
        vec[:, :part.shape[1]] = part
        lines = vectors_to_lines(vec).reshape(layout.rows * w, lanes)
        yield sl, _line_numbers(layout, addr), lines


def read_tensor(layout: TensorLayout, fetch, lanes: int) -> np.ndarray:
    """Assemble a tensor from SRAM; ``fetch(slice, lines)`` returns uint8 lines."""
    mat = np.empty((layout.rows, layout.cols), layout.dtype.np)
    for j, (sl, addr) in enumerate(layout.tiles):
        vec = fetch(sl, _line_numbers(layout, addr)).view(layout.dtype.np).reshape(layout.rows, lanes)
        c0, c1 = j * lanes, min(layout.cols, (j + 1) * lanes)
        mat[:, c0:c1] = vec[:, :c1 - c0]
    return mat.reshape(layout.shape)


def _line_numbers(layout: TensorLayout, addr: int):
    """The lines of one tile: a slice when its vectors are contiguous, else an index array."""
    w = layout.dtype.itemsize
    if layout.row_stride == w:
        return slice(addr, addr + layout.rows * w)
    rows = np.arange(layout.rows, dtype=np.int64)
    return (addr + rows[:, None] * layout.row_stride + np.arange(w)[None, :]).ravel()


def check_layout(layout: TensorLayout, lanes: int, slices: int, lines: int, name: str = "tensor"):
    need = -(-layout.cols // lanes)
    if len(layout.tiles) != need:
        raise ProgramError(f"{name}: {layout.cols} columns need {need} tiles of {lanes} lanes, "
                           f"layout has {len(layout.tiles)}")
    w = layout.dtype.itemsize
    if layout.dtype is DType.NONE:
        raise ProgramError(f"{name}: layout has no dtype")
    for sl, addr in layout.tiles:
        last = addr + (layout.rows - 1) * layout.row_stride + w - 1
        if not 0 <= sl < slices or addr < 0 or last >= lines:
            raise ProgramError(f"{name}: tile at slice {sl} lines {addr}..{last} is outside the SRAM "
                               f"({slices} slices of {lines} lines)")

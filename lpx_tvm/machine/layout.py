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


def stored_bytes(rows: int, cols: int, itemsize: int, lanes: int) -> int:
    """SRAM bytes a (rows, cols) matrix takes: each row whole vectors of ``lanes``
    (the last one padded), a value of ``itemsize`` bytes one line per byte. The one
    sizing rule of stored matrices: weights, tables, caches and activations."""
    return rows * -(-cols // lanes) * lanes * itemsize


def coerce(name: str, array, layout: TensorLayout) -> np.ndarray:
    """Check shape and convert to the layout's dtype, refusing lossy integer casts."""
    a = np.asarray(array)
    if a.dtype.kind in "SUOcmM":  # strings, objects, complex, dates: not numbers a lane holds
        raise ProgramError(f"tensor {name!r}: expected {layout.dtype.short} numbers, got an array of {a.dtype}")
    if tuple(a.shape) != tuple(layout.shape):
        raise ProgramError(f"tensor {name!r}: expected shape {tuple(layout.shape)}, got {tuple(a.shape)}")
    out = a.astype(layout.dtype.np)
    if layout.dtype.is_int and not np.array_equal(out.astype(np.float64), a.astype(np.float64)):
        raise ProgramError(f"tensor {name!r}: values do not fit dtype {layout.dtype.short} exactly")
    return out


def tensor_tiles(layout: TensorLayout, array: np.ndarray, lanes: int):
    """Yield ``(slice, lines, raw_lines)`` for each chunk of each column tile of ``array``.

    ``lines`` is a slice (or an index array) of line numbers, ``raw_lines`` the uint8
    lines for them.
    """
    w = layout.dtype.itemsize
    mat = np.asarray(array).reshape(layout.rows, layout.cols)
    for j in range(-(-layout.cols // lanes)):
        part = mat[:, j * lanes:(j + 1) * lanes]
        for q in range(layout.nchunks):
            (sl, addr), r0, n = layout.chunk(j, q)
            vec = np.zeros((n, lanes), layout.dtype.np)
            vec[:, :part.shape[1]] = part[r0:r0 + n]
            yield sl, _line_numbers(layout, addr, n), vectors_to_lines(vec).reshape(n * w, lanes)


def read_tensor(layout: TensorLayout, fetch, lanes: int) -> np.ndarray:
    """Assemble a tensor from SRAM; ``fetch(slice, lines)`` returns uint8 lines."""
    mat = np.empty((layout.rows, layout.cols), layout.dtype.np)
    for j in range(-(-layout.cols // lanes)):
        c0, c1 = j * lanes, min(layout.cols, (j + 1) * lanes)
        for q in range(layout.nchunks):
            (sl, addr), r0, n = layout.chunk(j, q)
            vec = fetch(sl, _line_numbers(layout, addr, n)).view(layout.dtype.np).reshape(n, lanes)
            mat[r0:r0 + n, c0:c1] = vec[:, :c1 - c0]
    return mat.reshape(layout.shape)


def _line_numbers(layout: TensorLayout, addr: int, rows: int):
    """The lines of ``rows`` vectors from ``addr``: a slice when contiguous, else an index array."""
    w = layout.dtype.itemsize
    if layout.row_stride == w:
        return slice(addr, addr + rows * w)
    r = np.arange(rows, dtype=np.int64)
    return (addr + r[:, None] * layout.row_stride + np.arange(w)[None, :]).ravel()


def check_layout(layout: TensorLayout, lanes: int, slices: int, lines: int, name: str = "tensor"):
    if layout.dtype is DType.NONE:
        raise ProgramError(f"{name}: layout has no dtype")
    need = -(-layout.cols // lanes) * layout.nchunks
    if len(layout.tiles) != need:
        raise ProgramError(f"{name}: {layout.cols} columns in {layout.nchunks} row chunk(s) need {need} tiles of "
                           f"{lanes} lanes, layout has {len(layout.tiles)}")
    w = layout.dtype.itemsize
    for j in range(-(-layout.cols // lanes)):
        for q in range(layout.nchunks):
            (sl, addr), _, n = layout.chunk(j, q)
            last = addr + (n - 1) * layout.row_stride + w - 1
            if not 0 <= sl < slices or addr < 0 or last >= lines:
                raise ProgramError(f"{name}: chunk at slice {sl} lines {addr}..{last} is outside the SRAM "
                                   f"({slices} slices of {lines} lines)")


def offchip_bytes(layout: TensorLayout, array: np.ndarray, lanes: int) -> np.ndarray:
    """A tensor as an off-chip binding stores it: column tile after column tile, each
    ``rows`` vectors of ``lanes`` lanes (zeros past the last column); uint8."""
    ntiles = -(-layout.cols // lanes)
    mat = np.zeros((layout.rows, ntiles * lanes), layout.dtype.np)
    mat[:, :layout.cols] = np.asarray(array).reshape(layout.rows, layout.cols)
    return np.ascontiguousarray(mat.reshape(layout.rows, ntiles, lanes).transpose(1, 0, 2)).view(np.uint8).ravel()


def read_offchip(layout: TensorLayout, raw: np.ndarray, lanes: int) -> np.ndarray:
    """The inverse of :func:`offchip_bytes`: ``raw`` uint8 bytes -> the tensor."""
    ntiles = -(-layout.cols // lanes)
    vec = raw.view(layout.dtype.np).reshape(ntiles, layout.rows, lanes)
    return np.ascontiguousarray(vec.transpose(1, 0, 2).reshape(layout.rows, ntiles * lanes)[:, :layout.cols]) \
        .reshape(layout.shape)


def offchip_nbytes(layout: TensorLayout, lanes: int) -> int:
    return -(-layout.cols // lanes) * layout.rows * lanes * layout.dtype.itemsize

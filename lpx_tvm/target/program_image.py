"""A program's image: what it carries besides its instructions (the initial SRAM image,
the initial off-chip memory and its working buffers, the bindings of its inputs and
outputs, the permutation tables, the symbol table)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..errors import SchedulingError
from ..machine.config import LPXConfig
from ..machine.isa import DType
from ..machine.program import Binding, TensorLayout

if TYPE_CHECKING:
    from .sram_plan import SramTensor


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
    def base(self) -> "OffchipTensor":
        """The tensor whose bytes these are: itself (as :attr:`SramTensor.base`)."""
        return self

    @property
    def vector_bytes(self) -> int:
        return self.lanes * self.layout.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.ntiles * self.layout.rows * self.vector_bytes

    def at(self, j: int, row: int) -> int:
        """Byte offset of row ``row`` of column tile ``j``."""
        return self.offset + (j * self.layout.rows + row) * self.vector_bytes


class ProgramImage:
    """The image and bindings of a program being built (:class:`~lpx_tvm.target.builder.ProgramBuilder`)."""

    def __init__(self, config: LPXConfig):
        self.config = config
        self.images = []  # [SramImage]: the initial SRAM image
        self.tables = []
        self.symbols = {}
        self.host = bytearray()  # initial off-chip memory (streamed weights)
        self.host_end = 0  # off-chip bytes in use: initial data and working buffers
        self._bindings = []

    def declare(self, binding: Binding):
        """Add a binding (an input or output of the program)."""
        self._bindings.append(binding)

    def host_buffer(self, array: np.ndarray) -> int:
        """Place an array in off-chip memory (row-major vectors); returns its byte offset."""
        off = self.host_end
        self.host += bytes(off - len(self.host))  # past any working buffers placed before
        self.host += np.ascontiguousarray(array).tobytes()
        self.host_end = len(self.host)
        return off

    def offchip(self, name: str, shape, dtype, *, role: "str | None" = None) -> OffchipTensor:
        """Working space (or an input / output binding) in off-chip memory, never reused:
        off-chip memory is large next to one region's activations."""
        dt = DType.parse(dtype)
        shape = tuple(int(s) for s in shape) or (1,)
        layout = TensorLayout(shape, dt, (), dt.itemsize)
        off = -(-self.host_end // 64) * 64
        t = OffchipTensor(name, layout, off, self.config.lanes)
        self.host_end = off + t.nbytes
        if role is not None:
            self.declare(Binding(name, role, layout, offchip=off))
        self.symbols[name] = {**layout.to_json(), "offchip": off}
        return t

    def bind(self, name: str, t: OffchipTensor, shape=None, role: str = "output"):
        """Bind an existing off-chip tensor under another name, seen as ``shape`` of the
        same rows and columns (e.g. an output that is a reshape of another value)."""
        layout = t.layout if shape is None else replace(t.layout, shape=tuple(int(s) for s in shape))
        if (layout.rows, layout.cols) != (t.layout.rows, t.layout.cols):
            raise SchedulingError(f"binding {name}: shape {layout.shape} is not stored like {t.layout.shape}")
        self.declare(Binding(name, role, layout, offchip=t.offset))

    def bind_sram(self, name: str, t: SramTensor, role: str = "output"):
        """Bind an existing SRAM tensor under another name (an input updated in place,
        returned as an output: the same lines)."""
        self.declare(Binding(name, role, t.layout))

    def table(self, entries) -> int:
        t = np.asarray(entries, np.int32)
        if t.shape != (self.config.lanes,):
            raise SchedulingError(f"a permutation map needs {self.config.lanes} entries, got {t.shape}")
        self.tables.append(t)
        return len(self.tables) - 1

    def bindings(self, role: "str | None" = None) -> list:
        """The program's bindings so far (of ``role`` only, when given), in binding order."""
        return [b for b in self._bindings if role is None or b.role == role]

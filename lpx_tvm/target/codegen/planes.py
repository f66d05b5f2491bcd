"""Which MXM plane, weight buffer and accumulator rows the next block of a region uses."""

from __future__ import annotations

from ...machine.config import LPXConfig
from .graph import UnsupportedOnLPX


class Planes:
    """Round-robin plane choice, alternating weight buffers and accumulator halves."""

    def __init__(self, cfg: LPXConfig):
        self.cfg = cfg
        self.next = 0
        self.installs = [0] * cfg.mxm_planes
        self.blocks = [0] * cfg.mxm_planes

    def new_block(self, rows: int, plane: "int | None" = None) -> tuple:
        """(plane, first accumulator row) of a new output block of ``rows`` rows, on
        ``plane`` or the next plane in turn."""
        p = plane
        if p is None:
            p = self.next
            self.next = (self.next + 1) % self.cfg.mxm_planes
        half = self.cfg.mxm_acc_rows // 2
        base = (self.blocks[p] % 2) * half if rows <= half else 0
        if rows > self.cfg.mxm_acc_rows:
            raise UnsupportedOnLPX(f"an output block of {rows} rows exceeds the {self.cfg.mxm_acc_rows} accumulators")
        self.blocks[p] += 1
        return p, base

    def buffer(self, plane: int) -> int:
        """The weight buffer of ``plane`` the next install goes to."""
        b = self.installs[plane] % self.cfg.mxm_weight_buffers
        self.installs[plane] += 1
        return b

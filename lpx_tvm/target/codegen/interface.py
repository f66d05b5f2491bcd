"""What a program gets and gives: its declared interface, passed to the compiler as an
argument (``pipeline.lower``, :func:`~.region_compiler.compile_region`).

Inputs come
- from the host (written into the program's SRAM, or its off-chip memory, before a run),
- pinned in SRAM shared with another program of a session (a KV cache the prefill and
  decode steps both hold: :class:`~lpx_tvm.target.builder.SharedSram`),
- received over a link from the chip before (a pipeline stage's rows).

Outputs are
- returned (read by the host after a run),
- updated in place (an input's lines, written where they lie),
- sent downstream over a link (to the next pipeline stage; still bound),
- spilled (kept in off-chip memory, where a region run by bands leaves them).

A program of one chip alone, sharing nothing, is :data:`ALONE`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..builder import ProgramBuilder, SharedSram
from ..system_programs import ChipPlace


class InputKind(enum.Enum):
    HOST = "host"
    PINNED = "pinned"
    RECEIVED = "received"


class OutputKind(enum.Enum):
    RETURNED = "returned"
    UPDATED_IN_PLACE = "updated in place"
    SENT = "sent downstream"
    SPILLED = "spilled"


@dataclass(frozen=True)
class ProgramInterface:
    """The program's place among others.

    Attributes
    ----------
    shared : SharedSram or None
        SRAM held in common with another program of a session: state inputs pinned to
        its lines, its resident weights reused in place (docs/llm.md). Such a program
        keeps its activations on chip or does not compile.
    chip : ChipPlace or None
        The chip of a system the program is for: its group, the inputs it receives from
        the chip upstream, the chip downstream it sends its outputs to, and its messages'
        arrivals (docs/multichip.md). None: one chip alone, its links loop back.
    """

    shared: "SharedSram | None" = None
    chip: "ChipPlace | None" = None

    @property
    def on_chip_only(self) -> bool:
        """Its activations may not go off chip (it shares SRAM with another program)."""
        return self.shared is not None

    def builder(self, cfg, name: str) -> ProgramBuilder:
        """A builder of the program: one chip's, or a system chip's (links to its peers)."""
        return ProgramBuilder(cfg, name) if self.chip is None else self.chip.builder(cfg, name)

    def input_kind(self, name: str, pinned: bool) -> InputKind:
        """How input ``name`` reaches the program (``pinned``: the shared SRAM has it)."""
        if self.chip is not None and name in self.chip.received:
            return InputKind.RECEIVED
        return InputKind.PINNED if pinned else InputKind.HOST

    @property
    def sends_downstream(self) -> bool:
        return self.chip is not None and self.chip.downstream is not None


ALONE = ProgramInterface()

"""What the compiler hands the runtime for one LPX region."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..machine.program import Program


@dataclass
class CompiledRegion:
    """One region's Program with its host-side bindings and the compiler's counts."""

    name: str
    program: Program
    inputs: list  # [(param name, logical shape)]
    outputs: list  # [(binding name, logical shape)]
    macs: int = 0
    ops: dict = field(default_factory=dict)  # relax op -> count, for reports
    weight_bytes: int = 0  # all MXM weights, resident or streamed
    streamed_bytes: int = 0  # the part kept off chip and loaded over the DMA path
    input_transforms: dict = field(default_factory=dict)  # param -> host-side layout (im2col)

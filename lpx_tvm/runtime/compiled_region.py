"""What the compiler hands the runtime for one LPX region, and the name it is called by."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..machine.program import Program

# The VM calls region NAME as the packed function REGION_PREFIX + NAME (an extern call
# the pipeline's outline stage writes and the executable registers).
REGION_PREFIX = "lpx.region."
# The target tag TVM knows the machine by (tvm.compile(mod, target="lpx")).
TARGET_TAG = "lpx"


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
    # Layer tag (an instruction tag up to its first ".") -> the stable layer name the
    # report shows (ONNX node name, torch module path); see docs/report.md.
    layer_names: dict = field(default_factory=dict)
    # The constants the compiler placed, by content ((key, SramTensor), ...): what a
    # second program sharing this one's SRAM reuses in place (target.builder.SharedSram).
    # Not kept in artifacts.
    constants: tuple = ()
    sram_lines: int = 0  # the most SRAM lines in use at once (constants, bindings, working space)
    # The program's dependency floor: its groups each at the earliest cycle their
    # dependencies allow, every port and stream free (target.placer.Placer). Not kept in artifacts.
    dependency_cycles: int = 0

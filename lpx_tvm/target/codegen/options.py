"""The knobs of one region compile, as one frozen value: how codegen spends the SRAM.

:func:`compile_region` takes a :class:`CodegenOptions`; a caller that cannot pass one
down (a test compiling a whole model through the pipeline) sets it for the compiles run
inside a ``with codegen_options(...)`` block. These are knobs only: what a program gets
and gives (SRAM shared with another program, its chip of a system) is its
:class:`~.interface.ProgramInterface`, an argument of the compile, never set around it.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, replace

# The smallest share of the free SRAM a band may take: the partitioner refuses an
# activation one row of which needs more (see rules.activation_row_problem).
SMALLEST_BAND_SHARE = 0.125


@dataclass(frozen=True)
class CodegenOptions:
    """How codegen spends the SRAM.

    Attributes
    ----------
    weight_budget : float
        Share of the SRAM that resident weights may take; the rest is working space.
        Weights past it stream in from off-chip memory. Streaming costs far more than
        SRAM (a 320 x 320 fp16 tile loads in 6,660 cycles on ``tsp`` and installs in
        40), so a region first tries this large share and falls back to
        ``fallback_weight_budget`` when its working space does not fit beside it.
    fallback_weight_budget : float
        The share tried next, before the activations go off chip. It is also the share
        the int8 partitioning rule reserves (int8 regions have no off-chip lowering).
    offchip_weight_budget : float
        The same share when the region's activations are kept off chip (bands need room).
    spread : int
        Image values are cut into this many row chunks (on different slices), so that
        row-wise passes (padding, pools, adds) and the planes' reads run side by side.
    weight_spread : int
        The same for weight matrices: planes installing different parts of one matrix
        read through different slices' ports.
    band_shares : tuple of float
        Shares of the SRAM left beside the constants that one band's inputs and output
        may take, tried in order while a band does not fit after all.
    force_offchip : bool
        Keep the activations off chip even when they fit (tests of the band lowerings);
        applies to compiles that allow off-chip values.
    """

    weight_budget: float = 0.9
    fallback_weight_budget: float = 0.6
    offchip_weight_budget: float = 0.25
    spread: int = 8
    weight_spread: int = 8
    band_shares: tuple = (0.5, 0.25, SMALLEST_BAND_SHARE)
    force_offchip: bool = False


_OPTIONS: contextvars.ContextVar = contextvars.ContextVar("lpx_codegen_options", default=None)


def current_options() -> CodegenOptions:
    """The options of the innermost :func:`codegen_options` block, else the defaults."""
    options = _OPTIONS.get()
    return options if options is not None else CodegenOptions()


@contextlib.contextmanager
def codegen_options(**overrides):
    """Compile the regions of the enclosed block with these option values.

    Parameters
    ----------
    **overrides
        Fields of :class:`CodegenOptions` to change from the options in force.

    Yields
    ------
    CodegenOptions
        The options in force inside the block.
    """
    options = replace(current_options(), **overrides)
    token = _OPTIONS.set(options)
    try:
        yield options
    finally:
        _OPTIONS.reset(token)

"""Everything the lowering of one region may read and write, in one object.

A :class:`LoweringContext` is made fresh for every compile attempt of a region (see
:func:`~lpx_tvm.target.codegen.region_compiler.compile_region`) and handed to every lowering and
helper; nothing about a compile lives anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...machine.config import LPXConfig
from ...machine.isa import DType
from ...precision import Precision
from ..builder import ProgramBuilder
from .graph import Operand, UnsupportedOnLPX
from .interface import ALONE, ProgramInterface
from .planes import Planes
from .options import CodegenOptions
from .tiling_policy import TilingPolicy
from .quant import MXM_8BIT_IN_FLOAT, relax_dtype
from .storage import Stored

PRECISION_DTYPE = {Precision.FP32: DType.FP32, Precision.FP16: DType.FP16, Precision.BF16: DType.BF16,
                   Precision.INT8: DType.INT8}


def check_precision(precision: str):
    """Raise :class:`UnsupportedOnLPX` unless ``precision`` is one codegen compiles at."""
    if precision not in PRECISION_DTYPE:
        raise UnsupportedOnLPX(f"precision {precision!r} (expected fp32, fp16, bf16 or int8)")


@dataclass(eq=False)
class LoweringContext:
    """The state of one region's lowering.

    Attributes
    ----------
    cfg, precision, options, policy
        The machine, the precision compiled at, the SRAM knobs, and the tilings of the MXM layers (the policy
        records the layers it is asked about).
    interface
        What the program gets and gives (:class:`~.interface.ProgramInterface`): SRAM
        shared with another program, its chip of a system.
    dtype, int8, acc
        The stored dtype of float values, whether the region is a QDQ model's integer
        graph (values then keep their own dtypes), and the accumulator dtype.
    offchip, band_share
        Whether the region's values live off chip (every op then runs by bands), and the
        share of the free SRAM one band may take.
    builder, planes
        The program being built, and the MXM plane / buffer rotation.
    values
        Region value name -> its :class:`~.storage.Stored` (or off-chip ``Spilled``) value.
    weights
        Op name -> its MXM weight matrix (resident tensor, streamed, or None).
    input_transforms, im2col_values
        Region inputs the host lays out as im2col rows, and every value stored that way.
    layer_ops
        Op name -> the composite a lowering was given when it lowers a view of it (an
        int8 op as its integer conv2d): the tuning task is the whole composite.
    dequantized
        Int8 MXM op name -> (the ``lpx.dequantize`` op that alone reads it, whether that
        op's value is a region output): the drain dequantizes on the way out
        (:func:`~.quant.fusable_dequantizes`).
    fills, lane_maps
        Constant fill vectors and SXM permutation tables made so far (shared).
    stacks
        Constant stacks of matrices placed so far, by content (the products that pick
        from one stack, a layer's experts, share its lines).
    scratch
        Tensors that live only while the current op is emitted.
    macs, op_counts
        Useful multiply-accumulates, and Relax ops lowered by name, for the report.
    """

    cfg: LPXConfig
    precision: str
    dtype: DType
    int8: bool
    acc: DType
    options: CodegenOptions
    policy: TilingPolicy
    offchip: bool
    band_share: float
    interface: ProgramInterface
    builder: ProgramBuilder
    planes: Planes
    values: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    input_transforms: dict = field(default_factory=dict)
    im2col_values: dict = field(default_factory=dict)
    layer_ops: dict = field(default_factory=dict)
    dequantized: dict = field(default_factory=dict)
    fills: dict = field(default_factory=dict)
    lane_maps: dict = field(default_factory=dict)
    stacks: dict = field(default_factory=dict)
    scratch: list = field(default_factory=list)
    macs: int = 0
    op_counts: dict = field(default_factory=dict)
    # Value name -> index of the last op that reads it (region outputs: past the last op),
    # and the index of the op being lowered: an op may update a value in place only at
    # its last use (index_put into a KV cache).
    last_use: dict = field(default_factory=dict)
    op_index: int = 0
    updated_in_place: set = field(default_factory=set)  # values stored in an input's lines
    installed: frozenset = frozenset()  # values a product installs as its matrix (a runtime B)
    multiplied: frozenset = frozenset()  # values multiplied by a runtime B

    @classmethod
    def fresh(cls, cfg: LPXConfig, precision: str, name: str, policy: TilingPolicy, options: CodegenOptions,
              offchip: bool, band_share: float, interface: ProgramInterface = ALONE) -> "LoweringContext":
        """A new context (and a new program builder) for one compile of region ``name``."""
        check_precision(precision)
        int8 = precision == Precision.INT8
        acc = DType.INT32 if int8 else DType.FP32
        return cls(cfg, str(precision), PRECISION_DTYPE[precision], int8, acc, options, policy, offchip, band_share,
                   interface, interface.builder(cfg, name), Planes(cfg))

    def mxm_dtype(self, op) -> DType:
        """The dtype an MXM op multiplies in: its input's (int8 or fp8) for a quantized
        dense layer of a float build (``lpx.qlinear``), else the build's."""
        return relax_dtype(op.main.args[0].dtype) if op.composite in MXM_8BIT_IN_FLOAT else self.dtype

    def acc_dtype(self, op) -> DType:
        """The dtype of an MXM op's accumulators (int32 for int8 products)."""
        return DType.INT32 if self.mxm_dtype(op).is_int else DType.FP32

    def value(self, operand: Operand) -> Stored:
        """The stored value of a tensor operand."""
        if operand.is_const:
            raise UnsupportedOnLPX("a constant where a tensor input was expected")
        return self.values[operand.name]

    def temp(self, tensor):
        """Register a tensor (or stored value) that lives only while the current op is
        emitted; returns it."""
        self.scratch.append(tensor.tensor if isinstance(tensor, Stored) else tensor)
        return tensor

    def spread_of(self, shape: tuple) -> int:
        """How many row chunks a value of logical ``shape`` is cut into."""
        return self.options.spread if len(shape) == 4 else 1


__all__ = ["LoweringContext", "PRECISION_DTYPE", "check_precision"]

"""Compile one LPX region (a partitioned Relax function) into one Program.

Storage convention inside a region: a 4-D NCHW tensor is stored as an NHWC matrix
(rows = N*H*W pixels, cols = C channels, cut into tiles of ``lanes`` channels); any
other tensor as rows = product of all but the last dim, cols = last dim. The lanes
past a tensor's last channel hold unspecified values and every consumer ignores them
(MXM installs only the valid weight rows, reductions take a width). The runtime
converts NCHW to NHWC and back at the region's boundary.

MXM ops (conv2d, dense) are lowered through their TensorIR schedule: the scheduled
PrimFunc's tile instances (:func:`lpx_tvm.tir_schedules.tile_steps`) become install /
multiply-accumulate groups, and the last reduction tile of each output block a drain
group that also applies the fused epilogue (bias, ReLU, clip) and the conversion to the
storage dtype. Vector ops (elementwise, pools) become VXM/SXM groups per column tile.
All groups of the region go to one ProgramBuilder, whose list scheduler times them.

Each op is lowered by the function :mod:`.registry` holds for it (the modules of
:mod:`.lowerings`), with a fresh :class:`~.context.LoweringContext` per compile.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ...errors import SchedulingError, SramFull
from ...machine.config import LPXConfig
from ...machine.isa import DType
from ...precision import Precision
from ...runtime.compiled_region import CompiledRegion
from ..sram_plan import SPREAD_MARGIN, spread_chunks
from ..system_programs import emit_receive, emit_send
from .interface import ALONE, InputKind, OutputKind, ProgramInterface
from .lowering_context import LoweringContext, check_precision
from .graph import Region, read_region
from .im2col import float_image_stems, int8_image_stems
from .lowerings import FAMILIES  # noqa: F401  (importing them registers every lowering)
from .offchip import Spilled, lower_by_bands, spill_param
from .options import CodegenOptions, current_options
from .tiling_policy import TilingPolicy
from .quant import fusable_dequantizes, relax_dtype
from .registry import lower
from .storage import Stored, StreamedWeights, row_align, stored_shape
from .values import copy_value, release
from .weights import place_weights


def compile_region(cfg: LPXConfig, precision: str, name: str, func, policy: "TilingPolicy | None" = None, *,
                   offchip: bool = True, options: "CodegenOptions | None" = None,
                   interface: ProgramInterface = ALONE) -> CompiledRegion:
    """Compile one LPX region into one Program.

    Parameters
    ----------
    cfg : LPXConfig
        The machine.
    precision : str
        ``fp32``, ``fp16``, ``bf16`` or ``int8``.
    name : str
        The region's name (its program's name).
    func : relax.Function or Region
        The partitioned Relax function, or a :class:`~.graph.Region` already read from one.
    policy : TilingPolicy, optional
        The tilings of its MXM layers (None: every layer at its default); it records the
        layers it was asked about.
    offchip : bool
        Whether a region whose activations do not fit the SRAM may keep them off chip
        (else :class:`~lpx_tvm.errors.SramFull` is raised).
    options : CodegenOptions, optional
        The SRAM knobs; by default those of the innermost
        :func:`~.options.codegen_options` block, else the defaults.
    interface : ProgramInterface
        What the program gets and gives: SRAM shared with another program, its chip of
        a system (default: one chip alone).

    Returns
    -------
    CompiledRegion
    """
    check_precision(precision)
    policy = policy if policy is not None else TilingPolicy()
    options = options if options is not None else current_options()
    region = func if isinstance(func, Region) else read_region(name, func)

    def attempt(off_chip: bool, band_share: float, opts=options) -> CompiledRegion:
        ctx = LoweringContext.fresh(cfg, precision, region.name, policy, opts, off_chip, band_share, interface)
        return _compile(ctx, region)

    def on_chip() -> CompiledRegion:
        # Weights resident up to the large share; if the working space then does not
        # fit beside them, up to the smaller one (more of them stream from off chip).
        try:
            return attempt(False, shares[0])
        except SchedulingError:  # SramFull, or a buffer that must sit in one slice found no hole
            if options.fallback_weight_budget >= options.weight_budget:
                raise
        return attempt(False, shares[0], replace(options, weight_budget=options.fallback_weight_budget))

    shares = options.band_shares
    if not offchip:
        return on_chip()
    if not options.force_offchip:
        try:
            return on_chip()
        except SramFull:
            if precision == Precision.INT8 or interface.on_chip_only:
                # The off-chip (band) lowerings are for float regions, and a program that
                # shares SRAM with another keeps its activations on chip: say why they do not fit.
                raise
    # The activations do not fit beside each other: keep them off chip, run by bands.
    for share in shares:
        try:
            return attempt(True, share)
        except SramFull:
            if share == shares[-1]:
                raise


def _compile(ctx: LoweringContext, region: Region) -> CompiledRegion:
    """One compile attempt of ``region`` with the (fresh) context ``ctx``, in phases:
    bind the inputs, place the weights, lower the ops, bind the outputs."""
    received = _bind_inputs(ctx, region)
    _plan_liveness(ctx, region)
    # Constants go first: the initial image must sit in lines that working space never
    # touches, which the allocator can only promise for space it has not handed out yet.
    ctx.weights = {op.out: place_weights(ctx, op) for op in region.ops}
    for name, t in received.items():
        emit_receive(ctx.builder, ctx.interface.chip, t, f"{name}.handoff")
    _lower_ops(ctx, region)
    outputs = _bind_outputs(ctx, region)
    return _compiled(ctx, region, outputs)


def _bind_inputs(ctx: LoweringContext, region: Region) -> dict:
    """Give every input of the region its storage, by its kind (from the host, pinned in
    shared SRAM, received over a link); returns {name: tensor} of the received ones."""
    b, interface = ctx.builder, ctx.interface
    if interface.shared is not None:
        if ctx.offchip:
            raise SramFull(f"region {region.name}: its activations do not fit on chip beside the SRAM it shares "
                           "with another program")
        b.share(interface.shared)
    if not ctx.offchip:
        ctx.input_transforms = float_image_stems(ctx.cfg, region)
    # Values stored as im2col rows: those inputs, and an int8 stem's quantized input.
    ctx.im2col_values = dict(ctx.input_transforms)
    if ctx.int8 and not ctx.offchip:
        inputs, values = int8_image_stems(ctx.cfg, region)
        ctx.input_transforms.update(inputs)
        ctx.im2col_values.update(values)
    received = {}  # input name -> tensor its rows arrive in, from the chip before (a pipeline stage's)
    scattered = _scattered_inputs(region)
    for p in region.params:
        if ctx.offchip:
            if p.dtype == "int32":  # indices: the band lowerings have no gather or scatter
                raise SramFull(f"region {region.name}: its activations do not fit on chip, and its int32 input "
                               f"{p.name!r} (indices) has no off-chip lowering")
            ctx.values[p.name] = spill_param(ctx, p.name, p.shape)
            continue
        tr = ctx.input_transforms.get(p.name)
        shape = tuple(tr["matrix"]) if tr else stored_shape(p.shape)
        # Integer inputs (token ids, positions, int8 activations) and fp8 ones keep their dtype; other
        # float ones are stored at the precision (an int8 build's inputs are its quantized integers).
        dtype = relax_dtype(p.dtype) if ctx.int8 or p.dtype in ("int32", "int8", "float8_e4m3fn") else ctx.dtype
        pinned = b.pinned(p.name)
        kind = interface.input_kind(p.name, pinned is not None)
        if kind is InputKind.RECEIVED:
            received[p.name] = b.tensor(p.name, shape, dtype, row_align=row_align(p.shape))
            ctx.values[p.name] = Stored(received[p.name], p.shape)
        elif kind is InputKind.PINNED:
            if tuple(pinned.shape) != tuple(shape) or pinned.dtype != DType.parse(dtype):
                raise SchedulingError(f"input {p.name!r} is {shape} {dtype} here but {pinned.shape} "
                                      f"{pinned.dtype.short} in the program it shares SRAM with")
            ctx.values[p.name] = Stored(b.input_at(p.name, pinned), p.shape)
        elif p.name in scattered:
            # A value cache: its rows spread in chunks over as many slices as a plane has
            # install lanes (or a multiple), which then read a tile's rows at once (p @ V
            # at the install rate, not one slice's port), each chunk with a spare row
            # either side for the scatters of rows it does not hold. The least-used
            # slices: the others keep room for what must sit whole in one slice (a
            # gather's table).
            count = spread_chunks(ctx.cfg, math.prod(shape[:-1]), DType.parse(dtype).itemsize).slices
            used = b.slice_lines_used
            slices = sorted(sorted(range(ctx.cfg.mem_slices), key=lambda sl: (used[sl], sl))[:count])
            ctx.values[p.name] = Stored(b.input(p.name, shape, dtype, install_align=ctx.cfg.lanes,
                                                margin=SPREAD_MARGIN, slices=slices), p.shape)
        else:
            ctx.values[p.name] = Stored(b.input(p.name, shape, dtype, row_align=1 if tr else row_align(p.shape)),
                                        p.shape)
    return received


def _scattered_inputs(region: Region) -> set:
    """The region's inputs that an ``index_put`` writes rows of (a decoder's value caches)."""
    params = {p.name for p in region.params}
    return {op.main.args[0].name for op in region.ops
            if op.main.op == "index_put" and op.main.args[0].name in params}


def _plan_liveness(ctx: LoweringContext, region: Region) -> None:
    """A value's SRAM is reused once its last reader has been emitted; the outputs live
    past the last op."""
    last_use = {}
    names = {p.name for p in region.params} | {op.out for op in region.ops}
    for i, op in enumerate(region.ops):
        for arg in [a for s in [op.main] + op.epilogue for a in s.args if not a.is_const]:
            if arg.name in names:
                last_use[arg.name] = i
    ctx.last_use = {**last_use, **{name: len(region.ops) for name in region.outputs}}
    ctx.installed, ctx.multiplied = _runtime_products(region)
    if ctx.int8 and not ctx.offchip:
        ctx.dequantized = fusable_dequantizes(region, ctx.cfg.vxm_alus, ctx.cfg.mxm_planes)


def _runtime_products(region: Region) -> tuple:
    """The values the products of two runtime values (attention's) install as their
    matrix (2-D: laid out for the install lanes) and multiply (spread over a slice per
    plane, which the planes then read side by side)."""
    products = [op.main.args for op in region.ops
                if op.main.op == "matmul" and len(op.main.args) > 1 and not op.main.args[1].is_const]
    return (frozenset(b.name for _, b, *_ in products if len(b.shape) == 2),
            frozenset(a.name for a, *_ in products if not a.is_const))


def _lower_ops(ctx: LoweringContext, region: Region) -> None:
    """Lower the ops in order, freeing each value after its last reader."""
    keep = set(region.outputs)
    for i, op in enumerate(region.ops):
        ctx.op_index = i
        for s in [op.main] + op.epilogue:
            ctx.op_counts[s.op] = ctx.op_counts.get(s.op, 0) + 1
        ctx.scratch = []
        (lower_by_bands if ctx.offchip else lower)(ctx, op, op.out in region.outputs)
        for t in ctx.scratch:
            ctx.builder.free(t)
        for v in [v for v, last in ctx.last_use.items() if last == i and v not in keep]:
            release(ctx, v)


def _compiled(ctx: LoweringContext, region: Region, outputs: list) -> CompiledRegion:
    prog = ctx.builder.build()
    weights = [w for w in ctx.weights.values() if w is not None]
    streamed = sum(w.nbytes for w in weights if isinstance(w, StreamedWeights))
    resident = sum(_resident_bytes(w, ctx.cfg.lanes) for w in weights if not isinstance(w, StreamedWeights))
    return CompiledRegion(region.name, prog, [(p.name, p.shape) for p in region.params], outputs, ctx.macs,
                          ctx.op_counts, resident + streamed, streamed, ctx.input_transforms,
                          constants=ctx.builder.shareable_constants, sram_lines=ctx.builder.peak_lines,
                          dependency_cycles=ctx.builder.dependency_cycles)


def _resident_bytes(w, lanes: int) -> int:
    """SRAM bytes of a weight matrix, or what a layout that is not one tensor says it takes
    (a stack of experts: ``resident_bytes``)."""
    if hasattr(w, "resident_bytes"):
        return w.resident_bytes
    return w.ntiles * w.layout.rows * lanes * w.layout.dtype.itemsize


def _output_kind(ctx: LoweringContext, name: str, in_names: set) -> OutputKind:
    st = ctx.values[name]
    if isinstance(st, Spilled):
        return OutputKind.SPILLED
    if name in ctx.updated_in_place and st.tensor.name in in_names:
        return OutputKind.UPDATED_IN_PLACE
    return OutputKind.RETURNED


def _bind_outputs(ctx: LoweringContext, region: Region) -> list:
    """[(binding name, logical shape)] of the region's outputs, each its own binding, by
    its kind (spilled, updated in place, returned); then, on a pipeline stage, every
    output but those updated in place is also sent downstream."""
    b = ctx.builder
    outputs = []
    out_names = {bnd.name for bnd in b.bindings(role="output")}
    in_names = {bnd.name for bnd in b.bindings(role="input")}
    taken = set()
    kinds = {name: _output_kind(ctx, name, in_names) for name in region.outputs}
    for name in region.outputs:
        st, kind = ctx.values[name], kinds[name]
        if kind is OutputKind.SPILLED:
            # Another name for the same off-chip bytes (an input, a reshape, a repeat).
            if st.tensor.name not in out_names or st.tensor.name in taken or \
                    tuple(st.tensor.layout.shape) != stored_shape(st.shape):
                b.bind(f"{name}_out", st.tensor, stored_shape(st.shape))
                st = Spilled(replace(st.tensor, name=f"{name}_out"), st.shape)
            taken.add(st.tensor.name)
            outputs.append((st.tensor.name, st.shape))
            continue
        if kind is OutputKind.UPDATED_IN_PLACE and st.tensor.name not in taken and \
                tuple(st.tensor.layout.shape) == stored_shape(st.shape):
            # An input updated where it lies (a KV cache): the output is the same lines.
            b.bind_sram(name, st.tensor)
            taken.add(st.tensor.name)
            outputs.append((name, st.shape))
            continue
        # A reshape alias shares its source's tensor: an output tensor stored in another
        # shape (or already returned for another output) is returned through a copy.
        if st.tensor.name not in out_names or st.tensor.name in taken or \
                tuple(st.tensor.layout.shape) != stored_shape(st.shape):
            st = copy_value(ctx, st, f"{name}_out", is_output=True)
        taken.add(st.tensor.name)
        outputs.append((st.tensor.name, st.shape))
    if ctx.interface.sends_downstream:
        _send_outputs(ctx, region, [n for n in region.outputs if n not in ctx.updated_in_place])
    return outputs


def _send_outputs(ctx: LoweringContext, region: Region, names: list) -> None:
    """Send outputs ``names`` to the next chip of a pipeline, as its program receives
    them (a later stage's ``received`` inputs)."""
    if ctx.offchip:
        raise SramFull(f"region {region.name}: its activations do not fit on chip, and a pipeline stage hands its "
                       "outputs on from SRAM")
    for name in names:
        st = ctx.values[name]
        if tuple(st.tensor.layout.shape) != stored_shape(st.shape):
            st = copy_value(ctx, st, f"{name}.handoff")
        emit_send(ctx.builder, ctx.interface.chip, st.tensor, f"{name}.handoff")

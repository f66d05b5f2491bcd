"""The compile flow, its named stages top to bottom.

::

    import        an ONNX model (path or ModelProto) -> Relax; a model the torch front end
                  imported passes through                                  import_model
    canonicalize  int8: Q/DQ pairs into integer ops; fold constants and BatchNorm,
                  normalize the forms the patterns expect                  canonicalize_model
    partition     maximal LPX regions (BYOC patterns with real checks),
                  and the offload report                                   partition
    ranges        refuse constants the precision would store as inf
                  (fp16, bf16; additive masks before a softmax pass)       check_constant_ranges
    lower         each region -> one Program (scheduled TensorIR tiles and vector ops,
                  tilings from the tuning policy), with its layer names    lower_regions
    outline       region calls -> extern calls the VM makes at run time    outline
    build         the rest for the CPU with TVM's llvm pipeline, and the
                  LPX executable around it                                 build_executable

:func:`build` (a Relax module) and :func:`compile_model` (a model) run them all;
``tvm.compile(mod, target="lpx", relax_pipeline="lpx")`` runs the same stages through
the Relax pipeline ``"lpx"`` registered here, with the target tag ``"lpx"``.

The tuning policy (:class:`~lpx_tvm.target.codegen.TilingPolicy`) is passed in: the
pipeline never reads a tuning log (``lpx_tvm.tune.policy_from_log`` does). A policy
with a ``summary(precision)`` method (one read from a log) says what it applied; that
goes into the report's ``tuning``.
"""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import tvm
from tvm import relax

from .errors import ConfigError, LPXError, SramFull
from .layer_names import region_layer_names
from .machine.config import LPXConfig, load_config
from .machine.schema import compiler_problem
from .precision import Precision
from .relax_passes import canonicalize, import_onnx, partition_for_lpx
from .relax_passes.constant_range import check_constant_ranges
from .relax_passes.qdq import FoldQDQ, has_qdq
from .relax_passes.split_region import op_calls, split_region
from .relax_passes.tvm_output import quiet_tvm
from .runtime.compiled_model import CompiledModel
from .runtime.executable import LPXExecutable
from .runtime.compiled_region import TARGET_TAG
from .runtime.report import Offload, layer_of
from .target.codegen import TilingPolicy, compile_region
from .target.codegen.outline import lpx_functions, outline_regions
from .target.codegen.interface import ALONE, ProgramInterface

# ---- the stages ----------------------------------------------------------------------

@quiet_tvm()  # TVM's C++ log lines stay off the user's stderr (docs/errors.md)
def import_model(model, input_shapes=None):
    """An ONNX model (path or ``onnx.ModelProto``) imported into Relax; a model already
    imported (an ``ImportedModel`` or ``ImportedTorch``: it has ``mod``, ``inputs`` and
    ``outputs``) is returned as it is."""
    if hasattr(model, "mod") and hasattr(model, "inputs") and hasattr(model, "outputs"):
        return model
    return import_onnx(model, input_shapes)


@quiet_tvm()
def canonicalize_model(mod: tvm.IRModule, precision: str) -> tvm.IRModule:
    """The module in the forms the LPX patterns expect (for int8, its Q/DQ pairs first
    become integer ops, before constant folding turns the int8 weights into floats)."""
    if precision == Precision.INT8:
        if not has_qdq(mod):
            raise LPXError("precision int8 needs a quantized (QDQ) model, with QuantizeLinear/DequantizeLinear "
                           "(e.g. from onnxruntime.quantization.quantize_static(quant_format=QDQ)); this model is "
                           "float: compile it with fp32, fp16 or bf16, or quantize it first")
        mod = FoldQDQ(mod)
    return canonicalize(mod)


@quiet_tvm()
def partition(mod: tvm.IRModule, cfg: LPXConfig, precision: str) -> tuple:
    """``(module with LPX regions as Codegen="lpx" functions, OffloadReport)``; a machine
    the compiler cannot target is refused here, before any region is made."""
    problem = compiler_problem(cfg)
    if problem:
        raise ConfigError(problem)
    return partition_for_lpx(mod, cfg, precision)


def region_names(mod: tvm.IRModule) -> dict:
    """{region function name: the name its extern call and compiled region take}.

    Extern-call names are global in the process: a per-build tag keeps two models apart.
    """
    tag = uuid.uuid4().hex[:8]
    return {fn: f"{tag}_{i}" for i, fn in enumerate(sorted(lpx_functions(mod)))}


def lower_regions(mod: tvm.IRModule, cfg: LPXConfig, precision: str, names: dict,
                  policy: "TilingPolicy | None" = None, interface: ProgramInterface = ALONE) -> tuple:
    """``(module, names, {name: CompiledRegion})`` of the module's LPX regions (``names``
    from :func:`region_names`), each with its layer-name table (docs/report.md).

    A region whose ops fit the SRAM one by one but not together (:class:`SramFull`) is
    split in two and each half compiled (``relax_passes.split_region``): the module and
    the names returned have the halves in its place. ``interface``: what the programs
    get and give (SRAM shared with another program, a chip of a system).
    """
    policy = TilingPolicy() if policy is None else policy
    names, compiled = dict(names), {}
    pending = sorted(lpx_functions(mod))
    while pending:
        fn = pending.pop(0)
        func = mod[fn]
        try:
            compiled[fn] = compile_region(cfg, precision, names[fn], func, policy, interface=interface)
        except SramFull:
            if op_calls(func) < 2:
                raise
            mod = split_region(mod, fn)
            name = names.pop(fn)
            names[f"{fn}_a"], names[f"{fn}_b"] = f"{name}a", f"{name}b"
            pending[:0] = [f"{fn}_a", f"{fn}_b"]
    funcs = sorted(lpx_functions(mod).items())
    known = [region_layer_names(func) for _, func in funcs]
    regions = {}
    for i, (fn, _) in enumerate(funcs):
        region = compiled[fn]
        # Every layer tag gets a name: the source's, else the tag in its region (by index,
        # which, unlike the region's name, is the same in every build).
        table = {}
        for layer in dict.fromkeys(layer_of(ins.tag) for ins in region.program.instrs):
            name = known[i].get(layer)
            table[layer] = name if name is not None else f"region{i}/{layer}"
        regions[names[fn]] = dataclasses.replace(region, layer_names=table)
    return mod, names, regions


def outline(mod: tvm.IRModule, names: dict) -> tvm.IRModule:
    """The module with each region call an extern call and the region functions removed."""
    return outline_regions(mod, names)


def build_executable(cpu_mod: tvm.IRModule, regions: dict, cfg: LPXConfig, precision: str, offload,
                     tuning: "dict | None" = None) -> LPXExecutable:
    """The CPU part built with TVM's llvm pipeline, in an executable with the regions."""
    vm_exec = tvm.compile(cpu_mod, target="llvm")
    return LPXExecutable(vm_exec, regions, cfg, precision, _offload(offload), tuning)


# ---- composed ------------------------------------------------------------------------

@quiet_tvm()
def lower(mod: tvm.IRModule, cfg: LPXConfig, precision: str, policy: "TilingPolicy | None" = None,
          interface: ProgramInterface = ALONE) -> tuple:
    """Canonicalize, partition, check constant ranges, lower and outline: ``(cpu module,
    {name: CompiledRegion}, OffloadReport)``. ``policy`` gives the tilings and records the
    tuning tasks; ``interface`` is what the programs get and give (default: one chip
    alone, sharing nothing)."""
    mod, offload = partition(canonicalize_model(mod, precision), cfg, precision)
    check_constant_ranges(mod, precision)
    names = region_names(mod)
    # What still overflows when constants are cast to the storage dtype is an additive
    # mask meant as -inf (check_constant_ranges refused the rest): no numpy warning.
    with np.errstate(over="ignore"):
        mod, names, regions = lower_regions(mod, cfg, precision, names, policy, interface)
    offload.regions = len(regions)
    return outline(mod, names), regions, offload


@quiet_tvm()
def build(mod: tvm.IRModule, target=TARGET_TAG, params=None, preset="tsp", precision="fp16",
          policy: "TilingPolicy | None" = None) -> LPXExecutable:
    """Compile a Relax IRModule for LPX (the successor of ``relay.build(mod, target="lpx")``).

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module as imported (not yet legalized).
    target : str or tvm.target.Target
        ``"lpx"`` (or a target with the ``lpx`` key).
    params : dict, optional
        Values bound to ``main``'s parameters of those names.
    preset : str or LPXConfig
        The machine: a preset name or a machine JSON file.
    precision : str
        ``fp32``, ``fp16``, ``bf16`` or ``int8``.
    policy : TilingPolicy, optional
        The tuned tilings (default: every layer on its default tiling).
    """
    if str(target) != TARGET_TAG and "lpx" not in getattr(tvm.target.Target(target), "keys", ()):
        raise LPXError(f"target {target!r}: lpx_tvm.build compiles for target 'lpx'")
    precision = Precision.parse(precision).value
    cfg = preset if isinstance(preset, LPXConfig) else load_config(preset)
    if params:
        mod = relax.transform.BindParams("main", params)(mod)
    policy = TilingPolicy() if policy is None else policy
    cpu_mod, regions, offload = lower(mod, cfg, precision, policy)
    summary = getattr(policy, "summary", None)
    return build_executable(cpu_mod, regions, cfg, precision, offload, summary(precision) if summary else None)


@quiet_tvm()
def compile_model(model, preset="tsp", precision="fp16", input_shapes=None,
                  policy: "TilingPolicy | None" = None) -> CompiledModel:
    """An ONNX model (path or ``ModelProto``) or an imported model, compiled into a
    runnable :class:`~lpx_tvm.runtime.compiled_model.CompiledModel`."""
    imported = import_model(model, input_shapes)
    return CompiledModel(build(imported.mod, preset=preset, precision=precision, policy=policy), imported)


def _offload(report) -> "Offload | None":
    return None if report is None else Offload.from_json(report.to_json())


# ---- tvm.compile(mod, target="lpx", relax_pipeline="lpx") ------------------------------

@quiet_tvm()
def lower_for_tvm_compile(mod: tvm.IRModule, preset: str, precision: str) -> tvm.IRModule:
    """The Relax pipeline ``"lpx"`` (registered by :mod:`lpx_tvm.tvm_hooks`): the LPX
    regions lowered and their extern calls registered, the rest through TVM's default
    pipeline."""
    cfg = load_config(preset)
    cpu_mod, regions, offload = lower(mod, cfg, Precision.parse(precision).value)
    # The VM resolves the extern calls by name when it runs: register them now.
    LPXExecutable(None, regions, cfg, precision, _offload(offload)).register(keep_alive=True)
    return relax.get_pipeline("default")(cpu_mod)

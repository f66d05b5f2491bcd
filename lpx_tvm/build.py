"""lpx_tvm.build: a Relax module in, an executable whose LPX regions run on the simulator out.

The flow: canonicalize (fold constants, fold BatchNorm into convolutions) -> partition
into maximal LPX regions (BYOC patterns with real checks) -> compile each region
(scheduled TensorIR tiles and vector ops -> one Program per region) -> replace the
regions by extern calls -> build the rest for the CPU with TVM's llvm pipeline.

``tvm.compile(mod, target="lpx", relax_pipeline="lpx")`` runs the same flow through the
registered Relax pipeline ``"lpx"`` and target tag ``"lpx"``.
"""

from __future__ import annotations

import uuid

import tvm
from tvm import relax

from .errors import LPXError
from .precision import Precision
from .relax_passes import canonicalize, partition_for_lpx
from .relax_passes.qdq import FoldQDQ, has_qdq
from .runtime.executable import LPXExecutable
from .target.codegen import TilingPolicy, compile_region
from .target.codegen.outline import lpx_functions, outline_regions
from .machine.config import load_config

TARGET_TAG = "lpx"


def _check(precision):
    Precision.parse(precision)


def partition_model(mod, cfg, precision: str):
    """Canonicalize and partition: ``(module with LPX regions as functions, offload report)``."""
    if precision == "int8" and not has_qdq(mod):
        raise LPXError("precision int8 needs a quantized (QDQ) model, with QuantizeLinear/DequantizeLinear "
                       "(e.g. from onnxruntime.quantization.quantize_static(quant_format=QDQ)); this model is "
                       "float: compile it with fp32, fp16 or bf16, or quantize it first")
    if precision == "int8":
        mod = FoldQDQ(mod)  # Q/DQ pairs into integer ops, before canonicalize folds the int8 weights to floats
    mod = canonicalize(mod)
    mod, offload = partition_for_lpx(mod, cfg, precision)
    return mod, offload


def lower_for_lpx(mod, cfg, precision: str, tuned=None, tasks=None, tuned_used=None):
    """Canonicalize, partition and compile the LPX regions.

    Returns ``(cpu_module, regions, offload_report)``: the module with regions replaced by
    extern calls, the compiled regions by name, and what ran where. ``tuned``: tilings by
    (workload, composite, batches) from a tuning log; the keys applied are added to
    ``tuned_used``. ``tasks``: a dict that collects every MXM layer (tuning tasks).
    """
    mod, offload = partition_model(mod, cfg, precision)
    policy = TilingPolicy(tuned or {})
    # Extern-call names are global in the process: a per-build tag keeps two models apart.
    tag = uuid.uuid4().hex[:8]
    names = {fn: f"{tag}_{i}" for i, fn in enumerate(sorted(lpx_functions(mod)))}
    regions = {names[fn]: compile_region(cfg, precision, names[fn], func, policy)
               for fn, func in lpx_functions(mod).items()}
    if tasks is not None:
        tasks.update(policy.tasks)
    if tuned_used is not None:
        tuned_used.update(policy.used)
    return outline_regions(mod, names), regions, offload


def build(mod, target=TARGET_TAG, params=None, preset="tsp", precision="fp16", tuning_log=None) -> LPXExecutable:
    """Compile a Relax IRModule for LPX (the successor of ``relay.build(mod, target="lpx")``)."""
    if str(target) != TARGET_TAG and "lpx" not in getattr(tvm.target.Target(target), "keys", ()):
        raise LPXError(f"target {target!r}: lpx_tvm.build compiles for target 'lpx'")
    _check(precision)
    cfg = load_config(preset)
    if params:
        mod = relax.transform.BindParams("main", params)(mod)
    tuned, used, layers = {}, set(), {}
    if tuning_log is not None:
        from .tune.database import load_tuned

        tuned = load_tuned(str(tuning_log), cfg)
    cpu_mod, regions, offload = lower_for_lpx(mod, cfg, precision, tuned=tuned, tasks=layers, tuned_used=used)
    vm_exec = tvm.compile(cpu_mod, target="llvm")
    exe = LPXExecutable(vm_exec, regions, cfg, precision, offload)
    exe.tuning = None  # the report's "tuning": which layers a tuning log set
    if tuning_log is not None:
        from .tune.space import Task

        names = lambda keys: sorted(Task(k, None, precision).name for k in keys)  # noqa: E731
        exe.tuning = {"log": str(tuning_log), "tuned_layers": names(used),
                      "default_layers": names(set(layers) - used)}
    return exe


def _register_target_and_pipeline():
    tvm.target.tag.register_tag(TARGET_TAG, {"kind": "llvm", "keys": ["lpx", "cpu"]}, override=True)
    if "lpx" in relax.pipeline.PIPELINE_MAP:
        return

    @relax.register_pipeline("lpx")
    def _lpx_pipeline(preset="tsp", precision="fp16"):
        @tvm.transform.module_pass(opt_level=0, name="LPXPipeline")
        def _pass(mod, _ctx):
            _check(precision)
            cfg = load_config(preset)
            cpu_mod, regions, offload = lower_for_lpx(mod, cfg, precision)
            # The VM resolves the extern calls by name when it runs: register them now.
            LPXExecutable(None, regions, cfg, precision, offload).register()
            return relax.get_pipeline("default")(cpu_mod)
        return _pass


_register_target_and_pipeline()

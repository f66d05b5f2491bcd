"""The entry points a user calls by name: ``lpx_tvm.build``, ``compile_model``, ``load``.

They are the pipeline's (:mod:`lpx_tvm.pipeline`) with one convenience: ``tuning_log=``,
a tuning log folder, which tune reads into the tiling policy the pipeline takes
(:func:`lpx_tvm.tune.policy_from_log`). The pipeline itself never imports tune.
"""

from __future__ import annotations

from . import pipeline
from .machine.config import load_config
from .precision import Precision
from .runtime.compiled_model import CompiledModel, load
from .runtime.executable import LPXExecutable


def _policy(tuning_log, preset):
    if tuning_log is None:
        return None
    from .tune.log_policy import policy_from_log  # MetaSchedule: imported only with a log

    return policy_from_log(tuning_log, load_config(preset))


def build(mod, target=pipeline.TARGET_TAG, params=None, preset="tsp", precision="fp16",
          tuning_log=None) -> LPXExecutable:
    """Compile a Relax IRModule for LPX (see :func:`lpx_tvm.pipeline.build`);
    ``tuning_log``: a tuning log folder (``lpx-tvm tune``) whose schedules to use."""
    Precision.parse(precision)
    return pipeline.build(mod, target, params, preset, precision, policy=_policy(tuning_log, preset))


def compile_model(model, preset="tsp", precision="fp16", input_shapes=None, tuning_log=None) -> CompiledModel:
    """Compile an ONNX model (path or ``ModelProto``) into a runnable model with a report
    (see :func:`lpx_tvm.pipeline.compile_model`); ``tuning_log`` as for :func:`build`."""
    Precision.parse(precision)
    imported = pipeline.import_model(model, input_shapes)
    return pipeline.compile_model(imported, preset, precision, policy=_policy(tuning_log, preset))


__all__ = ["build", "compile_model", "load"]

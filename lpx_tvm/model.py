"""compile_model: an ONNX model (path or ModelProto) to a runnable LPX model with a report."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .build import build
from .errors import LPXError
from .relax_passes import import_onnx


class InputError(LPXError):
    """Inputs that do not match the model: a missing or unknown name, a wrong shape."""


@dataclass
class ImportedSignature:
    """A model's inputs [(name, shape, dtype)] and output names."""

    inputs: list
    outputs: list


class CompiledModel:
    """``run(inputs) -> outputs`` on the simulated LPX, and ``report`` of the last run."""

    def __init__(self, executable, imported, preset: str, precision: str):
        self.executable = executable
        self.inputs = imported.inputs  # [(name, shape, dtype)]
        self.outputs = imported.outputs
        self.preset = preset
        self.precision = precision

    def run(self, inputs) -> dict:
        """``inputs``: {name: array} (or a list in input order). Returns {output name: array}."""
        if not isinstance(inputs, dict):
            inputs = {name: a for (name, _, _), a in zip(self.inputs, inputs)}
        names = [n for n, _, _ in self.inputs]
        unknown = sorted(set(inputs) - set(names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model's inputs are {names}")
        arrays = []
        for name, shape, dtype in self.inputs:
            if name not in inputs:
                raise InputError(f"missing input {name!r} of shape {tuple(shape)}")
            a = np.asarray(inputs[name])
            if tuple(a.shape) != tuple(shape):
                raise InputError(f"input {name!r}: expected shape {tuple(shape)}, got {tuple(a.shape)}")
            arrays.append(a.astype(dtype))
        outs = self.executable.run(arrays)
        return dict(zip(self.outputs, outs))

    @property
    def report(self) -> dict:
        exe = self.executable
        cfg = exe.config
        s = exe.stats
        macs = s.useful_macs
        weight_bytes = sum(r.weight_bytes for r in exe.regions.values())
        peak = cfg.peak_macs_per_cycle_for(self.precision)  # int8: the int8 rate (4x fp16 on tsp)
        return {
            "preset": cfg.name,
            "precision": self.precision,
            "cycles": s.cycles,
            "latency_s": cfg.seconds(s.cycles),
            "macs": macs,
            "mxm_utilization": macs / (peak * s.cycles) if s.cycles else 0.0,
            # The activation dtypes the MXM multiplies (int8 / uint8: the int8 rate).
            "mxm_dtypes": _mxm_dtypes(exe),
            "offload": exe.offload.to_json() if exe.offload is not None else {},
            "layers": [{"name": k, "cycles": v["cycles"], "macs": v["macs"]} for k, v in s.layers.items()],
            "sim_wall_s": s.sim_wall_s,
            "cpu_wall_s": max(0.0, s.total_wall_s - s.sim_wall_s),
            "sram_bytes": s.sram_bytes,
            "offchip_bytes": s.offchip_bytes,
            "weight_bytes": weight_bytes,
            "streamed_weight_bytes": sum(r.streamed_bytes for r in exe.regions.values()),
            # Chips whose SRAM would hold every weight resident (the multi-chip mapping's job).
            "chips_to_hold_weights": max(1, math.ceil(weight_bytes / cfg.sram_bytes)),
            # With a tuning log: the log, and which MXM layers took a tuned schedule.
            "tuning": getattr(exe, "tuning", None),
        }


    def save(self, path: str):
        """Write a self-contained artifact folder (see docs/artifact.md)."""
        from .runtime.artifact import save_artifact

        save_artifact(self, path)


def _mxm_dtypes(exe) -> list:
    cached = getattr(exe, "_mxm_dtypes", None)
    if cached is None:
        cached = sorted({ins.dtype.short for r in exe.regions.values() for ins in r.program.instrs
                         if ins.op in ("mxm.mul", "mxm.mac")})
        exe._mxm_dtypes = cached
    return cached


def load(path: str) -> CompiledModel:
    """Load an artifact written by :meth:`CompiledModel.save` or ``lpx-tvm compile``."""
    from .runtime.artifact import load_artifact

    return load_artifact(path)


def compile_model(model, preset="tsp", precision="fp16", input_shapes=None, tuning_log=None) -> CompiledModel:
    imported = import_onnx(model, input_shapes)
    exe = build(imported.mod, preset=preset, precision=precision, tuning_log=tuning_log)
    return CompiledModel(exe, imported, exe.config.name, precision)

"""A compiled model as its user holds it: named inputs in, named outputs out, a report.

Made by the pipeline (:func:`lpx_tvm.pipeline.compile_model`) or loaded from an artifact
(:func:`load`); both hand it a whole :class:`~lpx_tvm.runtime.executable.LPXExecutable`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import LPXError
from .artifact import load_artifact, save_artifact
from .executable import LPXExecutable
from .report import Report, model_report


class InputError(LPXError):
    """Inputs that do not match the model: a missing or unknown name, a wrong shape."""


@dataclass
class ModelSignature:
    """A model's inputs ``[(name, shape, dtype)]`` in call order and its output names."""

    inputs: list
    outputs: list


class CompiledModel:
    """``run(inputs) -> outputs`` on the simulated LPX, ``report`` of the last run,
    ``save(path)`` as an artifact folder.

    Parameters
    ----------
    executable : LPXExecutable
    signature : ModelSignature or any object with ``inputs`` and ``outputs``
        (an imported ONNX or torch model).
    """

    def __init__(self, executable: LPXExecutable, signature):
        self.executable = executable
        self.inputs = [(name, tuple(shape), dtype) for name, shape, dtype in signature.inputs]
        self.outputs = list(signature.outputs)

    @property
    def preset(self) -> str:
        return self.executable.config.name

    @property
    def precision(self) -> str:
        return self.executable.precision

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
            arrays.append(input_array(name, a, dtype))
        outs = self.executable.run(arrays)
        return dict(zip(self.outputs, outs))

    @property
    def report(self) -> Report:
        """The last run's :class:`~lpx_tvm.runtime.report.Report` (docs/report.md)."""
        return model_report(self.executable)

    def save(self, path: str) -> None:
        """Write a self-contained artifact folder (see docs/artifact.md)."""
        save_artifact(self.executable, self.inputs, self.outputs, path)


def load(path: str) -> CompiledModel:
    """Load an artifact written by :meth:`CompiledModel.save` or ``lpx-tvm compile``."""
    executable, inputs, outputs = load_artifact(path)
    return CompiledModel(executable, ModelSignature(inputs, outputs))


def input_array(name: str, a: np.ndarray, dtype) -> np.ndarray:
    """``a`` as the model's input ``name`` of ``dtype``, refusing any conversion that would
    change a value: non-numbers, and into an integer input a value that is not finite, not
    whole, or out of the dtype's range (onnxruntime refuses these inputs too). Between
    float dtypes values are rounded, as any float input is."""
    want = np.dtype(dtype)
    if a.dtype == want:
        return a
    if a.dtype.kind not in "biuf":
        raise InputError(f"input {name!r}: expected {want} values, got an array of {a.dtype} "
                         f"({'strings' if a.dtype.kind in 'SU' else a.dtype.kind})")
    if want.kind in "iu":
        if a.dtype.kind == "f":
            bad = ~np.isfinite(a) | (a != np.round(a))
            if bad.any():
                raise InputError(f"input {name!r}: {want} input given {a.dtype} values that are not whole "
                                 f"numbers (e.g. {a[bad].flat[0]!r}); refusing a lossy conversion")
        info = np.iinfo(want)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise InputError(f"input {name!r}: values {a.min()}..{a.max()} do not fit {want}")
    elif want.kind == "b" and a.dtype.kind != "b":
        raise InputError(f"input {name!r}: expected bool values, got {a.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):  # found and reported just below
        out = a.astype(want)
    if want.kind == "f" and (np.isfinite(a) & ~np.isfinite(out)).any():
        raise InputError(f"input {name!r}: values beyond {want}'s range (they would become inf)")
    return out

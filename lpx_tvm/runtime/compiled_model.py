"""A compiled model as its user holds it: named inputs in, named outputs out, a report.

Made by the pipeline (:func:`lpx_tvm.pipeline.compile_model`) or loaded from an artifact
(:func:`load`); both hand it a whole :class:`~lpx_tvm.runtime.executable.LPXExecutable`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import LPXError
from ..precision import Precision
from .artifact import load_artifact, save_artifact
from .executable import LPXExecutable
from .report import Report, model_report, nonfinite_counts


class InputError(LPXError):
    """Inputs that do not match the model: a missing or unknown name, a wrong shape."""


class NonFiniteOutputWarning(UserWarning):
    """A model output holds inf or NaN values (at fp16, most often an overflow)."""


# What to try when a run at a narrow precision gives infinities.
_WIDER = {Precision.FP16: Precision.BF16, Precision.BF16: Precision.FP32}


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
        self._nonfinite = {}  # the last run's inf / NaN count per output

    @property
    def preset(self) -> str:
        return self.executable.config.name

    @property
    def precision(self) -> str:
        return self.executable.precision

    def run(self, inputs) -> dict:
        """``inputs``: {name: array} (or a list in input order). Returns {output name: array}.

        An output holding inf or NaN values is counted in the report
        (``nonfinite_outputs``) and warned about (:class:`NonFiniteOutputWarning`)."""
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
        # The simulator computes overflows as the hardware does (to inf); they are
        # counted and reported below, not left to numpy's warnings.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            outs = dict(zip(self.outputs, self.executable.run(arrays)))
        self._nonfinite = nonfinite_counts(outs)
        for name, count in self._nonfinite.items():
            if count:
                warnings.warn(nonfinite_message(name, count, outs[name].size, self.precision),
                              NonFiniteOutputWarning, stacklevel=2)
        return outs

    @property
    def report(self) -> Report:
        """The last run's :class:`~lpx_tvm.runtime.report.Report` (docs/report.md)."""
        return model_report(self.executable, self._nonfinite)

    def save(self, path: str) -> None:
        """Write a self-contained artifact folder (see docs/artifact.md)."""
        save_artifact(self.executable, self.inputs, self.outputs, path)


def load(path: str) -> CompiledModel:
    """Load an artifact written by :meth:`CompiledModel.save` or ``lpx-tvm compile``."""
    executable, inputs, outputs = load_artifact(path)
    return CompiledModel(executable, ModelSignature(inputs, outputs))


def nonfinite_message(name: str, count: int, size: int, precision: str) -> str:
    """``output 'y': 4,096 of 4,096 values are not finite (inf/NaN): fp16 overflow? ...``"""
    text = f"output {name!r}: {count:,} of {size:,} values are not finite (inf/NaN)"
    wider = _WIDER.get(precision)
    if wider is not None:
        text += f": {precision} overflow? try --precision {wider}"
    return text


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

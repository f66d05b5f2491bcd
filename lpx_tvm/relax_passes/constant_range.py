"""Refuse constants that the storage precision would turn into infinities.

At fp16 or bf16 an LPX region holds its constants (weights, biases, per-channel and
full-tensor operands, normalization scales) in that dtype or feeds them into results of
that dtype. A finite float32 constant beyond the dtype's range (|v| >= 65520 rounds to
inf in fp16, whose largest value is 65504) would become +-inf in the program, and the
op's results inf or NaN, with no error. :func:`check_constant_ranges` refuses such a
model while compiling it, naming the layer and suggesting a precision that holds the
values. The rule, with its one exemption (docs/compiler.md, "Constants and the storage
precision"):

- Checked: every float constant an op of an LPX region reads, except one-element
  constants of vector ops, which are instruction immediates held in fp32 (a clip bound
  of 3.4e38 is a no-op there, not an overflow). Values that become inf when rounded to
  the dtype are refused; tiny values that round to 0 are ordinary rounding and pass.
- Exempt: an *additive mask*, a constant added to (or subtracted from) the scores right
  before a softmax, whose out-of-range values are "minus infinity" by intent
  (``torch.finfo(float32).min``, -1e9): the add's result is its composite's result, is
  read by softmax ops only, every out-of-range value pushes the sum towards -inf, and
  no softmax row is masked whole (a row of -inf gives NaN where float32 gives a uniform
  row). ``x - inf`` is ``-inf`` and ``exp(-inf)`` is 0, exactly what the float32 model
  computes with -3.4e38.

fp32 and int8 (whose float constants are fp32 scales) store constants exactly: nothing
to check.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm
from tvm import relax

from ..errors import LPXError
from ..layer_names import span_name
from ..machine.isa import DType
from ..precision import Precision
from ..target.codegen.outline import lpx_functions
from ._binding_rewrite import bindings, is_const, is_float, static_shape

__all__ = ["ConstantRangeError", "check_constant_ranges", "out_of_range"]

# Ops that read their constant operand as a matrix (never an immediate, whatever its size).
_MXM_OPS = ("relax.matmul", "relax.nn.conv2d")
# Precisions whose stored values are narrower than float32, and what to suggest instead.
_NARROW = {Precision.FP16: (Precision.BF16, Precision.FP32), Precision.BF16: (Precision.FP32,)}


class ConstantRangeError(LPXError):
    """A constant of an LPX region does not fit the precision the model is compiled at."""


def out_of_range(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The mask of ``values`` that are finite but become +-inf when rounded to ``dtype``."""
    values = np.asarray(values)
    big = np.asarray(np.abs(values) > ml_dtypes.finfo(dtype).max)  # NaN compares False
    with np.errstate(over="ignore"):  # the overflow is what is looked for
        big[big] = np.isfinite(values[big]) & np.isinf(values[big].astype(dtype))
    return big


def check_constant_ranges(mod: tvm.IRModule, precision: str) -> None:
    """Raise :class:`ConstantRangeError` when a constant of an LPX region of the
    partitioned ``mod`` holds finite values that ``precision`` would store as infinities
    (additive masks before a softmax excepted: see the module docstring)."""
    precision = Precision.parse(precision)
    if precision not in _NARROW:
        return
    dtype = DType.parse(precision.value).np
    found = []
    for _, region in sorted(lpx_functions(mod).items()):
        found += _region_problems(region, dtype)
    if not found:
        return
    first, biggest = found[0]
    others = len(found) - 1
    more = f"; {others} more constant{'s' if others > 1 else ''} out of range" if others else ""
    raise ConstantRangeError(f"{first} holds finite values up to {biggest:.4g} in magnitude, beyond {precision}'s "
                             f"range (largest {float(ml_dtypes.finfo(dtype).max):g}): stored at {precision} they "
                             f"would become inf and the results inf or NaN{more}; compile with "
                             f"{_suggestion(precision, biggest)}")


def _suggestion(precision: Precision, biggest: float) -> str:
    wider = [p for p in _NARROW[precision]
             if p == Precision.FP32 or not out_of_range(np.float32(biggest), DType.parse(p.value).np)]
    first, rest = wider[0], wider[1:]
    return f"--precision {first}" + (f" (or {', '.join(rest)})" if rest else "")


def _region_problems(region: relax.Function, dtype: np.dtype) -> list:
    """[(description, max |value|)] of the constants of one region that do not fit."""
    composites, calls = {}, []
    for var, value in bindings(region):
        if isinstance(value, relax.Function):
            composites[var] = value
        elif isinstance(value, relax.Call) and value.op in composites:
            calls.append((var, composites[value.op], value.args))
    readers = _readers(region, calls)
    problems = []
    for var, composite, _ in calls:
        body = bindings(composite)
        for inner_var, call in body:
            if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
                continue
            for pos, arg in enumerate(call.args):
                if not is_const(arg) or not is_float(arg.ty.dtype):
                    continue
                values = arg.value.numpy()
                if values.size == 1 and call.op.name not in _MXM_OPS:
                    continue  # an immediate: held in fp32
                beyond = out_of_range(values, dtype)
                if not beyond.any():
                    continue
                result = inner_var.same_as(composite.body.body)
                if result and _is_additive_mask(call, pos, values, beyond, readers.get(var)):
                    continue
                problems.append((_describe(composite, body, call, pos, values.shape),
                                 float(np.abs(values[beyond]).max())))
    return problems


def _readers(region: relax.Function, calls: list) -> dict:
    """{composite result var: [(reading composite, its param)] or None when the region
    returns it (a reader outside the region)}."""
    out = {}
    for _, composite, args in calls:
        for param, arg in zip(composite.params, args):
            if isinstance(arg, relax.Var):
                out.setdefault(arg, []).append((composite, param))
    ret = region.body.body
    for field in (ret.fields if isinstance(ret, relax.Tuple) else [ret]):
        if isinstance(field, relax.Var):
            out[field] = None
    return out


def _is_additive_mask(call, pos: int, values: np.ndarray, beyond: np.ndarray, readers) -> bool:
    """Whether the constant ``call.args[pos]`` is an additive mask (module docstring)."""
    name = call.op.name
    if name == "relax.add":
        towards_minus_inf = values[beyond] < 0
    elif name == "relax.subtract" and pos == 1:
        towards_minus_inf = values[beyond] > 0
    else:
        return False
    shape = static_shape(call)
    if not readers or not towards_minus_inf.all() or shape is None:
        return False
    masked = np.broadcast_to(beyond, shape)
    for composite, param in readers:
        axis = _softmax_axis(composite, param)
        if axis is None or masked.all(axis=axis).any():
            return False
    return True


def _softmax_axis(composite: relax.Function, param: relax.Var) -> "int | None":
    """The axis of the softmax ``composite`` computes over ``param``, else None."""
    body = bindings(composite)
    if len(body) != 1:
        return None
    _, call = body[0]
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or \
            call.op.name != "relax.nn.softmax" or not call.args[0].same_as(param):
        return None
    return int(call.attrs.axis)


def _describe(composite: relax.Function, body: list, call: relax.Call, pos: int, shape: tuple) -> str:
    """``layer 'fc' (lpx.dense): its weight (32, 16)``."""
    name = next((n for n in (span_name(value) for _, value in body) if n), None)
    kind = str(composite.attrs["Composite"])
    layer = f"layer {name!r} ({kind})" if name else f"a {kind} layer (no source name)"
    op = call.op.name.removeprefix("relax.")
    mxm = any(isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name in _MXM_OPS for _, v in body)
    if call.op.name in _MXM_OPS and pos == 1:
        role = "weight"
    elif op == "add" and mxm:
        role = "bias"
    elif op in ("nn.layer_norm", "nn.rms_norm") and pos > 0:
        role = "scale" if pos == 1 else "offset"
    else:
        role = f"constant operand of {op}"
    return f"{layer}: its {role} {shape}"

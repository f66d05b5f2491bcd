"""Read a partitioned LPX region (a Relax function with Codegen="lpx") as a list of ops.

A region calls composite functions (``Composite="lpx.conv2d_bias_relu"`` ...). Each
composite is read as one *main* op (conv2d, matmul, add, max_pool2d, ...) followed by
an *epilogue* of elementwise ops on its result (bias add, relu, clip), which codegen
fuses into the main op's drain. Composite names are not relied on: the op chain in the
composite's body is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ...errors import LPXError


class UnsupportedOnLPX(LPXError):
    """An op inside an LPX region that codegen cannot lower (a partitioning bug)."""


@dataclass
class Operand:
    """A tensor operand: a region value (``name``) or a constant (``const``)."""

    name: "str | None" = None
    const: "np.ndarray | None" = None
    shape: tuple = ()
    dtype: str = "float32"

    @property
    def is_const(self) -> bool:
        return self.const is not None


@dataclass
class OpCall:
    """One Relax call inside a composite: the root op or an epilogue op."""

    op: str  # relax op name without "relax.", e.g. "nn.conv2d"
    args: list  # [Operand]
    attrs: dict
    shape: tuple
    dtype: str


@dataclass
class RegionOp:
    composite: str
    main: OpCall
    epilogue: list = field(default_factory=list)  # [OpCall]; args[0] is the running value
    out: str = ""  # name of the region value it defines
    shape: tuple = ()
    dtype: str = "float32"


@dataclass
class Region:
    name: str
    params: list  # [Operand] in call order
    ops: list  # [RegionOp] in order
    outputs: list  # [str] names of the values the region returns


def _shape(expr) -> tuple:
    return tuple(int(s) for s in expr.ty.shape)


def _operand(expr, env) -> Operand:
    if isinstance(expr, tvm.ir.Constant):
        value = expr.value
        data = value.numpy() if hasattr(value, "numpy") else np.array(_value(value))
        return Operand(const=data, shape=data.shape, dtype=str(data.dtype))
    if isinstance(expr, relax.Var):
        if expr not in env:
            raise UnsupportedOnLPX(f"value {expr.name} is used before it is defined in the region")
        return env[expr]
    if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):  # a slice's axes and bounds
        return Operand(const=np.array(expr.value), shape=(), dtype=str(np.array(expr.value).dtype))
    if isinstance(expr, relax.PrimValue):  # clip bounds and other scalar arguments
        value = _value(expr.value)
        return Operand(const=np.array(value), shape=(), dtype=str(np.array(value).dtype))
    raise UnsupportedOnLPX(f"operand {type(expr).__name__} inside an LPX region")


def _value(v):
    if isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "value"):  # IntImm, FloatImm, StringImm
        return v.value
    try:
        return [_value(x) for x in v]
    except TypeError:
        return str(v)


def _attrs(call) -> dict:
    if call.attrs is None:
        return {}
    skip = {"get_int", "get_int_tuple", "get_str", "id_", "is_", "same_as"}
    names = [n for n in dir(call.attrs) if not n.startswith("_") and n not in skip]
    return {n: _value(getattr(call.attrs, n)) for n in names}


def _bindings(func):
    for block in func.body.blocks:
        yield from block.bindings


def _composite_steps(func, args) -> list:
    """The op chain of a composite function, its params bound to ``args``."""
    env = {p: a for p, a in zip(func.params, args)}  # keyed by Var: name hints repeat
    steps = []
    for b in _bindings(func):
        call = b.value
        if not isinstance(call, relax.Call) or not hasattr(call.op, "name"):
            raise UnsupportedOnLPX(f"unexpected {type(call).__name__} in composite")
        ops = []
        for a in call.args:
            if isinstance(a, relax.ShapeExpr):
                ops.append(Operand(const=np.array([int(s) for s in a.values]), shape=(len(a.values),), dtype="int64"))
            elif isinstance(a, relax.Tuple):  # concat's inputs
                ops.extend(_operand(f, env) for f in a.fields)
            else:
                ops.append(_operand(a, env))
        steps.append(OpCall(call.op.name.removeprefix("relax."), ops, _attrs(call), _shape(b.var), str(b.var.ty.dtype)))
        env[b.var] = Operand(f"__step{len(steps) - 1}", shape=_shape(b.var), dtype=str(b.var.ty.dtype))
    return steps


def read_region(name: str, func) -> Region:
    names = {}

    def unique(hint: str) -> str:
        # Relax name hints repeat ("lv" for several values): SRAM tensors need distinct names.
        k = names.get(hint, 0)
        names[hint] = k + 1
        return hint if k == 0 else f"{hint}_{k}"

    params = [Operand(unique(p.name), shape=_shape(p), dtype=str(p.ty.dtype)) for p in func.params]
    env = dict(zip(func.params, params))  # keyed by Var
    local_funcs = {}
    ops = []
    for b in _bindings(func):
        value = b.value
        if isinstance(value, relax.Function):
            local_funcs[b.var] = value
            continue
        if isinstance(value, relax.Call) and isinstance(value.op, relax.Var) and value.op in local_funcs:
            inner = local_funcs[value.op]
            args = [_operand(a, env) for a in value.args]
            steps = _composite_steps(inner, args)
            out = Operand(unique(b.var.name), shape=_shape(b.var), dtype=str(b.var.ty.dtype))
            env[b.var] = out
            ops.append(RegionOp(str(inner.attrs["Composite"]), steps[0], steps[1:], out.name, out.shape, out.dtype))
            continue
        if isinstance(value, relax.Var):  # an alias
            env[b.var] = env[value]
            continue
        raise UnsupportedOnLPX(f"region {name}: unexpected binding {type(value).__name__}")
    body = func.body.body
    outs = [body] if isinstance(body, relax.Var) else list(body.fields)
    return Region(name, params, ops, [env[o].name for o in outs])

"""lpx.EvalConstants: evaluate constant subgraphs with numpy, before ``FoldConstant``.

Relax's ``FoldConstant`` legalizes every call whose arguments are all constant and
builds and runs a TIR kernel for it, about 30 ms each. The ONNX importer and
``DecomposeOpsForInference`` leave hundreds of such calls: ConstantOfShape weights
become ``broadcast_to``, Unsqueeze ``expand_dims``, Gemm's ``transB`` a
``permute_dims``, and each inference batch norm ``expand_dims`` / ``add`` / ``sqrt`` of
its statistics. On the ONNX light models that was most of the compile time.

This pass evaluates the ops whose numpy counterpart is bit-exact (data movement, and
IEEE add / subtract / multiply / divide / sqrt, which are correctly rounded in both;
integer add / subtract / multiply, which wrap in both; comparisons, logic, selects and
integer casts; ``arange``, which starts torch's attention masks; ``take`` of constant
indices; the shape of a value of static shape as a tensor, ``shape_to_tensor(shape_of(x))``,
which the ONNX importer writes to wrap a negative Gather index, as in a ViT's class token
``x[:, 0]``) and leaves everything else to ``FoldConstant``, which still runs after it. A result is
kept only when its shape and dtype are exactly the call's type.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ._binding_rewrite import bindings, is_const, rewrite_bindings, static_shape

__all__ = ["EvalConstants", "has_constant_calls"]

# Dtypes whose numpy arrays round-trip through relax.const unchanged.
_PLAIN = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)
# Arithmetic only where numpy and LLVM both round each op once to nearest (float16 is
# left out: TVM may compute it through float32 differently per op).
_IEEE = frozenset(["float32", "float64"])

_BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
}


def _ints(values):
    return tuple(int(v) for v in values)


# Exact in any dtype: comparisons and logic (to bool), selects.
_COMPARE = {
    "relax.equal": np.equal,
    "relax.not_equal": np.not_equal,
    "relax.less": np.less,
    "relax.less_equal": np.less_equal,
    "relax.greater": np.greater,
    "relax.greater_equal": np.greater_equal,
    "relax.logical_and": np.logical_and,
    "relax.logical_or": np.logical_or,
}
_INT = frozenset(["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])


def _scalar(arg):
    """The number of a scalar argument (arange's start, end, step), or None."""
    if isinstance(arg, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return arg.value
    return None


def _evaluate(call, args, out_shape):
    """The value of ``call`` on numpy ``args``, or None when this pass does not handle it."""
    name = call.op.name
    if name in _COMPARE:
        return _COMPARE[name](args[0], args[1])
    if name == "relax.logical_not":
        return np.logical_not(args[0])
    if name == "relax.where":
        return np.where(args[0], args[1], args[2])
    if name == "relax.astype" and (str(call.attrs.dtype) in _INT | {"bool"}) and args[0].dtype.kind in "biu":
        return args[0].astype(str(call.attrs.dtype))  # integer conversions wrap, as in TVM
    if name in _BINARY and name != "relax.divide" and all(a.dtype.name in _INT for a in args) \
            and args[0].dtype == args[1].dtype:
        return _BINARY[name](args[0], args[1])  # two's complement wrap, as in TVM
    if name == "relax.broadcast_to":
        return np.broadcast_to(args[0], out_shape)
    if name == "relax.reshape":
        return args[0].reshape(out_shape)
    if name == "relax.expand_dims":
        return np.expand_dims(args[0], _ints(call.attrs.axis))
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        return np.transpose(args[0], None if axes is None else _ints(axes))
    if name in _BINARY and all(a.dtype.name in _IEEE for a in args):
        if args[0].dtype != args[1].dtype:
            return None
        return _BINARY[name](args[0], args[1])
    if name == "relax.sqrt" and args[0].dtype.name in _IEEE:
        return np.sqrt(args[0])
    if name == "relax.take" and args[1].dtype.kind in "iu":
        return _take(call, args[0], args[1])
    return None


def _take(call, data, indices):
    """``take`` of constants as TVM computes it: "wrap" wraps every index, "clip" clamps,
    "fast" assumes them in bounds (None when one is not: left to TVM)."""
    axis = int(call.attrs.axis) if call.attrs.axis is not None else None
    if axis is None:
        data, axis = data.reshape(-1), 0
    mode = str(call.attrs.mode)
    n = data.shape[axis]
    if mode == "fast" and not np.all((indices >= -n) & (indices < n)):
        return None
    return np.take(data, indices, axis=axis, mode="wrap" if mode == "fast" else mode)


def _static_shape_of(value, shapes):
    """The int64 array of a ``shape_to_tensor`` of a static shape (a ShapeExpr, or
    ``shape_of`` a value whose type has a static shape), else None."""
    arg = value.args[0]
    if isinstance(arg, relax.Var):
        arg = shapes.get(arg)
    if isinstance(arg, relax.Call) and isinstance(arg.op, tvm.ir.Op) and arg.op.name == "relax.shape_of":
        dims = static_shape(arg.args[0])
    elif isinstance(arg, relax.ShapeExpr) and all(isinstance(v, tvm.tirx.IntImm) for v in arg.values):
        dims = _ints(arg.values)
    else:
        return None
    return None if dims is None else np.array(dims, "int64")


def _array(const):
    """A read-only numpy view of a constant's data (no copy: weights can be large)."""
    try:
        return np.from_dlpack(const.value)
    except (TypeError, ValueError, RuntimeError, BufferError):
        return const.value.numpy()


def _const(array, dtype):
    """A Relax constant holding ``array``, written once into the new tensor's memory."""
    tensor = tvm.runtime.empty(array.shape, dtype)
    try:
        np.copyto(np.from_dlpack(tensor), array)
    except (TypeError, ValueError, RuntimeError, BufferError):
        tensor.copyfrom(np.ascontiguousarray(array))
    return relax.const(tensor)


def _operand(arg, known):
    if is_const(arg) and str(arg.ty.dtype) in _PLAIN:
        return _array(arg)
    return known.get(arg)


def _plan(func):
    """{var: constant} for every binding computable from constants by ``_evaluate``."""
    known = {}  # var -> numpy value of a constant or folded binding, for chains
    folded = {}
    shapes = {}  # var -> its shape_of call
    for var, value in bindings(func):
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.shape_of":
            shapes[var] = value
            continue
        if is_const(value):
            if str(value.ty.dtype) in _PLAIN:
                known[var] = _array(value)
            continue
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            continue
        out_shape = static_shape(value)
        dtype = str(getattr(value.ty, "dtype", ""))
        if out_shape is None or dtype not in _PLAIN:
            continue
        if value.op.name == "relax.shape_to_tensor":
            result = _static_shape_of(value, shapes)
            if result is not None and result.shape == out_shape and dtype == "int64":
                folded[var] = _const(result, dtype)
                known[var] = _array(folded[var])
            continue
        if value.op.name == "relax.arange":
            bounds = [_scalar(a) for a in value.args]
            if any(b is None for b in bounds):
                continue
            result = np.arange(*bounds, dtype=dtype)
            if result.shape == out_shape:
                folded[var] = _const(result, dtype)
                known[var] = _array(folded[var])
            continue
        # The target shape of reshape / broadcast_to is a ShapeExpr: out_shape has it.
        args = [_operand(a, known) for a in value.args if not isinstance(a, relax.ShapeExpr)]
        if not args or any(a is None for a in args):
            continue
        result = _evaluate(value, args, out_shape)
        if result is None or result.shape != out_shape or result.dtype.name != dtype:
            continue
        folded[var] = const = _const(result, dtype)
        # Keep a view as it is: a transpose of a broadcast then copies a broadcast, not
        # hundreds of MB of materialized weights. Computed arrays are read back from the
        # constant instead of being held twice.
        known[var] = _array(const) if result.flags.owndata else result
    return folded


def has_constant_calls(mod) -> bool:
    """Whether ``FoldConstant`` could still fold something in ``mod``: a call whose
    arguments are all constant (directly or through variables bound to constants).
    Errs towards yes: nested control flow or functions count as foldable."""
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        if not isinstance(func.body, relax.SeqExpr):
            return True
        consts = set()
        for var, value in bindings(func):
            if isinstance(value, (relax.If, relax.SeqExpr, relax.Function)):
                return True
            if isinstance(value, relax.TupleGetItem):
                value = value.tuple_value
            if _is_constant_arg(value, consts):
                consts.add(var)
            elif isinstance(value, relax.Call) and all(_is_constant_arg(a, consts) for a in value.args):
                return True
    return False


def _is_constant_arg(expr, consts) -> bool:
    if isinstance(expr, relax.Tuple):
        return all(_is_constant_arg(f, consts) for f in expr.fields)
    if isinstance(expr, relax.Var):
        return expr in consts
    # Constants, shapes, dtypes, strings, prim values and global functions.
    return not isinstance(expr, (relax.Call, relax.If, relax.SeqExpr, relax.Function, relax.TupleGetItem))


@relax.transform.function_pass(opt_level=0, name="lpx.EvalConstants")
class EvalConstants:
    """Replace calls computable from constants (layout ops, float32 / float64 add,
    subtract, multiply, divide, sqrt) by their value; uses see the constant once
    ``CanonicalizeBindings`` runs."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        folded = _plan(func)
        rebuild = {var: (lambda visit, builder, c=c: c) for var, c in folded.items()}
        return rewrite_bindings(func, mod, set(), rebuild)

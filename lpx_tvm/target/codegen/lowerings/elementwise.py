"""Elementwise ops on the VXM, row run by row run of each column tile: add, subtract,
multiply, minimum and maximum (of two tensors, or of a tensor and a scalar, per-channel
or full constant), divide, the unary activations (those composed of several VXM ops are
in :mod:`.activations`), PReLU and ``where``."""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from ....errors import SramFull
from ..lowering_context import LoweringContext
from ..epilogue import Clip, apply_epilogue, epilogue_steps
from ..graph import Operand, RegionOp, UnsupportedOnLPX
from ..row_passes import finish, rowwise
from ..quant import relax_dtype
from ..pattern_checks import SUPPORTED_DTYPES, binary_pattern, clip_problem, fp8_problem, same_dtype_problem, tensors_problem
from ..registry import OpPattern, register_lowering, register_pattern, unary_pattern
from ..relax_exprs import expr_shape, is_const, op_name, scalar_value
from ..rules import (
    MAX_INTEGER_POWER,
    binary_operands_problem,
    constant_broadcast,
    divide_operands_problem,
    prelu_slope_problem,
)
from ..storage import Stored, chunk_of, one, row_align, runs, slices_of, stored_shape
from ..values import apart, clashes, copy_value, new_value, whole_groups
from .activations import UNARY_CHAINS, leaky


# Relax unary ops that are one VXM transcendental each.
UNARY_VXM = {"sigmoid": "vxm.sigmoid", "tanh": "vxm.tanh", "erf": "vxm.erf", "nn.gelu": "vxm.gelu",
             "nn.gelu_tanh": "vxm.gelu_tanh"}

BINARY_VXM = {"add": "vxm.add", "subtract": "vxm.sub", "multiply": "vxm.mul", "minimum": "vxm.min",
              "maximum": "vxm.max"}


@register_lowering(*BINARY_VXM, cuts_constants=True)
def lower_binary(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """``x op y`` of two values of one shape, or of a value and a constant that is a
    scalar, one value per channel or a full tensor (:func:`..rules.constant_broadcast`).
    ``c - x`` runs as ``x * -1 + c`` (the negation is exact)."""
    a, b = op.main.args
    problem = binary_operands_problem(op.main.op, a.shape, b.shape, a.is_const, b.is_const, op.shape)
    if problem:
        raise UnsupportedOnLPX(problem)
    if op.dtype == "int32" or any(_is_runtime_number(o, op.shape) for o in (a, b)):
        return _runtime_number_binary(ctx, op, is_output, a, b, BINARY_VXM[op.main.op])
    if not a.is_const and not b.is_const and tuple(a.shape) != tuple(b.shape):
        return _repeated_rows_binary(ctx, op, is_output, a, b, BINARY_VXM[op.main.op])
    _lower_binary(ctx, op, is_output, a, b, BINARY_VXM[op.main.op])


def _is_runtime_number(o, shape) -> bool:
    """A runtime value of one element against a larger result (broadcast to every lane)."""
    return not o.is_const and bool(o.shape) and math.prod(o.shape) == 1 and tuple(o.shape) != tuple(shape)


def _runtime_number_binary(ctx, op, is_output, a, b, vop):
    """``n op t`` or ``t op n`` of a runtime number ``n`` (a position) and a tensor or a
    constant ``t`` of the result's shape: ``n``'s vector read once per row, its lane 0
    broadcast to every lane on the SXM. Int32 values stay int32 (index arithmetic; a
    constant is stored whole, never an immediate, so the sum is exact), and an int32
    op of two values of one shape runs here too, without the broadcast."""
    if op.epilogue:
        raise UnsupportedOnLPX(f"{op.main.op} of a runtime number with an epilogue")
    n, t = (a, b) if _is_runtime_number(a, op.shape) or b.is_const else (b, a)
    broadcast = _is_runtime_number(n, op.shape)
    number_first = n is a
    dt = relax_dtype(op.dtype) if op.dtype == "int32" else ctx.dtype
    nval = ctx.value(n)
    # n and t are read in one group: a slice has one read port, so they sit apart.
    if t.is_const:
        cv = np.broadcast_to(np.asarray(t.const), op.shape)
        cv = cv.transpose(0, 2, 3, 1) if len(op.shape) == 4 else cv
        other = Stored(ctx.temp(ctx.builder.tensor(f"{op.out}.operand", stored_shape(op.shape), dt,
                                                   data=np.ascontiguousarray(cv), row_align=row_align(op.shape),
                                                   avoid=slices_of([nval]))),
                       op.shape)
    else:
        other = ctx.value(t)
        if not broadcast:
            nval = apart(ctx, nval, other, op.out)
        elif set(slices_of([nval])) & set(slices_of([other])):  # its one vector beside every tile
            nval = ctx.temp(copy_value(ctx, nval, f"{op.out}.apart", avoid=[other]))
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[other, nval], dtype=dt)
    tensors = [other.tensor, y.tensor] + ([] if broadcast else [nval.tensor])
    for j in range(y.tensor.ntiles):
        for r0, r1 in runs(y.tensor.layout.rows, lambda r: tuple(chunk_of(x, r) for x in tensors)):
            g = ctx.builder.group(f"{op.out}.{op.main.op}")
            if broadcast:
                nv = g.sxm("sxm.broadcast", g.read(nval.tensor.tile(0).repeat(r1 - r0)), lane=0)
            else:
                nv = g.read(one(nval.tensor.segments(j, r0, r1)))
            if nv.dtype != other.tensor.layout.dtype:
                nv = g.vxm("vxm.cvt", nv, to=other.tensor.layout.dtype)
            tv = g.read(one(other.tensor.segments(j, r0, r1)))
            finish(g, g.vxm(vop, nv, tv) if number_first else g.vxm(vop, tv, nv), one(y.tensor.segments(j, r0, r1)))
    ctx.values[op.out] = y


def _repeated_rows_binary(ctx, op, is_output, a, b, vop):
    """``x op r`` (or ``r op x``) of a value ``x`` and a smaller runtime block ``r`` of its
    trailing dims, repeated along the leading ones: row i of ``x`` meets row
    ``i % rows(r)``, read with ``x``'s rows one block (or, for a one-row block, one
    run, the row read again each cycle) at a time."""
    if op.epilogue:
        raise UnsupportedOnLPX(f"{op.main.op} of a repeated block with an epilogue")
    small_first = math.prod(a.shape) < math.prod(b.shape)
    r, x = (ctx.value(a), ctx.value(b)) if small_first else (ctx.value(b), ctx.value(a))
    if r.tensor.layout.nchunks != 1:
        raise UnsupportedOnLPX(f"a repeated block of shape {r.shape} that spans several slices")
    block = r.tensor.layout.rows
    if block > 1 and x.tensor.layout.rows_per_chunk % block:
        x = whole_groups(ctx, x, block, f"{op.out}.rows")
    r = apart(ctx, r, x, op.out)  # read beside x: a slice has one read port
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x, r])
    tensors = [x.tensor, y.tensor]
    # Runs of rows inside one chunk of x and y and, for a block of several rows, inside
    # one repetition of it (a one-row block is read again for every row of a run).
    key = lambda i: tuple(chunk_of(t, i) for t in tensors) + ((i // block,) if block > 1 else ())  # noqa: E731
    for j in range(y.tensor.ntiles):
        for r0, r1 in runs(y.tensor.layout.rows, key):
            g = ctx.builder.group(f"{op.out}.{op.main.op}")
            xv = g.read(one(x.tensor.segments(j, r0, r1)))
            k0 = r0 % block
            rv = g.read(r.tensor.tile(j).repeat(r1 - r0) if block == 1 else one(r.tensor.segments(j, k0, k0 + r1 - r0)))
            finish(g, g.vxm(vop, rv, xv) if small_first else g.vxm(vop, xv, rv), one(y.tensor.segments(j, r0, r1)))
    ctx.values[op.out] = y


@register_lowering("astype")
def lower_astype(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """Int32 (an index, a position) to the float dtype values are stored at."""
    x = ctx.value(op.main.args[0])
    assert x.tensor.layout.dtype == relax_dtype("int32") and op.dtype in SUPPORTED_DTYPES, \
        "the astype pattern converts int32 to a float dtype"
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x])
    rowwise(ctx, f"{op.out}.astype", [x], y, lambda g, vs: vs[0])  # finish converts
    ctx.values[op.out] = y


def _lower_binary(ctx, op, is_output, a, b, vop):
    negate = False
    if a.is_const:  # constant + tensor, constant * tensor: the tensor goes first
        a, b = b, a
        if vop == "vxm.sub":
            vop, negate = "vxm.add", True
    x = ctx.value(a)
    first = (lambda g, v: g.vxm("vxm.mul", v, imm=-1.0)) if negate else (lambda g, v: v)
    clips = [e for e in epilogue_steps(ctx, op, x.tensor.layout.cols) if isinstance(e, Clip)]
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x])
    tag = f"{op.out}.{op.main.op}"
    if not b.is_const:
        other = apart(ctx, ctx.value(b), x, op.out)
        rowwise(ctx, tag, [x, other], y,
                lambda g, vs: apply_epilogue(g, g.vxm(vop, first(g, vs[0]), vs[1]), clips, 0, 0))
        ctx.values[op.out] = y
        return
    cv = np.asarray(b.const, np.float32)
    kind = constant_broadcast(x.shape, cv.shape)
    if kind == "scalar":
        imm = float(cv.reshape(-1)[0])
        rowwise(ctx, tag, [x], y, lambda g, vs: apply_epilogue(g, g.vxm(vop, first(g, vs[0]), imm=imm), clips, 0, 0))
    elif kind == "channel":
        channel_rowwise(ctx, tag, f"{op.out}.operand", cv.reshape(1, -1), x, y,
                        lambda g, v, row, j, n: apply_epilogue(g, g.vxm(vop, first(g, v), row), clips, j, n))
    else:  # the value's own shape
        arr = cv.transpose(0, 2, 3, 1) if x.nhwc else cv
        full = Stored(ctx.temp(ctx.builder.tensor(f"{op.out}.operand", stored_shape(cv.shape), ctx.dtype,
                                                  data=arr, avoid=slices_of([x]), row_align=row_align(cv.shape))),
                      cv.shape)
        rowwise(ctx, tag, [x, full], y,
                lambda g, vs: apply_epilogue(g, g.vxm(vop, first(g, vs[0]), vs[1]), clips, 0, 0))
    ctx.values[op.out] = y


def channel_rowwise(ctx: LoweringContext, tag: str, name: str, row, x: Stored, y: Stored, body):
    """For each column tile and run of rows of ``x``: ``body(group, x's rows, the
    constant ``row`` (one value per channel) read once per row, tile, rows) -> value``,
    written to ``y``."""
    row_for = _channel_rows(ctx, name, row, x, y)
    tensors = [x.tensor, y.tensor]
    for j in range(x.tensor.ntiles):
        for r0, r1 in runs(x.tensor.layout.rows, lambda r: tuple(chunk_of(t, r) for t in tensors)):
            g = ctx.builder.group(tag)
            v = g.read(one(x.tensor.segments(j, r0, r1)))
            per_row = g.read(row_for(j, chunk_of(x.tensor, r0)).tile(j).repeat(r1 - r0))
            finish(g, body(g, v, per_row, j, r1 - r0), one(y.tensor.segments(j, r0, r1)))


@register_lowering("divide", cuts_constants=True)
def lower_divide(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """``x / y`` of two values of one shape as ``x * recip(y)`` (two roundings), ``c / x``
    with a scalar constant c as ``recip(x)`` (times c unless c is 1), and ``x / c`` as
    ``x * (1/c)`` with 1/c rounded to fp32 at compile time."""
    a, b = op.main.args
    problem = divide_operands_problem(a.shape, b.shape, a.is_const, b.is_const, op.shape)
    if problem:
        raise UnsupportedOnLPX(problem)
    if b.is_const:
        with np.errstate(divide="ignore"):
            inverse = (1.0 / np.asarray(b.const, np.float64)).astype(np.float32)
        _lower_binary(ctx, op, is_output, a, Operand(const=inverse, shape=b.shape, dtype=b.dtype), "vxm.mul")
        return
    clips = [e for e in epilogue_steps(ctx, op, ctx.value(b).tensor.layout.cols) if isinstance(e, Clip)]
    if a.is_const:
        c = float(np.asarray(a.const, np.float32).reshape(-1)[0])
        x = ctx.value(b)
        y = new_value(ctx, op.out, op.shape, is_output, avoid=[x])

        def body(g, vs):
            r = g.vxm("vxm.recip", vs[0])
            return apply_epilogue(g, r if c == 1.0 else g.vxm("vxm.mul", r, imm=c), clips, 0, 0)

        rowwise(ctx, f"{op.out}.divide", [x], y, body)
    else:
        x = ctx.value(a)
        other = apart(ctx, ctx.value(b), x, op.out)
        y = new_value(ctx, op.out, op.shape, is_output, avoid=[x])
        rowwise(ctx, f"{op.out}.divide", [x, other], y,
                lambda g, vs: apply_epilogue(g, g.vxm("vxm.mul", vs[0], g.vxm("vxm.recip", vs[1])), clips, 0, 0))
    ctx.values[op.out] = y


@register_lowering("nn.prelu")
def lower_prelu(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """PReLU with a constant slope (one value, or one per channel), as
    :func:`.activations.leaky`."""
    data, slope = op.main.args
    problem = prelu_slope_problem(data.shape, slope.shape, int(op.main.attrs["axis"]), slope.is_const)
    if problem:
        raise UnsupportedOnLPX(problem)
    x = ctx.value(data)
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x])
    values = np.asarray(slope.const, np.float32).reshape(-1)
    within_unit = bool(np.all((values >= 0) & (values <= 1)))
    tag = f"{op.out}.prelu"
    if values.size == 1:
        s = float(values[0])
        rowwise(ctx, tag, [x], y, lambda g, vs: leaky(g, vs[0], s, within_unit))
    else:
        channel_rowwise(ctx, tag, f"{op.out}.slope", values.reshape(1, -1), x, y,
                        lambda g, v, row, j, n: leaky(g, v, row, within_unit))
    ctx.values[op.out] = y


def _channel_rows(ctx: LoweringContext, name: str, row, x: Stored, y: Stored):
    """The constant ``row`` (one value per channel) read beside ``x``: ``(tile, chunk of
    x) -> SRAM tensor`` of it. One copy clear of the slices of ``x`` and ``y`` when there
    is one; else (``x``'s chunks cover every slice) two copies on different slices, and
    each chunk of ``x`` reads the one not on its own slice."""
    b = ctx.builder
    try:
        one_copy = ctx.temp(b.constant(name, row, ctx.dtype, avoid=slices_of([x, y])))
        return lambda j, q: one_copy
    except SramFull:
        pass
    first = ctx.temp(b.constant(name, row, ctx.dtype))
    second = ctx.temp(b.constant(f"{name}.2", row, ctx.dtype,
                                 tile_avoid=[{sl} for sl, _ in first.layout.tiles]))
    lay = x.tensor.layout

    def copy_for(j: int, q: int):
        return second if lay.chunk(j, q)[0][0] == first.layout.tiles[j][0] else first

    return copy_for


@register_lowering("nn.relu", "sigmoid", "tanh", "erf", "nn.gelu", "nn.gelu_tanh", "clip", *UNARY_CHAINS)
def lower_unary(ctx: LoweringContext, op: RegionOp, is_output: bool):
    x = ctx.value(op.main.args[0])
    y = new_value(ctx, op.out, op.shape, is_output, avoid=[x])

    def body(g, vs):
        v = vs[0]
        for s in [op.main] + op.epilogue:
            if s.op == "nn.relu":
                v = g.vxm("vxm.max", v, imm=0.0)
            elif s.op == "clip":
                lo, hi = (float(np.asarray(a.const)) for a in s.args[1:3])
                if np.isfinite(lo):
                    v = g.vxm("vxm.max", v, imm=lo)
                if np.isfinite(hi):
                    v = g.vxm("vxm.min", v, imm=hi)
            elif s.op in UNARY_VXM:
                v = g.vxm(UNARY_VXM[s.op], v)
            elif s.op in UNARY_CHAINS:
                v = UNARY_CHAINS[s.op](g, v, s)
            else:
                raise UnsupportedOnLPX(f"{s.op} after {op.main.op}")
        return v

    rowwise(ctx, f"{op.out}.{op.main.op}", [x], y, body)
    ctx.values[op.out] = y


@register_lowering("where", cuts_constants=True)
def lower_where(ctx: LoweringContext, op: RegionOp, is_output: bool):
    """``where(c, x, y)`` with a runtime bool c (stored as 0 / 1): m = (c - 1/2) * inf is
    +inf where c holds and -inf elsewhere, and max(min(x, m), min(y, -m)) picks x or y
    exactly, infinities included (a NaN in the branch not taken comes through: the
    VXM's min and max propagate NaN)."""
    cond, a, b = op.main.args
    ins = [ctx.value(cond)]  # read side by side: on different slices
    branches = []  # a scalar constant, or None for the next tensor of ins
    for arg in (a, b):
        if arg.is_const:
            branches.append(float(np.asarray(arg.const).reshape(-1)[0]))
            continue
        v = ctx.value(arg)
        if len(ins) == 2 and any(clashes(v, other) for other in ins):
            v = ctx.temp(copy_value(ctx, v, f"{op.out}.apart", avoid=ins))  # one copy clear of both
        else:
            v = apart(ctx, v, ins[0], op.out)
        ins.append(v)
        branches.append(None)
    y = new_value(ctx, op.out, op.shape, is_output)

    def body(g, vs):
        c, tensors = vs[0], iter(vs[1:])
        half = g.vxm("vxm.sub", c, imm=0.5)  # both masks one op from here: their paths line up
        masks = [g.vxm("vxm.mul", half, imm=inf) for inf in (float("inf"), float("-inf"))]
        picks = [g.vxm("vxm.min", mask, imm=branch) if branch is not None else g.vxm("vxm.min", next(tensors), mask)
                 for branch, mask in zip(branches, masks)]
        return g.vxm("vxm.max", picks[0], picks[1])

    rowwise(ctx, f"{op.out}.where", ins, y, body)
    ctx.values[op.out] = y


# ---- patterns ---------------------------------------------------------------------------


def _binary_check(a, settings):
    op, lhs, rhs = a["root"], a["lhs"], a["rhs"]
    found = same_dtype_problem(op, lhs, rhs)
    if found:
        return found
    problem = binary_operands_problem(op_name(op), expr_shape(lhs), expr_shape(rhs), is_const(lhs),
                                      is_const(rhs), expr_shape(op))
    return (op, problem) if problem else None


def _clip_check(a, settings):
    return clip_problem(a["root"])


def _divide_check(a, settings):
    op, lhs, rhs = a["root"], a["lhs"], a["rhs"]
    found = same_dtype_problem(op, lhs, rhs)
    if found:
        return found
    problem = divide_operands_problem(expr_shape(lhs), expr_shape(rhs), is_const(lhs), is_const(rhs),
                                      expr_shape(op))
    return (op, problem) if problem else None


def _prelu_check(a, settings):
    op = a["root"]
    data, slope = op.args
    problem = prelu_slope_problem(expr_shape(data), expr_shape(slope), int(op.attrs.axis), is_const(slope))
    return (op, problem) if problem else None


def _where_check(a, settings):
    op = a["root"]
    cond, x, y = op.args
    if is_const(cond):
        return op, "where with a constant condition and finite fills (see lpx.MaskingAdd for infinite ones)"
    if not isinstance(cond.ty, relax.TensorType) or cond.ty.dtype != "bool":
        return op, f"where with a condition of type {cond.ty}: LPX selects by a bool tensor"
    found = tensors_problem(op, [b for b in (x, y) if not (is_const(b) and scalar_value(b) is not None)], settings)
    if found:
        return found
    shape = expr_shape(op)
    if not shape:
        return op, "a where of scalars (0-d values stay on the CPU)"
    for b in (cond, x, y):
        if expr_shape(b) != shape and not (is_const(b) and scalar_value(b) is not None):
            return op, (f"where operand of shape {expr_shape(b)} broadcast against {shape}: "
                        "broadcasts move data between lanes")
    return None


def _astype_check(a, settings):
    op, data = a["root"], a["input"]
    if "float8_e4m3fn" in (getattr(data.ty, "dtype", None), op.ty.dtype):
        return fp8_problem(op, settings) or (op, (
            "an fp8 conversion outside an fp8 dense layer: LPX quantizes to fp8 by clip(x * (1 / s), -448, 448) "
            "(lpx.fp8_quant) for lpx.qlinear, which widens it"))
    if is_const(data) or not isinstance(data.ty, relax.TensorType) or data.ty.dtype != "int32" or \
            op.ty.dtype not in SUPPORTED_DTYPES:
        return op, (f"astype of {getattr(data.ty, 'dtype', data.ty)} to {op.ty.dtype}: LPX converts int32 "
                    "indices to float (floats stay at the precision)")
    return tensors_problem(op, [data], settings, integers=True)


def _power_check(a, settings):
    """lpx.Decompose has turned the exponents LPX raises to into other ops: what is left
    stays on the CPU."""
    op = a["root"]
    exponent = op.args[1]
    if not is_const(exponent):
        return op, "power with a runtime exponent: x^y is exp(y * log(x)) and the VXM has no log"
    if scalar_value(exponent) is None:
        return op, f"power with an exponent of shape {expr_shape(exponent)}: LPX raises to one constant exponent"
    return op, (f"power with exponent {scalar_value(exponent):g}: LPX raises to 0.5, -0.5 and the integers "
                f"1 <= |n| <= {MAX_INTEGER_POWER}; other exponents need exp(c * log(x)) and the VXM has no log")


# Ops the VXM has no instruction or exact composition for: they stay on the CPU, and
# the offload report says why.
_NO_VXM_OP = {
    "log": "the VXM has no log (its transcendentals are exp, tanh, sigmoid, erf, GELU, rsqrt and recip)",
    "floor": "the VXM has no floor (its float -> int conversion rounds to nearest and saturates at 2^31)",
    "ceil": "the VXM has no ceil (its float -> int conversion rounds to nearest and saturates at 2^31)",
    "round": "the VXM has no round for the whole float range (its float -> int conversion saturates at 2^31)",
}


def _no_vxm_op_check(a, settings):
    return a["root"], _NO_VXM_OP[op_name(a["root"])]


def _binary(op, priority, checks=(_binary_check,), integers=False):
    return OpPattern(op, lambda: binary_pattern(f"relax.{op}"), ("lhs", "rhs"), checks, priority, integers)


def _unary(name, relax_op, priority, checks=()):
    return OpPattern(name, lambda: unary_pattern(relax_op), checks=checks, priority=priority)


register_pattern(
    _binary("add", 10, integers=True), _binary("subtract", 10, integers=True), _binary("multiply", 10),
    *(_unary(name, relax_op, 20, (_clip_check,) if name == "clip" else ())
      for name, relax_op in (("relu", "relax.nn.relu"), ("sigmoid", "relax.sigmoid"), ("tanh", "relax.tanh"),
                             ("clip", "relax.clip"), ("erf", "relax.erf"), ("gelu", "relax.nn.gelu"),
                             ("gelu_tanh", "relax.nn.gelu_tanh"), ("silu", "relax.nn.silu"))),
    *(_unary(name, relax_op, 30)
      for name, relax_op in (("abs", "relax.abs"), ("negative", "relax.negative"), ("exp", "relax.exp"),
                             ("sqrt", "relax.sqrt"), ("rsqrt", "relax.rsqrt"), ("sign", "relax.sign"),
                             ("leakyrelu", "relax.nn.leakyrelu"))),
    _binary("minimum", 40), _binary("maximum", 40),
    _binary("divide", 50, (_divide_check,)),
    _unary("prelu", "relax.nn.prelu", 51, (_prelu_check,)),
    OpPattern("power", lambda: unary_pattern("relax.power"), checks=(_power_check,), priority=52, lowered=False),
    *(OpPattern(op, lambda op=op: unary_pattern(f"relax.{op}"), checks=(_no_vxm_op_check,), priority=53,
                lowered=False) for op in _NO_VXM_OP),
    OpPattern("astype", lambda: unary_pattern("relax.astype"), None, (_astype_check,), 76, zero_d=True),
    OpPattern("where", lambda: unary_pattern("relax.where"), None, (_where_check,), 81, zero_d=True),
)

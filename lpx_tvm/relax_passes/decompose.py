"""lpx.Decompose: ops spelled as other ops that LPX runs.

- ``split(x, ...)`` whose pieces are read only through ``TupleGetItem`` becomes one
  ``strided_slice`` per piece (a fused QKV projection split into Q, K and V): each
  piece is a lane move on LPX, and a slice nothing reads is dropped.
- consecutive ``permute_dims`` whose inner results nothing else reads compose into
  one (dropped when the composition is the identity): torch writes attention's head
  merge as three permutes, two of which cancel.
- ``broadcast_to`` a value's own shape is dropped, and a reshape of a reshape is one
  reshape (torch writes both around every operand of a batched matmul).
- the guards exporters put after an attention softmax for fully masked rows,
  ``where(isnan(p), 0, p)`` and torch's ``where(not(any(z != -inf)), 0, p)`` (the zeros
  a constant or ``full_like(p, 0)``), are
  dropped when no row can be fully masked: the softmax input adds no mask, or
  constant masks with a finite entry in every row (a causal mask). Finite scores then
  give every row a finite maximum. A runtime mask keeps the guard.
- a softmax over another axis than the last (rank 2 or 3) becomes one over the last
  axis between a permute that puts that axis last and its inverse (permutes on LPX).
- RMSNorm written out, ``x * rsqrt(mean(x * x, -1, keepdims) + eps)`` (then ``* w``
  with a constant per-column w), becomes one ``nn.rms_norm``.
- ``power(x, c)`` with a constant c of 2 or 3 (the cube in the tanh form of GELU)
  becomes ``x * x`` or ``x * x * x``, elementwise multiplies (two roundings instead of
  one; within the float tolerance of the rest of the graph). Other constant exponents
  the VXM reaches: 0.5 becomes ``sqrt``, -0.5 ``rsqrt``, 1 the value itself, other
  integers 4 <= n <= 16 multiplies by repeated squaring (fewer than n - 1 roundings'
  worth of error), and negative integers -16 <= n <= -1 ``1 / x^|n|``.
- PRelu whose slope the importer broadcasts itself, ``where(x < 0, x * s, x)``, becomes
  ``nn.leakyrelu(x, s)`` for a constant s of one value, ``nn.prelu(x, s)`` for one
  value per channel, and ``relu(x) + minimum(x, 0) * s`` for an s of x's shape
  (constant or not): the same arithmetic, x * s rounded once where x < 0 (the add is
  exact, one side is 0).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..target.codegen.rules import MAX_INTEGER_POWER, channel_axis, constant_broadcast
from ._binding_rewrite import bindings, is_const, is_float, op_is, rewrite_bindings, static_shape

__all__ = ["Decompose"]


def _split_bounds(call, shape) -> list | None:
    """[(begin, end)] of each piece of a ``relax.split`` along its axis, or None."""
    axis = int(call.attrs.axis) % len(shape)
    n = shape[axis]
    ios = call.attrs.indices_or_sections
    if isinstance(ios, (int, np.integer)) or hasattr(ios, "value"):
        k = int(getattr(ios, "value", ios))
        if k <= 0 or n % k:
            return None
        cuts = [n // k * i for i in range(1, k)]
    else:
        cuts = [int(getattr(i, "value", i)) for i in ios]
    edges = [0] + cuts + [n]
    return [(a, b) for a, b in zip(edges, edges[1:])]


def _integer_power(call):
    """2 or 3 when ``call`` is ``power(x, c)`` with c a constant scalar 2 or 3, else None."""
    c = call.args[1]
    if not is_const(c) or c.value.numpy().size != 1:
        return None
    k = float(c.value.numpy().reshape(()))
    return int(k) if k in (2.0, 3.0) else None


def _power(x, k, builder):
    if k == 2:
        return relax.op.multiply(x, x)
    return relax.op.multiply(builder.emit(relax.op.multiply(x, x)), x)


def _constant_exponent(call) -> float | None:
    """c when ``call`` is ``power(x, c)`` with c a constant scalar LPX raises to (see the
    module docstring), else None."""
    c = call.args[1]
    if not is_const(c) or c.value.numpy().size != 1:
        return None
    k = float(c.value.numpy().reshape(()))
    if k in (0.5, -0.5) or (k == int(k) and 1 <= abs(k) <= MAX_INTEGER_POWER):
        return k
    return None


def _integer_power_of(x, n, builder):
    """x^n for an integer n >= 1 by repeated squaring (x^4 = (x * x) * (x * x))."""
    if n == 1:
        return x
    half = _integer_power_of(x, n // 2, builder)
    half = builder.emit(half) if isinstance(half, relax.Call) else half
    square = relax.op.multiply(half, half)
    if n % 2 == 0:
        return square
    return relax.op.multiply(builder.emit(square), x)


def _constant_power(x, k, builder):
    if k == 0.5:
        return relax.op.sqrt(x)
    if k == -0.5:
        return relax.op.rsqrt(x)
    if k in (2.0, 3.0):
        return _power(x, int(k), builder)  # as before the general case: x * x, (x * x) * x
    n = int(abs(k))
    positive = _integer_power_of(x, n, builder)
    if k > 0:
        return positive
    positive = builder.emit(positive) if isinstance(positive, relax.Call) else positive
    return relax.op.divide(relax.const(1.0, x.ty.dtype), positive)


def _permutes(values, uses, drop, rebuild):
    """Chains of permute_dims whose inner results nothing else reads become one permute
    (torch's attention writes the head merge as three), or none when they compose to
    the identity."""
    chain = {}  # var -> (source, axes) of the composed permute it is bound to
    for var, value in values.items():
        if not op_is(value, "relax.permute_dims") or static_shape(value) is None:
            continue
        rank = len(static_shape(value))
        axes = [int(a) for a in value.attrs.axes] if value.attrs.axes is not None else list(range(rank))[::-1]
        src = value.args[0]
        if src in chain and uses.get(src, 0) == 1:
            inner_src, inner_axes = chain[src]
            src, axes = inner_src, [inner_axes[a] for a in axes]
            drop.add(value.args[0])
            rebuild.pop(value.args[0], None)
        chain[var] = (src, axes)
        if src is not value.args[0] or axes == list(range(rank)):
            identity = axes == list(range(rank))
            rebuild[var] = lambda visit, builder, x=src, a=axes, same=identity: \
                visit(x) if same else relax.op.permute_dims(visit(x), a)


def _layout_noise(values, uses, drop, rebuild):
    """``broadcast_to`` a value's own shape is the value; a reshape of a reshape whose
    inner result nothing else reads is one reshape (or none, back to the source's shape).
    torch's batched matmuls leave both around every operand."""
    def identity(v):
        return op_is(v, "relax.broadcast_to") and static_shape(v) is not None \
            and static_shape(v.args[0]) == static_shape(v)

    for var, value in values.items():
        if identity(value):
            rebuild[var] = lambda visit, builder, x=value.args[0]: visit(x)
        elif op_is(value, "relax.reshape") and static_shape(value) is not None:
            hops, inner = [], value.args[0]
            while identity(values.get(inner)) and uses.get(inner, 0) == 1:
                hops.append(inner)
                inner = values[inner].args[0]
            if not op_is(values.get(inner), "relax.reshape") or uses.get(inner, 0) != 1 or inner in rebuild:
                continue
            src, shape = values[inner].args[0], static_shape(value)
            drop.update(hops + [inner])
            for h in hops:
                rebuild.pop(h, None)
            rebuild[var] = lambda visit, builder, x=src, same=static_shape(src) == shape, t=shape: \
                visit(x) if same else relax.op.reshape(visit(x), t)


def _through_reshapes(var, values):
    while isinstance(var, relax.Var) and op_is(values.get(var), "relax.reshape"):
        var = values[var].args[0]
    return var


def _masks_leave_rows(z, values) -> bool:
    """Whether the additive constants of a softmax input ``z`` leave every row at least one
    finite entry (so finite scores give every row a finite maximum)."""
    value = values.get(_through_reshapes(z, values))
    while op_is(value, "relax.add"):
        a, b = value.args
        const, other = (a, b) if is_const(a) else (b, a) if is_const(b) else (None, None)
        if const is None:
            return False  # a runtime mask may fill a whole row
        c = const.value.numpy()
        if c.ndim and not np.isfinite(c).any(axis=-1).all():
            return False
        value = values.get(_through_reshapes(other, values))
    return True


def _guarded_rows(cond, values):
    """The softmax input a row guard tests, or None: ``isnan(p)`` of the softmax output p,
    or torch's ``not(max(astype(not(equal(z, -inf))), axis=-1))``."""
    value = values.get(cond)
    if op_is(value, "relax.isnan"):
        soft = values.get(_through_reshapes(value.args[0], values))
        return soft.args[0] if op_is(soft, "relax.nn.softmax") else None
    while op_is(value, "relax.logical_not", "relax.astype", "relax.max"):
        if op_is(value, "relax.max") and [int(a) for a in value.attrs.axis] not in ([-1], [len(static_shape(value)) - 1]):
            return None
        value = values.get(value.args[0])
    if op_is(value, "relax.equal") and is_const(value.args[1]):
        c = value.args[1].value.numpy()
        if c.size == 1 and np.isneginf(c.reshape(())):
            return value.args[0]
    return None


def _is_zeros(expr, values) -> bool:
    """Whether ``expr`` is all zeros: a zero constant, or ``full_like(x, 0)`` (how torch
    writes the guard's fill when it exports through the decomposition of sdpa)."""
    if is_const(expr):
        return not np.any(expr.value.numpy() != 0)
    value = values.get(expr)
    if op_is(value, "relax.zeros_like", "relax.zeros"):
        return True
    return op_is(value, "relax.full_like") and is_const(value.args[1]) and not np.any(value.args[1].value.numpy() != 0)


def _softmax_guards(values, rebuild):
    """``where(guard, 0, p)`` that zeroes the rows of a softmax p whose inputs are all -inf
    (or whose output is NaN) is p when no row can be fully masked."""
    for var, value in values.items():
        if not op_is(value, "relax.where") or var in rebuild:
            continue
        cond, zero, p = value.args
        if not _is_zeros(zero, values) or static_shape(p) != static_shape(value):
            continue
        soft = values.get(_through_reshapes(p, values))
        z = _guarded_rows(cond, values)
        if z is None or not op_is(soft, "relax.nn.softmax"):
            continue
        if _through_reshapes(z, values) is not _through_reshapes(soft.args[0], values) \
                and not _through_reshapes(z, values).same_as(_through_reshapes(soft.args[0], values)):
            continue
        if _masks_leave_rows(soft.args[0], values):
            rebuild[var] = lambda visit, builder, x=p: visit(x)


def _softmax_axes(values, rebuild):
    """A softmax over another axis than the last runs on the value permuted to put that
    axis last, and is permuted back (LPX reduces along the last axis, the one in lanes):
    for ranks 2 and 3, whose permutes run on LPX."""
    for var, value in values.items():
        shape = static_shape(value) if op_is(value, "relax.nn.softmax") else None
        if shape is None or len(shape) not in (2, 3) or int(value.attrs.axis) % len(shape) == len(shape) - 1:
            continue
        axis = int(value.attrs.axis) % len(shape)
        to_last = [a for a in range(len(shape)) if a != axis] + [axis]
        back = [to_last.index(a) for a in range(len(shape))]
        rebuild[var] = lambda visit, builder, x=value.args[0], p=to_last, q=back: relax.op.permute_dims(
            builder.emit(relax.op.nn.softmax(builder.emit(relax.op.permute_dims(visit(x), p)), axis=-1)), q)


def _squares_of(value, values):
    """x when ``value`` is ``x * x`` or ``power(x, 2)``, else None."""
    if op_is(value, "relax.multiply") and value.args[0].same_as(value.args[1]):
        return value.args[0]
    if op_is(value, "relax.power") and _integer_power(value) == 2:
        return value.args[0]
    return None


def _rms_scale_of(r, values):
    """(x, eps) when ``r`` is ``rsqrt(mean(x * x, last axis, keepdims) + eps)``, else None."""
    value = values.get(r)
    if not op_is(value, "relax.rsqrt"):
        return None
    add = values.get(value.args[0])
    if not op_is(add, "relax.add") or not is_const(add.args[1]) or add.args[1].value.numpy().size != 1:
        return None
    mean = values.get(add.args[0])
    shape = static_shape(mean) if op_is(mean, "relax.mean") else None
    if shape is None or not mean.attrs.keepdims or [int(a) % len(shape) for a in mean.attrs.axis] != [len(shape) - 1]:
        return None
    x = _squares_of(values.get(mean.args[0]), values)
    return None if x is None else (x, float(add.args[1].value.numpy().reshape(())))


def _rms_norms(values, uses, drop, rebuild):
    """RMSNorm written out (``x * rsqrt(mean(x^2, -1, keepdims) + eps)``, then ``* w`` with a
    constant w of one value per column) becomes ``nn.rms_norm``, which LPX runs like a
    layer norm without the centering."""
    for var, value in values.items():
        if not op_is(value, "relax.multiply") or not is_float(value.ty.dtype):
            continue
        for x, r in (value.args, value.args[::-1]):
            found = _rms_scale_of(r, values)
            if found is None or not found[0].same_as(x) or static_shape(x) != static_shape(value):
                continue
            cols = static_shape(value)[-1]
            weight, target = np.ones(cols, str(value.ty.dtype)), var
            users = [(v, u) for v, u in values.items() if op_is(u, "relax.multiply") and
                     any(a.same_as(var) for a in u.args)]
            if uses.get(var, 0) == 1 and len(users) == 1:
                outer_var, outer = users[0]
                w = outer.args[1] if outer.args[0].same_as(var) else outer.args[0]
                if is_const(w) and w.value.numpy().size == cols and w.value.numpy().shape[-1] == cols \
                        and static_shape(outer) == static_shape(value):
                    weight, target = w.value.numpy().reshape(cols), outer_var
                    drop.add(var)
            rebuild[target] = lambda visit, builder, x=x, w=weight, eps=found[1]: relax.op.nn.rms_norm(
                visit(x), relax.const(w), axes=[-1], epsilon=eps)
            break


def _slope_of(value, values, uses):
    """(x, the less and multiply vars, slope s) when ``value`` is ``where(x < 0, x * s, x)``
    with a constant s that broadcasts as one value or one per channel, else None."""
    cond, scaled, x = value.args
    less, mul = values.get(cond), values.get(scaled)
    if not (op_is(less, "relax.less") and op_is(mul, "relax.multiply")) or uses.get(cond) != 1 \
            or uses.get(scaled) != 1 or not less.args[0].same_as(x) or not is_const(less.args[1]) \
            or np.any(less.args[1].value.numpy() != 0):
        return None
    a, b = mul.args
    slope = b if a.same_as(x) else a if b.same_as(x) else None
    shape = static_shape(value)
    if slope is None or shape is None or static_shape(x) != shape or not is_float(value.ty.dtype):
        return None
    if static_shape(slope) == shape:
        return x, (cond, scaled), slope
    if is_const(slope) and constant_broadcast(shape, slope.value.numpy().shape) in ("scalar", "channel"):
        return x, (cond, scaled), slope.value.numpy()
    return None


def _prelus(values, uses, drop, rebuild):
    """``where(x < 0, x * s, x)`` (the importer's PRelu for a slope it broadcasts) is a
    leaky ReLU, a PReLU, or a ReLU plus the scaled negative part (see the module docstring)."""
    for var, value in values.items():
        found = _slope_of(value, values, uses) if op_is(value, "relax.where") and var not in rebuild else None
        if found is None:
            continue
        x, inner, slope = found
        drop.update(inner)
        rank = len(static_shape(value))
        if not isinstance(slope, np.ndarray):  # an s of x's shape
            rebuild[var] = lambda visit, builder, x=x, s=slope, dt=str(value.ty.dtype): relax.op.add(
                builder.emit(relax.op.nn.relu(visit(x))),
                builder.emit(relax.op.multiply(builder.emit(relax.op.minimum(visit(x), relax.const(0.0, dt))),
                                               visit(s))))
        elif slope.size == 1:
            rebuild[var] = lambda visit, builder, x=x, a=float(slope.reshape(())): relax.op.nn.leakyrelu(visit(x), a)
        else:
            rebuild[var] = lambda visit, builder, x=x, s=slope.reshape(-1), axis=channel_axis(rank): \
                relax.op.nn.prelu(visit(x), relax.const(s), axis=axis)


def _plan(func):
    drop, rebuild = set(), {}
    values = dict(bindings(func))
    items = {}
    for var, value in values.items():
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            items.setdefault(value.tuple_value, []).append((var, int(value.index)))
    uses = {}
    relax.analysis.post_order_visit(
        func.body, lambda e: uses.__setitem__(e, uses.get(e, 0) + 1) if isinstance(e, relax.Var) else None)
    for var, value in values.items():
        if op_is(value, "relax.split"):
            shape = static_shape(value.args[0])
            bounds = None if shape is None else _split_bounds(value, shape)
            readers = items.get(var, [])
            if bounds is None or uses.get(var, 0) != len(readers):
                continue  # the tuple itself is read: keep the split
            axis = int(value.attrs.axis) % len(shape)
            for item, index in readers:
                begin, end = bounds[index]
                rebuild[item] = lambda visit, builder, x=value.args[0], a=axis, b=begin, e=end: \
                    relax.op.strided_slice(visit(x), axes=[a], begin=[b], end=[e])
            drop.add(var)
        elif op_is(value, "relax.power") and is_float(value.ty.dtype) and _constant_exponent(value) is not None \
                and static_shape(value.args[0]) == static_shape(value):
            rebuild[var] = lambda visit, builder, x=value.args[0], k=_constant_exponent(value): \
                _constant_power(visit(x), k, builder)
    _permutes(values, uses, drop, rebuild)
    _layout_noise(values, uses, drop, rebuild)
    _softmax_guards(values, rebuild)
    _softmax_axes(values, rebuild)
    _rms_norms(values, uses, drop, rebuild)
    _prelus(values, uses, drop, rebuild)
    return drop, rebuild


@relax.transform.function_pass(opt_level=0, name="lpx.Decompose")
class Decompose:
    """Rewrite split into strided slices, permute chains into one, constant powers into multiplies,
    square roots and reciprocals."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        drop, rebuild = _plan(func)
        return rewrite_bindings(func, mod, drop, rebuild)

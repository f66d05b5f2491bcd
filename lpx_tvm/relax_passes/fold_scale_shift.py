"""lpx.FoldScaleShift: fold per-channel affine chains into conv2d / dense weights.

Batch norm after a conv decomposes into subtract / divide / multiply / add with
per-channel constants; with the conv's own bias that is a chain of up to five
elementwise ops. All of them are one affine map per output channel, so they fold
into the weights (scale) and a single bias add (shift).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._binding_rewrite import (
    bindings,
    block_index,
    is_const,
    is_float,
    op_is,
    rewrite_bindings,
    static_shape,
    use_counts,
    visible_at,
)

__all__ = ["FoldScaleShift", "affine_step", "users_of"]


def _foldable_producer(value, value_of):
    """(weight array, channel axis, channel count, output rank) if ``value`` is a conv2d
    or dense whose output channels can absorb a per-channel scale, else None
    (``value_of``: each variable's bound value)."""
    if op_is(value, "relax.nn.conv2d"):
        attrs = value.attrs
        layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout or attrs.data_layout)
        if layouts != ("NCHW", "OIHW", "NCHW"):
            return None
        axis = 1
    elif op_is(value, "relax.matmul"):
        data_shape = static_shape(value.args[0])
        if data_shape is None or len(data_shape) < 2:
            return None
        data = value_of.get(value.args[0])
        if op_is(data, "relax.astype") and data.args[0].ty.dtype == "float8_e4m3fn":
            return None  # an fp8 dense layer: its weights hold fp8 values, a scale folded in would not
        axis = -1
    else:
        return None
    weight = value.args[1]
    out_shape = static_shape(value)
    if not is_const(weight) or out_shape is None:
        return None
    if value.op.name == "relax.matmul" and len(static_shape(weight)) != 2:
        return None
    if not is_float(weight.ty.dtype) or weight.ty.dtype != value.ty.dtype:
        return None
    return weight.value.numpy(), axis, out_shape[axis], len(out_shape)


def _channel_vector(const, out_rank, axis, channels):
    """The constant as one float64 value per channel, or None if it broadcasts over
    anything but the channel axis (or would grow the output)."""
    arr = const.value.numpy()
    if arr.ndim > out_rank:
        return None
    shape = (1,) * (out_rank - arr.ndim) + arr.shape
    axis = axis % out_rank
    if any(n != 1 for i, n in enumerate(shape) if i != axis) or shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(arr.astype(np.float64).reshape(-1), (channels,)).copy()


AFFINE_OPS = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def affine_step(call, cur, scale, shift, coerce):
    """Apply one add / subtract / multiply / divide to the map y = scale * x + shift.

    ``coerce(const)`` returns the constant as a float64 array that broadcasts against
    ``scale`` and ``shift``, or None when its shape is not allowed. Returns the new
    (scale, shift), or None when ``call`` is not affine in ``cur`` with a constant
    other operand.
    """
    if not op_is(call, *AFFINE_OPS):
        return None
    lhs, rhs = call.args
    if lhs.same_as(cur) and is_const(rhs):
        const, cur_on_left = rhs, True
    elif rhs.same_as(cur) and is_const(lhs):
        const, cur_on_left = lhs, False
    else:
        return None
    if not is_float(call.ty.dtype) or const.ty.dtype != call.ty.dtype:
        return None
    if static_shape(call) is None or static_shape(call) != static_shape(cur):
        return None
    c = coerce(const)
    if c is None:
        return None
    op = call.op.name
    if op == "relax.add":
        new = scale, shift + c
    elif op == "relax.subtract":
        new = (scale, shift - c) if cur_on_left else (-scale, c - shift)
    elif op == "relax.multiply":
        new = scale * c, shift * c
    elif cur_on_left and np.all(c != 0):  # divide by a constant
        new = scale / c, shift / c
    else:
        return None
    if not (np.all(np.isfinite(new[0])) and np.all(np.isfinite(new[1]))):
        return None
    return new


def users_of(ordered):
    """Var -> the vars whose bindings use it, from (var, value) bindings."""
    users = {}
    for var, value in ordered:
        for used in relax.analysis.free_vars(value):
            users.setdefault(used, []).append(var)
    return users


def _is_canonical_bias(call, out_rank, axis, channels):
    """Whether a lone add already has the bias shape partitioning expects."""
    if not op_is(call, "relax.add") or not is_const(call.args[1]):
        return False
    want = (1, channels, 1, 1) if out_rank == 4 and axis == 1 else (channels,)
    return static_shape(call.args[1]) in (want, (1, channels))


def _plan_scale_shift(func):
    uses, blocks = use_counts(func), block_index(func)
    ordered = bindings(func)
    value_of = dict(ordered)
    users = users_of(ordered)

    drop, rebuild = set(), {}
    for var, value in ordered:
        if var in drop:
            continue
        producer = _foldable_producer(value, value_of)
        if producer is None:
            continue
        weight, axis, channels, out_rank = producer

        def per_channel(const, out_rank=out_rank, axis=axis, channels=channels):
            return _channel_vector(const, out_rank, axis, channels)

        scale, shift = np.ones(channels), np.zeros(channels)
        chain, cur = [], var
        while uses[cur] == 1 and len(users.get(cur, [])) == 1:
            nxt = users[cur][0]
            step = affine_step(value_of[nxt], cur, scale, shift, per_channel)
            if step is None:
                break
            scale, shift = step
            chain.append(nxt)
            cur = nxt
        if not chain or not visible_at(blocks, value.args[0], chain[-1]):
            continue
        if len(chain) == 1 and _is_canonical_bias(value_of[chain[0]], out_rank, axis, channels):
            continue
        drop.update([var, *chain[:-1]])
        rebuild[chain[-1]] = _folded_value(value, weight, axis, out_rank, scale, shift)
    return drop, rebuild


def _folded_value(producer, weight, axis, out_rank, scale, shift):
    """A callback building ``producer(x, weight * scale) + shift`` in the new function."""
    dtype = producer.ty.dtype
    if np.all(scale == 1.0):
        new_weight = producer.args[1]
    elif axis == 1:  # conv2d OIHW: scale the output channels
        new_weight = relax.const((weight * scale[:, None, None, None]).astype(weight.dtype), dtype)
    else:  # dense (K, N)
        new_weight = relax.const((weight * scale[None, :]).astype(weight.dtype), dtype)
    bias_shape = (1, len(shift), 1, 1) if axis == 1 else (len(shift),)
    bias = None
    if np.any(shift != 0.0):
        bias = relax.const(shift.reshape(bias_shape).astype(weight.dtype), dtype)

    def make(visit, builder):
        data = visit(producer.args[0])
        # The producer's span names its layer in reports (lpx_tvm/layer_names.py).
        call = relax.Call(producer.op, [data, new_weight], producer.attrs, producer.ty_args, producer.span)
        if bias is None:
            return call
        return relax.op.add(builder.emit(call), bias)

    return make


@relax.transform.function_pass(opt_level=0, name="lpx.FoldScaleShift")
class FoldScaleShift:
    """Fold per-channel affine chains with constant operands into conv2d / dense weights.

    After a ``relax.nn.conv2d`` (NCHW / OIHW) or a ``relax.matmul`` with a constant 2-D
    weight, a run of add / subtract / multiply / divide-by-constant ops whose constants
    broadcast over the output channels only, and whose intermediate results have no
    other use, becomes ``conv2d(x, W * s) + b`` with ``b`` shaped ``(1, C, 1, 1)``
    (``(N,)`` for dense). Chains that broadcast over anything else are left alone.
    """

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        drop, rebuild = _plan_scale_shift(func)
        return rewrite_bindings(func, mod, drop, rebuild)

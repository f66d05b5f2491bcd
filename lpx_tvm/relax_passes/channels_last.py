"""lpx.ChannelsLast: NHWC sections of CNN blocks on the pixel-rows view of their values.

ConvNeXt-style blocks (and the "channels_first" LayerNorm of their downsampling) leave
the NCHW convolutions with ``permute_dims(x, [0, 2, 3, 1])``, work along the last axis
(C) of the NHWC value, and come back with ``permute_dims(v, [0, 3, 1, 2])``. LPX stores
a 4-D NCHW value as one row per pixel with the channels in lanes: byte for byte the
storage of the 2-D value (N*H*W, C). So the NHWC section can run on that 2-D view
without moving data. This pass rewrites:

- ``permute_dims(x, [0, 2, 3, 1])`` of a 4-D value into
  ``reshape(permute_dims(x, [0, 2, 3, 1]), (N*H*W, C))``, which the
  ``lpx.pixels_to_rows`` pattern takes as one free view;
- the ops on such values that work along the last axis (layer norm over it, a matmul
  by a constant 2-D weight, unary activations, elementwise ops of two such values or
  with a constant) into the same ops on the 2-D views; a constant loses its leading
  ones and becomes a scalar, one value per channel, or a full (N*H*W, C) tensor;
- reshapes between such a value and its rows (the importer's own flattening around a
  Linear, or a 3-D (N*H, W, C) form) into reshapes of the 2-D view, which keep storage;
- ``permute_dims(v, [0, 3, 1, 2])`` back to NCHW into
  ``permute_dims(reshape(rows, (N, H, W, C)), [0, 3, 1, 2])`` (``lpx.rows_to_pixels``).

A 4-D NHWC value that something else still reads is kept as ``reshape(rows, (N, H, W,
C))`` (dead code elimination removes the ones nothing reads). A permute of a reshaped
value is left alone: that is a head split of attention (see :mod:`.heads_3d`).
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from ._binding_rewrite import bindings, is_const, is_float, op_is, static_shape

__all__ = ["ChannelsLast", "TO_NHWC", "TO_NCHW"]

TO_NHWC = [0, 2, 3, 1]
TO_NCHW = [0, 3, 1, 2]

_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")
_UNARY = ("relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.erf", "relax.nn.gelu", "relax.nn.gelu_tanh",
          "relax.nn.silu", "relax.exp", "relax.clip")


def _axes(call, rank):
    return [int(a) for a in call.attrs.axes] if call.attrs.axes is not None else list(range(rank))[::-1]


def _rows_shape(shape4) -> tuple:
    """The (N*H*W, C) view of an NHWC-logical 4-D shape (N, H, W, C)."""
    return (math.prod(shape4[:-1]), shape4[-1])


def _is_entry(value, values) -> bool:
    """``permute_dims(x, [0, 2, 3, 1])`` of a 4-D float value not bound to a reshape."""
    if not op_is(value, "relax.permute_dims"):
        return False
    src = value.args[0]
    shape = static_shape(src)
    if shape is None or len(shape) != 4 or not is_float(src.ty.dtype) or _axes(value, 4) != TO_NHWC:
        return False
    return not op_is(values.get(src), "relax.reshape")


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, func):
        super().__init__(mod)
        self.values = dict(bindings(func))
        self.rows = {}  # old NHWC-logical 4-D var -> its (N*H*W, C) view (a var of the new function)
        self.derived = set()  # old vars of rank <= 3 computed from a rows view

    def _emit(self, expr):
        return self.builder_.emit(expr)

    def _rows_operand(self, expr, shape4):
        """``expr`` as an operand of an elementwise op on rows views of the NHWC shape
        ``shape4``: a converted value, or a constant; None when it is neither."""
        if isinstance(expr, relax.Var) and expr in self.rows:
            return self.rows[expr]
        if not is_const(expr):
            return None
        c = expr.value.numpy()
        if c.size == 1:
            return relax.const(c.reshape(()))
        if c.shape[-1] == shape4[-1] and c.size == shape4[-1]:
            return relax.const(c.reshape(-1))
        if len(c.shape) > 4:
            return None
        return relax.const(np.ascontiguousarray(np.broadcast_to(c, shape4)).reshape(_rows_shape(shape4)))

    def _convert(self, var, value):
        """The rows-view expression for an NHWC-logical 4-D value, or None to keep it."""
        shape = static_shape(value) if isinstance(value, relax.Call) else None
        if shape is None or len(shape) != 4:
            return None
        rows_shape = _rows_shape(shape)
        args = value.args
        if _is_entry(value, self.values):
            nhwc = self._emit(relax.op.permute_dims(self.visit_expr(args[0]), TO_NHWC))
            return relax.op.reshape(nhwc, rows_shape)
        if op_is(value, "relax.reshape"):
            src = args[0]
            src_shape = static_shape(src)
            if src in self.derived and src_shape is not None and len(src_shape) <= 3 and \
                    (math.prod(src_shape[:-1]), src_shape[-1]) == rows_shape:
                new = self.visit_expr(src)
                return new if src_shape == rows_shape else relax.op.reshape(new, rows_shape)
            return None
        if not any(isinstance(a, relax.Var) and a in self.rows for a in args):
            return None
        if op_is(value, "relax.nn.layer_norm") and [int(a) % 4 for a in value.attrs.axes] == [3] \
                and is_const(args[1]) and is_const(args[2]):
            return relax.op.nn.layer_norm(self.rows[args[0]], args[1], args[2], axes=[-1],
                                          epsilon=float(value.attrs.epsilon), center=bool(value.attrs.center),
                                          scale=bool(value.attrs.scale))
        if op_is(value, "relax.matmul") and is_const(args[1]) and len(static_shape(args[1]) or ()) == 2 \
                and args[0] in self.rows:
            return relax.op.matmul(self.rows[args[0]], args[1], out_dtype=value.attrs.out_dtype)
        if op_is(value, *_UNARY) and args[0] in self.rows and \
                not any(isinstance(a, relax.Var) for a in args[1:]):
            return relax.Call(value.op, [self.rows[args[0]], *args[1:]], value.attrs)
        if op_is(value, *_BINARY) and all(static_shape(a) is not None for a in args):
            if any(isinstance(a, relax.Var) and a not in self.rows for a in args):
                return None
            ops = [self._rows_operand(a, shape) for a in args]
            if any(o is None for o in ops) or any(static_shape(a) != shape for a in args if a in self.rows):
                return None
            return relax.Call(value.op, ops, value.attrs)
        return None

    def _back(self, value):
        """The NCHW expression of ``permute_dims(v, [0, 3, 1, 2])`` of a converted v, or None."""
        if not op_is(value, "relax.permute_dims") or value.args[0] not in self.rows or \
                _axes(value, 4) != TO_NCHW:
            return None
        src = value.args[0]
        nhwc = self._emit(relax.op.reshape(self.rows[src], static_shape(src)))
        return relax.op.permute_dims(nhwc, TO_NCHW)

    def visit_var_binding_(self, binding):
        var, value = binding.var, binding.value
        back = self._back(value)
        if back is not None:
            self.set_var_remap(var, self.builder_.emit(back, name_hint=var.name))
            return
        converted = self._convert(var, value)
        if converted is not None:
            rows = converted if isinstance(converted, relax.Var) else self._emit(converted)
            self.rows[var] = rows
            # The 4-D value itself, for readers that stay 4-D (removed when there are none).
            four = self.builder_.emit(relax.op.reshape(rows, static_shape(value)), name_hint=var.name)
            self.set_var_remap(var, four)
            return
        if isinstance(value, relax.Call) and any(isinstance(a, relax.Var) and (a in self.rows or a in self.derived)
                                                 for a in value.args):
            shape = static_shape(value)
            if shape is not None and len(shape) <= 3:
                self.derived.add(var)
            src = value.args[0]
            if op_is(value, "relax.reshape") and src in self.rows and shape is not None and len(shape) <= 3:
                # NHWC -> rank <= 3: a view of the rows when it keeps the last axis.
                rows = self.rows[src]
                if (math.prod(shape[:-1]) if len(shape) > 1 else 1, shape[-1]) == static_shape(rows):
                    new = rows if shape == static_shape(rows) else \
                        self.builder_.emit(relax.op.reshape(rows, shape), name_hint=var.name)
                    self.set_var_remap(var, new)
                    return
        super().visit_var_binding_(binding)


@relax.transform.function_pass(opt_level=0, name="lpx.ChannelsLast")
class ChannelsLast:
    """Run NHWC sections of CNN blocks on (N*H*W, C) views (see module doc)."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        values = dict(bindings(func))
        if not any(_is_entry(v, values) for v in values.values()):
            return func
        return _Rewriter(mod, func).visit_expr(func)

"""lpx.HeadsTo3D: multi-head attention on (heads, seq, dim) 3-D values.

Exporters write attention with 4-D values: the projections (1, s, h*d) are reshaped to
(1, s, h, d) and permuted to (1, h, s, d); the scores are 4-D batched matmuls, and the
heads merge back with the inverse permute and reshape. LPX stores a 4-D value as an
NCHW image (axis 1 in lanes), which is the wrong layout for these: their last axis
belongs in lanes. With a batch of one, each such value is a 3-D value (h, s, d), and
3-D values are stored with the last axis in lanes. This pass rewrites the chain:

- ``permute_dims(reshape(x, (1, s, h, d)), [0, 2, 1, 3])`` (the head split) becomes
  ``permute_dims(reshape(x, (s, h, d)), [1, 0, 2])``, which the ``lpx.split_heads``
  pattern takes as one lane move; with the axes [0, 2, 3, 1] (the split of K,
  transposed) a transpose of the last two axes follows;
- every op on such values (matmul, softmax over the last axis, elementwise ops with
  constants, permutes, reshapes, unary activations) is emitted on the 3-D values;
- ops that work along the last axis of any 4-D value (a matmul of two 4-D values
  with the same leading dims, softmax and layer norm over the last axis, a swap of
  the last two axes) run on the value with its two leading axes merged, (a*b, m, n),
  reshaped from the 4-D value where it is not already 3-D;
- the head merge ``reshape(permute_dims(v, [0, 2, 1, 3]), (1, s, h*d))`` becomes
  ``reshape(permute_dims(v3, [1, 0, 2]), (1, s, h*d))`` (``lpx.merge_heads``);
- a 3-D value reshaped to 4-D (an importer's own batched form) is its own 3-D form;
- rotary embeddings (RoPE) on such values stay 3-D: slices of the last axis, ``negative``
  (a multiply by -1, which the VXM does with an immediate), a concat along the last axis
  (or, with a batch of one, along heads or sequence: rows placed whole), and the
  multiplies by cos / sin constants of shape (1, 1, s, d), broadcast over the heads;
- grouped-query attention's repeat_kv, ``reshape(broadcast_to(expand_dims(kv, 2), (1,
  k, n, s, d)), (1, k*n, s, d))``, becomes a concat along axis 0 of n copies of each of
  the k head blocks of rows (a slice of axis 0 each): rows placed whole, no lane moves.

A 4-D value that something else still reads is kept as ``reshape(v3, (1, h, s, d))``;
dead code elimination removes the ones nothing reads. Constants in elementwise ops
lose their leading 1, and are broadcast to the full shape unless they are a scalar or
one value per last-axis element (the forms LPX adds without moving lanes). Only values
that derive from a head split, or feed one of the last-axis ops, change: 4-D images
otherwise never do.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ._binding_rewrite import bindings, is_const, op_is, static_shape

__all__ = ["HeadsTo3D"]

_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")
_UNARY = ("relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.erf", "relax.nn.gelu", "relax.nn.gelu_tanh",
          "relax.exp")


def _merged(shape4) -> tuple:
    """The 3-D shape of a 4-D value: its two leading axes as one batch axis."""
    a, b, m, n = shape4
    return (a * b, m, n)


def _axes(call, rank):
    return [int(a) for a in call.attrs.axes] if call.attrs.axes is not None else list(range(rank))[::-1]


def _ints(expr) -> list:
    """The ints of a ``strided_slice`` argument (axes, begin, end, strides)."""
    return [int(getattr(f, "value", f)) for f in expr.fields]


def _head_split_entries(func) -> set:
    """Vars bound to ``permute_dims(reshape(x, (1, s, h, d)), [0, 2, 1, 3] or [0, 2, 3, 1])``
    with x of rank <= 3."""
    values = dict(bindings(func))
    found = set()
    for var, value in values.items():
        if not op_is(value, "relax.permute_dims") or static_shape(value) is None or len(static_shape(value)) != 4:
            continue
        src = value.args[0]
        inner = values.get(src)
        if _axes(value, 4) not in ([0, 2, 1, 3], [0, 2, 3, 1]) or not op_is(inner, "relax.reshape"):
            continue
        x_shape, r_shape = static_shape(inner.args[0]), static_shape(inner)
        if x_shape is not None and len(x_shape) <= 3 and r_shape is not None and r_shape[0] == 1:
            found.add(var)
    return found


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, func):
        super().__init__(mod)
        self.values = dict(bindings(func))
        self.entries = _head_split_entries(func)
        self.three = {}  # old 4-D var -> new 3-D expression (a var of the new function)
        self.derived = set()  # old vars of rank <= 3 computed from a head split

    # ---- helpers ------------------------------------------------------------
    def _emit(self, expr):
        return self.builder_.emit(expr)

    def _new(self, expr):
        return self.visit_expr(expr)

    def _operand3(self, expr, shape4):
        """A 3-D operand for an elementwise op on 3-D values: a converted value, a value
        derived from one, or a constant (broadcast unless a scalar or a last-axis vector)."""
        shape3 = _merged(shape4)
        if isinstance(expr, relax.Var) and expr in self.three:
            return self.three[expr]
        if isinstance(expr, relax.Var) and expr in self.derived and static_shape(expr) == shape3:
            return self._new(expr)
        if is_const(expr):
            c = expr.value.numpy()
            if c.size == 1:
                return relax.const(c.reshape(()))
            if c.shape[-1] == shape4[-1] and c.size == shape4[-1]:
                return relax.const(c.reshape(-1))
            return relax.const(np.ascontiguousarray(np.broadcast_to(c, shape4)).reshape(shape3))
        return None

    def _to3(self, expr):
        """A 4-D operand of an op over its last axes as its 3-D value (a reshape where it
        has none yet)."""
        if expr in self.three:
            return self.three[expr]
        shape = static_shape(expr)
        return self._emit(relax.op.reshape(self._new(expr), _merged(shape)))

    def _convert(self, var, value):
        """The 3-D expression for a 4-D value, or None to keep it as it is."""
        shape = static_shape(value) if isinstance(value, relax.Call) else None
        if shape is None or len(shape) != 4:
            return None
        shape3 = _merged(shape)
        if var in self.entries:
            inner = self.values[value.args[0]]
            x = self._new(inner.args[0])
            s, h, d = static_shape(inner)[1:]
            heads = relax.op.permute_dims(self._emit(relax.op.reshape(x, (s, h, d))), [1, 0, 2])
            if _axes(value, 4) == [0, 2, 3, 1]:
                return relax.op.permute_dims(self._emit(heads), [0, 2, 1])
            return heads
        args = value.args
        repeated = self._repeat_kv(value)
        if repeated is not None:
            return repeated
        rope = self._rope_step(value, shape)
        if rope is not None:
            return rope
        if op_is(value, "relax.reshape"):
            src = args[0]
            if src in self.three:
                return relax.op.reshape(self.three[src], shape3)
            if static_shape(src) == shape3 and str(src.ty.dtype).startswith(("float", "bfloat")):
                return self._new(src)  # already the 3-D form
            return None
        if op_is(value, "relax.permute_dims"):
            axes = _axes(value, 4)
            if axes == [0, 1, 3, 2] and static_shape(args[0]) is not None:
                return relax.op.permute_dims(self._to3(args[0]), [0, 2, 1])  # the last two: any 4-D value
            if args[0] in self.three and axes[0] == 0 and (shape[0] == 1 or axes[1] == 1):
                return relax.op.permute_dims(self.three[args[0]], [a - 1 for a in axes[1:]])
            return None
        if op_is(value, "relax.matmul"):
            a, b = (static_shape(x) for x in args)
            if a is None or b is None or len(a) != 4 or len(b) != 4 or a[:2] != b[:2] or is_const(args[1]):
                return None
            return relax.op.matmul(self._to3(args[0]), self._to3(args[1]), out_dtype=value.attrs.out_dtype)
        if op_is(value, "relax.nn.softmax") and int(value.attrs.axis) % 4 == 3:
            return relax.op.nn.softmax(self._to3(args[0]), axis=-1)
        if op_is(value, "relax.nn.layer_norm") and [int(a) % 4 for a in value.attrs.axes] == [3] \
                and is_const(args[1]) and is_const(args[2]):
            return relax.op.nn.layer_norm(self._to3(args[0]), args[1], args[2], axes=[-1],
                                          epsilon=float(value.attrs.epsilon), center=bool(value.attrs.center),
                                          scale=bool(value.attrs.scale))
        if op_is(value, *_ELEMENTWISE):
            if not any(isinstance(x, relax.Var) and x in self.three for x in args):
                return None
            ops = [self._operand3(x, shape) for x in args]
            if any(o is None for o in ops):
                return None
            return relax.Call(value.op, ops, value.attrs)
        if op_is(value, *_UNARY) and args[0] in self.three:
            return relax.Call(value.op, [self.three[args[0]]], value.attrs)
        return None

    def _rope_step(self, value, shape):
        """The 3-D form of one step of a rotary embedding on converted values, or None:
        a slice of the last axis, ``negative`` (as a multiply by -1), a concat."""
        args = value.args
        if op_is(value, "relax.strided_slice") and args[0] in self.three:
            axes, begin, end = (_ints(a) for a in args[1:4])
            strides = _ints(args[4]) if len(args) > 4 else [1] * len(axes)
            if [a % 4 for a in axes] != [3]:
                return None
            return relax.op.strided_slice(self.three[args[0]], axes=[2], begin=begin, end=end, strides=strides)
        if op_is(value, "relax.negative") and args[0] in self.three:
            return relax.op.multiply(self.three[args[0]], relax.const(-1.0, str(value.ty.dtype)))
        if op_is(value, "relax.concat") and isinstance(args[0], relax.Tuple):
            fields = list(args[0].fields)
            axis = int(value.attrs.axis) % 4
            if not all(isinstance(f, relax.Var) and f in self.three for f in fields):
                return None
            if axis != 3 and shape[0] != 1:
                return None  # along heads or sequence, the merged form interleaves batches
            return relax.op.concat([self.three[f] for f in fields], axis=axis - 1)
        return None

    def _repeat_kv(self, value):
        """repeat_kv of a converted (1, k, s, d) value as its 3-D form (k*n, s, d): each head
        block of rows n times, a concat along axis 0 of slices of axis 0; or None.

        The chain is ``reshape(broadcast_to(expand_dims(x, 2), (1, k, n, s, d)), (1, k*n, s,
        d) or (k*n, s, d))``, how transformers repeats the key / value heads of
        grouped-query attention (without the broadcast when n = 1)."""
        if not op_is(value, "relax.reshape"):
            return None
        bcast = self.values.get(value.args[0])
        # With one copy (n = 1) lpx.Decompose has dropped the broadcast to its own shape.
        expand = self.values.get(bcast.args[0]) if op_is(bcast, "relax.broadcast_to") else bcast
        if not op_is(expand, "relax.expand_dims") or [int(a) % 5 for a in expand.attrs.axis] != [2]:
            return None
        x = expand.args[0]
        if not isinstance(x, relax.Var) or x not in self.three:
            return None
        one, k, s, d = static_shape(x)
        wide = static_shape(bcast)
        if one != 1 or wide is None or len(wide) != 5 or wide[:2] != (1, k) or wide[3:] != (s, d):
            return None
        n = wide[2]
        if tuple(static_shape(value)) not in ((1, k * n, s, d), (k * n, s, d)):
            return None
        x3 = self.three[x]
        if n == 1:
            return x3
        heads = [x3] if k == 1 else \
            [self._emit(relax.op.strided_slice(x3, axes=[0], begin=[i], end=[i + 1])) for i in range(k)]
        return relax.op.concat([h for h in heads for _ in range(n)], axis=0)

    # ---- the walk ------------------------------------------------------------
    def _bind(self, var, expr):
        """Rebind ``var`` to ``expr``; a dataflow block's output (the function's result)
        stays an output of the block, or the function would return a dataflow var."""
        if self.builder_.current_block_is_dataflow() and not isinstance(var, relax.DataflowVar):
            new = self.builder_.emit_output(expr, name_hint=var.name)
        else:
            new = expr if isinstance(expr, relax.Var) else self.builder_.emit(expr, name_hint=var.name)
        self.set_var_remap(var, new)

    def visit_var_binding_(self, binding):
        var, value = binding.var, binding.value
        shape = static_shape(value) if isinstance(value, relax.Call) else None
        repeated = self._repeat_kv(value) if shape is not None and len(shape) == 3 else None
        if repeated is not None:  # repeat_kv straight to the 3-D batch of a matmul
            self.derived.add(var)
            self._bind(var, repeated)
            return
        converted = self._convert(var, value)
        if converted is not None:
            new3 = converted if isinstance(converted, relax.Var) else self._emit(converted)
            self.three[var] = new3
            # The 4-D value itself, for readers that stay 4-D (removed when there are none).
            shape = static_shape(value)
            self._bind(var, relax.op.reshape(new3, shape))
            return
        if isinstance(value, relax.Call) and any(isinstance(a, relax.Var) and (a in self.three or a in self.derived)
                                                 for a in value.args):
            self.derived.add(var)
            if op_is(value, "relax.reshape") and value.args[0] in self.three:
                # (1, h, s, d) -> 3-D: read the 3-D value directly.
                src = self.three[value.args[0]]
                self._bind(var, src if static_shape(src) == static_shape(value) else
                           relax.op.reshape(src, static_shape(value)))
                return
        super().visit_var_binding_(binding)


@relax.transform.function_pass(opt_level=0, name="lpx.HeadsTo3D")
class HeadsTo3D:
    """Rewrite unit-batch multi-head attention from 4-D to 3-D values (see module doc)."""

    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        return _Rewriter(mod, func).visit_expr(func)

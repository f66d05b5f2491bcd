"""lpx.FoldQDQ: fold the QuantizeLinear / DequantizeLinear pairs of a QDQ model into
integer ops.

A QDQ model (``onnxruntime.quantization.quantize_static(quant_format=QDQ)``) spells a
quantized convolution as float ops between dequantize and quantize::

    y_q = quantize(conv2d(dequantize(x_q, s_x, z_x), dequantize(W_q, s_w, 0)) + dequantize(b_q), s_y, z_y)

This pass rewrites every such group (conv2d or a matmul with a constant weight, with
or without bias) into integer arithmetic on the quantized values::

    acc = conv2d(astype(x_q, int32) - z_x, W_q, out_dtype=int32) + b      # int32
    y_q = quantize(astype(acc, float32), s_y / (s_x * s_w), z_y)           # requantize

with ``W_q`` the int8 weights (per-channel scales ``s_w``), ``b = round(bias / (s_x s_w))``
in int32 and the requantization scale per output channel. That is the exact arithmetic
an int8 accelerator does (the ``lpx.qconv2d`` / ``lpx.qdense`` patterns hand it to the
MXM at int8 rate with int32 accumulators and ``vxm.requant``), and it still runs on the
CPU, with the same result, where LPX does not take it.

A max pooling between a dequantize and a quantize of the same scale and zero point
becomes a max pooling of the quantized values (dequantization is monotonic, so the two
commute exactly). Residual adds and global average pooling keep their
``quantize(op(dequantize(..)))`` form: the ``lpx.qadd`` / ``lpx.qglobal_avg_pool2d``
patterns take them whole. Everything else is left as it was (the float ops of a QDQ
model compute the same values as ONNX defines).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ._binding_rewrite import bindings, is_const, op_is, static_shape, use_counts

__all__ = ["FoldQDQ", "has_qdq"]

_LAYOUT_OPS = ("relax.permute_dims", "relax.reshape")


def has_qdq(mod) -> bool:
    """Whether ``main`` (or any Relax function) holds a quantize or dequantize."""
    found = []

    def visit(e):
        if op_is(e, "relax.quantize", "relax.dequantize"):
            found.append(e)

    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return bool(found)


def _np(expr):
    return expr.value.numpy()


def _qparams(call):
    """(scale array, zero point array, axis) of a quantize / dequantize with constant parameters."""
    scale, zp = call.args[1], call.args[2]
    if not (is_const(scale) and is_const(zp)):
        return None
    return _np(scale).astype(np.float64), _np(zp).astype(np.int64), int(call.attrs.axis)


def _scalar(a):
    a = np.asarray(a)
    return float(a.reshape(-1)[0]) if a.size == 1 else None


def _const_weight(expr, values):
    """A constant quantized weight seen through layout ops: (int weights, full-shape scales)
    of ``layout(dequantize(W_q, s, 0))``, or None (a nonzero weight zero point included)."""
    chain = []
    while True:
        if isinstance(expr, relax.Var) and expr in values:
            expr = values[expr]
            continue
        if op_is(expr, *_LAYOUT_OPS):
            chain.append(expr)
            expr = expr.args[0]
            continue
        break
    if not op_is(expr, "relax.dequantize") or not is_const(expr.args[0]):
        return None
    q = _qparams(expr)
    if q is None:
        return None
    scale, zp, axis = q
    w = _np(expr.args[0])
    if w.dtype != np.int8 or np.any(zp != 0):
        return None
    shape = [1] * w.ndim
    if scale.size > 1:
        shape[axis % w.ndim] = scale.size
    s = np.broadcast_to(scale.reshape(shape), w.shape)
    w = w.astype(np.int64)
    for op in reversed(chain):
        if op.op.name == "relax.permute_dims":
            axes = None if op.attrs.axes is None else [int(a) for a in op.attrs.axes]
            w, s = np.transpose(w, axes), np.transpose(s, axes)
        else:
            shape = static_shape(op)
            if shape is None:
                return None
            w, s = w.reshape(shape), s.reshape(shape)
    return w, s


def _const_bias(expr, values):
    """A constant float bias: dequantize(b_q) (through reshapes) or a float constant."""
    while isinstance(expr, relax.Var) and expr in values:
        expr = values[expr]
    if op_is(expr, "relax.reshape"):
        inner = _const_bias(expr.args[0], values)
        return None if inner is None else inner.reshape(-1)
    if is_const(expr) and str(expr.ty.dtype) == "float32":
        return _np(expr).astype(np.float64).reshape(-1)
    if op_is(expr, "relax.dequantize") and is_const(expr.args[0]):
        q = _qparams(expr)
        if q is None:
            return None
        scale, zp, axis = q
        b = _np(expr.args[0]).astype(np.int64)
        if b.ndim != 1:
            return None
        return ((b - zp.reshape(-1)) * scale.reshape(-1)).astype(np.float64)  # per tensor or per channel
    return None


def _fold_plan(func):
    """{quantize var: builder} for each foldable group."""
    values = dict(bindings(func))
    uses = use_counts(func)
    plan = {}
    for var, q in bindings(func):
        if not op_is(q, "relax.quantize"):
            continue
        qy = _qparams(q)
        if qy is None or _scalar(qy[0]) is None or _scalar(qy[1]) is None:
            continue
        sy, zy = _scalar(qy[0]), int(_scalar(qy[1]))
        out_dtype = str(q.ty.dtype)
        if out_dtype not in ("int8", "uint8"):
            continue
        f = q.args[0]
        inner = values.get(f)
        if inner is None or uses[f] != 1:
            continue
        if op_is(inner, "relax.nn.max_pool2d"):
            d = values.get(inner.args[0])
            if op_is(d, "relax.dequantize") and _qparams(d) is not None and \
                    str(d.args[0].ty.dtype) == out_dtype and \
                    _scalar(_qparams(d)[0]) == sy and _scalar(_qparams(d)[1]) == zy:
                plan[var] = ("pool", inner, d.args[0])
            continue
        bias_expr = None
        if op_is(inner, "relax.add"):
            core_var, bias_expr = inner.args
            core = values.get(core_var)
            if core is None or uses[core_var] != 1:
                continue
        else:
            core = inner
        if not op_is(core, "relax.nn.conv2d", "relax.matmul"):
            continue
        d = values.get(core.args[0])
        if not op_is(d, "relax.dequantize") or str(d.args[0].ty.dtype) not in ("int8", "uint8"):
            continue
        qx = _qparams(d)
        if qx is None or _scalar(qx[0]) is None or _scalar(qx[1]) is None:
            continue
        sx, zx = _scalar(qx[0]), int(_scalar(qx[1]))
        wq = _const_weight(core.args[1], values)
        if wq is None:
            continue
        w, s = wq
        conv = op_is(core, "relax.nn.conv2d")
        if conv:
            if w.ndim != 4 or str(core.attrs.data_layout) != "NCHW" or str(core.attrs.kernel_layout) != "OIHW":
                continue
            sw = s.reshape(s.shape[0], -1)
            channels = w.shape[0]
        else:
            if w.ndim != 2:
                continue
            sw = s.T
            channels = w.shape[1]
        if not np.all(sw == sw[:, :1]):
            continue  # scales must vary along the output channel only
        sw = sw[:, 0]
        bias = np.zeros(channels)
        if bias_expr is not None:
            b = _const_bias(bias_expr, values)
            if b is None or b.size not in (1, channels):
                continue
            bias = np.broadcast_to(b, (channels,))
        plan[var] = ("mxm", core, d.args[0], dict(sx=sx, zx=zx, w=w, sw=sw, bias=bias, sy=sy, zy=zy,
                                                   out_dtype=out_dtype, conv=conv, axis=int(q.attrs.axis)))
    return plan


def _build(entry, visit, bb):
    if entry[0] == "pool":
        _, pool, xq = entry
        a = pool.attrs
        return relax.op.nn.max_pool2d(visit(xq), [int(v) for v in a.pool_size], [int(v) for v in a.strides],
                                      [int(v) for v in a.padding], [int(v) for v in a.dilation],
                                      bool(a.ceil_mode), bool(a.count_include_pad), str(a.layout),
                                      None if a.out_layout is None else str(a.out_layout))
    _, core, xq, p = entry
    w, sw, sx = p["w"], p["sw"], p["sx"]
    acc_scale = sx * sw  # the real value of one unit of the int32 accumulator, per channel
    bias = np.rint(p["bias"] / acc_scale)
    x = bb.emit(relax.op.astype(visit(xq), "int32"))
    x = bb.emit(relax.op.subtract(x, relax.const(np.int32(p["zx"]))))
    wconst = relax.const(w.astype(np.int8))
    if p["conv"]:
        a = core.attrs
        acc = bb.emit(relax.op.nn.conv2d(x, wconst, [int(v) for v in a.strides], [int(v) for v in a.padding],
                                         [int(v) for v in a.dilation], int(a.groups), "NCHW", "OIHW", "NCHW",
                                         "int32"))
        bshape = (1, w.shape[0], 1, 1)
    else:
        acc = bb.emit(relax.op.matmul(x, wconst, out_dtype="int32"))
        bshape = (w.shape[1],)
    acc = bb.emit(relax.op.add(acc, relax.const(bias.astype(np.int32).reshape(bshape))))
    f = bb.emit(relax.op.astype(acc, "float32"))
    scale = (p["sy"] / acc_scale).astype(np.float32)
    axis = 1 if p["conv"] else len(static_shape(core)) - 1
    return relax.op.quantize(f, relax.const(scale), relax.const(np.array(p["zy"], p["out_dtype"])), axis=axis,
                             out_dtype=p["out_dtype"])


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def __init__(self, mod, plan):
        super().__init__(mod)
        self.plan = plan

    def visit_var_binding_(self, binding):
        entry = self.plan.get(binding.var)
        if entry is None:
            super().visit_var_binding_(binding)
            return
        value = self.builder_.normalize(_build(entry, self.visit_expr, self.builder_))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))


@relax.transform.function_pass(opt_level=0, name="lpx.FoldQDQFunctions")
class _FoldQDQFunctions:
    def transform_function(self, func, mod, ctx):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            return func
        plan = _fold_plan(func)
        return _Folder(mod, plan).visit_expr(func) if plan else func


@tvm.ir.transform.module_pass(opt_level=0, name="lpx.FoldQDQ")
def FoldQDQ(mod, ctx):  # noqa: N802 (a pass, named like TVM's)
    """Fold the Q/DQ pairs around convolutions, dense layers and max pooling (see module doc);
    the float ops they replace are removed."""
    mod = _FoldQDQFunctions()(mod)
    entries = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)]
    return relax.transform.DeadCodeElimination(entries)(mod)

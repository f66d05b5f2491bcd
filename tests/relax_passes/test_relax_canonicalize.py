"""canonicalize and its passes: numerics against onnxruntime, and Before/Expected IR."""

from __future__ import annotations

from collections import Counter

import numpy as np
import tvm
import tvm.testing
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import relax as R
from tvm.script import tirx as T

from lpx_tvm.relax_passes import canonicalize, import_onnx
from lpx_tvm.relax_passes.fold_scale_shift import FoldScaleShift
from lpx_tvm.relax_passes.normalize_clip import NormalizeClip

from relax_models import (
    convnet,
    depthwise_net,
    make_model,
    op_names,
    random_inputs,
    run_onnxruntime,
    run_tvm,
)


def _canonical(model):
    imported = import_onnx(model)
    return imported, canonicalize(imported.mod)


def _check_numerics(model, mod, imported):
    inputs = random_inputs(imported)
    expected = run_onnxruntime(model, inputs)
    actual = run_tvm(mod, imported, inputs)
    for got, want in zip(actual, expected):
        tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_convnet_batch_norm_folded_and_numerics_kept():
    model = convnet()
    imported, mod = _canonical(model)
    ops = Counter(op_names(mod["main"]))
    # conv + bias + BN became conv2d(x, W') + b'; Relu + Clip(0, 6) became one clip;
    # Sum became one add; Dropout went away.
    assert ops == Counter(
        {
            "nn.conv2d": 2,
            "add": 3,  # the folded conv bias, the residual Sum and the Gemm bias
            "clip": 1,
            "nn.max_pool2d": 1,
            "mean": 1,
            "reshape": 1,
            "matmul": 1,
            "nn.softmax": 1,
        }
    )
    bias = _value_of(
        mod["main"], "relax.add", lambda call: _produced_by(mod["main"], call, "relax.nn.conv2d")
        and isinstance(call.args[1], tvm.ir.GenericConst)
    )
    assert tuple(int(d) for d in bias.args[1].ty.shape.values) == (1, 4, 1, 1)
    assert all(isinstance(f, relax.Function) for f in mod.functions.values())  # TOPI PrimFuncs gone
    _check_numerics(model, mod, imported)


def test_depthwise_dense_and_lone_batch_norm_folded_and_numerics_kept():
    model = depthwise_net()
    imported, mod = _canonical(model)
    ops = Counter(op_names(mod["main"]))
    # The input BatchNorm collapsed into one multiply and one add.
    assert ops == Counter(
        {"multiply": 1, "nn.conv2d": 1, "add": 3, "nn.relu": 1, "reshape": 1, "matmul": 1}
    )
    dense_bias = _value_of(
        mod["main"], "relax.add", lambda call: _produced_by(mod["main"], call, "relax.matmul")
    )
    assert tuple(int(d) for d in dense_bias.args[1].ty.shape.values) == (6,)
    _check_numerics(model, mod, imported)


def test_chain_broadcasting_over_space_is_left_alone():
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.standard_normal((2, 3, 1, 1)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((1, 1, 4, 4)).astype(np.float32), "m"),
        numpy_helper.from_array(rng.standard_normal((2, 1, 1)).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"]),
        helper.make_node("Mul", ["c", "m"], ["s"]),  # per pixel, not per channel
        helper.make_node("Add", ["s", "b"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        inits,
    )
    _, mod = _canonical(model)
    assert Counter(op_names(mod["main"])) == Counter({"nn.conv2d": 1, "multiply": 1, "add": 1})


def test_chain_with_a_shared_intermediate_is_left_alone():
    rng = np.random.default_rng(6)
    inits = [
        numpy_helper.from_array(rng.standard_normal((2, 3, 1, 1)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((2, 1, 1)).astype(np.float32), "s"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"]),
        helper.make_node("Mul", ["c", "s"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["y"]),  # the conv result is used twice
    ]
    model = make_model(
        nodes,
        [("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        inits,
    )
    _, mod = _canonical(model)
    assert Counter(op_names(mod["main"])) == Counter({"nn.conv2d": 1, "multiply": 1, "add": 1})


def test_fold_scale_shift_before_expected():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    divisor = rng.uniform(0.5, 1.5, (2, 1, 1)).astype(np.float32)
    shift = rng.standard_normal((1, 2, 1, 1)).astype(np.float32)
    x = relax.Var("x", relax.TensorType((1, 3, 5, 5), "float32"))

    def build(chain):
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(chain(bb))
            bb.emit_func_output(out)
        return bb.get()

    def before_chain(bb):
        conv = bb.emit(relax.op.nn.conv2d(x, relax.const(w)))
        scaled = bb.emit(relax.op.divide(conv, relax.const(divisor)))
        return relax.op.add(scaled, relax.const(shift))

    def expected_chain(bb):
        # The pass folds in float64 and rounds each constant once.
        scale = 1.0 / divisor.astype(np.float64).reshape(-1)
        folded = (w * scale[:, None, None, None]).astype(np.float32)
        conv = bb.emit(relax.op.nn.conv2d(x, relax.const(folded)))
        return relax.op.add(conv, relax.const(shift))

    after = FoldScaleShift()(build(before_chain))
    tvm.ir.assert_structural_equal(after, build(expected_chain))


@tvm.script.ir_module
class _ClipBefore:
    @R.function
    def main(x: R.Tensor((2, 3), "float32"), y: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            a = R.maximum(x, R.const(0.0, "float32"))
            b = R.minimum(a, R.const(6.0, "float32"))  # ReLU6 spelled as max/min
            c = R.maximum(b, y)  # tensor-tensor: not a clamp
            d = R.maximum(c, R.const(0.0, "float32"))
            e = R.nn.relu(d)
            f = R.clip(e, R.prim_value(T.float64(-1.0)), R.prim_value(T.float64(3.0)))
            g = R.minimum(y, R.const(2.0, "float32"))  # one-sided: stays as it is
            R.output(f, g)
        return (f, g)


@tvm.script.ir_module
class _ClipExpected:
    @R.function
    def main(x: R.Tensor((2, 3), "float32"), y: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            b = R.clip(x, T.float64(0.0), T.float64(6.0))
            c = R.maximum(b, y)
            f = R.clip(c, T.float64(0.0), T.float64(3.0))
            g = R.minimum(y, R.const(2.0, "float32"))
            R.output(f, g)
        return (f, g)


def test_normalize_clip_before_expected():
    tvm.ir.assert_structural_equal(NormalizeClip()(_ClipBefore), _ClipExpected)


def test_onnx_clip_call_tir_becomes_relu_or_clip():
    # Clip with only a lower bound of 0 is a ReLU; the importer emits a TOPI call_tir.
    model = make_model(
        [helper.make_node("Clip", ["x", "lo"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "lo")],
    )
    imported, mod = _canonical(model)
    assert "call_tir" in op_names(imported.mod["main"])
    assert op_names(mod["main"]) == ["nn.relu"]


def _value_of(func, op_name, where=lambda call: True):
    found = [
        b.value
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call)
        and isinstance(b.value.op, tvm.ir.Op)
        and b.value.op.name == op_name
        and where(b.value)
    ]
    assert len(found) == 1, found
    return found[0]


def _produced_by(func, call, op_name):
    var2val = relax.analysis.get_var2val(func)
    producer = var2val.get(call.args[0]) if isinstance(call.args[0], relax.Var) else None
    return isinstance(producer, relax.Call) and getattr(producer.op, "name", "") == op_name


@tvm.script.ir_module
class _VariadicBefore:
    @R.function
    def main(
        x: R.Tensor((2, 3), "float32"),
        y: R.Tensor((3,), "float32"),
        z: R.Tensor((2, 3), "float32"),
    ):
        with R.dataflow():
            bx = R.broadcast_to(x, R.shape([2, 3]))
            by = R.broadcast_to(y, R.shape([2, 3]))
            bz = R.broadcast_to(z, R.shape([2, 3]))
            s = R.stack((bx, by, bz), axis=0)
            total = R.sum(s, axis=[0], keepdims=False)
            t = R.stack((x, z), axis=0)
            biggest = R.max(t, axis=[0], keepdims=False)
            d = R.nn.dropout(biggest, rate=0.5)
            out = R.add(total, d[0])
            R.output(out)
        return out


@tvm.script.ir_module
class _VariadicExpected:
    @R.function
    def main(
        x: R.Tensor((2, 3), "float32"),
        y: R.Tensor((3,), "float32"),
        z: R.Tensor((2, 3), "float32"),
    ):
        with R.dataflow():
            lv = R.add(x, y)
            total = R.add(lv, z)
            biggest = R.maximum(x, z)
            out = R.add(total, biggest)
            R.output(out)
        return out


def test_unstack_reduce_and_remove_dropout_before_expected():
    tvm.ir.assert_structural_equal(canonicalize(_VariadicBefore), _VariadicExpected)

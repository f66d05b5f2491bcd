"""lpx.EvalConstants: numpy folding must give bit for bit what Relax's FoldConstant gives."""

from __future__ import annotations

import numpy as np
import tvm
import tvm.testing
import tvm_ffi
from onnx import TensorProto, helper
from tvm import relax

from lpx_tvm.relax_passes import canonicalize, import_onnx
from lpx_tvm.relax_passes.canonicalize import _remove_unused
from lpx_tvm.relax_passes.eval_constants import EvalConstants, has_constant_calls

from relax_models import make_model, op_names, random_inputs, run_onnxruntime, run_tvm


def _tidy(mod):
    return _remove_unused(relax.transform.CanonicalizeBindings()(mod))


def _const_chains():
    """Constant subgraphs of the kinds the ONNX importer and batch-norm decomposition
    leave, feeding ops on the input so that their results stay in use."""
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    x = relax.Var("x", relax.TensorType((2, 4, 3, 3), "float32"))
    y = relax.Var("y", relax.TensorType((5, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            # ConstantOfShape weight, then a Reshape of it.
            w = bb.emit(relax.op.broadcast_to(relax.const(np.array([0.02], np.float32)), (4, 4, 1, 1)))
            w = bb.emit(relax.op.reshape(w, (4, 4, 1, 1)))
            # Inference batch norm statistics: expand_dims, + eps, sqrt, and a divide.
            var = bb.emit(relax.op.expand_dims(relax.const(np.abs(f32(4)) + 0.1), [0, 2, 3]))
            std = bb.emit(relax.op.sqrt(relax.op.add(var, relax.const(1e-5, "float32"))))
            gamma = bb.emit(relax.op.expand_dims(relax.const(f32(4)), [0, 2, 3]))
            scale = bb.emit(relax.op.divide(gamma, std))
            mean = bb.emit(relax.op.expand_dims(relax.const(f32(4)), [0, 2, 3]))
            shift = bb.emit(relax.op.subtract(relax.op.multiply(mean, scale), relax.const(f32(1, 4, 1, 1))))
            conv = bb.emit(relax.op.nn.conv2d(x, w))
            out = bb.emit(relax.op.add(relax.op.multiply(conv, scale), shift))
            # Gemm transB: permute_dims of a constant.
            g = bb.emit(relax.op.permute_dims(relax.const(f32(7, 6))))
            dense = bb.emit(relax.op.matmul(y, g))
            gv = bb.emit_output(relax.Tuple([out, dense]))
        bb.emit_func_output(gv)
    return bb.get()


def test_same_bits_as_fold_constant():
    mod = _const_chains()
    ours = EvalConstants()(mod)
    assert not has_constant_calls(ours)
    theirs = relax.transform.FoldConstant()(mod)
    assert tvm_ffi.structural_equal(_tidy(ours), _tidy(theirs), map_free_vars=True)
    assert sorted(op_names(_tidy(ours)["main"])) == ["add", "matmul", "multiply", "nn.conv2d"]


def test_unhandled_calls_are_left_to_fold_constant():
    rng = np.random.default_rng(1)
    x = relax.Var("x", relax.TensorType((4,), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            # float16 arithmetic and ops numpy does not evaluate here stay for FoldConstant.
            h = bb.emit(relax.op.add(relax.const(rng.standard_normal(4).astype(np.float16)),
                                     relax.const(np.float16(0.1), "float16")))
            r = bb.emit(relax.op.nn.relu(relax.const(rng.standard_normal(4).astype(np.float16))))
            gv = bb.emit_output(relax.op.add(relax.op.add(x, h), r))
        bb.emit_func_output(gv)
    mod = bb.get()
    ours = EvalConstants()(mod)
    assert tvm_ffi.structural_equal(ours, mod)
    assert has_constant_calls(ours)
    folded = canonicalize(mod)
    assert op_names(folded["main"]) == ["add", "add"]
    want = _tidy(relax.transform.FoldConstant()(mod))
    assert tvm_ffi.structural_equal(folded, want, map_free_vars=True)


def _constant_of_shape_net():
    """Weights as ConstantOfShape nodes, as in the ONNX light models, with a BatchNorm
    and a Gemm (transB) on them."""
    c = 4

    def cos(name, shape, value):
        return [
            helper.make_node("Constant", [], [f"{name}_shape"],
                             value=helper.make_tensor(f"{name}_s", TensorProto.INT64, [len(shape)], shape)),
            helper.make_node("ConstantOfShape", [f"{name}_shape"], [name],
                             value=helper.make_tensor(f"{name}_v", TensorProto.FLOAT, [1], [value])),
        ]

    nodes = [
        *cos("W", [c, 3, 3, 3], 0.02), *cos("s", [c], 1.3), *cos("b", [c], 0.2),
        *cos("m", [c], -0.1), *cos("v", [c], 0.7), *cos("G", [5, c * 8 * 8], 0.01),
        helper.make_node("Conv", ["x", "W"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv", "s", "b", "m", "v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["relu"]),
        helper.make_node("Flatten", ["relu"], ["flat"]),
        helper.make_node("Gemm", ["flat", "G"], ["y"], transB=1),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [("y", TensorProto.FLOAT, [1, 5])], name="cos_net")


def test_constant_of_shape_weights_fold_without_fold_constant_and_match_onnxruntime():
    model = _constant_of_shape_net()
    imported = import_onnx(model)
    mod = canonicalize(imported.mod)
    assert sorted(op_names(mod["main"])) == ["add", "matmul", "nn.conv2d", "nn.relu", "reshape"]
    inputs = random_inputs(imported)
    for got, want in zip(run_tvm(mod, imported, inputs), run_onnxruntime(model, inputs)):
        tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # The same module as with FoldConstant doing all the folding.
    decomposed = relax.transform.DecomposeOpsForInference()(imported.mod)
    assert not has_constant_calls(EvalConstants()(decomposed))
    assert has_constant_calls(decomposed)

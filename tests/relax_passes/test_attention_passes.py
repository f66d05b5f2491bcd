"""The passes that bring exported attention into LPX's forms (lpx.Decompose,
lpx.HeadsTo3D, and EvalConstants on mask subgraphs): each rewritten module must compute
what the original computes (both built for llvm), and have the expected form."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from lpx_tvm.relax_passes import canonicalize

S, H, D = 8, 2, 4  # sequence, heads, head dim


def _llvm(mod, *args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy()


def _ops(mod) -> list:
    names = []
    relax.analysis.post_order_visit(
        mod["main"].body,
        lambda e: names.append(e.op.name.removeprefix("relax."))
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return names


def _attention(mask, guard: str, k_axes=(0, 2, 1, 3)):
    """softmax(Q K^T + mask) V over (1, S, H*D) projections, written 4-D as exporters do;
    ``guard``: none, "isnan" (ONNX export) or "torch" (torch's safe softmax)."""
    q = relax.Var("q", relax.TensorType((1, S, H * D), "float32"))
    k = relax.Var("k", relax.TensorType((1, S, H * D), "float32"))
    v = relax.Var("v", relax.TensorType((1, S, H * D), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            def heads(x, axes=(0, 2, 1, 3)):
                return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, (1, S, H, D))), list(axes)))

            qh, vh = heads(q), heads(v)
            if k_axes == (0, 2, 3, 1):
                kt = heads(k, k_axes)
            else:
                kt = bb.emit(relax.op.permute_dims(heads(k), [0, 1, 3, 2]))
            scores = bb.emit(relax.op.matmul(qh, kt))
            z = bb.emit(relax.op.add(scores, relax.const(mask)))
            p = bb.emit(relax.op.nn.softmax(z, axis=-1))
            if guard == "isnan":
                p = bb.emit(relax.op.where(bb.emit(relax.op.isnan(p)), relax.const(0.0, "float32"), p))
            elif guard == "torch":
                finite = bb.emit(relax.op.logical_not(bb.emit(relax.op.equal(z, relax.const(-np.inf, "float32")))))
                anyrow = bb.emit(relax.op.max(bb.emit(relax.op.astype(finite, "int8")), axis=[-1], keepdims=True))
                empty = bb.emit(relax.op.logical_not(bb.emit(relax.op.astype(anyrow, "bool"))))
                p = bb.emit(relax.op.where(empty, relax.const(np.zeros((1, H, S, S), np.float32)), p))
            o = bb.emit(relax.op.matmul(p, vh))
            # The head merge as torch writes it: three permutes, two of which cancel.
            o = bb.emit(relax.op.permute_dims(o, [2, 0, 1, 3]))
            o = bb.emit(relax.op.permute_dims(o, [1, 2, 0, 3]))
            o = bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3]))
            out = bb.emit_output(bb.emit(relax.op.reshape(o, (1, S, H * D))))
        bb.emit_func_output(out)
    return bb.get()


def _inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, S, H * D)).astype(np.float32) for _ in range(3)]


CAUSAL = np.triu(np.full((S, S), -np.inf, np.float32), 1).reshape(1, 1, S, S)


@pytest.mark.parametrize("guard", ["none", "isnan", "torch"])
@pytest.mark.parametrize("k_axes", [(0, 2, 1, 3), (0, 2, 3, 1)])
def test_attention_becomes_3d_and_computes_the_same(guard, k_axes):
    mod = _attention(CAUSAL, guard, k_axes)
    args = _inputs()
    want = _llvm(mod, *args)
    new = canonicalize(mod)
    np.testing.assert_allclose(_llvm(new, *args), want, rtol=1e-6, atol=1e-6)
    ops = _ops(new)
    # No 4-D value is left, and no guard: a causal mask leaves every row one finite entry.
    assert "where" not in ops and "isnan" not in ops and "equal" not in ops, ops
    for var_binding in (b for block in new["main"].body.blocks for b in block.bindings):
        assert len(var_binding.var.ty.shape) <= 3, var_binding
    # Head splits (reshape to (S, H, D), permute [1, 0, 2]) and one merge.
    assert ops.count("permute_dims") == (3 + 1 + 1), ops  # 3 splits, K^T, the merge


def test_a_fully_masked_row_keeps_the_guard():
    mask = CAUSAL.copy()
    mask[..., 0, :] = -np.inf  # row 0 sees nothing: the softmax gives NaN there
    for guard in ("isnan", "torch"):
        mod = _attention(mask, guard)
        args = _inputs()
        want = _llvm(mod, *args)
        new = canonicalize(mod)
        assert "where" in _ops(new)
        np.testing.assert_array_equal(np.isnan(_llvm(new, *args)), np.isnan(want))
        np.testing.assert_allclose(_llvm(new, *args), want, rtol=1e-6, atol=1e-6)


def test_arange_masks_fold_to_constants():
    """torch builds its masks from arange, comparisons and selects: all fold."""
    x = relax.Var("x", relax.TensorType((1, 1, S, S), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            i = bb.emit(relax.op.arange(0, S, 1, dtype="int64"))
            rows = bb.emit(relax.op.expand_dims(i, [1]))
            keep = bb.emit(relax.op.greater_equal(rows, bb.emit(relax.op.expand_dims(i, [0]))))
            mask = bb.emit(relax.op.where(keep, relax.const(0.0, "float32"), relax.const(-np.inf, "float32")))
            out = bb.emit_output(bb.emit(relax.op.add(x, mask)))
        bb.emit_func_output(out)
    mod = bb.get()
    arg = np.random.default_rng(1).standard_normal((1, 1, S, S)).astype(np.float32)
    new = canonicalize(mod)
    assert _ops(new) == ["add"], _ops(new)
    np.testing.assert_array_equal(_llvm(new, arg), _llvm(mod, arg))


def test_split_and_power_decompose():
    x = relax.Var("x", relax.TensorType((1, S, 3 * H * D), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, 3, axis=2))
            a, b, c = (bb.emit(relax.TupleGetItem(parts, i)) for i in range(3))
            cube = bb.emit(relax.op.power(b, relax.const(3.0, "float32")))
            out = bb.emit_output(bb.emit(relax.op.add(bb.emit(relax.op.multiply(a, cube)), c)))
        bb.emit_func_output(out)
    mod = bb.get()
    arg = np.random.default_rng(2).standard_normal((1, S, 3 * H * D)).astype(np.float32)
    new = canonicalize(mod)
    ops = _ops(new)
    assert "split" not in ops and "power" not in ops and ops.count("strided_slice") == 3, ops
    np.testing.assert_allclose(_llvm(new, arg), _llvm(mod, arg), rtol=1e-6)

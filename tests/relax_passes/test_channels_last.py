"""lpx.ChannelsLast on Relax modules: what it rewrites onto pixel rows, and what it leaves."""

import numpy as np
import tvm
from tvm import relax

from lpx_tvm.relax_passes.channels_last import ChannelsLast


def _function(build):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 5, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod):
    ops = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: ops.append(
        (e.op.name, [int(s) for s in e.ty.shape.values])) if isinstance(e, relax.Call) else None)
    return ops


def test_nhwc_section_runs_on_pixel_rows():
    gamma = relax.const(np.linspace(0.5, 1.5, 8).astype("float32"))
    beta = relax.const(np.zeros(8, "float32"))
    scale = relax.const(np.arange(8, dtype="float32"))

    def build(bb, x):
        t = bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1]))
        t = bb.emit(relax.op.nn.layer_norm(t, gamma, beta, axes=[-1]))
        t = bb.emit(relax.op.multiply(scale, t))  # a layer scale of shape (C,)
        return relax.op.permute_dims(t, [0, 3, 1, 2])

    ops = _ops(ChannelsLast()(_function(build)))
    rows = [15, 8]  # (N*H*W, C)
    assert ("relax.nn.layer_norm", rows) in ops and ("relax.multiply", rows) in ops
    # in: permute then the reshape to rows (lpx.pixels_to_rows); out: the inverse (lpx.rows_to_pixels)
    assert ("relax.reshape", rows) in ops and ("relax.reshape", [1, 5, 3, 8]) in ops
    assert ops[-1] == ("relax.permute_dims", [1, 8, 5, 3])


def test_head_split_is_left_alone():
    """A permute of a reshaped value is an attention head split (lpx.HeadsTo3D's)."""
    def build(bb, x):
        r = bb.emit(relax.op.reshape(x, (1, 8, 15)))
        r = bb.emit(relax.op.reshape(r, (1, 8, 3, 5)))
        return relax.op.permute_dims(r, [0, 2, 3, 1])

    mod = _function(build)
    tvm.ir.assert_structural_equal(ChannelsLast()(mod), mod)

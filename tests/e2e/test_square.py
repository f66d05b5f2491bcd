"""Relax's ``square`` on LPX (a family of one module, lowerings/square.py): offloaded as
one op, and its values those of numpy's x * x rounded once to the build's dtype, for odd
shapes and every float precision. (torch.export and the ONNX importer write x * x as a
multiply; a Relax module may hold ``R.square`` itself.)"""

import numpy as np
import pytest
from tvm import relax

import lpx_tvm
from lpx_tvm.relax_passes.partition import partition_for_lpx

NP_DTYPE = {"fp32": np.float32, "fp16": np.float16}


def _square_plus_one(shape, dtype):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.square(x))
            y = bb.emit_output(relax.op.add(s, relax.const(1.0, dtype)))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 333)])
def test_square_runs_on_lpx_and_matches_numpy(precision, shape):
    dtype = "float32" if precision == "fp32" else "float16"
    mod = _square_plus_one(shape, dtype)
    _, report = partition_for_lpx(mod, "mini", precision)
    assert report.lpx.get("square") == 1 and not report.cpu, (report.lpx, report.cpu)
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, shape).astype(NP_DTYPE[precision])
    (got,) = lpx_tvm.build(mod, preset="mini", precision=precision).run([x])
    # The square in fp32 (exact for fp16 inputs) rounded once to the dtype, then + 1 rounded again.
    sq = (x.astype(np.float32) * x.astype(np.float32)).astype(NP_DTYPE[precision])
    want = (sq.astype(np.float32) + np.float32(1.0)).astype(NP_DTYPE[precision])
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)

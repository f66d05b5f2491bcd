"""The executable's host-side layout work (lpx_tvm/runtime/executable.py)."""

from __future__ import annotations

import numpy as np
import pytest

from lpx_tvm.runtime.executable import im2col


def im2col_reference(x, kernel, strides, dilation, padding):
    """Row (n, oh, ow), column (kh * KW + kw) * C + c, by loops over every window."""
    kh, kw = kernel
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    n, c, h, w = x.shape
    xp = np.zeros((n, c, h + pt + pb, w + pl + pr), x.dtype)
    xp[:, :, pt:pt + h, pl:pl + w] = x
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n * oh * ow, kh * kw * c), x.dtype)
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                for a in range(kh):
                    for e in range(kw):
                        out[(b * oh + i) * ow + j, (a * kw + e) * c:(a * kw + e + 1) * c] = \
                            xp[b, :, i * sh + a * dh, j * sw + e * dw]
    return out


@pytest.mark.parametrize("kernel, strides, dilation, padding", [
    ((7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),
    ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((3, 2), (2, 1), (2, 1), (0, 1, 2, 0)),
    ((1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
])
def test_im2col(kernel, strides, dilation, padding):
    x = np.random.default_rng(0).standard_normal((2, 3, 11, 9)).astype(np.float32)
    t = {"kernel": kernel, "strides": strides, "dilation": dilation, "padding": padding}
    assert np.array_equal(im2col(x, t), im2col_reference(x, kernel, strides, dilation, padding))


def test_a_freed_executable_leaves_no_region_functions():
    """The registry holds region functions by name for the whole process: they must not
    keep a freed model's programs and simulators alive (a process compiling many models
    grew by ~65 MiB a model on tsp)."""
    import gc
    import weakref

    import tvm
    from onnx import TensorProto, helper, numpy_helper

    import lpx_tvm
    from lpx_tvm.runtime.compiled_region import REGION_PREFIX

    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 8))], [w])
    model = lpx_tvm.compile_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                                  preset="mini", precision="fp32")
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_allclose(model.run({"x": x})["y"], x @ np.ones((8, 8), np.float32))
    names = [REGION_PREFIX + name for name in model.executable.regions]
    assert names and all(tvm.get_global_func(n, allow_missing=True) is not None for n in names)
    exe = weakref.ref(model.executable)
    del model
    gc.collect()
    assert exe() is None
    assert all(tvm.get_global_func(n, allow_missing=True) is None for n in names)

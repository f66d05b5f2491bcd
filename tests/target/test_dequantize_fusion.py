"""A DequantizeLinear that alone reads an int8 conv2d / dense runs in that op's drains.

Which ops fuse is checked on small regions written by hand; the fused program is bench's
QDQ GEMV on ``mini``, checked against onnxruntime within one output step, and read back:
no dequantize pass is left, and the drains convert to fp32.
"""

import os
import sys

import numpy as np
import pytest
import tvm.testing

import lpx_tvm
from lpx_tvm.machine.isa import DType
from lpx_tvm.target.codegen.graph import Operand, Region, RegionOp, OpCall
from lpx_tvm.target.codegen.quant import fusable_dequantizes

pytest.importorskip("onnxruntime.quantization")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
from e2e import gemv  # noqa: E402


def _const(v):
    return Operand(const=np.asarray(v, np.float32))


def _dequantize(src: str, out: str, scale=0.5, zp=3):
    return RegionOp("lpx.dequantize", OpCall("dequantize", [Operand(src), _const(scale), _const(zp)], {}, (1, 16),
                                           "float32"), out=out, shape=(1, 16))


def _qdense(out: str, src: str = "x"):
    return RegionOp("lpx.qdense", OpCall("matmul", [Operand(src), _const(np.ones((16, 16)))], {}, (1, 16), "uint8"),
                    out=out, shape=(1, 16), dtype="uint8")


def _region(ops, outputs):
    return Region("r", [Operand("x", shape=(1, 16), dtype="uint8")], ops, outputs)


def test_which_dequantizes_fuse():
    one = _region([_qdense("q"), _dequantize("q", "y")], ["y"])
    (name, (dq, is_output)), = fusable_dequantizes(one, alus=16, planes=4).items()
    assert (name, dq.out, is_output) == ("q", "y", True)
    # The int8 value is also a region output, or read by a second op: it must be written.
    assert fusable_dequantizes(_region([_qdense("q"), _dequantize("q", "y")], ["y", "q"]), 16, 4) == {}
    two = _region([_qdense("q"), _dequantize("q", "y"), _dequantize("q", "z")], ["y", "z"])
    assert fusable_dequantizes(two, 16, 4) == {}
    # A per-channel scale: its own pass.
    per_channel = _region([_qdense("q"), _dequantize("q", "y", scale=np.ones(16))], ["y"])
    assert fusable_dequantizes(per_channel, 16, 4) == {}
    # The drain's chain: 3 K-part adds (4 planes), bias, requantization, then cvt, sub
    # (zero point 3) and mul: 8 ALUs. With 7 it does not fit; with zero point 0 (no sub) it does.
    assert fusable_dequantizes(one, alus=7, planes=4) == {}
    no_zp = _region([_qdense("q"), _dequantize("q", "y", zp=0)], ["y"])
    assert list(fusable_dequantizes(no_zp, alus=7, planes=4)) == ["q"]


def test_fused_gemv_matches_onnxruntime_without_a_dequantize_pass(tmp_path):
    shape = (1, 64, 48)
    fig, got, want, step = gemv(shape, preset="mini", folder=str(tmp_path))
    tvm.testing.assert_allclose(got, want, rtol=0, atol=step * 1.001)
    model = lpx_tvm.compile_model(str(tmp_path / "gemv_qdq_u8s8.onnx"), preset="mini", precision="int8")
    (region,) = model.executable.regions.values()
    tags = {ins.tag.rsplit(".", 1)[-1] for ins in region.program.instrs}
    assert "dequantize" not in tags and "quantize" in tags  # the input is still quantized on chip
    to_fp32 = [ins for ins in region.program.instrs if ins.op == "vxm.cvt" and ins.out_dtype == DType.FP32]
    # One conversion per output vector (48 columns: 3 tiles of 16), all in drains.
    assert len(to_fp32) == 3 and all(ins.tag.endswith(".drain") for ins in to_fp32)

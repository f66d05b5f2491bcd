"""partition_for_lpx: composites per region, the offload report, and each check's refusals."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.backend.pattern_registry import get_patterns_with_prefix
from tvm.script import relax as R

from lpx_tvm.relax_passes import (
    OffloadReport,
    PartitionError,
    canonicalize,
    import_onnx,
    partition_for_lpx,
)

from relax_models import convnet, depthwise_net, rejects_net

COMPOSITES = {
    f"lpx.{family}{bias}{act}"
    for family in ("conv2d", "dense")
    for bias in ("", "_bias")
    for act in ("", "_relu", "_clip")
} | {
    f"lpx.{op}"
    for op in (
        "add", "subtract", "multiply", "relu", "sigmoid", "tanh", "clip",
        "max_pool2d", "avg_pool2d", "global_avg_pool2d", "reshape", "concat", "softmax",
        "layer_norm", "erf", "gelu", "gelu_tanh", "permute_dims",
    )
}


def _partition(model, config="tsp", precision="fp16"):
    return partition_for_lpx(canonicalize(import_onnx(model).mod), config, precision)


def _lpx_composites(mod):
    """Composite names inside each Codegen="lpx" function, one Counter per region."""
    regions = []
    for _, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs and func.attrs.get("Codegen") == "lpx":
            found = Counter()

            def visit(expr, found=found):
                if isinstance(expr, relax.Function) and expr.attrs and "Composite" in expr.attrs:
                    found[str(expr.attrs["Composite"])] += 1

            relax.analysis.post_order_visit(func.body, visit)
            regions.append(found)
    return regions


def test_every_composite_is_registered_with_a_check():
    names = {str(p.name) for p in get_patterns_with_prefix("lpx.")}
    assert COMPOSITES <= names
    assert all(p.check is not None for p in get_patterns_with_prefix("lpx."))


def test_convnet_regions_and_report():
    mod, report = _partition(convnet())
    assert _lpx_composites(mod) == [
        Counter(
            {
                "lpx.conv2d_bias_clip": 1,
                "lpx.conv2d": 1,
                "lpx.add": 1,
                "lpx.max_pool2d": 1,
                "lpx.global_avg_pool2d": 1,
                "lpx.reshape": 1,
                "lpx.dense_bias": 1,
                "lpx.softmax": 1,
            }
        )
    ]
    assert report.lpx == {
        "add": 3, "clip": 1, "matmul": 1, "mean": 1,
        "nn.conv2d": 2, "nn.max_pool2d": 1, "reshape": 1, "nn.softmax": 1,
    }
    assert report.cpu == {}
    assert report.reasons == {}
    assert report.regions == 1
    assert (report.config, report.precision) == ("tsp", "fp16")
    assert report.offload_fraction == pytest.approx(1.0)
    # Nothing is left in main but the call of the LPX region.
    ops_in_main = [
        b.value.op.name
        for block in mod["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
    ]
    assert ops_in_main == []


def test_depthwise_conv_and_dense_chain_offloaded():
    """The NCHW flatten of a 4x4 map reorders elements stored as NHWC, so it stays on the
    CPU with its reason and splits the graph into two LPX regions."""
    mod, report = _partition(depthwise_net())
    assert sorted(_lpx_composites(mod), key=len) == [
        Counter({"lpx.dense_bias": 1}),
        Counter({"lpx.multiply": 1, "lpx.add": 1, "lpx.conv2d_bias_relu": 1}),
    ]
    assert report.cpu == {"reshape": 1}
    (reason,) = report.reasons["reshape"]
    assert "moves data between lanes" in reason


def test_runtime_weight_conv_int_add_and_softmax_stay_on_cpu_with_reasons():
    mod, report = _partition(rejects_net())
    assert report.cpu == {"nn.conv2d": 1, "add": 1, "nn.softmax": 1}
    assert report.lpx == {"nn.relu": 1}
    (conv_reason,) = report.reasons["nn.conv2d"]
    assert conv_reason.startswith("weight is not a constant")
    assert report.reasons["add"] == [
        "dtype int64 is not supported on LPX (float32, float16 or bfloat16)"
    ]
    assert report.reasons["nn.softmax"] == [
        "softmax over axis 1 of a 4-D tensor: LPX reduces the last axis"
    ]
    assert [op.op for op in report.cpu_ops] == ["nn.conv2d", "nn.softmax", "add"]
    assert _lpx_composites(mod) == [Counter({"lpx.relu": 1})]


def test_report_round_trips_through_json():
    _, report = _partition(rejects_net())
    data = json.loads(json.dumps(report.to_json()))
    assert OffloadReport.from_json(data) == report
    assert "weight is not a constant" in report.format_table()


@tvm.script.ir_module
class _Wide:
    @R.function
    def main(x: R.Tensor((1, 8, 2, 8192), "float32")):
        with R.dataflow():
            y = R.nn.relu(x)
            R.output(y)
        return y


def test_activation_row_bigger_than_a_band_is_refused():
    # Activations larger than the SRAM run off chip in bands of image rows; one row of
    # 8192 pixels x 16 lanes at fp16 is 256 KiB: more than 1/8 of mini's 512 KiB SRAM.
    _, report = partition_for_lpx(_Wide, "mini", "fp16")
    assert report.cpu == {"nn.relu": 1}
    (reason,) = report.reasons["nn.relu"]
    assert "needs 262144 bytes at fp16" in reason and "mini SRAM (524288 bytes)" in reason
    # On tsp the row fits a band, but an image row is stored whole in one slice: 8192
    # pixels at fp16 need 16384 lines, a tsp slice has 8192 (codegen would fail).
    _, report = partition_for_lpx(_Wide, "tsp", "fp16")
    (reason,) = report.reasons["nn.relu"]
    assert "an image row of 8192 pixels" in reason and "(8192)" in reason, reason


def test_unknown_precision():
    with pytest.raises(PartitionError, match="precision 'fp8'"):
        partition_for_lpx(_Wide, "tsp", "fp8")


@tvm.script.ir_module
class _Refusals:
    @R.function
    def main(
        x: R.Tensor((1, 4, 6, 6), "float32"),
        w: R.Tensor((4, 4, 3, 3), "float32"),
        a: R.Tensor((2, 4), "float32"),
        b: R.Tensor((2, 4, 3), "float32"),
        xh: R.Tensor((1, 6, 6, 4), "float32"),
    ):
        with R.dataflow():
            conv = R.nn.conv2d(x, w)  # weights are an input, not a constant
            pool = R.nn.max_pool2d(x, (2, 2), ceil_mode=True)
            avg = R.nn.avg_pool2d(x, (2, 2), dilation=(2, 2))
            mean = R.mean(x, axis=[1], keepdims=True)
            mm = R.matmul(a, b)  # activation x activation, broadcast over a batch
            nhwc = R.nn.conv2d(
                xh, R.const(1.0, "float32") * R.ones((3, 3, 4, 4), "float32"),
                data_layout="NHWC", kernel_layout="HWIO",
            )
            clip = R.clip(a, R.prim_value(3.0), R.prim_value(1.0))
            R.output(conv, pool, avg, mean, mm, nhwc, clip)
        return (conv, pool, avg, mean, mm, nhwc, clip)


def test_each_check_says_why():
    mod = relax.transform.FoldConstant()(_Refusals)
    _, report = partition_for_lpx(mod, "tsp")
    reasons = {op.var: op.reason for op in report.cpu_ops}
    assert reasons["conv"].startswith("weight is not a constant")
    assert reasons["pool"].startswith("ceil_mode=True")
    assert reasons["avg"].startswith("dilation (2, 2)")
    assert reasons["mean"].startswith("mean over axes [1] of a rank-4 tensor")
    assert reasons["mm"].startswith("runtime matmul operands (2, 4) x (2, 4, 3)")
    assert reasons["nhwc"].startswith("layouts data=NHWC weight=HWIO")
    assert reasons["clip"] == "clip min 3.0 is above max 1.0"
    assert report.lpx == {}


@tvm.script.ir_module
class _Elementwise:
    @R.function
    def main(
        x: R.Tensor((2, 3, 4), "float16"),
        y: R.Tensor((3, 4), "float16"),
        z: R.Tensor((2, 3, 4), "bfloat16"),
    ):
        with R.dataflow():
            s = R.add(x, y)  # numpy broadcasting
            t = R.multiply(s, R.const(2.0, "float16"))
            u = R.subtract(t, x)
            v = R.sigmoid(u)
            w = R.tanh(v)
            c = R.concat((w, x), axis=1)
            r = R.reshape(c, (2, 24))
            q = R.nn.relu(z)
            R.output(r, q)
        return (r, q)


def test_elementwise_and_data_movement_offloaded_in_half_precisions():
    mod, report = partition_for_lpx(_Elementwise, "mini")
    # What would move data between lanes stays on the CPU: a reshape that changes the
    # last dimension. A tensor-tensor broadcast of a block of rows along the leading dims
    # runs on LPX, and a concat off the last axis places whole rows (lpx.concat_rows).
    assert report.cpu == {"reshape": 1}
    assert "moves data between lanes" in report.reasons["reshape"][0]
    assert report.lpx == {"add": 1, "concat": 1, "multiply": 1, "nn.relu": 1, "sigmoid": 1, "subtract": 1,
                          "tanh": 1}
    assert sum(_lpx_composites(mod), Counter()) == Counter(
        {"lpx.add": 1, "lpx.multiply": 1, "lpx.subtract": 1, "lpx.sigmoid": 1, "lpx.tanh": 1, "lpx.relu": 1,
         "lpx.concat_rows": 1}
    )


def test_equal_composites_count_once_per_call():
    # Two identical conv+relu layers: merging shares one composite definition.
    weight = relax.const(np.ones((4, 4, 1, 1), np.float32))
    x = relax.Var("x", relax.TensorType((1, 4, 4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(2):
                h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(h, weight))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    _, report = partition_for_lpx(bb.get(), "mini")
    assert report.lpx == {"nn.conv2d": 2, "nn.relu": 2}
    assert report.composites == {"lpx.conv2d_relu": 2}

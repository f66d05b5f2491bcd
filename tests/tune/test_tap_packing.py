"""Tap packing: a convolution with few input channels packs several taps into one
reduction tile through an im2col built on chip (a decision of its design space)."""

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir

from lpx_tvm.pipeline import build_executable, lower
from lpx_tvm.target.codegen import TilingPolicy
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.machine.config import load_config
from lpx_tvm.tir_schedules import Conv2dTiling, Conv2dWorkload, default_tiling
from lpx_tvm.tir_schedules.schedules import packed_tiles, packings, taps_per_tile, tiling_of
from lpx_tvm.tune.database import TuningLog, best_records, load_tuned, tiling_of_record
from lpx_tvm.tune.measure import task_cycles
from lpx_tvm.tune.space import LPXFits, fits, space_fn, structures, workload_module
from lpx_tvm.tune.tuner import extract_tasks, tune

MINI = load_config("mini")
TSP = load_config("tsp")


def conv_relu(c, co, hw, stride=1, seed=0):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.integers(-2, 3, (co, c, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.integers(-2, 3, (co,)).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c1"], pads=[1, 1, 1, 1], strides=[stride, stride]),
             helper.make_node("Relu", ["c1"], ["y"])]
    out = (hw - 1) // stride + 1
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, co, out, out])],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def run(model, cfg, precision, tuned, x):
    """Outputs and cycles of the model compiled with ``tuned`` tilings (by task key)."""
    cpu_mod, regions, offload = lower(import_onnx(model).mod, cfg, precision, TilingPolicy(tuned))
    exe = build_executable(cpu_mod, regions, cfg, precision, offload)
    return exe.run([x])[0], exe.stats.cycles


def packed_tuning(model, cfg, precision, pack):
    (task,) = extract_tasks(import_onnx(model).mod, cfg, precision)
    assert pack in packings(task.workload, cfg.lanes)
    return task, {task.key: dataclasses.replace(default_tiling(cfg, task.workload), pack=pack)}


def test_which_convolutions_pack():
    w = Conv2dWorkload(1, 10, 10, 16, 3, 3, 16, (1, 1), (1, 1), "float16", channels=4)
    assert packings(w, 16) == ("taps", "rows")
    # "taps": 4 taps of 4 channels per 16-lane tile, 3 tiles for 9 taps; "rows": a kernel row per tile.
    assert (taps_per_tile(w, 16, "taps"), packed_tiles(w, 16, "taps")) == (4, 3)
    assert (taps_per_tile(w, 16, "rows"), packed_tiles(w, 16, "rows")) == (3, 3)
    six = dataclasses.replace(w, channels=6)  # 2 taps per tile: a kernel row is 2 tiles (2 taps, then 1)
    assert (packed_tiles(six, 16, "taps"), packed_tiles(six, 16, "rows")) == (5, 6)
    assert packings(dataclasses.replace(w, channels=9), 16) == ()  # more than half a tile
    assert packings(dataclasses.replace(w, KH=1, KW=1, Hp=8, Wp=8), 16) == ()  # one tap: nothing to pack
    assert packings(dataclasses.replace(w, KW=1, Wp=8), 16) == ("taps",)  # a 3x1 kernel has no row to pack
    assert packings(dataclasses.replace(w, channels=0), 16) == ()  # channels unknown
    assert structures(w, 16) == [("noc", ""), ("nco", ""), ("noc", "taps"), ("nco", "taps"), ("noc", "rows"),
                                 ("nco", "rows")]
    assert "packing 'taps'" in fits(dataclasses.replace(w, channels=9), Conv2dTiling(8, 16, 16, pack="taps"), MINI)
    assert fits(w, Conv2dTiling(oh=8, ci=16, co=16, pack="taps", k_split=2), MINI) is None
    assert "3 reduction tiles" in fits(w, Conv2dTiling(oh=8, ci=16, co=16, pack="taps", k_split=4), MINI)


@pytest.mark.parametrize("pack", ["taps", "rows"])
@pytest.mark.parametrize("c,co,hw,stride", [(4, 8, 10, 1), (6, 20, 9, 2), (3, 16, 12, 1)])
def test_packed_convolution_matches_onnxruntime(c, co, hw, stride, pack):
    model = conv_relu(c, co, hw, stride)
    task, tuned = packed_tuning(model, MINI, "fp16", pack)
    x = np.random.default_rng(1).integers(-3, 4, (1, c, hw, hw)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    packed, packed_cycles = run(model, MINI, "fp16", tuned, x)
    plain, plain_cycles = run(model, MINI, "fp16", {}, x)
    np.testing.assert_array_equal(packed, want)  # integers: every summation order is exact
    np.testing.assert_array_equal(plain, want)
    # Another program: fewer reduction tiles, and the im2col work.
    assert task_cycles(task, MINI, tuned[task.key]) != task_cycles(task, MINI, None)


def test_packed_points_of_the_space_compile_and_run():
    (task,) = extract_tasks(import_onnx(conv_relu(4, 8, 10)).mod, MINI, "fp16")
    post, packed = LPXFits(MINI, task.workload), 0
    for seed in range(8):
        sch = s_tir.Schedule(workload_module(task, MINI), seed=seed + 1)
        space = space_fn(task.workload, MINI)(sch)[2 + seed % 4]  # the packed design spaces
        if post.apply(space):
            t = tiling_of(task.workload, space.mod["main"])
            assert t.pack == ("taps", "rows")[seed % 4 // 2]
            assert task_cycles(task, MINI, t) > 0
            packed += 1
    assert packed >= 4


@pytest.mark.parametrize("pack", ["taps", "rows"])
def test_packed_resnet_stage_on_tsp_matches_onnxruntime(pack):
    """64 input channels on tsp: 5 taps per 320-lane tile (2 tiles instead of 9), or a
    kernel row per tile (3 tiles); bf16."""
    model = conv_relu(64, 64, 14)
    task, tuned = packed_tuning(model, TSP, "bf16", pack)
    x = np.random.default_rng(2).standard_normal((1, 64, 14, 14)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    packed, packed_cycles = run(model, TSP, "bf16", tuned, x)
    _, plain_cycles = run(model, TSP, "bf16", {}, x)
    assert np.linalg.norm(packed - want) / np.linalg.norm(want) < 1e-2
    assert packed_cycles < plain_cycles


def qdq_conv(tmp_path, rng):
    """A QDQ convolution: uint8 activations (zero point in the padding), int8 weights."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    import onnx

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(conv_relu(40, 24, 11), src)

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": rng.standard_normal((1, 40, 11, 11)).astype(np.float32)} for _ in range(2)])

        def get_next(self):
            return next(self.data, None)

    quantization.quantize_static(str(src), str(dst), Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8, per_channel=True)
    return str(dst)


@pytest.mark.parametrize("pack", ["taps", "rows"])
def test_packed_int8_convolution_is_bit_identical(tmp_path, pack):
    """Packed and not: the same integers (int32 sums of int8 products are exact in any order)."""
    import onnx

    rng = np.random.default_rng(3)
    path = qdq_conv(tmp_path, rng)
    model = onnx.load(path)
    task, tuned = packed_tuning(model, TSP, "int8", pack)
    x = rng.standard_normal((1, 40, 11, 11)).astype(np.float32)
    packed, _ = run(model, TSP, "int8", tuned, x)
    plain, _ = run(model, TSP, "int8", {}, x)
    np.testing.assert_array_equal(packed, plain)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(path, so).run(None, {"x": x})[0]
    assert np.abs(packed - want).max() <= np.abs(want).max() / 100  # within a few output steps


def test_int8_layers_are_measured_as_tuning_tasks(tmp_path):
    """An int8 layer's one-op region holds the whole composite (zero point, bias,
    requantization): it compiles and runs, and its tuned records are applied."""
    import onnx

    path = qdq_conv(tmp_path, np.random.default_rng(4))
    (task,) = extract_tasks(import_onnx(onnx.load(path)).mod, TSP, "int8")
    assert task.name.endswith("int8_qconv2d")
    assert task_cycles(task, TSP, None) > 0
    results = tune([task], TSP, str(tmp_path / "log"), 3, seed=1)
    assert results[0].error is None and results[0].trials == 3
    # The log's best record applies, and the model built with it gives the default
    # build's integers.
    log = str(tmp_path / "log")
    (best, _), = best_records(TuningLog(log), TSP).values()
    tuned = load_tuned(log, TSP)
    assert tuned == {task.key: tiling_of_record(best)}
    x = np.random.default_rng(5).standard_normal((1, 40, 11, 11)).astype(np.float32)
    got, _ = run(onnx.load(path), TSP, "int8", tuned, x)
    want, _ = run(onnx.load(path), TSP, "int8", {}, x)
    np.testing.assert_array_equal(got, want)

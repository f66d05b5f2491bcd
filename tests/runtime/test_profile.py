"""The profiler: a valid whole-model trace, layer cycles adding up to the simulated total,
floors worked out by hand, the counters of a hand-made program, and the CLI's files."""

import json
import sys
from collections import defaultdict

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm
from lpx_tvm import cli
from lpx_tvm.machine.config import load_config
from lpx_tvm.machine.isa import DType, Instr, Stream
from lpx_tvm.machine.program import Program
from lpx_tvm.runtime.profile import DEPENDENCY, RegionTimeline, exclusive_cycles, profile_model
from lpx_tvm.runtime.profile_trace import model_trace, sram_occupancy, stream_planes
from lpx_tvm.runtime.compiled_region import CompiledRegion

RNG = np.random.default_rng(5)


def _two_regions_and_a_cpu_kernel() -> onnx.ModelProto:
    """fc1 + act on LPX, a CumSum on the CPU (no LPX pattern), fc2 on LPX."""
    w1 = numpy_helper.from_array(RNG.standard_normal((16, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(RNG.standard_normal((32, 16)).astype(np.float32), "w2")
    ax = numpy_helper.from_array(np.array(1, np.int64), "ax")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="fc1"),
             helper.make_node("Relu", ["a"], ["r"], name="act"),
             helper.make_node("CumSum", ["r", "ax"], ["c"], name="scan"),
             helper.make_node("MatMul", ["c", "w2"], ["y"], name="fc2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])], initializer=[w1, w2, ax])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _matmul(m, k, n) -> onnx.ModelProto:
    w = numpy_helper.from_array(RNG.standard_normal((k, n)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def profiled():
    model = lpx_tvm.compile_model(_two_regions_and_a_cpu_kernel(), preset="mini", precision="fp32")
    profile, _ = profile_model(model, {"x": RNG.standard_normal((8, 16)).astype(np.float32)})
    return model, profile, model_trace(profile)


def test_trace_is_valid_trace_event_format(profiled):
    _, profile, trace = profiled
    events = trace["traceEvents"]
    json.dumps(trace)  # plain JSON types
    by_track = defaultdict(list)
    for e in events:
        assert {"ph", "pid", "name"} <= set(e), e
        if e["ph"] == "M":
            continue
        assert {"ts", "tid"} <= set(e) and e["ph"] in ("X", "C"), e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] > 0
            by_track[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
        else:
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
    eps = 1e-9  # microseconds: float rounding of cycle * (1e6 / clock_hz)
    for track, spans in by_track.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - eps, (track, end, start)
    processes = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {"host", "LPX", "MXM", "VXM", "MEM west", "MEM east"} <= processes


def test_regions_and_the_cpu_kernel_run_one_after_another(profiled):
    _, profile, trace = profiled
    events = trace["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    timeline = sorted((e["ts"], e["ts"] + e["dur"], names[e["pid"], e["tid"]], e["name"]) for e in events
                      if e["ph"] == "X" and names[e["pid"], e["tid"]] in ("region calls",
                                                                          "CPU kernels (measured wall time)"))
    kinds = [t[2] for t in timeline]
    assert kinds == ["region calls", "CPU kernels (measured wall time)", "region calls"], timeline
    assert "cumsum" in timeline[1][3]
    us = 1e6 / profile.cfg.clock_hz
    assert sum(t[1] - t[0] for t in timeline if t[2] == "region calls") == pytest.approx(profile.cycles * us)


def test_layer_cycles_add_up_to_the_simulated_total(profiled):
    model, profile, trace = profiled
    assert model.report.cycles == profile.cycles > 0
    assert sum(x.cycles for x in profile.layers) == profile.cycles
    assert [x.name for x in profile.layers] == ["fc1", "fc2"]  # the ONNX node names, in order
    assert all(x.macs == 8 * 16 * 32 for x in profile.layers)  # (8, 16) @ (16, 32); (8, 32) @ (32, 16)
    # the owner track tiles the LPX time, and every unit slice carries a layer name
    owner = [e for e in trace["traceEvents"] if e["ph"] == "X" and "region" in e.get("args", {})
             and "op" not in e["args"]]
    assert sum(e["args"]["cycles"] for e in owner) == profile.cycles
    units = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and "op" in e.get("args", {})}
    assert units == {"fc1", "fc2"}


def test_multiply_floor_of_a_matmul_is_hand_arithmetic():
    m, k, n = 8, 40, 48  # on mini: 16x16 tiles, so ceil(40/16) = 3 K tiles and 3 N tiles
    model = lpx_tvm.compile_model(_matmul(m, k, n), preset="mini", precision="fp16")
    profile, _ = profile_model(model, {"x": RNG.standard_normal((m, k)).astype(np.float32)})
    cfg = load_config("mini")
    (layer,) = profile.layers
    assert layer.name == "proj" and layer.mxm_dtype == "fp16"
    # every activation row meets every (K tile, N tile) once; fp16 takes 4 cycles a vector
    vectors = m * 3 * 3
    assert layer.floors.multiply == vectors * cfg.mxm_cycles_per_vector["fp16"] / cfg.mxm_planes == 144.0
    assert layer.macs >= m * k * n
    # a floor is a lower bound: the layer owns every cycle of the run and cannot beat it
    assert layer.cycles == profile.cycles >= max(layer.floors.to_json().values())


def test_exclusive_cycles_by_hand():
    issue, done = np.array([0, 2, 10, 11]), np.array([5, 4, 12, 20])
    owned, waited = exclusive_cycles(issue, done)
    # [0,5) owns 0..4; [2,4) is covered; 5..9 is idle: the next to issue ([10,12)) waited on it
    assert owned.tolist() == [5, 0, 7, 8] and waited.tolist() == [0, 0, 5, 0]
    assert owned.sum() == done.max()


def test_sram_and_stream_counters_of_a_hand_program():
    cfg = load_config("mini")
    e0 = Stream("E", 0)
    instrs = [Instr("mem.write", 2, 0, 3, dtype=DType.INT8, addr=10, stride=1, src0=e0),
              Instr("mem.read", 10, 0, 3, dtype=DType.INT8, addr=10, stride=1, dst=e0),
              Instr("vxm.add", 12, 0, 3, dtype=DType.FP16, src0=e0, src1=e0, dst=Stream("W", 1))]
    prog = Program(cfg.hash, instrs=instrs)
    tl = RegionTimeline(cfg, CompiledRegion("r", prog, [], []))
    occ = sram_occupancy(tl) // cfg.lanes  # lines holding a value still to be read
    # line 10 + j is written at 2 + j and read at 10 + j: live through that read
    want = [0, 0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 2, 1] + [0] * (tl.cycles + 1 - 13)
    assert occ.tolist() == want
    east, west = stream_planes(tl)
    read_emit = 10 + cfg.latency["mem_read"]  # three int8 vectors: one byte-plane each cycle
    assert np.flatnonzero(east).tolist() == [read_emit, read_emit + 1, read_emit + 2] and east.max() == 1
    add_emit = 12 + cfg.latency["vxm_alu"]  # fp16: two byte-planes a vector
    assert np.flatnonzero(west).tolist() == [add_emit, add_emit + 1, add_emit + 2] and west.max() == 2
    (part,) = tl.layers.values()
    assert part.cycles == tl.cycles and part.span == tl.cycles - 2  # one layer (untagged) owns every cycle


def test_profile_cli_writes_the_three_files(tmp_path, capsys):
    onnx.save(_two_regions_and_a_cpu_kernel(), str(tmp_path / "m.onnx"))
    out = tmp_path / "prof"
    assert cli.main(["profile", str(tmp_path / "m.onnx"), "--preset", "mini", "--precision", "fp32",
                     "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("trace.json", "layers.json", "roofline.png"):
        assert str(out / name) in printed
    table = json.loads((out / "layers.json").read_text())
    assert sum(x["cycles"] for x in table["layers"]) == table["cycles"]
    assert {x["bottleneck"] for x in table["layers"]} <= {"multiply", "install", "SRAM port", "stream budget",
                                                         "VXM", "SXM", "DMA", DEPENDENCY}
    assert (out / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((out / "trace.json").read_text())
    assert any(e["ph"] == "C" for e in trace["traceEvents"])
    # run --trace writes the same tracks for a model
    assert cli.main(["run", str(tmp_path / "m.onnx"), "--preset", "mini", "--precision", "fp32",
                     "--fill-mode", "random", "--trace", str(tmp_path / "run.json")]) == 0
    run = json.loads((tmp_path / "run.json").read_text())

    def unit_slices(t):
        return sorted((e["name"], e["args"]["op"], e["args"]["cycle"]) for e in t["traceEvents"]
                      if e["ph"] == "X" and "op" in e.get("args", {}))

    assert unit_slices(run) == unit_slices(trace)


def test_profile_cli_errors(tmp_path, capsys, monkeypatch):
    cases = [(["profile", str(tmp_path / "none.onnx"), "-o", str(tmp_path / "o")], "no such file"),
             (["profile", str(tmp_path / "p.lpx"), "-o", str(tmp_path / "o")], "takes a model")]
    (tmp_path / "file").write_text("x")
    onnx.save(_matmul(2, 16, 16), str(tmp_path / "mm.onnx"))
    cases.append((["profile", str(tmp_path / "mm.onnx"), "--preset", "mini", "-o", str(tmp_path / "file")],
                  "not a folder"))
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("lpx-tvm: error:") and message in err, (argv, err)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert cli.main(["profile", str(tmp_path / "mm.onnx"), "-o", str(tmp_path / "o")]) == 2
    assert "pip install 'lpx-tvm[profile]'" in capsys.readouterr().err


def test_roofline_points_lie_under_the_ceilings(profiled):
    from lpx_tvm.runtime.roofline import bandwidths, roofline_points

    _, profile, _ = profiled
    cfg, bw = profile.cfg, bandwidths(profile.cfg)
    assert bw == {"install": 2 * 4 * 16, "sram_read": 8 * 1 * 16}  # mini: planes x streams x lanes; slices x lanes
    points = roofline_points(profile)
    assert [p[0].name for p in points] == ["fc1", "fc2"]
    for layer, rate, per_installed, per_read in points:
        assert rate == layer.macs / layer.cycles
        # each layer owns its whole region here, so no ceiling can be beaten: the floors hold
        assert rate <= cfg.peak_macs_per_cycle_for(layer.mxm_dtype)
        assert rate <= bw["install"] * per_installed and rate <= bw["sram_read"] * per_read
        # on a bandwidth line exactly when the cycles equal that floor
        assert bw["install"] * per_installed == pytest.approx(layer.macs / layer.floors.install)


def test_demo_points_to_the_profile_command():
    import argparse

    args = argparse.Namespace(model="light_resnet50", preset="tsp", precision="bf16")
    line = cli._profile_command(args, "/x/tuning logs/r50")
    assert line.endswith("lpx-tvm profile light_resnet50 --preset tsp --precision bf16 "
                         "--tuning-log '/x/tuning logs/r50' -o light_resnet50_profile")
    assert cli._profile_command(args, None).endswith("--precision bf16 -o light_resnet50_profile")

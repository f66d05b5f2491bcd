"""Where a dense layer's weights live and which planes install them.

``block_parts`` is checked against counts worked out by hand; the GEMV below is compiled
for ``tsp`` and its program is read back: how many tiles each plane multiplies, and which
SRAM slices feed which plane's installs (each install matched to the read that put its
rows on the stream: same stream register, same ``D = cycle - sign * position``). The
expected figures come from the ``tsp`` floorplan (MXM, MXM, SXM, 44 MEM, VXM, 44 MEM, SXM,
MXM, MXM), not from the compiler.
"""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm
from lpx_tvm import load_config
from lpx_tvm.machine.timing import timing
from lpx_tvm.tir_schedules.schedules import block_parts


# (blocks, k_split, reduction tiles, block rows, cycles per row, install cycles) -> parts;
# a split into s pays when tiles * max(rows * rate, install) * (1 - 1/s) exceeds
# (s - 1) * (5 * rows + 20).
@pytest.mark.parametrize("blocks, k_split, tiles, rows, rate, install, want", [
    (13, 1, 13, 1, 1, 20, [1] * 12 + [4]),  # the int8 GEMV: one block left over, 195 > 75
    (13, 1, 18, 49, 1, 20, [1] * 13),  # an int8 7x7 conv: 661.5 <= 795
    (13, 1, 18, 49, 4, 40, [1] * 12 + [4]),  # the same in bf16: 2646 > 795
    (14, 1, 3, 1, 1, 20, [1] * 12 + [2, 2]),  # two left over, each in 2: 30 > 25
    (14, 1, 2, 1, 1, 20, [1] * 14),  # 20 <= 25
    (15, 1, 16, 1, 1, 20, [1] * 12 + [4] * 3),  # three left over: 12 parts, 3 per plane
    (3, 1, 16, 1, 1, 20, [4] * 3),  # fewer blocks than planes (a split of 1 would idle a plane)
    (8, 1, 64, 1, 1, 20, [1] * 8),  # whole rounds: nothing to split
    (13, 2, 64, 1, 1, 20, [2] * 13),  # a K split other than 1 is kept as it is
])
def test_block_parts(blocks, k_split, tiles, rows, rate, install, want):
    assert block_parts(load_config("tsp"), blocks, k_split, tiles, rows, rate, install) == want


def _gemv_model(path, k, n, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return w


def _install_reads(cfg, instrs) -> list:
    """(plane, lane, slice) of each install: the slice of the read that put its rows on
    the stream (same stream register, same ``D = cycle - sign * position``)."""
    reads = {}
    for ins in instrs:
        if ins.op == "mem.read":
            t = timing(cfg, ins)
            reads[(ins.dst, t.emit - ins.dst.sign * t.position)] = ins.unit
    return [(ins.unit, ins.aux1, reads[(ins.src0, ins.cycle - ins.src0.sign * timing(cfg, ins).position)])
            for ins in instrs if ins.op == "mxm.install"]


def test_gemv_planes_and_slices(tmp_path):
    # fp16, 1 x 1280 x 1600: 4 reduction tiles of 320 rows, 5 column blocks of 320. Blocks
    # 0-3 take planes 0-3 (4 tiles each); block 4 is split into 4 parts of one tile, one
    # per plane (4 tiles of 40 install cycles: 120 saved against 3 * (5 + 20)): every plane
    # multiplies 5 tiles.
    k, n = 1280, 1600
    path = str(tmp_path / "gemv.onnx")
    w = _gemv_model(path, k, n)
    model = lpx_tvm.compile_model(path, preset="tsp", precision="fp16")
    x = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
    got = model.run({"x": x})["y"]
    want = x @ w
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()

    cfg = load_config("tsp")
    (region,) = model.executable.regions.values()
    instrs = region.program.instrs
    muls = [ins.unit for ins in instrs if ins.op in ("mxm.mul", "mxm.mac")]
    assert [muls.count(p) for p in range(4)] == [5, 5, 5, 5]

    feeds = {}  # slice -> planes it installs into
    lanes = {}  # (plane, lane) -> slices
    installs = _install_reads(cfg, instrs)
    # 20 tiles of 320 fp16 rows, each cut over the plane's 8 lanes (16 install streams, 2 bytes a row).
    assert len(installs) == 20 * 8
    for plane, lane, src in installs:
        feeds.setdefault(src, set()).add(plane)
        lanes.setdefault((plane, lane), set()).add(src)
        west_plane = plane < 2
        assert (src < 44) == west_plane, f"plane {plane} installs from slice {src} across the VXM"
    assert all(len(planes) == 1 for planes in feeds.values()), "a slice feeds two planes"
    assert len(lanes) == 4 * 8
    # A side keeps for the pools its 32 slices farthest from the VXM, one per int8 lane
    # of its 2 planes (west: slices 0-31 at positions 3-34; east: 56-87 at 60-91), and
    # leaves the 12 nearest to the working space; its 2 planes x 8 fp16 lanes get 2 each.
    assert all(len(s) == 2 for s in lanes.values())
    used = {s for ss in lanes.values() for s in ss}
    assert used == set(range(32)) | set(range(56, 88)) and len(used) == len(feeds)


def test_weights_beyond_the_pools(tmp_path):
    # lp30's floorplan with slices of 100 lines (32,000 bytes): 80 slices a side, the 32
    # farthest from the VXM the pools (west 0-31, east 128-159), the next 32 beyond them
    # (west 32-63, east 96-127), the 16 nearest the VXM left to the working space. An fp16
    # GEMV of 1 x 1280 x 1280: each plane installs one column block, 4 tiles, each cut
    # over its 8 lanes into chunks of 40 rows (80 lines), so a slice holds one chunk. A
    # side's 16 lanes get 2 pool slices each (lane k of the west: k, k + 16) and 2
    # beyond (32 + k, 48 + k): all 4 chunks on its own side, no slice shared by two
    # lanes. Dealt to the least-used slice once the pools were full, plane 0's lane 0
    # took slices 8 and 24, plane 1's lane 0's pool: two planes on one read port.
    spec = json.loads((Path(lpx_tvm.__file__).parent / "machine/presets/lp30.json").read_text())
    spec["mem"]["slice_bytes"] = 32000
    spec["name"] = "lp30_small_slices"
    preset = tmp_path / "lp30_small_slices.json"
    preset.write_text(json.dumps(spec))
    k, n = 1280, 1280
    path = str(tmp_path / "gemv.onnx")
    w = _gemv_model(path, k, n)
    model = lpx_tvm.compile_model(path, preset=str(preset), precision="fp16")
    x = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
    got, want = model.run({"x": x})["y"], x @ w
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    (region,) = model.executable.regions.values()
    lanes = {}
    for plane, lane, src in _install_reads(load_config(str(preset)), region.program.instrs):
        lanes.setdefault((plane, lane), set()).add(src)
    assert len(lanes) == 4 * 8
    for (plane, lane), slices in lanes.items():
        k_ = (plane % 2) * 8 + lane  # the lane's index among its side's 16
        pool, beyond = (0, 32) if plane < 2 else (128, 96)  # each tier's first slice
        assert slices == {pool + k_, pool + 16 + k_, beyond + k_, beyond + 16 + k_}, (plane, lane)

"""bench/e2e.py's int8 GEMV, small, on ``mini``: through the function the benchmark runs.

The output must match onnxruntime (the QDQ graph as written) within one output step, and
the run's floors must be lower bounds: no floor above the achieved cycles (a floor above
them is a bug in the floor or in the timing), and each floor at least what the GEMV's
own arithmetic forces, derived by hand from the machine config below.
"""

import argparse
import json
import os
import sys

import pytest
import tvm.testing

from lpx_tvm import load_config

pytest.importorskip("onnxruntime.quantization")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
from e2e import gemv, gemv_shape  # noqa: E402

# (1, K, N): one tile, several tiles in both dimensions, and K and N padded to whole tiles.
SHAPES = [(1, 16, 16), (1, 64, 48), (1, 100, 72)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemv_matches_onnxruntime_above_its_floors(tmp_path, shape):
    fig, got, want, step = gemv(shape, preset="mini", folder=str(tmp_path))
    m, k, n = shape
    assert got.shape == want.shape == (m, n)
    tvm.testing.assert_allclose(got, want, rtol=0, atol=step * 1.001)
    assert fig["offload_cpu"] == {}  # the whole GEMV ran on LPX
    assert fig["lpx_regions"] == 1

    floors = fig["floors"]
    assert fig["floor_cycles"] == max(floors.values()) > 0
    assert floors[fig["floor_kind"]] == fig["floor_cycles"]
    assert fig["cycles"] >= fig["floor_cycles"]
    # floor_cycles is printed to 0.1 cycle: a small floor carries that rounding into the ratio
    assert fig["over_floor"] == pytest.approx(fig["cycles"] / fig["floor_cycles"],
                                              rel=1e-2 + 0.05 / fig["floor_cycles"])

    # What the arithmetic itself forces on mini, whatever the tiling: every weight byte is
    # read from SRAM (lines of `lanes` bytes, one per read port a cycle), installed (a row
    # of at most `cols` weights takes one stream-cycle on one of `install_streams` streams
    # per plane) and multiplied (a buffer holds at most rows x cols weights; one vector
    # through it takes the int8 cycles per vector on one plane).
    cfg = load_config("mini")
    weights = k * n
    assert floors["sram_read"] >= weights / cfg.lanes / (cfg.mem_slices * cfg.mem_read_ports) - 0.05
    assert floors["install"] >= weights / cfg.mxm_cols / (cfg.mxm_planes * cfg.mxm_install_streams) - 0.05
    buffers = -(-weights // (cfg.mxm_rows * cfg.mxm_cols))
    assert floors["multiply"] >= buffers * cfg.mxm_cycles_per_vector["int8"] / cfg.mxm_planes - 0.05
    # The model's compute floor: its m k n useful MACs at the int8 peak of all planes.
    peak = cfg.mxm_planes * cfg.mxm_rows * cfg.mxm_cols / cfg.mxm_cycles_per_vector["int8"]
    assert fig["macs"] == m * k * n
    assert fig["compute_floor_cycles"] == pytest.approx(m * k * n / peak, abs=0.05)
    assert floors["multiply"] >= fig["compute_floor_cycles"] - 0.1
    json.dumps(fig)  # the benchmark's last line


def test_gemv_shape_option():
    assert gemv_shape("1x4096x4096") == (1, 4096, 4096)
    for bad in ("4096x4096", "1x0x8", "1x4096x4096x2", "ax2x3"):
        with pytest.raises(argparse.ArgumentTypeError):
            gemv_shape(bad)

"""The decode step's latency floor (lpx_tvm/llm/latency_floor.py), derived by hand; the
compiled steps of the LLM tests check that none beats it (test_generate.py,
test_llm_int8.py, test_llm_fp8.py)."""

import pytest

from lpx_tvm.llm.latency_floor import LayerMatrices, decode_latency_floor
from lpx_tvm.machine.config import load_config

# The profile model of BENCHMARKS.md: hidden 1,024, 16 heads over 4 kv heads of 64,
# SwiGLU of 2,816, 8 layers, a vocabulary of 8,192.
H, KV, UNITS, VOCAB = 1024, 4 * 64, 2816, 8192
LAYER = LayerMatrices(qkv=H * (H + 2 * KV), o=H * H, up=H * 2 * UNITS, down=UNITS * H)


def test_floor_of_the_profile_model_on_tsp_int8_by_hand():
    f = decode_latency_floor(load_config("tsp"), "llama", 8, LAYER, VOCAB * H, "int8")
    # tsp: MXM planes at positions 0, 1, 93, 94, the VXM at 47: 46 positions from the
    # nearest plane. A trip: the drain (2) and there and back (2 x 46).
    assert f.trip == 2 + 2 * 46 == 94
    # A plane's two buffers of 320 int8 rows, 16 rows a cycle: 40 cycles of all planes.
    assert f.buffer_credit == 2 * 320 / 16 == 40
    # Installs over 4 x 16 x 320 = 20,480 bytes a cycle: qkv 76.8, o 51.2, gate and up
    # 281.6, down 140.8, the LM head 409.6. An int8 product lands 1 + 8 - 1 = 8 cycles
    # after its input; an fp16 one (the scores, p V) 4 + 8 - 1 = 11; a tile's install
    # latency is 4.
    dense, attention, tail = 8, 11, 4 + 8
    # Attention: the first head's chain (RoPE's multiply-add 2, the exponent 6, the
    # conversion 2) beats the last qkv tile's way (76.8 - 40 + 12 + 96 + 8 = 152.8) and
    # all installs (128 - 40 + 12 = 100).
    trips = dense + (94 + 2) + attention + (94 + 6) + attention + (94 + 2) + dense
    assert trips == 330 and f.binds["attention"] == "trips"
    norm = 94 + 9 + 6 + 2  # the sum of squares, 1/sqrt and the scale
    assert f.attention == pytest.approx(trips + norm)
    # MLP: all installs past the buffers (422.4 - 40 + 12 = 394.4) beat the last up tile's
    # way (281.6 - 40 + 12 + (94 + 6 + 2) + 8 = 363.6).
    assert f.binds["mlp"] == "installs" and f.mlp == pytest.approx(422.4 - 40 + tail + norm)
    # The first norm: a row read (2), one position to the VXM, 17, 46 to a plane.
    assert f.start == 2 + 1 + 17 + 46
    # The head: its installs past the buffers, then the drain, 46 positions and the
    # argmax's reduction (9).
    assert f.head == pytest.approx(409.6 - 40 + tail + 2 + 46 + 9)
    assert f.cycles == pytest.approx(66 + 8 * (441 + 505.4) + 438.6) == pytest.approx(8075.8)
    # 1.68x the install floor (98.6 MB over 20,480 B a cycle = 4,812.8): a step 1.4x that
    # floor is below what the machine allows at batch 1.
    install = (8 * (LAYER.qkv + LAYER.o + LAYER.up + LAYER.down) + VOCAB * H) / 20480
    assert install == pytest.approx(4812.8) and f.cycles > 1.4 * install


def test_floor_grows_with_the_floorplan_and_falls_to_direct_hops_in_fp32():
    tsp, lp30 = load_config("tsp"), load_config("lp30")
    # lp30 keeps the VXM 82 positions from the nearest plane.
    assert decode_latency_floor(lp30, "llama", 8, LAYER, VOCAB * H, "fp8").trip == 2 + 2 * 82
    eight = decode_latency_floor(tsp, "llama", 8, LAYER, VOCAB * H, "int8")
    fp32 = decode_latency_floor(tsp, "llama", 8, LAYER, VOCAB * H, "fp32")
    # fp32 installs 4 bytes a value (4x the work; a plane's two buffers hold 160 cycles
    # of it) and multiplies at 16 cycles a vector: the installs bind both segments.
    assert fp32.buffer_credit == 2 * 320 * 4 / 16
    assert fp32.binds == {"attention": "installs", "mlp": "installs"}
    # Its attention: qkv's and o's installs 4 x 128 - 160, the tail (4 + 16 + 7), the norm.
    assert fp32.attention == pytest.approx(4 * 128 - 160 + 27 + 111)
    # A small layer's chain of trips binds: there p V feeds o with no conversion, the
    # drain alone (2) where 8-bit o takes a trip to the VXM (94 + 2). An fp32 product
    # lands 16 + 8 - 1 = 23 cycles after its input.
    small = LayerMatrices(qkv=320 * 320, o=320 * 320, up=320 * 640, down=320 * 320)
    tiny = decode_latency_floor(tsp, "llama", 1, small, 320 * 320, "fp32")
    assert tiny.binds["attention"] == "trips"
    assert tiny.attention == 23 + (94 + 2) + 23 + (94 + 6) + 23 + 2 + 23 + 111
    # A batch of 4 multiplies four rows a product.
    four = decode_latency_floor(tsp, "llama", 8, LAYER, VOCAB * H, "int8", batch=4)
    assert four.cycles > eight.cycles

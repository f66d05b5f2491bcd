"""floors_of on tiny instruction lists, each number worked out by hand from the presets:

tsp: 4 planes, 16 install streams, 88 slices with one read and one write port each,
32 + 32 streams, 16 VXM ALUs, 2 SXMs, 320 lanes, 32e9 B/s off-chip at 0.9 GHz.
mini: 2 planes, 4 install streams, 8 slices, 32 + 32 streams, 8 ALUs, 2 SXMs, 16 lanes.
"""

import pytest

from lpx_tvm.machine.config import load_config
from lpx_tvm.machine.isa import DType, Instr, Stream
from lpx_tvm.runtime.floors import Floors, add, floors_of

E0, E1, W0 = Stream("E", 0), Stream("E", 1), Stream("W", 0)


@pytest.fixture(scope="module")
def tsp():
    return load_config("tsp")


@pytest.fixture(scope="module")
def mini():
    return load_config("mini")


def install(rows, dtype, cycle=0, plane=0, buf=0):
    return Instr("mxm.install", cycle, plane, rows, dtype=dtype, buf=buf, aux0=rows, src0=E0)


def mul(count, dtype, cycle=10, plane=0, buf=0, op="mxm.mul"):
    return Instr(op, cycle, plane, count, dtype=dtype, buf=buf, src0=E1)


def test_one_int8_install_on_tsp(tsp):
    # 320 rows of one byte over 4 planes x 16 streams
    assert floors_of(tsp, [install(320, DType.INT8)]) == Floors(install=320 / (4 * 16))
    assert floors_of(tsp, [install(320, DType.INT8)]).install == 5.0


def test_an_fp16_row_is_two_stream_cycles(tsp, mini):
    assert floors_of(tsp, [install(320, DType.FP16)]).install == 10.0
    # mini: 2 planes x 4 streams; 16 bf16 rows are 32 stream-cycles
    assert floors_of(mini, [install(16, DType.BF16)]).install == 4.0


def test_multiply_floor_at_the_slower_operands_rate(tsp):
    assert floors_of(tsp, [mul(100, DType.INT8)]).multiply == 100 / 4
    assert floors_of(tsp, [mul(100, DType.FP16, op="mxm.mac")]).multiply == 100 * 4 / 4
    # int8 activations against bf16 weights in that buffer: the bf16 rate (4 cycles a vector)
    f = floors_of(tsp, [install(320, DType.BF16, buf=1), mul(100, DType.INT8, buf=1)])
    assert f.multiply == 100.0
    # ...but the other buffer holds nothing known: the activation's own rate
    assert floors_of(tsp, [install(320, DType.BF16, buf=1), mul(100, DType.INT8, buf=0)]).multiply == 25.0


def test_sram_and_stream_floors_count_bytes(mini):
    instrs = [
        Instr("mem.read", 0, 0, 64, dtype=DType.INT8, dst=E0),  # 64 lines, 64 stream-cycles
        Instr("mem.read", 0, 1, 32, dtype=DType.FP16, dst=W0),  # 64 lines, 64 stream-cycles
        Instr("mem.write", 5, 2, 10, dtype=DType.FP32, src0=E0),  # 40 lines, emits nothing
    ]
    f = floors_of(mini, instrs)
    assert f.sram_read == 128 / 8
    assert f.sram_write == 40 / 8
    assert f.stream == 128 / 64
    assert f.multiply == f.install == f.vxm == f.sxm == f.dma == 0


def test_vxm_sxm_and_their_emitted_bytes(mini):
    instrs = [
        Instr("vxm.add", 0, 0, 40, dtype=DType.FP16, src0=E0, src1=E1, dst=W0),  # busy 40, emits 80
        Instr("vxm.cvt", 0, 1, 16, dtype=DType.INT32, out_dtype=DType.INT8, src0=E0, dst=E1),  # busy 16, emits 16
        Instr("sxm.transpose", 0, 0, 16, dtype=DType.INT8, aux0=16, src0=E0, dst=E1),  # busy 16+16, emits 16
    ]
    f = floors_of(mini, instrs)
    assert f.vxm == (40 + 16) / 8
    assert f.sxm == 32 / 2
    assert f.stream == (80 + 16 + 16) / 64


def test_dma_floor_is_bytes_over_the_offchip_rate(mini, tsp):
    load = Instr("dma.load", 0, 0, 9, dtype=DType.INT8, slice=0)
    assert floors_of(mini, [load]).dma == pytest.approx(9 * 16 * 0.9e9 / 32e9)
    assert floors_of(tsp, [load]).dma == pytest.approx(9 * 320 * 0.9e9 / 32e9)


def test_nops_do_no_work(tsp):
    assert floors_of(tsp, [Instr("mxm.nop", 0, 0, 50), Instr("vxm.nop", 0, 0, 50)]) == Floors()


def test_largest_add_and_json(tsp):
    a = floors_of(tsp, [install(320, DType.INT8), mul(8, DType.INT8)])  # install 5, multiply 2
    assert a.largest() == ("install", 5.0)
    b = floors_of(tsp, [mul(100, DType.INT8)])  # multiply 25
    total = add(a, b)
    assert total.largest() == ("multiply", 27.0)
    assert total.install == 5.0
    assert add() == Floors()
    assert set(total.to_json()) == {"multiply", "install", "sram_read", "sram_write", "stream", "vxm", "sxm", "dma"}
    assert Floors().largest() == ("multiply", 0.0)

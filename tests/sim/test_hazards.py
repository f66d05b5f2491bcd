"""Every schedule hazard the simulator detects, and program-level errors.

Each hazard test builds a small mini-preset program that breaks exactly one rule and
checks the hazard's kind and that it names the offending instruction, unit and cycle.
mini positions: MXM0=0, SXM0=1, MEM0..3=2..5, VXM=6, MEM4..7=7..10, SXM1=11, MXM1=12.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lpx_tvm.errors import ProgramError, ScheduleHazard
from lpx_tvm.sim import Simulator
from lpx_tvm.machine.isa import DType, Instr, Stream
from lpx_tvm.machine.program import Binding, SramImage, TensorLayout

from lpx_hand import E, Hand, W


def expect(h, kind, index, unit, cycle, inputs=None, *, both=True):
    """Run (functional, and timing-only when ``both``) and check the hazard in each."""
    modes = [False, True] if both else [False]
    errors = []
    for timing_only in modes:
        with pytest.raises(ScheduleHazard) as e:
            h.run(inputs, timing_only=timing_only)
        err = e.value
        assert err.kind == kind, str(err)
        assert (err.index, err.unit, err.cycle) == (index, unit, cycle), str(err)
        text = str(err)
        assert text.startswith(f"{kind}: ")
        assert f"instruction #{index}" in text and f"unit {unit}" in text and f"cycle {cycle}" in text, text
        assert str(h.instrs[index]) in text  # the instruction's assembly text
        errors.append(err)
    return errors[0]


def copy_pair(h, n=4, dtype="int8", t_write=3, write_slice=1, stream=E(0), count=None):
    """read slice 0 (pos 2) at 0 -> write into ``write_slice``; emits at 2."""
    w = DType.parse(dtype).itemsize
    h.add("mem.read", 0, unit=0, count=n, addr=0, stride=w, dtype=dtype, dst=stream)
    return h.add("mem.write", t_write, unit=write_slice, count=count or n, addr=0, stride=w, dtype=dtype,
                 src0=stream)


# =============================================================================
# streams
# =============================================================================

def test_stream_empty_nothing_emitted():
    h = Hand()
    h.add("mem.write", 5, unit=4, count=2, addr=0, stride=1, dtype="int8", src0=E(0))
    err = expect(h, "stream-empty", 0, "mem4", 5)
    assert "position 7" in str(err)


def test_stream_empty_wrong_direction():
    h = Hand()
    # the value is on W0, the write listens on E0 at the right cycle
    h.add("mem.read", 0, unit=0, count=2, addr=0, stride=1, dtype="int8", dst=W(0))
    h.add("mem.write", 3, unit=1, count=2, addr=0, stride=1, dtype="int8", src0=E(0))
    expect(h, "stream-empty", 1, "mem1", 3)


def test_stream_empty_one_cycle_early():
    h = Hand()
    copy_pair(h, t_write=2)  # vector 0 reaches pos 3 at 3
    expect(h, "stream-empty", 1, "mem1", 2)


def test_consumer_upstream_of_producer():
    h = Hand()
    # exp at the VXM (pos 6) issued at 6 emits at 12 on E1. A write at slice 1 (pos 3), west of
    # it, at 12 - 3 = 9 would be on the value's trajectory if eastward values went backwards.
    h.add("mem.read", 0, unit=0, count=2, addr=0, stride=2, dtype="fp16", dst=E(0))
    h.add("vxm.exp", 6, unit=0, count=2, dtype="fp16", src0=E(0), dst=E(1))
    h.add("mem.write", 9, unit=1, count=2, addr=0, stride=2, dtype="fp16", src0=E(1))
    err = expect(h, "stream-empty", 2, "mem1", 9)
    assert "upstream" in str(err) and "instruction #1" in str(err)


def test_stream_misaligned_reads_past_the_end():
    h = Hand()
    copy_pair(h, n=4, count=5)
    err = expect(h, "stream-misaligned", 1, "mem1", 3)
    assert "runs 1 past the end" in str(err)


def test_stream_misaligned_one_cycle_late():
    h = Hand()
    copy_pair(h, n=4, t_write=4)
    expect(h, "stream-misaligned", 1, "mem1", 4)


def test_back_to_back_values_cannot_be_read_as_one():
    h = Hand()
    # slice 0 (pos 2) emits 2 vectors on E0 from 2 (D = 0, 1); slice 1 (pos 3) emits 2 more
    # right behind them from 5 (D = 2, 3). A write at pos 4 taking 4 vectors from 4 spans both.
    h.add("mem.read", 0, unit=0, count=2, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.read", 3, unit=1, count=2, addr=0, stride=1, dtype="int8", dst=E(0))
    i = h.add("mem.write", 4, unit=2, count=4, addr=0, stride=1, dtype="int8", src0=E(0))
    err = expect(h, "stream-misaligned", i, "mem2", 4)
    assert "instruction #0" in str(err)
    # each value on its own is fine
    h.instrs[i] = replace(h.instrs[i], count=2)
    h.add("mem.write", 6, unit=3, count=2, addr=0, stride=1, dtype="int8", src0=E(0))  # slice 3 is pos 5
    with pytest.raises(ScheduleHazard) as e:
        h.run(timing_only=True)  # D = 6 - 5 = 1: starts inside the first value and runs past it
    assert e.value.kind == "stream-misaligned" and e.value.index == i + 1
    h.instrs[-1] = h.instrs[-1].moved(1)  # D = 2: exactly the second value
    h.run(timing_only=True)


def test_stream_conflict_two_producers_on_one_segment():
    h = Hand()
    # slice 0 (pos 2) emits 4 vectors on E0 from 2; at pos 3 they pass at 3..6.
    # slice 1 (pos 3) read at 2 would emit on E0 at pos 3 from 4: the same segment.
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.read", 2, unit=1, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    err = expect(h, "stream-conflict", 1, "mem1", 2)
    assert "instruction #0" in str(err)


def test_no_conflict_once_the_value_has_passed():
    h = Hand()
    # the first value passes pos 3 at 3..6; slice 1 emitting from 7 follows it on the same stream
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.read", 5, unit=1, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.read", 0, unit=2, count=4, addr=0, stride=1, dtype="int8", dst=W(0))  # W0 is another stream
    h.run(timing_only=True)
    h.instrs[1] = h.instrs[1].moved(-1)  # one cycle earlier: its first vector meets the last one
    expect(h, "stream-conflict", 1, "mem1", 4)


# ---- streams carry bytes: a w-byte value on an aligned group of w registers -----------

@pytest.mark.parametrize("dtype, reg, ok", [
    ("int8", 3, True), ("fp16", 2, True), ("fp16", 3, False), ("bf16", 5, False),
    ("fp32", 12, True), ("fp32", 14, False), ("int32", 2, False)])
def test_a_value_takes_an_aligned_group_of_byte_planes(dtype, reg, ok):
    """mini: slice 0 (pos 2) reads 2 vectors onto E<reg>; the write at slice 7 (pos 10)
    takes them at 2 + 8 = 10. A w-byte value needs registers reg .. reg + w - 1, reg a
    multiple of w; a misaligned group is refused at the read that emits it."""
    h = Hand()
    w = DType.parse(dtype).itemsize
    h.input("X", 2, dtype, 0)
    h.output("Y", 2, dtype, 7)
    h.add("mem.read", 0, unit=0, count=2, addr=0, stride=w, dtype=dtype, dst=Stream("E", reg))
    h.add("mem.write", 10, unit=7, count=2, addr=0, stride=w, dtype=dtype, src0=Stream("E", reg))
    if ok:
        h.run(timing_only=True)
    else:
        err = expect(h, "stream-group", 0, "mem0", 0, {"X": np.zeros((2, h.lanes), DType.parse(dtype).np)})
        first = reg - reg % w
        assert f"E{first}..E{first + w - 1}" in str(err) and f"multiple of {w}" in str(err)


@pytest.mark.parametrize("reg, conflict", [(0, True), (1, True), (2, False), (3, False)])
def test_an_fp16_value_holds_both_its_registers(reg, conflict):
    """slice 0 (pos 2) puts 4 fp16 vectors on E0 and E1 (its byte-planes) from cycle 2:
    D in [0, 4). An int8 read on slice 1 (pos 3) at cycle 1 emits from 3: D in [0, 4) too,
    so it meets the fp16 value on E0 and on E1 (byte-plane 1), and on neither E2 nor E3."""
    h = Hand()
    h.input("X", 4, "fp16", 0)
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=2, dtype="fp16", dst=Stream("E", 0))
    h.add("mem.read", 1, unit=1, count=4, addr=0, stride=1, dtype="int8", dst=Stream("E", reg))
    if conflict:
        err = expect(h, "stream-conflict", 1, "mem1", 1, {"X": np.zeros((4, h.lanes), np.float16)})
        assert "instruction #0" in str(err)
        assert f"byte-plane {reg} of a 2-byte fp16 value" in str(err)
    else:
        h.run(timing_only=True)


def test_a_byte_plane_is_not_a_value_of_its_own():
    """An fp32 value on E4..E7; reading E4 as int8 (the value's low bytes) is refused, and
    so is naming E6 for the value (its group starts at E4)."""
    h = Hand()
    h.input("X", 3, "fp32", 0)
    h.add("mem.read", 0, unit=0, count=3, addr=0, stride=4, dtype="fp32", dst=Stream("E", 4))
    h.add("mem.write", 10, unit=7, count=3, addr=0, stride=1, dtype="int8", src0=Stream("E", 4))
    x = {"X": np.zeros((3, h.lanes), np.float32)}
    expect(h, "dtype-mismatch", 1, "mem7", 10, x)
    h.instrs[1] = Instr("mem.write", 10, unit=7, count=3, addr=0, stride=4, dtype=DType.FP32, src0=Stream("E", 6))
    expect(h, "stream-group", 1, "mem7", 10, x)


def test_stream_conflict_westward():
    h = Hand()
    # slice 7 (pos 10) on W2 from 2; slice 6 (pos 9) emitting at 3 is where vector 0 is then.
    h.add("mem.read", 0, unit=7, count=2, addr=0, stride=1, dtype="int8", dst=W(2))
    h.add("mem.read", 1, unit=6, count=2, addr=0, stride=1, dtype="int8", dst=W(2))
    expect(h, "stream-conflict", 1, "mem6", 1)


# =============================================================================
# units
# =============================================================================

def test_two_reads_of_one_slice_overlap():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.read", 3, unit=0, count=1, addr=100, stride=1, dtype="int8", dst=E(1))
    err = expect(h, "unit-overlap", 1, "mem0", 3)
    assert "mem0.rd" in str(err) and "until cycle 4" in str(err) and "instruction #0" in str(err)


def test_two_reads_of_one_slice_in_one_cycle():
    h = Hand()
    h.add("mem.read", 7, unit=3, count=1, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.read", 4, unit=0, count=4, addr=0, stride=4, dtype="int32", dst=E(1))
    # a gather on slice 3 (pos 5) reading its index stream in the same cycle as the read
    h.add("mem.gather", 7, unit=3, count=4, addr=0, stride=1, dtype="int8", src0=E(1), dst=E(2))
    expect(h, "unit-overlap", 2, "mem3", 7)


def test_read_and_write_ports_are_separate():
    h = Hand()
    h.add("mem.read", 0, unit=2, count=8, addr=0, stride=1, dtype="int8", dst=E(0))  # port busy 0..7
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(1))
    h.add("mem.write", 4, unit=2, count=4, addr=50, stride=1, dtype="int8", src0=E(1))  # pos 2 -> 4: 2 + 2
    r = h.run(timing_only=True)
    assert r.counters.port_busy_cycles["mem2.rd"] == 8 and r.counters.port_busy_cycles["mem2.wr"] == 4


def test_two_writes_of_one_slice_overlap():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.write", 3, unit=1, count=4, addr=0, stride=1, dtype="int8", src0=E(0))
    # the first write holds slice 1's write port over 3..6; slice 2 (pos 4) read at 3 emits at 5,
    # one hop west: a write at 6
    h.add("mem.read", 3, unit=2, count=1, addr=0, stride=1, dtype="int8", dst=W(0))
    h.add("mem.write", 6, unit=1, count=1, addr=50, stride=1, dtype="int8", src0=W(0))
    expect(h, "unit-overlap", 3, "mem1", 6)


def test_two_instructions_on_one_vxm_alu():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=4, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("vxm.add", 6, unit=2, count=4, dtype="int8", src0=E(0), imm=1, dst=E(1))
    h.add("vxm.sub", 9, unit=2, count=1, dtype="int8", src0=E(0), imm=1, dst=E(2))
    expect(h, "unit-overlap", 2, "vxm2", 9)
    h.instrs[2] = replace(h.instrs[2], unit=3)  # another ALU: fine
    h.run(timing_only=True)


def test_nop_holds_the_queue():
    h = Hand()
    h.add("sxm.nop", 0, unit=0, count=5)
    h.add("mem.read", 0, unit=0, count=1, addr=0, stride=1, dtype="int8", dst=W(0))
    h.add("sxm.shift", 3, unit=0, count=1, dtype="int8", aux0=1, src0=W(0), dst=E(0))
    expect(h, "unit-overlap", 2, "sxm0", 3)


def test_mxm_compute_port_overlap():
    h = Hand()
    # install 16 int8 rows at 5 (slice 1, pos 3 -> plane 0): ready at 25
    h.add("mem.read", 0, unit=1, count=16, addr=0, stride=1, dtype="int8", dst=W(0))
    h.add("mxm.install", 5, unit=0, buf=0, count=16, dtype="int8", aux0=16, src0=W(0))
    # fp16 would be 4 cycles per vector, int8 is 1: 4 vectors busy the compute port 25..28
    h.add("mem.read", 21, unit=0, count=8, addr=0, stride=1, dtype="int8", dst=W(1))
    h.add("mxm.mul", 25, unit=0, buf=0, addr=0, count=4, dtype="int8", src0=W(1))
    h.add("mxm.mul", 28, unit=0, buf=0, addr=4, count=4, dtype="int8", src0=W(1))
    expect(h, "unit-overlap", 4, "mxm0", 28)


def test_dma_engine_busy():
    h = Hand()
    h.host_bytes = 64
    h.add("dma.load", 0, unit=0, slice=0, addr=0, stride=1, count=1, dtype="int8")  # 900 + 1 cycles
    h.add("dma.load", 900, unit=0, slice=1, addr=0, stride=1, count=1, dtype="int8")
    expect(h, "unit-overlap", 1, "dma0", 900)


# =============================================================================
# addresses
# =============================================================================

def test_sram_read_past_the_end_of_a_slice():
    h = Hand()
    # fp16 vectors are 2 lines; a slice has 65536 / 16 = 4096 lines: 4095 + 1 is outside
    h.add("mem.read", 0, unit=5, count=1, addr=4095, stride=2, dtype="fp16", dst=E(0))
    err = expect(h, "address-out-of-range", 0, "mem5", 0)
    assert "4095..4096" in str(err)
    h.instrs[0] = replace(h.instrs[0], addr=4094)
    h.run(timing_only=True)


def test_sram_negative_stride_below_zero():
    h = Hand()
    h.add("mem.read", 0, unit=2, count=3, addr=2, stride=-2, dtype="fp16", dst=E(0))  # lines 2, 0, -2
    expect(h, "address-out-of-range", 0, "mem2", 0)


def test_sram_write_out_of_range():
    h = Hand()
    copy_pair(h, n=2, dtype="int32")
    h.instrs[1] = replace(h.instrs[1], addr=4093)
    err = expect(h, "address-out-of-range", 1, "mem1", 3)
    assert "4093..4100" in str(err)


def test_gather_out_of_range():
    h = Hand()
    h.input("I", 2, "int32", 0)
    h.add("mem.read", 0, unit=0, count=2, addr=0, stride=4, dtype="int32", dst=E(0))
    h.add("mem.gather", 3, unit=1, count=2, addr=0, stride=4, dtype="fp32", src0=E(0), dst=E(1))
    idx = np.zeros((2, 16), np.int32)
    idx[1, 0] = 1024  # line 4096
    expect(h, "address-out-of-range", 1, "mem1", 3, {"I": idx}, both=False)  # data-dependent


def test_scatter_out_of_range():
    h = Hand()
    h.input("I", 2, "int32", 0)
    h.input("V", 2, "fp32", 2)
    h.add("mem.read", 0, unit=0, count=2, addr=0, stride=4, dtype="int32", dst=E(0))
    h.add("mem.read", 0, unit=2, count=2, addr=0, stride=4, dtype="fp32", dst=W(0))
    h.add("mem.scatter", 3, unit=1, count=2, addr=0, stride=4, dtype="fp32", src0=W(0), src1=E(0))
    idx = np.zeros((2, 16), np.int32)
    idx[1, 0] = 1024  # line 4096
    err = expect(h, "address-out-of-range", 2, "mem1", 3, {"I": idx, "V": np.ones((2, 16), np.float32)},
                 both=False)  # data-dependent
    assert "scattered lines 0..4099" in str(err)


def test_accumulator_rows_out_of_range():
    h = Hand()
    h.add("mem.read", 0, unit=1, count=16, addr=0, stride=1, dtype="int8", dst=W(0))
    h.add("mxm.install", 5, unit=0, buf=0, count=16, dtype="int8", aux0=16, src0=W(0))
    h.add("mem.read", 21, unit=0, count=8, addr=0, stride=1, dtype="int8", dst=W(1))
    h.add("mxm.mul", 25, unit=0, buf=0, addr=250, count=8, dtype="int8", src0=W(1))  # 250..257 of 256
    err = expect(h, "address-out-of-range", 3, "mxm0", 25)
    assert "250..257" in str(err)


def test_drain_rows_out_of_range():
    h = Hand()
    h.add("mxm.drain", 0, unit=1, addr=255, count=2, dtype="int32", dst=W(0))
    expect(h, "address-out-of-range", 0, "mxm1", 0)


def test_offchip_out_of_range():
    h = Hand()
    h.host_bytes = 100
    h.add("dma.load", 0, unit=0, slice=0, addr=0, stride=1, count=1, dtype="int8", aux0=84)  # 84..99: fits
    h.add("dma.store", 901, unit=0, slice=0, addr=0, stride=1, count=1, dtype="int8", aux0=85)  # 85..100
    err = expect(h, "address-out-of-range", 1, "dma0", 901)
    assert "85..100" in str(err)


def test_dma_sram_side_out_of_range():
    h = Hand()
    h.host_bytes = 1000
    h.add("dma.load", 0, unit=0, slice=3, addr=4090, stride=4, count=2, dtype="fp32")  # 4090..4097
    expect(h, "address-out-of-range", 0, "dma0", 0)


# =============================================================================
# dtypes
# =============================================================================

def test_stream_dtype_differs_from_instruction():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=2, addr=0, stride=2, dtype="fp16", dst=E(0))
    h.add("vxm.add", 6, unit=0, count=2, dtype="fp32", src0=E(0), imm=1.0, dst=E(1))
    err = expect(h, "dtype-mismatch", 1, "vxm0", 6)
    assert "expects fp32 but carries fp16" in str(err)


def test_write_dtype_differs_from_stream():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=2, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("mem.write", 3, unit=1, count=2, addr=0, stride=1, dtype="uint8", src0=E(0))
    expect(h, "dtype-mismatch", 1, "mem1", 3)


def install_and_mul(h, w_dt, act_dt, *, buf=0, t_mul=None, n=4, acc=0, op="mxm.mul", plane_read_slice=0):
    """Install 16 rows of ``w_dt`` on plane 0 (ready at 25), then a multiply of ``act_dt``."""
    ws, xs = DType.parse(w_dt).itemsize, DType.parse(act_dt).itemsize
    h.add("mem.read", 0, unit=1, count=16, addr=0, stride=ws, dtype=w_dt, dst=W(0))
    h.add("mxm.install", 5, unit=0, buf=buf, count=16, dtype=w_dt, aux0=16, src0=W(0))
    t = 25 if t_mul is None else t_mul
    h.add("mem.read", t - 4, unit=plane_read_slice, count=n, addr=0, stride=xs, dtype=act_dt, dst=W(1))
    return h.add(op, t, unit=0, buf=buf, addr=acc, count=n, dtype=act_dt, src0=W(1))


@pytest.mark.parametrize("w_dt, act_dt", [("int8", "fp16"), ("bf16", "fp16"), ("fp16", "int8"), ("fp32", "bf16")])
def test_activations_do_not_match_weights(w_dt, act_dt):
    h = Hand()
    i = install_and_mul(h, w_dt, act_dt)
    err = expect(h, "dtype-mismatch", i, "mxm0", 25)
    assert f"{act_dt} activations cannot multiply {w_dt} weights" in str(err)


def test_uint8_activations_on_int8_weights_are_fine():
    h = Hand()
    install_and_mul(h, "int8", "uint8")
    h.run(timing_only=True)


def test_mac_onto_the_other_accumulator_type():
    h = Hand()
    install_and_mul(h, "int8", "int8", n=4)  # int32 rows 0..3, landing 33..36
    # fp16 weights into buffer 1: install port free at 21; slice 2 (pos 4) read at 15
    h.add("mem.read", 15, unit=2, count=16, addr=0, stride=2, dtype="fp16", dst=W(2))
    h.add("mxm.install", 21, unit=0, buf=1, count=16, dtype="fp16", aux0=16, src0=W(2))
    h.add("mem.read", 41 - 2 - 5, unit=3, count=4, addr=0, stride=2, dtype="fp16", dst=W(3))  # slice 3, pos 5
    i = h.add("mxm.mac", 41, unit=0, buf=1, addr=0, count=4, dtype="fp16", src0=W(3))
    err = expect(h, "dtype-mismatch", i, "mxm0", 41)
    assert "other accumulator type" in str(err)


def test_drain_as_the_other_accumulator_type():
    h = Hand()
    install_and_mul(h, "fp16", "fp16", n=2)  # rows land at 25 + 4(k+1) + 7: 36, 40
    i = h.add("mxm.drain", 40, unit=0, addr=0, count=2, dtype="int32", dst=E(0))
    expect(h, "dtype-mismatch", i, "mxm0", 40)


def test_c2c_receive_other_dtype():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=1, addr=0, stride=1, dtype="int8", dst=E(0))
    h.add("c2c.send", 6, unit=0, count=1, dtype="int8", src0=E(0))  # 2 cycles + 450: arrives 458
    i = h.add("c2c.recv", 458, unit=0, count=1, dtype="uint8", dst=E(1))
    expect(h, "dtype-mismatch", i, "c2c0", 458)


# =============================================================================
# SRAM races
# =============================================================================

def test_sram_read_one_cycle_before_the_write_lands():
    h = Hand()
    copy_pair(h, n=4)  # line k of slice 1 lands at 3 + k + 2 = 5 + k
    i = h.add("mem.read", 4, unit=1, count=1, addr=2, stride=1, dtype="int8", dst=E(1))  # line 2 lands at 7
    err = expect(h, "sram-read-before-write", i, "mem1", 4)
    assert "line 2 is read at cycle 4" in str(err) and "lands at cycle 7" in str(err)
    h.instrs[i] = h.instrs[i].moved(3)  # at 7 it sees the new data
    h.run(timing_only=True)


def test_sram_write_after_read_race():
    h = Hand()
    # slice 1 line 0 is read 8 times (stride 0) at 10..17.
    h.add("mem.read", 10, unit=1, count=8, addr=0, stride=0, dtype="int8", dst=E(0))
    # a write issued later (11) lands line 0 at 11 + 2 = 13, before the reads at 13..17.
    h.add("mem.read", 0, unit=2, count=1, addr=0, stride=1, dtype="int8", dst=W(1))  # pos 4 -> pos 3: write at 3
    h.add("mem.read", 8, unit=2, count=1, addr=0, stride=1, dtype="int8", dst=W(2))
    h.add("mem.write", 3, unit=1, count=1, addr=0, stride=1, dtype="int8", src0=W(1))  # lands at 5: fine
    i = h.add("mem.write", 11, unit=1, count=1, addr=0, stride=1, dtype="int8", src0=W(2))
    err = expect(h, "sram-write-race", i, "mem1", 11)
    assert "read at cycle 17 by instruction #0" in str(err)


def test_sram_write_landing_in_the_cycle_of_an_earlier_issued_read():
    h = Hand()
    h.add("mem.read", 10, unit=1, count=4, addr=0, stride=0, dtype="int8", dst=E(0))  # line 0 at 10..13
    h.add("mem.read", 9, unit=2, count=1, addr=0, stride=1, dtype="int8", dst=W(1))  # at pos 3 at 12
    i = h.add("mem.write", 12, unit=1, count=1, addr=0, stride=1, dtype="int8", src0=W(1))  # lands at 14
    h.run(timing_only=True)  # after the last read at 13: fine
    h.instrs[0] = replace(h.instrs[0], count=5)  # the last read is now at 14, when the write lands
    err = expect(h, "sram-write-race", i, "mem1", 12)
    assert "written at cycle 14, not after it was read at cycle 14" in str(err)


def test_two_writes_landing_in_one_cycle():
    h = Hand()
    h.host_bytes = 16
    # 16 B: 900 + 1 cycles; its line lands at 901
    h.add("dma.load", 0, unit=0, slice=1, addr=0, stride=1, count=1, dtype="int8")
    h.add("mem.read", 896, unit=0, count=1, addr=0, stride=1, dtype="int8", dst=E(0))  # at pos 3 at 899
    i = h.add("mem.write", 899, unit=1, count=1, addr=0, stride=1, dtype="int8", src0=E(0))  # lands at 901
    err = expect(h, "sram-write-race", i, "mem1", 899)
    assert "written at cycle 901, not after it was written at cycle 901" in str(err)
    h.instrs[1], h.instrs[2] = h.instrs[1].moved(1), h.instrs[2].moved(1)  # lands at 902: fine
    h.run(timing_only=True)


def test_dma_store_does_not_hide_a_later_read():
    """A dma.store reading a line early must not hide a longer mem.read's later access of it."""
    h = Hand()
    h.host_bytes = 64
    h.add("mem.read", 10, unit=1, count=8, addr=0, stride=0, dtype="int8", dst=E(0))  # line 0 at 10..17
    h.add("dma.store", 11, unit=0, slice=1, addr=0, stride=1, count=1, dtype="int8")  # line 0 at 11
    h.add("mem.read", 9, unit=2, count=1, addr=0, stride=1, dtype="int8", dst=W(2))  # pos 4 -> 3 at 12
    i = h.add("mem.write", 12, unit=1, count=1, addr=0, stride=1, dtype="int8", src0=W(2))  # lands at 14
    err = expect(h, "sram-write-race", i, "mem1", 12)
    assert "read at cycle 17" in str(err)


def test_sram_write_after_write_out_of_order():
    h = Hand()
    h.host_bytes = 16
    h.add("dma.load", 0, unit=0, slice=1, addr=0, stride=1, count=1, dtype="int8")  # lands at 901
    i = copy_pair(h, n=1, t_write=3)  # lands at 5, issued after the DMA
    err = expect(h, "sram-write-race", i, "mem1", 3)
    assert "written at cycle 901 by instruction #0" in str(err)


# =============================================================================
# accumulators and weights
# =============================================================================

def test_drain_before_the_rows_land():
    h = Hand()
    install_and_mul(h, "int8", "int8", n=4)  # row k lands at 33 + k
    i = h.add("mxm.drain", 32, unit=0, addr=0, count=4, dtype="int32", dst=E(0))
    err = expect(h, "acc-read-before-write", i, "mxm0", 32)
    assert "row 0" in str(err) and "at cycle 33" in str(err)


def test_drain_of_rows_never_written():
    h = Hand()
    i = h.add("mxm.drain", 0, unit=0, addr=10, count=2, dtype="fp32", dst=E(0))
    expect(h, "acc-read-before-write", i, "mxm0", 0)


def test_mac_onto_rows_never_written():
    h = Hand()
    i = install_and_mul(h, "int8", "int8", op="mxm.mac")
    expect(h, "acc-read-before-write", i, "mxm0", 25)


def test_accumulator_write_race():
    h = Hand()
    install_and_mul(h, "int8", "int8", n=16)  # rows 0..15 land at 33..48
    # drain all 16 from 48: reads row k at 48 + k
    h.add("mxm.drain", 48, unit=0, addr=0, count=16, dtype="int32", dst=E(0))
    # a mul issued at 49 onto rows 10..11 lands row 10 at 49 + 8 = 57 <= its drain read at 58
    h.add("mem.read", 45, unit=0, count=2, addr=0, stride=1, dtype="int8", dst=W(2))
    i = h.add("mxm.mul", 49, unit=0, buf=0, addr=10, count=2, dtype="int8", src0=W(2))
    err = expect(h, "acc-write-race", i, "mxm0", 49)
    assert "row 10" in str(err) and "read at cycle 58" in str(err)


def test_weights_never_installed():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=1, addr=0, stride=1, dtype="int8", dst=W(0))
    i = h.add("mxm.mul", 4, unit=0, buf=1, addr=0, count=1, dtype="int8", src0=W(0))
    err = expect(h, "weights-missing", i, "mxm0", 4)
    assert "never installed" in str(err)


def test_weights_not_ready():
    h = Hand()
    i = install_and_mul(h, "int8", "int8", t_mul=24)  # ready at 5 + 16 + 4 = 25
    err = expect(h, "weights-not-ready", i, "mxm0", 24)
    assert "instruction #1 only at cycle 25" in str(err)


def test_weights_overwritten_while_in_use():
    h = Hand()
    install_and_mul(h, "fp16", "fp16", n=4)  # computes 25..40 (4 cycles per vector)
    # a new install into buffer 0 at 40, data from slice 2 (pos 4) read at 34
    h.add("mem.read", 34, unit=2, count=16, addr=0, stride=2, dtype="fp16", dst=W(2))
    i = h.add("mxm.install", 40, unit=0, buf=0, count=16, dtype="fp16", aux0=16, src0=W(2))
    err = expect(h, "weights-in-use", i, "mxm0", 40)
    assert "until cycle 41" in str(err)
    # at 41 the multiply has finished with the weights
    h.instrs[i - 1], h.instrs[i] = h.instrs[i - 1].moved(1), h.instrs[i].moved(1)
    h.run(timing_only=True)


def test_install_over_rows_of_the_same_fill():
    h = Hand()
    h.add("mem.read", 0, unit=1, count=16, addr=0, stride=1, dtype="int8", dst=W(0))
    h.add("mxm.install", 5, unit=0, buf=0, count=16, dtype="int8", aux0=16, src0=W(0))  # done at 25
    # no multiply between: the second install would write the rows of the same fill again
    h.add("mem.read", 18, unit=2, count=16, addr=0, stride=1, dtype="int8", dst=W(1))
    i = h.add("mxm.install", 24, unit=0, buf=0, count=16, dtype="int8", aux0=16, src0=W(1))
    expect(h, "weights-overlap", i, "mxm0", 24)


def test_install_while_a_multiply_reads_the_buffer():
    h = Hand()
    h.add("mem.read", 0, unit=1, count=16, addr=0, stride=1, dtype="int8", dst=W(0))
    h.add("mxm.install", 5, unit=0, buf=0, count=16, dtype="int8", aux0=16, src0=W(0))  # ready at 25
    h.add("mem.read", 21, unit=0, count=8, addr=0, stride=1, dtype="int8", dst=W(1))  # at plane 0 at 25
    h.add("mxm.mul", 25, unit=0, buf=0, addr=0, count=8, dtype="int8", src0=W(1))  # reads buffer 0 until 33
    # slice 2 (position 4) read at t - 6 reaches plane 0 at t: a new fill at 32 is too early
    h.add("mem.read", 26, unit=2, count=16, addr=0, stride=1, dtype="int8", dst=W(2))
    i = h.add("mxm.install", 32, unit=0, buf=0, count=16, dtype="int8", aux0=16, src0=W(2))
    expect(h, "weights-in-use", i, "mxm0", 32)
    h.instrs[i - 1], h.instrs[i] = h.instrs[i - 1].moved(1), h.instrs[i].moved(1)
    h.run(timing_only=True)


# =============================================================================
# c2c and sync
# =============================================================================

def test_c2c_receive_before_arrival():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=3, addr=0, stride=4, dtype="fp32", dst=E(0))
    h.add("c2c.send", 6, unit=2, count=3, dtype="fp32", src0=E(0))  # 3 * 5 + 450: arrives at 471
    i = h.add("c2c.recv", 470, unit=2, count=3, dtype="fp32", dst=E(1))
    err = expect(h, "c2c-not-arrived", i, "c2c2", 470)
    assert "arrives only at cycle 471" in str(err)


def test_c2c_receive_on_another_link():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=1, addr=0, stride=4, dtype="fp32", dst=E(0))
    h.add("c2c.send", 6, unit=2, count=1, dtype="fp32", src0=E(0))
    i = h.add("c2c.recv", 1000, unit=3, count=1, dtype="fp32", dst=E(1))
    expect(h, "c2c-empty", i, "c2c3", 1000)


def test_c2c_receive_more_than_sent():
    h = Hand()
    h.add("mem.read", 0, unit=0, count=1, addr=0, stride=4, dtype="fp32", dst=E(0))
    h.add("c2c.send", 6, unit=2, count=1, dtype="fp32", src0=E(0))
    i = h.add("c2c.recv", 1000, unit=2, count=2, dtype="fp32", dst=E(1))
    err = expect(h, "c2c-empty", i, "c2c2", 1000)
    assert "1 of the 2" in str(err)


def test_sync_with_instructions_in_flight():
    h = Hand()
    copy_pair(h, n=4)  # the write's last vector lands at 3 + 3 + 2 = 8
    i = h.add("icu.sync", 7)
    err = expect(h, "sync-in-flight", i, "icu0", 7)
    assert "only at cycle 8" in str(err)
    h.instrs[i] = h.instrs[i].moved(1)
    assert h.run(timing_only=True).cycles == 8


def test_sync_ignores_instructions_issued_in_its_cycle():
    h = Hand()
    h.add("icu.sync", 0)
    copy_pair(h, n=4)
    h.run(timing_only=True)


# =============================================================================
# bad operands
# =============================================================================

BAD = [
    ("unit index", dict(op="mem.read", unit=8, count=1, addr=0, stride=1, dtype="int8", dst=E(0)),
     "MEM index 8 out of range 0..7", "mem8"),
    ("vxm alu", dict(op="vxm.add", unit=8, dtype="int8", src0=E(0), dst=E(1)), "VXM index 8 out of range", "vxm8"),
    ("sxm unit", dict(op="sxm.shift", unit=2, dtype="int8", src0=E(0), dst=E(1)), "SXM index 2", "sxm2"),
    ("c2c link", dict(op="c2c.nop", unit=4), "C2C index 4", "c2c4"),
    ("mxm plane", dict(op="mxm.nop", unit=2), "MXM index 2", "mxm2"),
    ("dma engine", dict(op="dma.nop", unit=1), "DMA index 1", "dma1"),
    ("stream id", dict(op="mem.read", unit=0, dtype="int8", dst=Stream("E", 32)), "stream E32 does not exist", "mem0"),
    ("west stream id", dict(op="mem.write", unit=0, dtype="int8", src0=Stream("W", 33)), "stream W33 does not exist", "mem0"),
    ("missing dtype", dict(op="mem.read", unit=0, dst=E(0)), "missing dtype", "mem0"),
    ("missing dst", dict(op="mem.read", unit=0, dtype="int8"), "missing dst stream", "mem0"),
    ("missing src", dict(op="vxm.exp", unit=0, dtype="fp16", dst=E(0)), "missing a stream", "vxm0"),
    ("install count", dict(op="mxm.install", unit=0, count=17, dtype="int8", aux0=16, src0=W(0)),
     "installs rows 0..16 but a plane has 16", "mxm0"),
    ("install width", dict(op="mxm.install", unit=0, count=4, dtype="int8", aux0=17, src0=W(0)),
     "width 17 out of range 1..16", "mxm0"),
    ("install width 0", dict(op="mxm.install", unit=0, count=4, dtype="int8", aux0=0, src0=W(0)),
     "width 0 out of range", "mxm0"),
    ("weight buffer", dict(op="mxm.mul", unit=0, buf=2, dtype="int8", src0=W(0)), "weight buffer 2 out of range",
     "mxm0"),
    ("mxm dtype", dict(op="mxm.mul", unit=0, dtype="int32", src0=W(0)), "does not multiply int32", "mxm0"),
    ("drain dtype", dict(op="mxm.drain", unit=0, dtype="fp16", dst=E(0)), "drain as int32 or fp32", "mxm0"),
    ("transpose count", dict(op="sxm.transpose", unit=0, count=17, dtype="int8", aux0=16, src0=W(0), dst=E(0)),
     "transpose takes at most 16", "sxm0"),
    ("transpose out", dict(op="sxm.transpose", unit=0, count=4, dtype="int8", aux0=0, src0=W(0), dst=E(0)),
     "emits 1..16", "sxm0"),
    ("broadcast lane", dict(op="sxm.broadcast", unit=1, dtype="int8", aux0=16, src0=W(0), dst=E(0)),
     "lane 16 out of range", "sxm1"),
    ("permute table", dict(op="sxm.permute", unit=0, dtype="int8", aux0=0, src0=W(0), dst=E(0)),
     "not in the program's 0 tables", "sxm0"),
    ("reduce width", dict(op="vxm.reduce_max", unit=0, dtype="int8", aux0=17, src0=E(0), dst=E(1)),
     "width 17 out of range 1..16", "vxm0"),
    ("reduce width 0", dict(op="vxm.reduce_sum", unit=0, dtype="int32", aux0=0, src0=E(0), dst=E(1)),
     "width 0 out of range", "vxm0"),
    ("requant from", dict(op="vxm.requant", unit=0, dtype="fp32", out_dtype="int8", src0=E(0), dst=E(1)),
     "requant converts int32 to int8 or uint8", "vxm0"),
    ("requant to", dict(op="vxm.requant", unit=0, dtype="int32", out_dtype="int32", src0=E(0), dst=E(1)),
     "requant converts int32", "vxm0"),
    ("cvt target", dict(op="vxm.cvt", unit=0, dtype="int32", src0=E(0), dst=E(1)), "missing target dtype", "vxm0"),
    ("dma slice", dict(op="dma.load", unit=0, slice=8, dtype="int8"), "slice 8 out of range 0..7", "dma0"),
    ("icu unit", dict(op="icu.sync", unit=1), "ICU index 1 out of range 0..0", "icu1"),
]


@pytest.mark.parametrize("what, kw, text, unit", BAD, ids=[b[0] for b in BAD])
def test_bad_operand(what, kw, text, unit):
    h = Hand()
    h.add("icu.sync", 0)
    kw = dict(kw)
    i = h.add(kw.pop("op"), 3, **kw)
    err = expect(h, "bad-operand", i, unit, 3)
    assert text in str(err)


@pytest.mark.parametrize("table", [list(range(15)), [16] + list(range(15)), [-2] + list(range(15))])
def test_bad_permute_table(table):
    h = Hand()
    h.table(table)
    i = h.add("sxm.permute", 2, unit=0, dtype="int8", aux0=0, src0=W(0), dst=E(0))
    err = expect(h, "bad-operand", i, "sxm0", 2)
    assert "must have 16 entries in -1..15" in str(err)


def run_vxm_after_read(h, op, dtype, **kw):
    w = DType.parse(dtype).itemsize
    h.add("mem.read", 0, unit=0, count=1, addr=0, stride=w, dtype=dtype, dst=E(0))
    return h.add(op, 6, unit=1, count=1, dtype=dtype, src0=E(0), dst=E(1), **kw)


@pytest.mark.parametrize("op, dtype, kw, text", [
    ("vxm.exp", "int32", {}, "needs a float dtype"),
    ("vxm.rsqrt", "int8", {}, "needs a float dtype"),
    ("vxm.reduce_sum", "int8", {"aux0": 16}, "convert to int32 first"),
    ("vxm.reduce_sum", "uint8", {"aux0": 4}, "convert to int32 first"),
    ("vxm.add", "int8", {"imm": 1.5}, "not an integer"),
    ("vxm.mul", "int32", {"imm": float("nan")}, "not an integer"),
    ("vxm.max", "uint8", {"imm": float("inf")}, "not an integer"),
])
def test_op_not_defined_for_dtype(op, dtype, kw, text):
    h = Hand()
    i = run_vxm_after_read(h, op, dtype, **kw)
    err = expect(h, "bad-operand", i, "vxm1", 6)
    assert text in str(err)


# =============================================================================
# program-level errors
# =============================================================================

def small_copy(preset="mini"):
    h = Hand(preset)
    h.input("X", 2, "int8", 0)
    h.output("Y", 2, "int8", 1)
    copy_pair(h, n=2)
    return h


def test_program_for_another_machine():
    prog = small_copy().program()
    with pytest.raises(ProgramError) as e:
        Simulator("tsp").run(prog, {"X": np.zeros((2, 16), np.int8)})
    assert prog.config_hash in str(e.value) and Simulator("tsp").config.hash in str(e.value)
    assert "tsp" in str(e.value)


def test_wrong_isa_version():
    prog = small_copy().program()
    prog.isa_version = 2
    with pytest.raises(ProgramError) as e:
        Simulator("mini").run(prog, {"X": np.zeros((2, 16), np.int8)})
    assert "ISA version 2" in str(e.value)


def test_missing_input():
    with pytest.raises(ProgramError) as e:
        small_copy().run({})
    assert "missing input 'X'" in str(e.value) and "(2, 16)" in str(e.value)


def test_unknown_input():
    with pytest.raises(ProgramError) as e:
        small_copy().run({"X": np.zeros((2, 16), np.int8), "Z": np.zeros(3)})
    assert "'Z'" in str(e.value) and "['X']" in str(e.value)
    with pytest.raises(ProgramError):
        small_copy().run({"Y": np.zeros((2, 16), np.int8)}, timing_only=True)  # an output is not an input


@pytest.mark.parametrize("shape", [(2, 15), (16, 2), (2, 16, 1), (32,)])
def test_wrong_input_shape(shape):
    with pytest.raises(ProgramError) as e:
        small_copy().run({"X": np.zeros(shape, np.int8)})
    assert "expected shape (2, 16)" in str(e.value) and str(shape) in str(e.value)


def test_input_values_that_do_not_fit_the_dtype():
    with pytest.raises(ProgramError) as e:
        small_copy().run({"X": np.full((2, 16), 200)})
    assert "do not fit dtype int8" in str(e.value)


def test_initial_image_outside_the_sram():
    prog = small_copy().program()
    prog.sram_init = [SramImage(0, 4095, bytes(32))]  # 2 lines from 4095
    with pytest.raises(ProgramError) as e:
        Simulator("mini").run(prog, timing_only=True)
    assert "does not fit" in str(e.value)
    prog.sram_init = [SramImage(8, 0, bytes(16))]
    with pytest.raises(ProgramError):
        Simulator("mini").run(prog, timing_only=True)
    prog.sram_init = [SramImage(0, 0, bytes(15))]  # not whole lines
    with pytest.raises(ProgramError):
        Simulator("mini").run(prog, timing_only=True)


def test_binding_outside_the_sram():
    prog = small_copy().program()
    prog.bindings.append(Binding("Z", "output", TensorLayout((3, 16), DType.FP32, ((2, 4090),), 4)))
    with pytest.raises(ProgramError) as e:
        Simulator("mini").run(prog, timing_only=True)
    assert "'Z'" in str(e.value)


def test_hazards_stop_at_the_first_violation():
    """Two broken instructions: the earlier-issued one is reported."""
    h = Hand()
    h.add("mem.write", 9, unit=4, count=1, addr=0, stride=1, dtype="int8", src0=Stream("E", 5))
    h.add("mem.write", 8, unit=5, count=1, addr=0, stride=1, dtype="int8", src0=Stream("E", 6))
    expect(h, "stream-empty", 1, "mem5", 8)


def test_stream_objects_validate_their_own_fields():
    with pytest.raises(ValueError):
        Stream("N", 0)
    with pytest.raises(ValueError):
        Stream("E", 64)

"""The LPX program binary: round trips, exact layout, and clear errors on bad input."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpx_tvm.cli import main
from lpx_tvm.errors import EncodingError
from lpx_tvm.machine.encoding import (HEADER_SIZE, INSTR_SIZE, decode_instrs, decode_program,
                                     encode_instrs, encode_program, f32_bits, f32_from_bits,
                                     load_program, save_program, tag_table)
from lpx_tvm.machine.isa import ISA_VERSION, OPS, DType, Instr, Stream
from lpx_tvm.machine.program import Binding, Program, SramImage, TensorLayout

from program_strategies import instrs, nan_f32, programs

HASH = "0123456789abcdef0123456789abcdef"


def sample_program() -> Program:
    return Program(
        config_hash=HASH,
        instrs=[
            Instr("mem.read", 120, unit=12, count=64, addr=256, stride=2, dtype=DType.FP16,
                  dst=Stream("E", 3), tag="conv1"),
            Instr("vxm.add", 130, unit=1, count=64, dtype=DType.FP16, src0=Stream("E", 3),
                  imm=1.5, dst=Stream("W", 7), tag="conv1"),
            Instr("icu.sync", 400),
        ],
        sram_init=[SramImage(2, 0, bytes(range(32)))],
        host_init=b"\x01\x02\x03",
        host_bytes=4096,
        bindings=[Binding("x", "input", TensorLayout((2, 16), DType.FP16, ((0, 0),), 1)),
                  Binding("y", "output", TensorLayout((3, 20), DType.FP32, (), 4), offchip=64)],
        tables=[np.arange(16, dtype=np.int32)[::-1]],
        symbols={"conv1": {"kind": "op", "cycles": [120, 194]}},
        name="sample",
    )


def fix_crc(data: bytes) -> bytes:
    """Recompute the header CRC so a deliberate edit is checked past the CRC."""
    data = bytearray(data)
    struct.pack_into("<I", data, HEADER_SIZE - 4, zlib.crc32(bytes(data[HEADER_SIZE:])))
    return bytes(data)


def patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    data = bytearray(data)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


# ---- round trips ------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_every_opcode_round_trips(op, data):
    ins = data.draw(instrs(op=op))
    tags = tag_table([ins])
    raw = encode_instrs([ins], tags)
    assert len(raw) == INSTR_SIZE
    assert decode_instrs(raw, tags) == [ins]


@settings(max_examples=200, deadline=None)
@given(programs())
def test_program_round_trip(prog):
    data = encode_program(prog)
    back = decode_program(data)
    assert back == prog
    assert encode_program(back) == data


@settings(max_examples=100, deadline=None)
@given(programs(imm=nan_f32))
def test_nan_imm_bits_survive(prog):
    data = encode_program(prog)
    back = decode_program(data)
    assert encode_program(back) == data
    for a, b in zip(prog.instrs, back.instrs):
        assert f32_bits(a.imm) == f32_bits(b.imm)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_f32_bits_round_trip(bits):
    assert f32_bits(f32_from_bits(bits)) == bits


def test_save_and_load(tmp_path):
    prog = sample_program()
    path = tmp_path / "p.lpx"
    save_program(prog, path)
    assert load_program(path) == prog
    assert os.listdir(tmp_path) == ["p.lpx"]  # no temp file left behind
    save_program(prog, str(path))  # overwrite in place
    assert load_program(str(path)) == prog


# ---- exact layout -----------------------------------------------------------------

def test_instruction_record_layout():
    ins = Instr("mem.read", 0x0102030405, unit=12, count=64, addr=256, stride=-2, dtype=DType.FP16,
                dst=Stream("W", 5), tag="t")
    rec = encode_instrs([ins], ["", "t"])
    assert rec[0:2] == (0x01).to_bytes(2, "little")  # opcode code
    assert rec[2:4] == (12).to_bytes(2, "little")  # unit
    assert rec[4:8] == (1).to_bytes(4, "little")  # tag index
    assert rec[8:16] == (0x0102030405).to_bytes(8, "little")  # cycle
    assert rec[16:20] == (64).to_bytes(4, "little")  # count
    assert rec[20] == DType.FP16 and rec[21] == 0  # dtype, out_dtype
    assert rec[22:24] == b"\0\0"  # src0, src1 unused
    assert rec[24] == 0x80 | 0x40 | 5  # dst: present, west, id 5
    assert rec[28:32] == (256).to_bytes(4, "little")
    assert rec[32:36] == (-2).to_bytes(4, "little", signed=True)
    assert rec[36:64] == bytes(28)  # imm, aux0, aux1, reserved


def test_header_layout():
    prog = sample_program()
    data = encode_program(prog)
    assert data[:8] == b"LPXPROG\0"
    magic, version, flags, h, n, meta_len, data_len, crc = struct.unpack_from("<8sHH16sIIQI", data)
    assert (version, flags, h.hex(), n) == (ISA_VERSION, 0, HASH, 3)
    assert data_len == 32 + 3
    assert len(data) == HEADER_SIZE + 3 * INSTR_SIZE + meta_len + data_len
    assert crc == zlib.crc32(data[HEADER_SIZE:])


# ---- refused on encode ------------------------------------------------------------

def test_unused_field_refused():
    ins = Instr("mem.read", 1, addr=4, stride=1, dtype=DType.INT8, dst=Stream("E", 1), buf=3)
    with pytest.raises(EncodingError, match=r"instruction #0 \(mem.read\).*buf.*does not use"):
        encode_instrs([ins])
    with pytest.raises(EncodingError, match="buf"):
        encode_program(Program(HASH, [ins]))


@pytest.mark.parametrize("kw, field", [({"unit": 70000}, "unit"), ({"addr": -1}, "addr"),
                                       ({"stride": 2**31}, "stride"), ({"addr": 1.5}, "addr")])
def test_out_of_range_refused(kw, field):
    ins = Instr("mem.read", 1, **{"addr": 0, "stride": 1, "dtype": DType.INT8, "dst": Stream("E", 1), **kw})
    with pytest.raises(EncodingError, match=field):
        encode_instrs([ins])


def test_imm_overflow_refused():
    ins = Instr("vxm.mul", 1, dtype=DType.FP32, src0=Stream("E", 1), dst=Stream("E", 2), imm=1e39)
    with pytest.raises(EncodingError, match="too large for float32"):
        encode_instrs([ins])


@pytest.mark.parametrize("h", ["", "abc", "0123456789ABCDEF0123456789ABCDEF", "g" * 32])
def test_bad_config_hash_refused(h):
    with pytest.raises(EncodingError, match="config hash"):
        encode_program(Program(h))


def test_other_isa_version_refused():
    with pytest.raises(EncodingError, match="ISA version 2"):
        encode_program(Program(HASH, isa_version=2))


# ---- corrupt input ----------------------------------------------------------------

@pytest.fixture
def good():
    return encode_program(sample_program())


@pytest.mark.parametrize("cut", [0, 4, 8, 47, 48, 48 + 63, 48 + 3 * 64 + 5, -1])
def test_truncated(good, cut):
    data = good[:cut]
    with pytest.raises(EncodingError, match="truncated") as err:
        decode_program(data)
    assert str(len(data)) in str(err.value)
    if cut >= HEADER_SIZE or cut < 0:
        assert str(len(good)) in str(err.value)  # bytes expected


def test_trailing_bytes(good):
    with pytest.raises(EncodingError, match="trailing"):
        decode_program(good + b"\0")


@pytest.mark.parametrize("data", [b"PK\x03\x04" + bytes(60), b"\x7fELF", b"LPXPROG1" + bytes(100)])
def test_wrong_magic(data):
    with pytest.raises(EncodingError, match="not an LPX program"):
        decode_program(data)


def test_wrong_version(good):
    with pytest.raises(EncodingError, match=r"unsupported ISA version 7 .*supports version 1"):
        decode_program(patch(good, 8, "<H", 7))


def test_nonzero_flags(good):
    with pytest.raises(EncodingError, match="flags"):
        decode_program(patch(good, 10, "<H", 1))


@pytest.mark.parametrize("offset", [HEADER_SIZE, HEADER_SIZE + 100, -40, -1])
def test_flipped_byte_is_corrupt(good, offset):
    data = bytearray(good)
    data[offset] ^= 0x10
    with pytest.raises(EncodingError, match="corrupt"):
        decode_program(bytes(data))


def test_unknown_opcode(good):
    data = fix_crc(patch(good, HEADER_SIZE + INSTR_SIZE, "<H", 0xEE))
    with pytest.raises(EncodingError, match=r"instruction #1: unknown opcode code 0x00ee"):
        decode_program(data)


def test_unknown_dtype(good):
    data = fix_crc(patch(good, HEADER_SIZE + 20, "<B", 99))
    with pytest.raises(EncodingError, match=r"instruction #0 \(mem.read\): unknown dtype code 99"):
        decode_program(data)


def test_nonzero_reserved(good):
    data = fix_crc(patch(good, HEADER_SIZE + 2 * INSTR_SIZE + 60, "<B", 1))
    with pytest.raises(EncodingError, match=r"instruction #2 .*reserved"):
        decode_program(data)


def test_unused_slot_set_in_binary(good):
    data = fix_crc(patch(good, HEADER_SIZE + 25, "<B", 3))  # buf of mem.read
    with pytest.raises(EncodingError, match=r"instruction #0 \(mem.read\) sets field\(s\) buf"):
        decode_program(data)


def test_bad_stream_byte(good):
    data = fix_crc(patch(good, HEADER_SIZE + 24, "<B", 0x05))  # dst without the present bit
    with pytest.raises(EncodingError, match=r"instruction #0 .*dst.*bad stream byte"):
        decode_program(data)


def test_bad_tag_index(good):
    data = fix_crc(patch(good, HEADER_SIZE + 4, "<I", 99))
    with pytest.raises(EncodingError, match="tag index 99"):
        decode_program(data)


def test_invalid_metadata_json(good):
    meta_at = HEADER_SIZE + 3 * INSTR_SIZE
    data = bytearray(good)
    data[meta_at] = ord("[") + 100  # no longer JSON
    with pytest.raises(EncodingError, match="invalid program metadata"):
        decode_program(fix_crc(bytes(data)))


def test_metadata_missing_key():
    prog = Program(HASH)
    good = encode_program(prog)
    meta = good[HEADER_SIZE:].replace(b'"name"', b'"nome"')
    with pytest.raises(EncodingError, match="missing key 'name'"):
        decode_program(fix_crc(good[:HEADER_SIZE] + meta))


def test_load_missing_file(tmp_path):
    with pytest.raises(EncodingError, match="no such file"):
        load_program(tmp_path / "nope.lpx")


def test_load_names_file(tmp_path):
    path = tmp_path / "bad.lpx"
    path.write_bytes(b"garbage")
    with pytest.raises(EncodingError, match=r"bad\.lpx: not an LPX program"):
        load_program(path)


# ---- the command line -------------------------------------------------------------

def test_cli_disasm(tmp_path, capsys):
    from lpx_tvm.machine.asm import parse_program

    path = tmp_path / "p.lpx"
    save_program(sample_program(), path)
    assert main(["disasm", str(path)]) == 0
    assert parse_program(capsys.readouterr().out) == sample_program()


@pytest.mark.parametrize("corruption", ["flip", "truncate", "missing"])
def test_cli_disasm_corrupt(tmp_path, capsys, good, corruption):
    path = tmp_path / "p.lpx"
    if corruption == "flip":
        data = bytearray(good)
        data[-1] ^= 1
        path.write_bytes(bytes(data))
    elif corruption == "truncate":
        path.write_bytes(good[:100])
    assert main(["disasm", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("lpx-tvm: error: ")
    assert str(path) in lines[0]
    expected = {"flip": "corrupt", "truncate": "truncated", "missing": "no such file"}[corruption]
    assert expected in lines[0]

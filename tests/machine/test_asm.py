"""LPX assembly text: exact format, lossless round trips, and clear parse errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpx_tvm.cli import main
from lpx_tvm.errors import EncodingError
from lpx_tvm.machine.asm import format_instr, format_program, parse_instr, parse_program
from lpx_tvm.machine.config import load_config
from lpx_tvm.machine.encoding import encode_program, f32_bits, f32_from_bits, load_program
from lpx_tvm.machine.isa import OPS, DType, Instr, Stream
from lpx_tvm.machine.program import Program, SramImage

from program_strategies import instrs, nan_f32, programs

HASH = "0123456789abcdef0123456789abcdef"


# ---- format -----------------------------------------------------------------------

def test_example_line():
    ins = Instr("mem.read", 120, unit=12, count=64, addr=256, stride=2, dtype=DType.FP16,
                dst=Stream("E", 3), tag="conv1")
    line = "@120 mem.read slice=12 count=64 addr=256 stride=2 dtype=fp16 dst=E3 ; conv1"
    assert format_instr(ins) == line == str(ins)
    assert parse_instr(line) == ins


def test_optional_fields_omitted_at_default():
    ins = Instr("vxm.add", 7, unit=3, dtype=DType.INT32, src0=Stream("E", 1), dst=Stream("W", 2))
    assert format_instr(ins) == "@7 vxm.add alu=3 count=1 dtype=int32 a=E1 dst=W2"
    ins = Instr("vxm.add", 7, unit=3, dtype=DType.FP32, src0=Stream("E", 1), src1=Stream("E", 4),
                imm=-0.0, dst=Stream("W", 2))
    assert format_instr(ins) == "@7 vxm.add alu=3 count=1 dtype=fp32 a=E1 b=E4 imm=-0.0 dst=W2"


def test_mandatory_fields_always_written():
    ins = Instr("mem.read", 0)  # everything left at its default
    assert format_instr(ins) == "@0 mem.read slice=0 count=1 addr=0 stride=0 dtype=none dst=-"
    assert parse_instr(format_instr(ins)) == ins
    assert format_instr(Instr("icu.sync", 9)) == "@9 icu.sync unit=0 count=1"


@pytest.mark.parametrize("value, text", [(0.1, "0.1"), (1e20, "1e+20"), (float("inf"), "inf"),
                                         (float("-inf"), "-inf"), (f32_from_bits(0x7FC00001), "nan:0x7fc00001"),
                                         (f32_from_bits(0xFF800001), "nan:0xff800001")])
def test_float_text(value, text):
    ins = Instr("vxm.mul", 0, dtype=DType.FP32, src0=Stream("E", 0), dst=Stream("E", 1), imm=value)
    assert f"imm={text} " in format_instr(ins)
    assert f32_bits(parse_instr(format_instr(ins)).imm) == f32_bits(value)


@pytest.mark.parametrize("tag", [" lead", "trail ", '"q"', "a ; b", "tab\there", "new\nline", "#x", "ü ∑"])
def test_awkward_tags_round_trip(tag):
    ins = Instr("icu.sync", 1, tag=tag)
    line = format_instr(ins)
    assert "\n" not in line
    assert parse_instr(line).tag == tag


def test_unused_field_marked_and_refused():
    ins = Instr("mem.nop", 3, aux1=5)
    line = format_instr(ins)
    assert line == "@3 mem.nop slice=0 count=1 !aux1=5"
    with pytest.raises(EncodingError, match="mem.nop does not use field 'aux1'"):
        parse_instr(line)
    with pytest.raises(EncodingError, match=r"instruction #0 \(mem.nop\).*aux1"):
        format_program(Program(HASH, [ins]))


# ---- round trips ------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_every_opcode_round_trips(op, data):
    ins = data.draw(instrs(op=op))
    line = format_instr(ins)
    assert "\n" not in line
    assert parse_instr(line) == ins


@settings(max_examples=200, deadline=None)
@given(programs())
def test_program_round_trip(prog):
    text = format_program(prog)
    assert parse_program(text) == prog
    assert format_program(parse_program(text)) == text


@settings(max_examples=100, deadline=None)
@given(programs(imm=nan_f32))
def test_program_round_trip_keeps_nan_bits(prog):
    back = parse_program(format_program(prog))
    assert encode_program(back) == encode_program(prog)


def test_decimal_imm_rounds_to_float32():
    ins = parse_instr("@0 vxm.mul alu=0 dtype=fp32 a=E0 imm=0.1 dst=E1")
    assert ins.imm == float(np.float32(0.1))


def test_hand_written_program():
    text = """
    # a tiny hand-written program
    .config mini
    .program "hand"
    .sram slice=1 addr=0 size=16
    .data AAECAwQFBgcICQoLDA0ODw==
    @0 mem.read slice=1 addr=0 stride=1 dtype=int8 dst=E1 ; load
    @5 icu.sync unit=0
    """
    prog = parse_program(text)
    assert prog.config_hash == load_config("mini").hash
    assert prog.name == "hand"
    assert prog.sram_init == [SramImage(1, 0, bytes(range(16)))]
    assert [i.op for i in prog.instrs] == ["mem.read", "icu.sync"]
    assert prog.instrs[0].tag == "load" and prog.instrs[1].count == 1


# ---- parse errors -----------------------------------------------------------------

@pytest.mark.parametrize("line, problem", [
    ("mem.nop slice=0", "missing cycle"),
    ("@x mem.nop slice=0", "bad integer 'x'"),
    ("@1", "missing mnemonic"),
    ("@1 mem.raed slice=0", "unknown mnemonic 'mem.raed'"),
    ("@1 mem.nop slice=0 bogus=1", "unknown field 'bogus' for mem.nop"),
    ("@1 mem.nop slice=0 buf=1", "mem.nop does not use field 'buf'"),
    ("@1 mem.nop slice=0 slice=1", "given twice"),
    ("@1 mem.nop count=2", "missing field(s) slice"),
    ("@1 mem.read slice=0 addr=0 stride=1 dtype=int8", "missing field(s) dst"),
    ("@1 mem.read slice=0 addr=0 stride=1 dtype=int9 dst=E1", "unknown dtype 'int9'"),
    ("@1 mem.read slice=0 addr=0 stride=1 dtype=int8 dst=N1", "bad stream 'N1'"),
    ("@1 mem.read slice=0 addr=0 stride=1 dtype=int8 dst=E64", "out of range"),
    ("@1 mem.nop slice=0 count=0", "count must be >= 1"),
    ("@1 mem.nop slice", "expected name=value"),
    ("@1 vxm.mul alu=0 dtype=fp32 a=E0 imm=fast dst=E1", "bad float 'fast'"),
    ("@1 icu.sync unit=0 ; \"unterminated", "bad quoted tag"),
])
def test_parse_errors(line, problem):
    with pytest.raises(EncodingError) as err:
        parse_instr(line, 42)
    msg = str(err.value)
    assert msg.startswith("line 42: ")
    assert problem in msg
    assert line.split()[0] in msg  # quotes the offending text


@pytest.mark.parametrize("body, problem", [
    ("@0 icu.sync unit=0\n", "missing .config"),
    (".config nothex\n", "config hash"),
    (".config " + HASH + "\n.isa 2\n", "unsupported ISA version 2"),
    (".config " + HASH + "\n.bogus 1\n", "line 2: unknown directive '.bogus'"),
    (".config " + HASH + "\n.sram slice=0 addr=0 size=4\n.data AAAA\n", "line 2: .sram declares size=4"),
    (".config " + HASH + "\n.data AAAA\n", "line 2: .data outside"),
    (".config " + HASH + "\n.host size=3\n.data !!!!\n", "line 3: bad base64"),
    (".config " + HASH + "\n.binding input \"x\" dtype=fp16\n", "missing shape"),
    (".config " + HASH + "\n.binding middle \"x\" dtype=fp16 shape=[1] row_stride=1 tiles=[[0,0]]\n", "role"),
    (".config " + HASH + "\n.table [1,2.5]\n", "table 0"),
    (".config " + HASH + "\n.symbol \"a\" 1\n.symbol \"a\" 2\n", "line 3: .symbol 'a' given twice"),
    (".config " + HASH + "\n\n# c\n@0 mem.nop\n", "line 4: mem.nop is missing field(s) slice"),
])
def test_program_parse_errors(body, problem):
    with pytest.raises(EncodingError) as err:
        parse_program(body)
    assert problem in str(err.value)


# ---- the command line -------------------------------------------------------------

def test_cli_asm_then_disasm(tmp_path, capsys):
    prog = Program(HASH, [Instr("icu.sync", 3, tag="end")], host_init=b"xyz", name="cli")
    src = tmp_path / "p.s"
    src.write_text(format_program(prog))
    out = tmp_path / "p.lpx"
    assert main(["asm", str(src), "-o", str(out)]) == 0
    assert load_program(out) == prog
    listing = tmp_path / "p2.s"
    assert main(["disasm", str(out), "-o", str(listing)]) == 0
    assert listing.read_text() == src.read_text()
    assert capsys.readouterr().err == ""


def test_cli_asm_error_names_file_and_line(tmp_path, capsys):
    src = tmp_path / "bad.s"
    src.write_text(f".config {HASH}\n@0 mem.raed slice=0\n")
    assert main(["asm", str(src), "-o", str(tmp_path / "x.lpx")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("lpx-tvm: error: ") and "bad.s: line 2: unknown mnemonic" in err[0]
    assert not (tmp_path / "x.lpx").exists()


def test_cli_asm_missing_file(tmp_path, capsys):
    assert main(["asm", str(tmp_path / "none.s"), "-o", str(tmp_path / "x.lpx")]) == 2
    assert "no such file" in capsys.readouterr().err

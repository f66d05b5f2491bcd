"""Readable LPX assembly: one instruction per line, plus directives for a whole Program.

An instruction line is ``@<cycle> <mnemonic> <unit_name>=<unit> count=<count>`` followed
by the opcode's fields as ``name=value`` in the order :data:`~lpx_tvm.machine.isa.OPS`
declares, and ``; <tag>`` when the instruction has a tag::

    @120 mem.read slice=12 count=64 addr=256 stride=2 dtype=fp16 dst=E3 ; conv1

:func:`format_program` and :func:`parse_program` convert a whole :class:`Program`
(header, bindings, tables, symbols, initial data, instructions) to and from text
without loss. ``docs/encoding.md`` describes the syntax.
"""

from __future__ import annotations

import base64
import binascii
import json


from ..errors import EncodingError, ProgramError
from .encoding import check_config_hash, table_from_json, table_to_json
from .isa import (_DEFAULTS, _DTYPES, _STREAMS, ISA_VERSION, OPS, DType, Instr, Stream, f32_bits, f32_from_bits,
                  format_f32, format_instr)  # noqa: F401 (format_instr: part of the assembler's API)
from .program import Binding, Program, SramImage, TensorLayout

_DATA_CHUNK = 48  # bytes per .data line (64 base64 characters)
_QNAN = 0x7FC00000


def _json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


# ---- values -----------------------------------------------------------------------

def parse_f32(text: str) -> float:
    """Parse a float written by :func:`format_f32` (or any decimal), rounded to float32."""
    low = text.lower()
    if low.startswith(("nan:", "-nan:", "+nan:")):
        try:
            bits = int(low.partition(":")[2], 16)
        except ValueError:
            bits = -1
        if not (0 <= bits <= 0xFFFFFFFF and bits & 0x7F800000 == 0x7F800000 and bits & 0x7FFFFF):
            raise EncodingError(f"bad NaN {text!r} (expected nan:0x<8 hex digits of a float32 NaN>)")
        return f32_from_bits(bits)
    if low in ("nan", "+nan", "-nan"):
        return f32_from_bits(_QNAN | (0x80000000 if low[0] == "-" else 0))
    try:
        value = float(text)
    except ValueError:
        raise EncodingError(f"bad float {text!r}") from None
    return f32_from_bits(f32_bits(value))


def _parse_int(text: str, what: str) -> int:
    try:
        body = text.lstrip("+-").lower()
        return int(text, 16) if body.startswith("0x") else int(text, 10)
    except ValueError:
        raise EncodingError(f"bad integer {text!r} for {what}") from None


def _parse_value(name: str, text: str):
    if name in _STREAMS:
        if text == "-":
            return None
        try:
            return Stream.parse(text)
        except ValueError as e:
            raise EncodingError(str(e)) from None
    if name in _DTYPES:
        try:
            return DType.parse(text)
        except ValueError:
            names = ", ".join(d.short for d in DType)
            raise EncodingError(f"unknown dtype {text!r} (expected one of: {names})") from None
    if name == "imm":
        return parse_f32(text)
    return _parse_int(text, name)


def _parse_tag(text: str) -> str:
    text = text.strip()
    if text.startswith('"'):
        try:
            tag = json.loads(text)
        except json.JSONDecodeError:
            raise EncodingError(f"bad quoted tag {text!r}") from None
        if not isinstance(tag, str):
            raise EncodingError(f"bad quoted tag {text!r}")
        return tag
    return text


# ---- instructions -----------------------------------------------------------------

def _line_error(problem: str, line: str, lineno) -> EncodingError:
    where = f"line {lineno}: " if lineno is not None else ""
    return EncodingError(f"{where}{problem}: {line.strip()!r}")


def parse_instr(line: str, lineno: "int | None" = None) -> Instr:
    """Parse one instruction line written by :func:`format_instr`.

    Parameters
    ----------
    line : str
    lineno : int, optional
        Line number to put in error messages.

    Raises
    ------
    EncodingError
        Naming the line and the problem: missing cycle, unknown mnemonic, unknown or
        unused field, duplicate or missing field, bad stream, dtype or number.
    """
    body, sep, tag_text = line.partition(";")
    try:
        tag = _parse_tag(tag_text) if sep else ""
    except EncodingError as e:
        raise _line_error(str(e), line, lineno) from None
    tokens = body.split()
    if not tokens or not tokens[0].startswith("@"):
        raise _line_error("missing cycle (an instruction starts with @<cycle>)", line, lineno)
    try:
        cycle = _parse_int(tokens[0][1:], "the cycle")
    except EncodingError as e:
        raise _line_error(str(e), line, lineno) from None
    if len(tokens) < 2:
        raise _line_error("missing mnemonic after the cycle", line, lineno)
    op = tokens[1]
    spec = OPS.get(op)
    if spec is None:
        raise _line_error(f"unknown mnemonic {op!r}", line, lineno)
    names = {spec.unit_name: "unit", "count": "count", **dict(spec.fields)}
    values = {}
    for tok in tokens[2:]:
        key, eq, text = tok.partition("=")
        if not eq or not key or not text:
            raise _line_error(f"expected name=value, got {tok!r}", line, lineno)
        name = names.get(key)
        if name is None:
            if key.lstrip("!") in _DEFAULTS:
                problem = f"{op} does not use field {key.lstrip('!')!r}"
            else:
                problem = f"unknown field {key!r} for {op} (it takes: {', '.join(names)})"
            raise _line_error(problem, line, lineno)
        if name in values:
            raise _line_error(f"field {key!r} given twice", line, lineno)
        try:
            values[name] = _parse_value(name, text)
        except EncodingError as e:
            raise _line_error(f"{key}: {e}", line, lineno) from None
    missing = [key for key, name in names.items()
               if name not in values and name != "count" and name not in spec.optional]
    if missing:
        raise _line_error(f"{op} is missing field(s) {', '.join(missing)}", line, lineno)
    try:
        return Instr(op=op, cycle=cycle, tag=tag, **values)
    except ValueError as e:
        raise _line_error(str(e), line, lineno) from None


# ---- whole programs ---------------------------------------------------------------

def _data_lines(data: bytes) -> list:
    return [".data " + base64.b64encode(data[i:i + _DATA_CHUNK]).decode("ascii")
            for i in range(0, len(data), _DATA_CHUNK)]


def format_program(prog: Program) -> str:
    """The whole program as assembly text; :func:`parse_program` reads it back equal.

    Raises
    ------
    EncodingError
        If an instruction sets a field its opcode does not use, the config hash is
        not 32 hex digits, or a table or symbol cannot be written.
    """
    check_config_hash(prog.config_hash)
    for i, ins in enumerate(prog.instrs):
        unused = ins.unused_fields_set()
        if unused:
            raise EncodingError(f"instruction #{i} ({ins.op}) sets field(s) {', '.join(unused)} "
                                f"that the opcode does not use: {ins}")
    out = ["# LPX assembly",
           f".program {json.dumps(prog.name)}",
           f".isa {prog.isa_version}",
           f".config {prog.config_hash}",
           f".host_bytes {prog.host_bytes}"]
    for b in prog.bindings:
        lay = b.layout
        out.append(f".binding {b.role} {json.dumps(b.name)} dtype={lay.dtype.short} "
                   f"shape={_json(list(lay.shape))} row_stride={lay.row_stride} "
                   f"tiles={_json([list(t) for t in lay.tiles])}"
                   + (f" chunk_rows={lay.chunk_rows}" if lay.chunk_rows else "")
                   + (f" margin={lay.margin}" if lay.margin else "")
                   + ("" if b.offchip is None else f" offchip={b.offchip}"))
    for i, table in enumerate(prog.tables):
        out.append(f".table {_json(table_to_json(table, i))}")
    for key, value in prog.symbols.items():
        try:
            out.append(f".symbol {json.dumps(str(key))} {_json(value)}")
        except (TypeError, ValueError) as e:
            raise EncodingError(f"symbol {key!r} cannot be written as JSON: {e}") from None
    for img in prog.sram_init:
        data = bytes(img.data)
        out.append(f".sram slice={img.slice} addr={img.addr} size={len(data)}")
        out.extend(_data_lines(data))
    if prog.host_init:
        out.append(f".host size={len(prog.host_init)}")
        out.extend(_data_lines(bytes(prog.host_init)))
    out.append("# instructions")
    out.extend(format_instr(ins) for ins in prog.instrs)
    return "\n".join(out) + "\n"


class _Reader:
    """State of :func:`parse_program`: the program so far and the open data block."""

    def __init__(self):
        self.header = {}
        self.instrs, self.bindings, self.tables, self.sram = [], [], [], []
        self.symbols = {}
        self.host = None
        self.block = None  # [kind, declared size, bytearray, lineno, slice, addr]

    def close_block(self):
        if self.block is None:
            return
        kind, size, data, lineno, sl, addr = self.block
        if len(data) != size:
            raise EncodingError(f"line {lineno}: {kind} declares size={size} but its .data lines "
                                f"hold {len(data)} bytes")
        if kind == ".sram":
            self.sram.append(SramImage(sl, addr, bytes(data)))
        else:
            self.host = bytes(data)
        self.block = None


def _keyvals(tokens, allowed, what) -> dict:
    out = {}
    for tok in tokens:
        key, eq, text = tok.partition("=")
        if not eq or key not in allowed:
            raise EncodingError(f"{what}: unexpected {tok!r} (expected {', '.join(f'{k}=' for k in allowed)})")
        if key in out:
            raise EncodingError(f"{what}: {key} given twice")
        out[key] = text
    missing = [k for k in allowed if k not in out]
    if missing:
        raise EncodingError(f"{what}: missing {', '.join(missing)}")
    return out


def _json_prefix(text: str, what: str):
    """Decode the JSON value at the start of ``text``; return it and the rest."""
    text = text.lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as e:
        raise EncodingError(f"{what}: bad JSON ({e.msg})") from None
    return value, text[end:]


def _directive(r: _Reader, word: str, rest: str, lineno: int) -> None:
    if word == ".data":
        if r.block is None:
            raise EncodingError(".data outside a .sram or .host block")
        try:
            r.block[2] += base64.b64decode(rest.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise EncodingError("bad base64 in .data") from None
        return
    r.close_block()
    if word in (".program", ".isa", ".config", ".host_bytes"):
        if word in r.header:
            raise EncodingError(f"{word} given twice")
        if word == ".program":
            name, tail = _json_prefix(rest, ".program")
            if not isinstance(name, str) or tail.strip():
                raise EncodingError('.program takes one quoted name, e.g. .program "resnet"')
            r.header[word] = name
        elif word == ".config":
            r.header[word] = _config_hash(rest.strip())
        else:
            r.header[word] = _parse_int(rest.strip(), word)
    elif word == ".binding":
        role, _, rest = rest.strip().partition(" ")
        name, rest = _json_prefix(rest, ".binding")
        if not isinstance(name, str):
            raise EncodingError(".binding: the name must be a quoted string")
        tokens = rest.split()
        offchip = [t for t in tokens if t.startswith("offchip=")]
        optional = {t.partition("=")[0]: t.partition("=")[2] for t in tokens
                    if t.startswith(("chunk_rows=", "margin="))}
        kv = _keyvals([t for t in tokens if t not in offchip and t.partition("=")[0] not in optional],
                      ("dtype", "shape", "row_stride", "tiles"), ".binding")
        try:
            layout = TensorLayout.from_json({"dtype": kv["dtype"], "shape": json.loads(kv["shape"]),
                                             "tiles": json.loads(kv["tiles"]),
                                             "row_stride": kv["row_stride"], **optional})
            off = _parse_int(offchip[-1].partition("=")[2], ".binding offchip") if offchip else None
            r.bindings.append(Binding(name, role, layout, off))
        except (ValueError, TypeError, ProgramError) as e:
            raise EncodingError(f".binding {name!r}: {e}") from None
    elif word == ".table":
        values, tail = _json_prefix(rest, ".table")
        if tail.strip():
            raise EncodingError(".table: unexpected text after the values")
        r.tables.append(table_from_json(values, len(r.tables)))
    elif word == ".symbol":
        name, rest = _json_prefix(rest, ".symbol")
        if not isinstance(name, str):
            raise EncodingError(".symbol: the name must be a quoted string")
        if name in r.symbols:
            raise EncodingError(f".symbol {name!r} given twice")
        value, tail = _json_prefix(rest, f".symbol {name!r}")
        if tail.strip():
            raise EncodingError(f".symbol {name!r}: unexpected text after the value")
        r.symbols[name] = value
    elif word == ".sram":
        kv = _keyvals(rest.split(), ("slice", "addr", "size"), ".sram")
        kv = {k: _parse_int(v, f".sram {k}") for k, v in kv.items()}
        r.block = [".sram", kv["size"], bytearray(), lineno, kv["slice"], kv["addr"]]
    elif word == ".host":
        if r.host is not None:
            raise EncodingError(".host given twice")
        kv = _keyvals(rest.split(), ("size",), ".host")
        r.block = [".host", _parse_int(kv["size"], ".host size"), bytearray(), lineno, 0, 0]
    else:
        raise EncodingError(f"unknown directive {word!r}")


def _config_hash(text: str) -> str:
    """A config hash, or a preset name standing for its hash (handy in hand-written tests)."""
    from .config import PRESETS, load_config

    if text in PRESETS:
        return load_config(text).hash
    check_config_hash(text)
    return text


def parse_program(text: str) -> Program:
    """Parse assembly text written by :func:`format_program` into a :class:`Program`.

    Blank lines and lines starting with ``#`` are ignored. ``.config`` is required;
    it may name a preset (``mini``) instead of giving a hash.

    Raises
    ------
    EncodingError
        Naming the line number and the problem.
    """
    r = _Reader()
    lines = text.split("\n")
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("."):
            word, _, rest = stripped.partition(" ")
            try:
                _directive(r, word, rest, lineno)
            except EncodingError as e:
                raise EncodingError(f"line {lineno}: {e}") from None
            continue
        r.close_block()
        r.instrs.append(parse_instr(line, lineno))
    r.close_block()
    if ".config" not in r.header:
        raise EncodingError("missing .config directive (the machine config hash)")
    version = r.header.get(".isa", ISA_VERSION)
    if version != ISA_VERSION:
        raise EncodingError(f"unsupported ISA version {version} (this lpx_tvm supports version {ISA_VERSION})")
    return Program(config_hash=r.header[".config"], instrs=r.instrs, sram_init=r.sram,
                   host_init=r.host or b"", host_bytes=r.header.get(".host_bytes", 0),
                   bindings=r.bindings, tables=r.tables, symbols=r.symbols,
                   name=r.header.get(".program", ""), isa_version=version)

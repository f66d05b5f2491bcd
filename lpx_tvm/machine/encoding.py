"""The fixed-width LPX program binary.

A file is a 48-byte header, the instructions (64 bytes each), UTF-8 JSON metadata and
a data blob holding the initial SRAM images and off-chip memory. ``docs/encoding.md``
gives the layout field by field. Every malformed input raises
:class:`~lpx_tvm.errors.EncodingError` with a message saying what is wrong and where.
"""

from __future__ import annotations

import json
import operator
import os
import re
import struct
import zlib

import numpy as np

from ..errors import EncodingError, ProgramError
from .isa import FIELDS, ISA_VERSION, OPS, OPS_BY_CODE, DType, Instr, Stream, f32_bits, f32_from_bits  # noqa: F401
from .program import Binding, Program, SramImage, TensorLayout

MAGIC = b"LPXPROG\0"
HEADER = struct.Struct("<8sHH16sIIQI")
INSTR = struct.Struct("<HHIQIBBBBBBHIiIqq8s")
HEADER_SIZE = HEADER.size
INSTR_SIZE = INSTR.size
assert HEADER_SIZE == 48 and INSTR_SIZE == 64

_RESERVED = bytes(8)
_HASH_RE = re.compile(r"[0-9a-f]{32}")

# Integer fields of an instruction and the range their binary slot holds.
INT_RANGES = {
    "unit": (0, 2**16 - 1),
    "cycle": (0, 2**64 - 1),
    "count": (1, 2**32 - 1),
    "buf": (0, 2**8 - 1),
    "slice": (0, 2**16 - 1),
    "addr": (0, 2**32 - 1),
    "stride": (-(2**31), 2**31 - 1),
    "aux0": (-(2**63), 2**63 - 1),
    "aux1": (-(2**63), 2**63 - 1),
}

# Order of the generic fields in the instruction record (after op, unit, tag, cycle, count).
_SLOTS = ("dtype", "out_dtype", "src0", "src1", "dst", "buf", "slice", "addr", "stride", "imm", "aux0", "aux1")
assert set(_SLOTS) == set(FIELDS)


def check_config_hash(text: str) -> bytes:
    """Validate a config hash (32 lowercase hex digits) and return its 16 raw bytes."""
    if not isinstance(text, str) or not _HASH_RE.fullmatch(text):
        raise EncodingError(f"config hash must be 32 lowercase hex digits, got {text!r}")
    return bytes.fromhex(text)


def stream_to_byte(stream: "Stream | None") -> int:
    """Encode a stream operand: 0 for none, else 0x80 | (0x40 if west) | id."""
    if stream is None:
        return 0
    if not isinstance(stream, Stream):
        raise EncodingError(f"expected a Stream or None, got {stream!r}")
    return 0x80 | (0x40 if stream.dir == "W" else 0) | stream.id


def stream_from_byte(byte: int) -> "Stream | None":
    """Decode a stream operand byte written by :func:`stream_to_byte`."""
    if byte == 0:
        return None
    if not byte & 0x80:
        raise EncodingError(f"bad stream byte 0x{byte:02x} (bit 7 must be set)")
    return Stream("W" if byte & 0x40 else "E", byte & 0x3F)


def table_to_json(table, index: int) -> list:
    """An int32 lookup table as (nested) int lists."""
    arr = np.asarray(table)
    if arr.dtype.kind not in "iub":
        raise EncodingError(f"table {index} is not an integer array (dtype {arr.dtype})")
    if arr.size and (arr.min() < -(2**31) or arr.max() > 2**31 - 1):
        raise EncodingError(f"table {index} has values outside int32")
    return arr.tolist()


def table_from_json(values, index: int) -> np.ndarray:
    """Rebuild an int32 table from :func:`table_to_json` output."""
    try:
        arr = np.asarray(values)
        if arr.size and arr.dtype.kind not in "iub":
            raise ValueError(f"non-integer values (dtype {arr.dtype})")
        if arr.size and (arr.min() < -(2**31) or arr.max() > 2**31 - 1):
            raise ValueError("values outside int32")
        return arr.astype(np.int32)
    except (ValueError, TypeError, OverflowError) as e:
        raise EncodingError(f"table {index}: {e}") from None


def _int_field(ins: Instr, name: str, index: int) -> int:
    value = getattr(ins, name)
    try:
        value = operator.index(value)
    except TypeError:
        raise EncodingError(f"instruction #{index} ({ins.op}): {name} must be an integer, "
                            f"got {value!r}") from None
    lo, hi = INT_RANGES[name]
    if not lo <= value <= hi:
        raise EncodingError(f"instruction #{index} ({ins.op}): {name}={value} out of range {lo}..{hi}")
    return value


# ---- instructions -----------------------------------------------------------------

def tag_table(instrs) -> list:
    """The tag table of ``instrs``: ``""`` then each distinct non-empty tag in first-use order."""
    tags = {"": 0}
    for ins in instrs:
        tags.setdefault(ins.tag, len(tags))
    return list(tags)


def encode_instrs(instrs, tags=None) -> bytes:
    """Encode instructions as 64-byte records.

    Parameters
    ----------
    instrs : list of Instr
    tags : list of str, optional
        Tag table the records index (``tags[0]`` must be ``""``); defaults to
        ``tag_table(instrs)``.

    Raises
    ------
    EncodingError
        If an instruction sets a field its opcode does not use, a value does not fit
        its slot, or a tag is missing from ``tags``.
    """
    if tags is None:
        tags = tag_table(instrs)
    tag_index = {t: i for i, t in enumerate(tags)}
    out = bytearray()
    for i, ins in enumerate(instrs):
        if not isinstance(ins, Instr):
            raise EncodingError(f"instruction #{i}: expected an Instr, got {type(ins).__name__}")
        spec = OPS[ins.op]
        unused = ins.unused_fields_set()
        if unused:
            raise EncodingError(f"instruction #{i} ({ins.op}) sets field(s) {', '.join(unused)} "
                                f"that the opcode does not use: {ins}")
        if ins.tag not in tag_index:
            raise EncodingError(f"instruction #{i}: tag {ins.tag!r} is not in the tag table")
        used = set(spec.field_names)
        slot = dict.fromkeys(_SLOTS, 0)
        for name in used:
            value = getattr(ins, name)
            if name in ("dtype", "out_dtype"):
                slot[name] = int(value)
            elif name in ("src0", "src1", "dst"):
                try:
                    slot[name] = stream_to_byte(value)
                except EncodingError as e:
                    raise EncodingError(f"instruction #{i} ({ins.op}) {name}: {e}") from None
            elif name == "imm":
                try:
                    slot[name] = f32_bits(value)
                except (EncodingError, TypeError, ValueError) as e:
                    raise EncodingError(f"instruction #{i} ({ins.op}) imm: {e}") from None
            else:
                slot[name] = _int_field(ins, name, i)
        out += INSTR.pack(spec.code, _int_field(ins, "unit", i), tag_index[ins.tag],
                          _int_field(ins, "cycle", i), _int_field(ins, "count", i),
                          *(slot[name] for name in _SLOTS), _RESERVED)
    return bytes(out)


def decode_instrs(data: bytes, tags) -> list:
    """Decode 64-byte instruction records written by :func:`encode_instrs`.

    Parameters
    ----------
    data : bytes
        A whole number of records.
    tags : list of str
        The tag table the records index.

    Raises
    ------
    EncodingError
        On a partial record, an unknown opcode or dtype code, a bad stream byte, a tag
        index outside the table, a used-field-free slot holding a value, or nonzero
        reserved bytes; the message names the instruction number.
    """
    if len(data) % INSTR_SIZE:
        raise EncodingError(f"instruction data is {len(data)} bytes, not a multiple of {INSTR_SIZE}")
    instrs = []
    for i, rec in enumerate(INSTR.iter_unpack(data)):
        code, unit, tag, cycle, count, *raw, reserved = rec
        where = f"instruction #{i}"
        spec = OPS_BY_CODE.get(code)
        if spec is None:
            raise EncodingError(f"{where}: unknown opcode code 0x{code:04x}")
        if reserved != _RESERVED:
            raise EncodingError(f"{where} ({spec.mnemonic}): reserved bytes are not zero")
        if tag >= len(tags):
            raise EncodingError(f"{where} ({spec.mnemonic}): tag index {tag} outside the tag table "
                                f"({len(tags)} entries)")
        raw = dict(zip(_SLOTS, raw))
        used = set(spec.field_names)
        stray = [name for name in _SLOTS if name not in used and raw[name] != 0]
        if stray:
            raise EncodingError(f"{where} ({spec.mnemonic}) sets field(s) {', '.join(stray)} "
                                f"that the opcode does not use")
        kw = {}
        for name in used:
            value = raw[name]
            if name in ("dtype", "out_dtype"):
                try:
                    value = DType(value)
                except ValueError:
                    raise EncodingError(f"{where} ({spec.mnemonic}): unknown dtype code {value} "
                                        f"in {name}") from None
            elif name in ("src0", "src1", "dst"):
                try:
                    value = stream_from_byte(value)
                except EncodingError as e:
                    raise EncodingError(f"{where} ({spec.mnemonic}) {name}: {e}") from None
            elif name == "imm":
                value = f32_from_bits(value)
            kw[name] = value
        try:
            ins = Instr(op=spec.mnemonic, cycle=cycle, unit=unit, count=count, tag=tags[tag], **kw)
        except ValueError as e:
            raise EncodingError(f"{where}: {e}") from None
        instrs.append(ins)
    return instrs


# ---- whole programs -------------------------------------------------------------

def _json_dumps(obj, what: str) -> str:
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise EncodingError(f"{what} cannot be written as JSON: {e}") from None


def encode_program(prog: Program) -> bytes:
    """Encode a :class:`Program` as the LPX binary.

    Raises
    ------
    EncodingError
        If the program's ISA version is not this one, its config hash is not 32 hex
        digits, an instruction is invalid (see :func:`encode_instrs`), or its
        symbols are not JSON-serializable.
    """
    if prog.isa_version != ISA_VERSION:
        raise EncodingError(f"program is for ISA version {prog.isa_version}; "
                            f"this lpx_tvm writes version {ISA_VERSION}")
    hash_bytes = check_config_hash(prog.config_hash)
    tags = tag_table(prog.instrs)
    code = encode_instrs(prog.instrs, tags)

    blob = bytearray()
    sram = []
    for img in prog.sram_init:
        data = bytes(img.data)
        sram.append({"slice": int(img.slice), "addr": int(img.addr), "offset": len(blob), "size": len(data)})
        blob += data
    host = bytes(prog.host_init)
    host_entry = {"offset": len(blob), "size": len(host)}
    blob += host

    meta = {
        "name": prog.name,
        "host_bytes": int(prog.host_bytes),
        "tags": tags,
        "bindings": [{"name": b.name, "role": b.role, "layout": b.layout.to_json(),
                      **({} if b.offchip is None else {"offchip": int(b.offchip)})} for b in prog.bindings],
        "tables": [table_to_json(t, i) for i, t in enumerate(prog.tables)],
        "symbols": prog.symbols,
        "sram_init": sram,
        "host_init": host_entry,
    }
    meta_bytes = _json_dumps(meta, "program metadata (name, bindings, symbols)").encode("utf-8")
    body = code + meta_bytes + bytes(blob)
    header = HEADER.pack(MAGIC, ISA_VERSION, 0, hash_bytes, len(prog.instrs), len(meta_bytes),
                         len(blob), zlib.crc32(body))
    return header + body


def _blob_slice(blob: bytes, entry, what: str) -> bytes:
    offset, size = entry["offset"], entry["size"]
    if not (isinstance(offset, int) and isinstance(size, int) and 0 <= offset and 0 <= size
            and offset + size <= len(blob)):
        raise EncodingError(f"{what}: bytes {offset}..+{size} lie outside the {len(blob)}-byte data blob")
    return blob[offset:offset + size]


def _program_from_meta(meta, config_hash: str, instr_bytes: bytes, blob: bytes) -> Program:
    if not isinstance(meta, dict):
        raise EncodingError("invalid program metadata: expected a JSON object")
    tags = meta["tags"]
    if not isinstance(tags, list) or not tags or tags[0] != "" or not all(isinstance(t, str) for t in tags):
        raise EncodingError("invalid program metadata: tags must be a list of strings starting with \"\"")
    instrs = decode_instrs(instr_bytes, tags)
    bindings = [Binding(str(b["name"]), b["role"], TensorLayout.from_json(b["layout"]),
                        None if b.get("offchip") is None else int(b["offchip"])) for b in meta["bindings"]]
    tables = [table_from_json(t, i) for i, t in enumerate(meta["tables"])]
    sram = [SramImage(int(e["slice"]), int(e["addr"]), _blob_slice(blob, e, f"sram_init[{i}]"))
            for i, e in enumerate(meta["sram_init"])]
    host = _blob_slice(blob, meta["host_init"], "host_init")
    symbols = meta["symbols"]
    if not isinstance(symbols, dict):
        raise EncodingError("invalid program metadata: symbols must be an object")
    name = meta["name"]
    if not isinstance(name, str):
        raise EncodingError("invalid program metadata: name must be a string")
    return Program(config_hash=config_hash, instrs=instrs, sram_init=sram, host_init=host,
                   host_bytes=int(meta["host_bytes"]), bindings=bindings, tables=tables,
                   symbols=symbols, name=name, isa_version=ISA_VERSION)


def decode_program(data: bytes) -> Program:
    """Decode an LPX binary written by :func:`encode_program`.

    Raises
    ------
    EncodingError
        If the data is not an LPX program, is truncated or has trailing bytes, is for
        another ISA version, fails its CRC check, or holds an invalid instruction or
        metadata.
    """
    data = bytes(data)
    if data[:len(MAGIC)] != MAGIC[:len(data)]:
        raise EncodingError("not an LPX program (bad magic bytes)")
    if len(data) < HEADER_SIZE:
        raise EncodingError(f"truncated: the header needs {HEADER_SIZE} bytes, only {len(data)} present")
    magic, version, flags, hash_bytes, n_instr, meta_len, data_len, crc = HEADER.unpack_from(data)
    if version != ISA_VERSION:
        raise EncodingError(f"unsupported ISA version {version} (this lpx_tvm supports version {ISA_VERSION})")
    if flags != 0:
        raise EncodingError(f"unsupported header flags 0x{flags:04x} (expected 0)")
    instr_end = HEADER_SIZE + n_instr * INSTR_SIZE
    meta_end = instr_end + meta_len
    expected = meta_end + data_len
    if len(data) < expected:
        raise EncodingError(f"truncated: expected {expected} bytes ({n_instr} instructions, "
                            f"{meta_len} bytes of metadata, {data_len} bytes of data), "
                            f"only {len(data)} present")
    if len(data) > expected:
        raise EncodingError(f"{len(data) - expected} unexpected trailing bytes after the "
                            f"{expected} bytes the header describes")
    actual = zlib.crc32(memoryview(data)[HEADER_SIZE:])
    if actual != crc:
        raise EncodingError(f"corrupt: CRC32 mismatch (header says 0x{crc:08x}, contents give 0x{actual:08x})")
    try:
        meta = json.loads(data[instr_end:meta_end].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EncodingError(f"invalid program metadata (not UTF-8 JSON): {e}") from None
    try:
        return _program_from_meta(meta, hash_bytes.hex(), data[HEADER_SIZE:instr_end], data[meta_end:])
    except KeyError as e:
        raise EncodingError(f"invalid program metadata: missing key {e}") from None
    except (TypeError, ValueError, ProgramError) as e:
        raise EncodingError(f"invalid program metadata: {e}") from None


def save_program(prog: Program, path) -> None:
    """Encode ``prog`` and write it to ``path`` atomically (temp file + ``os.replace``)."""
    data = encode_program(prog)
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load_program(path) -> Program:
    """Read and decode an LPX binary; errors name the file."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise EncodingError(f"{path}: no such file") from None
    except OSError as e:
        raise EncodingError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return decode_program(data)
    except EncodingError as e:
        raise EncodingError(f"{path}: {e}") from None

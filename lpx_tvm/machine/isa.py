"""The LPX instruction set: the single definition of opcodes, operand fields and dtypes.

Every instruction belongs to one functional unit's queue and carries its exact issue
cycle, a ``count`` of vectors streamed one per cycle, and a tag naming the graph op it
came from. Which generic field each opcode uses, and under what assembly name, is
declared once in :data:`OPS`; the encoder, the assembler and the simulator all read it.
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass, field, replace
from functools import cached_property

import ml_dtypes
import numpy as np

from ..errors import EncodingError

ISA_VERSION = 1


class DType(enum.IntEnum):
    NONE = 0
    INT8 = 1
    UINT8 = 2
    INT32 = 3
    FP16 = 4
    BF16 = 5
    FP32 = 6
    FP8 = 7  # e4m3 (finite only: no inf, one NaN; max FP8_MAX), the LP30's native format

    @property
    def np(self):
        return _NP[self]

    @property
    def itemsize(self) -> int:
        return _NP[self].itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.FP16, DType.BF16, DType.FP32, DType.FP8)

    @property
    def is_int(self) -> bool:
        return self in (DType.INT8, DType.UINT8, DType.INT32)

    @property
    def short(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: "str | DType") -> "DType":
        if isinstance(text, DType):
            return text
        try:
            return cls[str(text).upper()]
        except KeyError:
            raise ValueError(f"unknown dtype {text!r}") from None


FP8_MAX = 448.0  # the largest finite e4m3 value: conversions to fp8 saturate there

_NP = {
    DType.NONE: np.dtype(np.uint8),
    DType.INT8: np.dtype(np.int8),
    DType.UINT8: np.dtype(np.uint8),
    DType.INT32: np.dtype(np.int32),
    DType.FP16: np.dtype(np.float16),
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.FP32: np.dtype(np.float32),
    DType.FP8: np.dtype(ml_dtypes.float8_e4m3fn),
}


def dtype_of_numpy(dt) -> DType:
    dt = np.dtype(dt)
    for k, v in _NP.items():
        if k is not DType.NONE and v == dt:
            return k
    raise ValueError(f"numpy dtype {dt} has no LPX dtype")


class Unit(enum.IntEnum):
    """Functional unit kinds; each instance (slice, plane, ALU, ...) has its own queue."""

    MEM = 0
    DMA = 1
    MXM = 2
    VXM = 3
    SXM = 4
    C2C = 5
    ICU = 6


@dataclass(frozen=True)
class Stream:
    """A stream register: direction ``"E"`` (eastward) or ``"W"`` (westward) and index."""

    dir: str
    id: int

    def __post_init__(self):
        if self.dir not in ("E", "W"):
            raise ValueError(f"stream direction must be 'E' or 'W', got {self.dir!r}")
        if not 0 <= self.id < 64:
            raise ValueError(f"stream index {self.id} out of range 0..63")

    def __str__(self):
        return f"{self.dir}{self.id}"

    @property
    def sign(self) -> int:
        """+1 for eastward (position grows each cycle), -1 for westward."""
        return 1 if self.dir == "E" else -1

    @classmethod
    def parse(cls, text: str) -> "Stream":
        text = text.strip()
        if len(text) < 2 or text[0] not in "EW" or not text[1:].isdigit():
            raise ValueError(f"bad stream {text!r} (expected E<n> or W<n>)")
        return cls(text[0], int(text[1:]))


# Generic instruction fields that an opcode may use (besides op, cycle, unit, count, tag).
FIELDS = ("dtype", "out_dtype", "src0", "src1", "dst", "buf", "slice", "addr", "stride", "imm", "aux0", "aux1")


@dataclass(frozen=True)
class OpSpec:
    code: int
    mnemonic: str
    unit: Unit
    unit_name: str  # assembly name of the unit index: slice, plane, alu, ...
    fields: tuple  # ((asm_name, field), ...) in assembly order
    optional: tuple = ()  # fields that may be left at their default (e.g. vxm.add's b or imm)
    doc: str = ""

    @cached_property
    def field_names(self) -> tuple:
        return tuple(f for _, f in self.fields)


def _spec(code, mnemonic, unit, unit_name, fields, optional=(), doc=""):
    return OpSpec(code, mnemonic, unit, unit_name, tuple(fields), tuple(optional), doc)


_MEM_RW = (("addr", "addr"), ("stride", "stride"), ("dtype", "dtype"))
_MEM_2D = (("inner", "aux0"), ("outer", "aux1"))  # optional second address dimension
_UNARY = (("dtype", "dtype"), ("a", "src0"), ("dst", "dst"))
_BINARY = (("dtype", "dtype"), ("a", "src0"), ("b", "src1"), ("imm", "imm"), ("dst", "dst"))
_SXM1 = (("dtype", "dtype"), ("a", "src0"), ("dst", "dst"))

_OP_LIST = [
    # MEM: one queue per SRAM slice; one read port and one write port.
    _spec(0x01, "mem.read", Unit.MEM, "slice", _MEM_RW + _MEM_2D + (("dst", "dst"),), optional=("aux0", "aux1"),
          doc="Read `count` vectors from lines addr + k*stride (2-D: addr + (k//inner)*outer + "
              "(k%inner)*stride) onto stream dst."),
    _spec(0x02, "mem.write", Unit.MEM, "slice", _MEM_RW + _MEM_2D + (("src", "src0"),), optional=("aux0", "aux1"),
          doc="Write `count` vectors from stream src to lines addr + k*stride (or the 2-D pattern)."),
    _spec(0x03, "mem.gather", Unit.MEM, "slice", (("base", "addr"), ("stride", "stride"), ("dtype", "dtype"),
                                                    ("idx", "src0"), ("dst", "dst")),
          doc="For each int32 index i in lane 0 of stream idx, read the vector at base + i*stride onto dst."),
    _spec(0x04, "mem.scatter", Unit.MEM, "slice", (("base", "addr"), ("stride", "stride"), ("dtype", "dtype"),
                                                     ("values", "src0"), ("idx", "src1")),
          doc="For each int32 index i in lane 0 of the k-th vector of stream idx, write the k-th vector of "
              "stream values to the lines at base + i*stride (the write port; a later vector wins a line "
              "two indices share)."),
    _spec(0x0F, "mem.nop", Unit.MEM, "slice", (), doc="Hold the slice's queue for `count` cycles."),
    # DMA engines: SRAM <-> off-chip (host) memory at the preset's off-chip bandwidth.
    _spec(0x11, "dma.load", Unit.DMA, "engine", (("slice", "slice"), ("addr", "addr"), ("stride", "stride"),
                                                   ("dtype", "dtype"), ("host", "aux0")),
          doc="Copy `count` vectors from off-chip byte offset host into the slice."),
    _spec(0x12, "dma.store", Unit.DMA, "engine", (("slice", "slice"), ("addr", "addr"), ("stride", "stride"),
                                                    ("dtype", "dtype"), ("host", "aux0")),
          doc="Copy `count` vectors from the slice to off-chip byte offset host."),
    _spec(0x1F, "dma.nop", Unit.DMA, "engine", ()),
    # MXM: one queue per plane; install, compute and drain ports run concurrently.
    _spec(0x21, "mxm.install", Unit.MXM, "plane", (("buf", "buf"), ("dtype", "dtype"), ("width", "aux0"),
                                                     ("row", "addr"), ("lane", "aux1"), ("src", "src0")),
          optional=("addr", "aux1"),
          doc="Install `count` weight rows of `width` columns (N) from stream src into rows row.. of buffer "
              "buf, through install lane `lane`; the lanes of a plane install at once, and the rows one fill "
              "installs (0..K-1) are the K the next multiply contracts."),
    _spec(0x22, "mxm.mul", Unit.MXM, "plane", (("buf", "buf"), ("acc", "addr"), ("dtype", "dtype"), ("src", "src0")),
          doc="acc[addr+k] = src[k][:K] @ W[buf] for k < count."),
    _spec(0x23, "mxm.mac", Unit.MXM, "plane", (("buf", "buf"), ("acc", "addr"), ("dtype", "dtype"), ("src", "src0")),
          doc="acc[addr+k] += src[k][:K] @ W[buf] for k < count (accumulate across K splits)."),
    _spec(0x24, "mxm.drain", Unit.MXM, "plane", (("acc", "addr"), ("dtype", "dtype"), ("dst", "dst")),
          doc="Stream accumulator rows addr..addr+count-1 onto dst."),
    _spec(0x2F, "mxm.nop", Unit.MXM, "plane", ()),
    # VXM: 16 ALUs per lane, each a queue.
    _spec(0x31, "vxm.add", Unit.VXM, "alu", _BINARY, optional=("src1", "imm")),
    _spec(0x32, "vxm.sub", Unit.VXM, "alu", _BINARY, optional=("src1", "imm")),
    _spec(0x33, "vxm.mul", Unit.VXM, "alu", _BINARY, optional=("src1", "imm")),
    _spec(0x34, "vxm.max", Unit.VXM, "alu", _BINARY, optional=("src1", "imm")),
    _spec(0x35, "vxm.min", Unit.VXM, "alu", _BINARY, optional=("src1", "imm")),
    _spec(0x40, "vxm.exp", Unit.VXM, "alu", _UNARY),
    _spec(0x41, "vxm.tanh", Unit.VXM, "alu", _UNARY),
    _spec(0x42, "vxm.sigmoid", Unit.VXM, "alu", _UNARY),
    _spec(0x43, "vxm.gelu", Unit.VXM, "alu", _UNARY, doc="x * Phi(x), the erf form."),
    _spec(0x44, "vxm.gelu_tanh", Unit.VXM, "alu", _UNARY, doc="The tanh approximation of GELU."),
    _spec(0x45, "vxm.erf", Unit.VXM, "alu", _UNARY),
    _spec(0x46, "vxm.rsqrt", Unit.VXM, "alu", _UNARY),
    _spec(0x47, "vxm.recip", Unit.VXM, "alu", _UNARY),
    _spec(0x50, "vxm.cvt", Unit.VXM, "alu", (("dtype", "dtype"), ("to", "out_dtype"), ("a", "src0"), ("dst", "dst"))),
    _spec(0x51, "vxm.requant", Unit.VXM, "alu", (("dtype", "dtype"), ("to", "out_dtype"), ("a", "src0"),
                                                  ("scale", "src1"), ("imm", "imm"), ("zp", "aux0"), ("dst", "dst")),
          optional=("src1", "imm", "aux0"),
          doc="int32 -> int8/uint8: clip(round_half_even(a * scale) + zp). scale is imm or a per-lane fp32 stream."),
    _spec(0x58, "vxm.reduce_sum", Unit.VXM, "alu", (("dtype", "dtype"), ("width", "aux0"), ("a", "src0"), ("dst", "dst"))),
    _spec(0x59, "vxm.reduce_max", Unit.VXM, "alu", (("dtype", "dtype"), ("width", "aux0"), ("a", "src0"), ("dst", "dst"))),
    _spec(0x3F, "vxm.nop", Unit.VXM, "alu", ()),
    # SXM: lane movement.
    _spec(0x61, "sxm.shift", Unit.SXM, "unit", (("by", "aux0"),) + _SXM1),
    _spec(0x62, "sxm.rotate", Unit.SXM, "unit", (("by", "aux0"),) + _SXM1),
    _spec(0x63, "sxm.permute", Unit.SXM, "unit", (("map", "aux0"),) + _SXM1),
    _spec(0x64, "sxm.transpose", Unit.SXM, "unit", (("out", "aux0"),) + _SXM1),
    _spec(0x65, "sxm.broadcast", Unit.SXM, "unit", (("lane", "aux0"),) + _SXM1),
    _spec(0x66, "sxm.pad", Unit.SXM, "unit", (("before", "aux0"), ("width", "aux1")) + _SXM1),
    _spec(0x6F, "sxm.nop", Unit.SXM, "unit", ()),
    # C2C: chip-to-chip links (a single chip loops each link back to itself).
    _spec(0x71, "c2c.send", Unit.C2C, "link", (("dtype", "dtype"), ("src", "src0"))),
    _spec(0x72, "c2c.recv", Unit.C2C, "link", (("dtype", "dtype"), ("dst", "dst"))),
    _spec(0x7F, "c2c.nop", Unit.C2C, "link", ()),
    # ICU: program-level control.
    _spec(0x81, "icu.sync", Unit.ICU, "unit", (), doc="Check that every earlier-issued instruction has completed."),
]

OPS = {s.mnemonic: s for s in _OP_LIST}
OPS_BY_CODE = {s.code: s for s in _OP_LIST}
assert len(OPS) == len(OPS_BY_CODE) == len(_OP_LIST)

VXM_BINARY = ("vxm.add", "vxm.sub", "vxm.mul", "vxm.max", "vxm.min")
VXM_TRANSCENDENTAL = ("vxm.exp", "vxm.tanh", "vxm.sigmoid", "vxm.gelu", "vxm.gelu_tanh", "vxm.erf",
                      "vxm.rsqrt", "vxm.recip")
VXM_REDUCE = ("vxm.reduce_sum", "vxm.reduce_max")
NOPS = ("mem.nop", "dma.nop", "mxm.nop", "vxm.nop", "sxm.nop", "c2c.nop")

# The per-opcode meanings of the two auxiliary fields: {opcode: {name: "aux0" | "aux1"}}
# (mem.read's inner and outer, dma's host, mxm.install's width and lane, ...), read
# through Instr's named accessors.
AUX_NAMES = {s.mnemonic: {name: f for name, f in s.fields if f in ("aux0", "aux1")} for s in _OP_LIST}

_DEFAULTS = {"dtype": DType.NONE, "out_dtype": DType.NONE, "src0": None, "src1": None, "dst": None,
             "buf": 0, "slice": 0, "addr": 0, "stride": 0, "imm": 0.0, "aux0": 0, "aux1": 0}


@dataclass(frozen=True)
class Instr:
    """One LPX instruction. Fields an opcode does not use stay at their defaults."""

    op: str
    cycle: int
    unit: int = 0
    count: int = 1
    dtype: DType = DType.NONE
    out_dtype: DType = DType.NONE
    src0: "Stream | None" = None
    src1: "Stream | None" = None
    dst: "Stream | None" = None
    buf: int = 0
    slice: int = 0
    addr: int = 0
    stride: int = 0
    imm: float = 0.0
    aux0: int = 0
    aux1: int = 0
    tag: str = field(default="", compare=True)

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown opcode {self.op!r}")
        if self.cycle < 0:
            raise ValueError(f"{self.op}: negative issue cycle {self.cycle}")
        if self.count < 1:
            raise ValueError(f"{self.op}: count must be >= 1, got {self.count}")
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "out_dtype", DType(self.out_dtype))

    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    @property
    def queue(self) -> tuple:
        """The instruction queue this instruction sits in: (unit kind, unit index)."""
        return (self.spec.unit, self.unit)

    def _aux(self, name: str) -> int:
        f = AUX_NAMES[self.op].get(name)
        if f is None:
            raise AttributeError(f"{self.op} has no field {name!r}")
        return getattr(self, f)

    # Named accessors of the auxiliary fields (an opcode without the field raises).
    inner = property(lambda self: self._aux("inner"), doc="mem.read/write: 2-D rows per outer step (0: 1-D)")
    outer = property(lambda self: self._aux("outer"), doc="mem.read/write: 2-D line step between outer rows")
    host = property(lambda self: self._aux("host"), doc="dma.load/store: the off-chip byte offset")
    width = property(lambda self: self._aux("width"),
                     doc="mxm.install: columns installed; vxm.reduce_*: lanes reduced; sxm.pad: lanes kept")
    lane = property(lambda self: self._aux("lane"), doc="mxm.install: the install lane; sxm.broadcast: the lane")
    zp = property(lambda self: self._aux("zp"), doc="vxm.requant: the zero point")
    by = property(lambda self: self._aux("by"), doc="sxm.shift/rotate: lanes moved")
    map = property(lambda self: self._aux("map"), doc="sxm.permute: the permutation table's index")
    out = property(lambda self: self._aux("out"), doc="sxm.transpose: the output vector index")
    before = property(lambda self: self._aux("before"), doc="sxm.pad: lanes of zeros before")

    def unused_fields_set(self) -> list:
        """Fields set away from their default that the opcode does not use."""
        used = set(self.spec.field_names)
        return [f for f, d in _DEFAULTS.items() if f not in used and getattr(self, f) != d]

    def moved(self, delta: int) -> "Instr":
        return replace(self, cycle=self.cycle + delta)

    def __str__(self):
        return format_instr(self)


def queue_name(queue: tuple) -> str:
    unit, index = queue
    return f"{unit.name.lower()}{index}"


# ---- float32 immediates ---------------------------------------------------------

def f32_bits(value: float) -> int:
    """Raw IEEE-754 binary32 bits of ``value``, rounded to nearest.

    NaN payloads carried by a Python float made with :func:`f32_from_bits` are kept
    bit for bit (signalling NaNs included). A finite value too large for float32
    raises :class:`EncodingError`.
    """
    value = float(value)
    if value != value:
        (b64,) = struct.unpack("<Q", struct.pack("<d", value))
        mantissa = (b64 >> 29) & 0x7FFFFF or 0x400000
        return ((b64 >> 63) << 31) | 0x7F800000 | mantissa
    try:
        (bits,) = struct.unpack("<I", struct.pack("<f", value))
    except OverflowError:
        raise EncodingError(f"value {value!r} is too large for float32") from None
    return bits


def f32_from_bits(bits: int) -> float:
    """The Python float holding binary32 ``bits`` exactly (NaN payloads included)."""
    if bits & 0x7F800000 == 0x7F800000 and bits & 0x7FFFFF:
        b64 = ((bits >> 31) << 63) | (0x7FF << 52) | ((bits & 0x7FFFFF) << 29)
        return struct.unpack("<d", struct.pack("<Q", b64))[0]
    return struct.unpack("<f", struct.pack("<I", bits))[0]


# ---- one instruction as assembly text (lpx_tvm.machine.asm reads it back) ---------

_STREAMS = ("src0", "src1", "dst")
_DTYPES = ("dtype", "out_dtype")


def format_f32(value: float) -> str:
    """Shortest text that reads back as the same float32: ``0.1``, ``-0.0``, ``inf``,
    ``nan:0x7fc00001`` (NaNs as raw bits, so payloads survive)."""
    bits = f32_bits(value)
    if bits & 0x7F800000 == 0x7F800000:
        if bits & 0x7FFFFF:
            return f"nan:0x{bits:08x}"
        return "-inf" if bits >> 31 else "inf"
    return str(np.float32(f32_from_bits(bits)))


def _format_value(name: str, value) -> str:
    if name in _STREAMS:
        return "-" if value is None else str(value)
    if name in _DTYPES:
        return DType(value).short
    if name == "imm":
        try:
            return format_f32(value)
        except EncodingError:
            return repr(value)
    return str(value)


def _is_default(name: str, value) -> bool:
    if name == "imm":
        return f32_bits(value) == 0
    return value == _DEFAULTS[name]


def _format_tag(tag: str) -> str:
    """Tags are written raw unless they could not read back so (then as a JSON string)."""
    if tag != tag.strip() or tag.startswith('"') or not tag.isprintable():
        return json.dumps(tag)
    return tag


def format_instr(ins: Instr) -> str:
    """One assembly line for ``ins``.

    Optional fields left at their default are omitted; mandatory ones are always
    written. Fields the opcode does not use but that are set anyway are shown as
    ``!field=value`` so the line stays informative; :func:`parse_instr` rejects them.
    """
    spec = OPS[ins.op]
    parts = [f"@{ins.cycle}", ins.op, f"{spec.unit_name}={ins.unit}", f"count={ins.count}"]
    for asm_name, name in spec.fields:
        value = getattr(ins, name)
        if name in spec.optional:
            try:
                if _is_default(name, value):
                    continue
            except EncodingError:
                pass
        parts.append(f"{asm_name}={_format_value(name, value)}")
    for name in ins.unused_fields_set():
        parts.append(f"!{name}={_format_value(name, getattr(ins, name))}")
    line = " ".join(parts)
    if ins.tag:
        line += " ; " + _format_tag(ins.tag)
    return line

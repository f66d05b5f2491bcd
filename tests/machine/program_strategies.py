"""Hypothesis strategies for random valid LPX instructions and programs."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from lpx_tvm.machine.encoding import f32_from_bits
from lpx_tvm.machine.isa import OPS, DType, Instr, Stream
from lpx_tvm.machine.program import Binding, Program, SramImage, TensorLayout

streams = st.builds(Stream, st.sampled_from("EW"), st.integers(0, 63))
finite_or_inf_f32 = st.floats(width=32, allow_nan=False)  # -0.0, subnormals, +-inf
nan_f32 = st.builds(lambda sign, mant: f32_from_bits((sign << 31) | 0x7F800000 | mant),
                    st.integers(0, 1), st.integers(1, 0x7FFFFF))
# A few repeated tags (to exercise the tag table), arbitrary text, and awkward cases.
tags = st.one_of(st.sampled_from(["", "", "conv1", "layer.0/matmul"]), st.text(max_size=12),
                 st.sampled_from([" lead", "trail ", '"quoted"', "a ; b", "tab\there", "new\nline", "#"]))

FIELD_VALUES = {
    "dtype": st.sampled_from(list(DType)),
    "out_dtype": st.sampled_from(list(DType)),
    "src0": st.one_of(streams, st.none()),
    "src1": st.one_of(streams, st.none()),
    "dst": st.one_of(streams, st.none()),
    "buf": st.integers(0, 255),
    "slice": st.integers(0, 2**16 - 1),
    "addr": st.integers(0, 2**32 - 1),
    "stride": st.integers(-(2**31), 2**31 - 1),
    "imm": finite_or_inf_f32,
    "aux0": st.integers(-(2**63), 2**63 - 1),
    "aux1": st.integers(-(2**63), 2**63 - 1),
}


@st.composite
def instrs(draw, op=None, imm=None):
    """A valid Instr: only the fields its opcode uses, optional ones sometimes default."""
    spec = OPS[op] if op else draw(st.sampled_from(list(OPS.values())))
    kw = {}
    for _, name in spec.fields:
        if name in spec.optional and draw(st.booleans()):
            continue
        kw[name] = draw(imm if name == "imm" and imm is not None else FIELD_VALUES[name])
    return Instr(op=spec.mnemonic, cycle=draw(st.integers(0, 2**64 - 1)), unit=draw(st.integers(0, 2**16 - 1)),
                 count=draw(st.integers(1, 2**32 - 1)), tag=draw(tags), **kw)


layouts = st.builds(
    TensorLayout,
    shape=st.lists(st.integers(0, 300), max_size=4).map(tuple),
    dtype=st.sampled_from([d for d in DType if d is not DType.NONE]),
    tiles=st.lists(st.tuples(st.integers(0, 87), st.integers(0, 2**20)), max_size=4).map(tuple),
    row_stride=st.integers(0, 64),
)
bindings = st.builds(Binding, st.text(max_size=10), st.sampled_from(["input", "output"]), layouts)
tables = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20).map(lambda v: np.array(v, dtype=np.int32))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)


@st.composite
def sram_images(draw, lanes):
    data = draw(st.binary(min_size=0, max_size=4).map(lambda b: b * lanes))  # whole lines only
    return SramImage(draw(st.integers(0, 87)), draw(st.integers(0, 2**20)), data)


@st.composite
def programs(draw, imm=None):
    """A random valid Program (instructions need not form a sensible schedule)."""
    lanes = draw(st.sampled_from([16, 320]))
    return Program(
        config_hash=draw(st.binary(min_size=16, max_size=16)).hex(),
        instrs=draw(st.lists(instrs(imm=imm), max_size=12)),
        sram_init=draw(st.lists(sram_images(lanes), max_size=3)),
        host_init=draw(st.binary(max_size=100)),
        host_bytes=draw(st.integers(0, 2**40)),
        bindings=draw(st.lists(bindings, max_size=3)),
        tables=draw(st.lists(tables, max_size=3)),
        symbols=draw(st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
        name=draw(st.text(max_size=16)),
    )

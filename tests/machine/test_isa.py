"""The instruction record: the named fields of its per-opcode auxiliary operands."""

import pytest

from lpx_tvm.machine.isa import Instr

def test_named_fields_read_each_opcodes_auxiliary_field():
    """Instr's named accessors read the aux field the opcode's spec names, and an opcode
    without that field raises (a reader cannot take sxm.pad's width for install's)."""
    from lpx_tvm.machine.isa import AUX_NAMES, OPS

    pad = Instr("sxm.pad", 0, aux0=3, aux1=7)
    assert (pad.before, pad.width) == (3, 7)
    install = Instr("mxm.install", 0, aux0=5, aux1=2)
    assert (install.width, install.lane) == (5, 2)
    read = Instr("mem.read", 0, aux0=4, aux1=9)
    assert (read.inner, read.outer) == (4, 9)
    assert Instr("dma.load", 0, aux0=64).host == 64
    assert Instr("vxm.requant", 0, aux0=-3).zp == -3
    assert Instr("sxm.broadcast", 0, aux0=11).lane == 11
    with pytest.raises(AttributeError, match="mxm.mul has no field 'width'"):
        Instr("mxm.mul", 0).width
    # every aux operand of every opcode has an accessor
    for op, names in AUX_NAMES.items():
        for name, f in names.items():
            assert getattr(Instr(op, 0, **{f: 13}), name) == 13, (op, name)
    assert set(AUX_NAMES) == set(OPS)

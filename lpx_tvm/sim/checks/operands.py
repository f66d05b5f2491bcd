"""Static operand checks: an instruction's fields alone, before the run (``bad-operand``)."""

from __future__ import annotations

from ...errors import ScheduleHazard
from ...machine import timing as tm
from ...machine.isa import DType, Unit, queue_name
from . import dma, mem, mxm, sxm, vxm

_BY_UNIT = {Unit.MEM: mem.operand_problems, Unit.DMA: dma.operand_problems, Unit.MXM: mxm.operand_problems,
            Unit.VXM: vxm.operand_problems, Unit.SXM: sxm.operand_problems}


def validate(cfg, program, i: int, ins):
    """Raise ``bad-operand`` naming every problem of instruction ``i``'s fields."""
    unit, idx = ins.queue
    problems = []
    if not 0 <= idx < tm.unit_count(cfg, unit):
        problems.append(f"{unit.name} index {idx} out of range 0..{tm.unit_count(cfg, unit) - 1}")
    for name in ("src0", "src1", "dst"):
        s = getattr(ins, name)
        if s is not None and s.id >= (cfg.streams_east if s.dir == "E" else cfg.streams_west):
            problems.append(f"stream {s} does not exist ({cfg.streams_east} east, {cfg.streams_west} west)")
    spec = ins.spec
    for f in ("src0", "dst"):
        if f in spec.field_names and f not in spec.optional and getattr(ins, f) is None:
            problems.append(f"missing {dict((b, a) for a, b in spec.fields)[f]} stream")
    if "dtype" in spec.field_names and ins.dtype is DType.NONE:
        problems.append("missing dtype")
    by_unit = _BY_UNIT.get(unit)
    if by_unit is not None:
        problems += by_unit(cfg, program, ins)
    if problems:
        raise ScheduleHazard("bad-operand", "; ".join(problems), index=i, instr=str(ins),
                             unit=queue_name(ins.queue), cycle=ins.cycle)

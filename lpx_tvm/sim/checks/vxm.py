"""VXM: elementwise, transcendental, conversion and reduction ops on stream operands."""

from __future__ import annotations

import numpy as np

from ...machine.isa import VXM_BINARY, VXM_REDUCE, VXM_TRANSCENDENTAL, DType
from .. import numerics as nx
from ..replay_steps import Vxm


def operand_problems(cfg, program, ins) -> list:
    op, problems = ins.op, []
    if op in VXM_REDUCE and not 1 <= ins.width <= cfg.lanes:
        problems.append(f"width {ins.width} out of range 1..{cfg.lanes}")
    if op == "vxm.requant" and (ins.dtype is not DType.INT32 or ins.out_dtype not in (DType.INT8, DType.UINT8)):
        problems.append("requant converts int32 to int8 or uint8")
    if op == "vxm.cvt" and ins.out_dtype is DType.NONE:
        problems.append("missing target dtype")
    return problems


def vxm(run, i, ins, t, _):
    op, dt = ins.op, ins.dtype
    a = run.read_stream(ins, ins.src0, dt, t.position)
    b = imm = None
    out_dt = dt
    if op in VXM_BINARY or op == "vxm.requant":
        if ins.src1 is not None:
            b = run.read_stream(ins, ins.src1, DType.FP32 if op == "vxm.requant" else dt, t.position)
        else:
            imm = float(np.float32(ins.imm)) if op == "vxm.requant" else nx.imm_value(ins.imm, dt)
    if op in VXM_TRANSCENDENTAL and not dt.is_float:
        raise nx.NumericsError(f"{op} needs a float dtype, got {dt.short}")
    if op in ("vxm.cvt", "vxm.requant"):
        out_dt = ins.out_dtype
    if op == "vxm.reduce_sum" and dt in (DType.INT8, DType.UINT8):
        raise nx.NumericsError("reduce_sum of int8/uint8 would overflow; convert to int32 first")
    k = run.record(Vxm(i, op, dt, out_dt, ins.count, a, b, imm, ins.aux0),
                   (a.producer,) if b is None else (a.producer, b.producer), i)
    run.notes.fresh[i] = ins.count
    if op in VXM_BINARY and dt is DType.FP32:
        run.notes.fp32_binary.append((k, i, a, b))
    run.emit(i, ins, t, out_dt)


HANDLERS = {"vxm.*": vxm}

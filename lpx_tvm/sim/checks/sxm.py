"""SXM: lane movement (shift, rotate, permute, transpose, broadcast, pad)."""

from __future__ import annotations

import numpy as np

from ..replay_steps import Sxm


def operand_problems(cfg, program, ins) -> list:
    op, problems = ins.op, []
    if op == "sxm.transpose" and (ins.count > cfg.lanes or not 1 <= ins.out <= cfg.lanes):
        problems.append(f"transpose takes at most {cfg.lanes} vectors and emits 1..{cfg.lanes}")
    if op == "sxm.broadcast" and not 0 <= ins.lane < cfg.lanes:
        problems.append(f"lane {ins.lane} out of range")
    if op == "sxm.permute":
        if not 0 <= ins.map < len(program.tables):
            problems.append(f"permutation map {ins.map} not in the program's {len(program.tables)} tables")
        else:
            t = np.asarray(program.tables[ins.map])
            if t.shape != (cfg.lanes,) or t.min() < -1 or t.max() >= cfg.lanes:
                problems.append(f"permutation map {ins.map} must have {cfg.lanes} entries in -1..{cfg.lanes - 1}")
    return problems


def sxm(run, i, ins, t, _):
    a = run.read_stream(ins, ins.src0, ins.dtype, t.position)
    run.record(Sxm(i, ins.op, ins.count, a, ins.aux0, ins.aux1), (a.producer,), i)
    run.emit(i, ins, t, ins.dtype)


HANDLERS = {"sxm.*": sxm}

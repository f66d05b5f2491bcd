"""MEM: reads, writes, gathers and scatters of SRAM lines, checked against the lines' race stamps."""

from __future__ import annotations

import numpy as np

from ...machine.isa import DType
from ...machine.timing import mem_write_landing
from ..memory import _bounds
from ..replay_steps import MemRead, MemReadLines, MemWrite, MemWriteLines


def operand_problems(cfg, program, ins) -> list:
    if ins.op in ("mem.read", "mem.write") and ins.inner < 0:
        return [f"inner count {ins.inner} must be >= 0"]
    return []


def count_sram(run, ins, read: bool):
    nbytes = ins.count * run.cfg.lanes * ins.dtype.itemsize
    tagc = run.counters.by_tag[ins.tag]
    if read:
        run.counters.sram_bytes_read += nbytes
        tagc.sram_bytes_read += nbytes
    else:
        run.counters.sram_bytes_written += nbytes
        tagc.sram_bytes_written += nbytes


def mem_read(run, i, ins, t, _):
    w = ins.dtype.itemsize
    index = run.sram.read(ins.unit, ins.addr, ins.stride, ins.count, w, ins.cycle, i,
                          inner=ins.inner, outer=ins.outer)
    count_sram(run, ins, read=True)
    source = (ins.unit, ins.addr, ins.stride, ins.inner, ins.outer, ins.dtype, int(run.sram.generation[ins.unit]))
    run.emit(i, ins, t, ins.dtype, source)
    spec = run.sram.vectors_spec(ins.unit, ins.addr, ins.stride, ins.count, w, w, ins.inner, ins.outer)
    if spec is None:
        run.record(MemReadLines(i, ins.unit, index, ins.count, ins.dtype.np), makes=i)
        return
    run.notes.reads.append((len(run.steps), i, ins.unit, *_bounds(index)))  # a replay may share it (finalize)
    run.record(MemRead(i, spec, ins.count, ins.dtype.np), makes=i)


def mem_write(run, i, ins, t, _):
    src = run.read_stream(ins, ins.src0, ins.dtype, t.position)
    w = ins.dtype.itemsize
    index = run.sram.write(ins.unit, ins.addr, ins.stride, ins.count, w,
                           mem_write_landing(run.cfg, ins), i, inner=ins.inner, outer=ins.outer)
    run.note_write(ins.unit, index)
    count_sram(run, ins, read=False)
    spec = run.sram.vectors_spec(ins.unit, ins.addr, ins.stride, ins.count, w, w, ins.inner, ins.outer, write=True)
    if spec is None:
        run.record(MemWriteLines(ins.unit, index, src, ins.count), (src.producer,))
    else:
        run.record(MemWrite(spec, src, ins.count), (src.producer,))


def mem_gather(run, i, ins, t, _):
    # The addresses are data: only a run that computes can check them (see Simulator._run).
    src = run.read_stream(ins, ins.src0, DType.INT32, t.position)
    if run.ex is not None:
        idx = run.ex.operand(src.producer, src.offset, ins.count)
        addrs = ins.addr + idx[:, 0].astype(np.int64) * ins.stride
        index = run.sram.gather(ins.unit, addrs, ins.dtype.itemsize, ins.cycle, i)
        run.record(MemReadLines(i, ins.unit, index, ins.count, ins.dtype.np), (src.producer,), i)
    count_sram(run, ins, read=True)
    run.emit(i, ins, t, ins.dtype)


def mem_scatter(run, i, ins, t, _):
    # The addresses are data, as for a gather: only a run that computes can check them.
    src = run.read_stream(ins, ins.src0, ins.dtype, t.position)
    idx = run.read_stream(ins, ins.src1, DType.INT32, t.position)
    if run.ex is not None:
        rows = run.ex.operand(idx.producer, idx.offset, ins.count)
        addrs = ins.addr + rows[:, 0].astype(np.int64) * ins.stride
        index = run.sram.scatter(ins.unit, addrs, ins.dtype.itemsize, mem_write_landing(run.cfg, ins), i)
        run.note_write(ins.unit, index)
        run.record(MemWriteLines(ins.unit, index, src, ins.count), (src.producer, idx.producer))
    count_sram(run, ins, read=False)


HANDLERS = {"mem.read": mem_read, "mem.write": mem_write, "mem.gather": mem_gather, "mem.scatter": mem_scatter}

"""DMA: SRAM <-> off-chip memory; SRAM lines are checked, off-chip bytes only for range."""

from __future__ import annotations

from ..memory import Race
from ..replay_steps import DmaLoad, DmaLoadLines, DmaStore


def operand_problems(cfg, program, ins) -> list:
    if ins.op in ("dma.load", "dma.store") and not 0 <= ins.slice < cfg.mem_slices:
        return [f"slice {ins.slice} out of range 0..{cfg.mem_slices - 1}"]
    return []


def _host_range(run, ins):
    nbytes = ins.count * run.cfg.lanes * ins.dtype.itemsize
    if ins.host < 0 or ins.host + nbytes > run.host_size:
        raise Race("address-out-of-range", f"off-chip bytes {ins.host}..{ins.host + nbytes - 1} outside "
                                           f"the program's {run.host_size} bytes of off-chip memory")
    return ins.host, nbytes


def _count(run, ins, nbytes, load: bool):
    c, tagc = run.counters, run.counters.by_tag[ins.tag]
    tagc.offchip_bytes += nbytes
    if load:
        c.offchip_bytes_read += nbytes
        c.sram_bytes_written += nbytes
        tagc.sram_bytes_written += nbytes
    else:
        c.offchip_bytes_written += nbytes
        c.sram_bytes_read += nbytes
        tagc.sram_bytes_read += nbytes


def dma_load(run, i, ins, t, _):
    lo, nbytes = _host_range(run, ins)
    index = run.sram.write(ins.slice, ins.addr, ins.stride, ins.count, ins.dtype.itemsize, t.done, i,
                           per_vector=False)
    run.note_write(ins.slice, index)
    _count(run, ins, nbytes, load=True)
    spec = run.sram.vectors_spec(ins.slice, ins.addr, ins.stride, ins.count, ins.dtype.itemsize, 1, write=True)
    if spec is None:
        run.record(DmaLoadLines(ins.slice, index, lo, lo + nbytes))
    else:
        run.record(DmaLoad(spec, lo, lo + nbytes))


def dma_store(run, i, ins, t, _):
    lo, nbytes = _host_range(run, ins)
    run.sram.read(ins.slice, ins.addr, ins.stride, ins.count, ins.dtype.itemsize, ins.cycle, i, per_vector=False)
    _count(run, ins, nbytes, load=False)
    spec = run.sram.vectors_spec(ins.slice, ins.addr, ins.stride, ins.count, ins.dtype.itemsize, 1)
    run.record(DmaStore(spec, lo, lo + nbytes))


HANDLERS = {"dma.load": dma_load, "dma.store": dma_store}

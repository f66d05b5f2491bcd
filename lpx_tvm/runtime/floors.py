"""Lower bounds, in cycles, of the work a list of instructions does on one machine.

Each floor is the time one kind of resource needs for that work if every instance of the
resource were busy every cycle, read from the machine config:

- ``multiply``: MXM compute, ``count * cycles_per_vector / mxm_planes`` summed over
  ``mxm.mul`` / ``mxm.mac`` (the rate of the slower of the activation and the installed
  weights, as :func:`~lpx_tvm.machine.timing.mxm_rate` has it);
- ``install``: weight installs, ``count * itemsize / (mxm_planes * mxm_install_streams)``
  summed over ``mxm.install`` (a stream carries ``lanes`` bytes a cycle, so an fp16 row
  takes two stream-cycles);
- ``sram_read``: ``count * itemsize`` lines over ``mem.read`` / ``mem.gather``, divided by
  ``mem_slices * mem_read_ports`` (a slice port moves one line of ``lanes`` bytes a cycle);
  ``sram_write`` likewise over ``mem.write`` / ``mem.scatter`` and the write ports;
- ``stream``: the stream-cycles of every emitted value (its vectors times its dtype's
  itemsize) over all the stream registers, ``streams_east + streams_west``;
- ``vxm``: VXM ALU busy cycles over ``vxm_alus``; ``sxm``: SXM busy cycles over the
  floorplan's SXMs (busy cycles as :func:`~lpx_tvm.machine.timing.timing` occupies them);
- ``dma``: off-chip bytes over ``offchip_bytes_per_cycle`` per DMA engine (each engine
  moves at that rate in the timing model); latency is not counted.

They bound the program's *own* work: its tiling, padding and re-reads included, so a
floor says how far a schedule is from what its instructions need, not from what the
model's arithmetic would need under a better tiling. Nops do no work and count nowhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..machine.config import LPXConfig
from ..machine.isa import NOPS, DType, Instr, Unit
from ..machine.timing import mxm_rate, timing, unit_count


@dataclass(frozen=True)
class Floors:
    """Lower bounds in cycles, one per resource kind (see the module docstring)."""

    multiply: float = 0.0
    install: float = 0.0
    sram_read: float = 0.0
    sram_write: float = 0.0
    stream: float = 0.0
    vxm: float = 0.0
    sxm: float = 0.0
    dma: float = 0.0

    def largest(self) -> tuple:
        """``(kind, cycles)`` of the binding floor (the first kind, in field order, on ties)."""
        best = max(fields(self), key=lambda f: getattr(self, f.name))
        return best.name, getattr(self, best.name)

    def to_json(self) -> dict:
        return asdict(self)


_EMITTERS = ("mem.read", "mem.gather", "mxm.drain", "c2c.recv")


def floors_of(cfg: LPXConfig, instrs) -> Floors:
    """The :class:`Floors` of ``instrs`` (any list of :class:`Instr`: one layer's, one
    program's) on machine ``cfg``."""
    multiply_cycles = install_stream_cycles = read_lines = write_lines = 0
    stream_cycles = vxm_busy = sxm_busy = dma_bytes = 0
    installed = {}  # (plane, buffer) -> weight dtype, walked in issue order as the machine runs
    for ins in sorted(instrs, key=lambda i: i.cycle):
        op, n = ins.op, ins.count
        if op in NOPS:
            continue
        size = ins.dtype.itemsize
        if op == "mxm.install":
            installed[ins.unit, ins.buf] = ins.dtype
            install_stream_cycles += n * size
        elif op in ("mxm.mul", "mxm.mac"):
            weights = installed.get((ins.unit, ins.buf))
            multiply_cycles += n * mxm_rate(cfg, ins.dtype, weights if weights not in (None, DType.NONE) else ins.dtype)
        elif op in ("mem.read", "mem.gather"):
            read_lines += n * size
        elif op in ("mem.write", "mem.scatter"):
            write_lines += n * size
        elif op in ("dma.load", "dma.store"):
            dma_bytes += n * cfg.lanes * size
        unit = ins.spec.unit
        if unit in (Unit.VXM, Unit.SXM) or op in _EMITTERS:
            t = timing(cfg, ins)
            stream_cycles += t.emit_count * _emitted_dtype(ins).itemsize
            if unit is Unit.VXM:
                vxm_busy += t.occupancy
            elif unit is Unit.SXM:
                sxm_busy += t.occupancy
    return Floors(
        multiply=multiply_cycles / cfg.mxm_planes,
        install=install_stream_cycles / cfg.install_vectors_per_cycle,
        sram_read=read_lines / cfg.sram_read_vectors_per_cycle,
        sram_write=write_lines / (cfg.mem_slices * cfg.mem_write_ports),
        stream=stream_cycles / (cfg.streams_east + cfg.streams_west),
        vxm=vxm_busy / cfg.vxm_alus,
        sxm=sxm_busy / unit_count(cfg, Unit.SXM),
        dma=dma_bytes / (cfg.offchip_bytes_per_cycle * cfg.dma_engines),
    )


def _emitted_dtype(ins: Instr) -> DType:
    """The dtype of the value ``ins`` puts on its stream (a conversion's target type)."""
    return ins.out_dtype if ins.op in ("vxm.cvt", "vxm.requant") else ins.dtype


def add(*floors: Floors) -> Floors:
    """The floors of regions run one after another: each kind's floors add."""
    return Floors(**{f.name: sum(getattr(x, f.name) for x in floors) for f in fields(Floors)})

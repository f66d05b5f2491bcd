"""The LPX executable: a Relax VM executable whose LPX regions run on the simulator.

Each compiled region is an extern call (``R.call_dps_packed("lpx.region.<name>")``) in
the VM program. Before a VirtualMachine is made, :meth:`LPXExecutable.register`
registers one Python packed function per region; it converts the VM's NCHW tensors to
the region's NHWC storage, runs the region's Program on a simulator of the machine,
and writes the outputs back. Cycles add up across regions; time spent in CPU ops is
measured apart.

Making an executable (building or loading one) loads every region's program onto a
simulator of its own, as a chip loads a program: its schedule is verified (a program
that breaks a timing rule fails there) and its initial SRAM image (the weights) is put
in place. Every run then replays the verified program and restores only the SRAM lines
the previous run changed (docs/design.md, "Verify once, replay").

The executable is made whole by whoever makes it (the pipeline, or an artifact being
loaded): its regions, machine, precision, offload report and tuning summary are
constructor data; what follows from them (the MXM dtypes, each region's per-layer
cycles) is computed here.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import tvm
from tvm import relax

from ..machine.config import LPXConfig
from ..sim import Simulator
from .compiled_region import REGION_PREFIX
from .report import Layer, Offload, layer_cycles, layer_instructions, layer_of, mxm_dtypes, weight_placement


@dataclass
class RunStats:
    """Counters of the last run, summed over its region calls."""

    cycles: int = 0
    macs: int = 0  # the simulator's count (whole MXM tiles)
    # The compiler's count of useful MACs, added per call: structurally equal regions
    # share one compiled definition that runs once per call site.
    useful_macs: int = 0
    region_calls: int = 0
    sim_wall_s: float = 0.0
    total_wall_s: float = 0.0
    calls: Counter = field(default_factory=Counter)  # region name -> calls
    layer_macs: Counter = field(default_factory=Counter)  # (region name, layer tag) -> MACs
    sram_bytes: int = 0
    offchip_bytes: int = 0


def to_storage(arr: np.ndarray, transform: "dict | None" = None) -> np.ndarray:
    """A region input as the region stores it: NHWC, or im2col rows for an image stem."""
    if transform is not None:
        return im2col(arr, transform)
    return arr.transpose(0, 2, 3, 1) if arr.ndim == 4 else arr


def im2col(x: np.ndarray, t: dict) -> np.ndarray:
    """NCHW -> (N*OH*OW, KH*KW*C) rows, column (kh * KW + kw) * C + c (the host's layout
    work for an image stem convolution)."""
    kh, kw = t["kernel"]
    (sh, sw), (dh, dw) = t["strides"], t["dilation"]
    pt, pl, pb, pr = t["padding"]
    xp = np.pad(x.transpose(0, 2, 3, 1), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    n, hp, wp, c = xp.shape
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    # Every window as a strided view (n, oh, ow, kh, kw, c) of the padded image; one copy.
    s = xp.strides
    windows = np.lib.stride_tricks.as_strided(xp, (n, oh, ow, kh, kw, c),
                                              (s[0], sh * s[1], sw * s[2], dh * s[1], dw * s[2], s[3]),
                                              writeable=False)
    return windows.reshape(n * oh * ow, kh * kw * c)


def from_storage(arr: np.ndarray) -> np.ndarray:
    return arr.transpose(0, 3, 1, 2) if arr.ndim == 4 else arr


class LPXExecutable:
    """A VM executable with its LPX regions, for one machine and precision.

    Parameters
    ----------
    vm_exec : tvm.relax.VMExecutable or None
        The CPU part, with extern calls to the regions (None: regions only, for a VM
        built elsewhere, as ``tvm.compile(..., relax_pipeline="lpx")`` does).
    regions : dict of str to CompiledRegion
    config : LPXConfig
    precision : str
    offload : Offload, optional
        What ran on LPX and what on the CPU.
    tuning : dict, optional
        With a tuning log: ``{"log", "tuned_layers", "default_layers"}``.
    """

    def __init__(self, vm_exec, regions: dict, config: LPXConfig, precision: str,
                 offload: "Offload | None" = None, tuning: "dict | None" = None):
        self.vm_exec = vm_exec
        self.regions = regions  # name -> CompiledRegion
        self.config = config
        self.precision = precision
        self.offload = offload
        self.tuning = tuning
        self.stats = RunStats()
        self._registered = False
        # A VM instrument function (see relax.VirtualMachine.set_instrument) each run's VM
        # gets: how the profiler sees the order of region calls and CPU kernels.
        self.instrument = None
        # One simulator per region: each keeps its program's image loaded between runs.
        self._sims = {}
        for name, region in regions.items():
            self._sims[name] = Simulator(config)
            self._sims[name].load(region.program)

    def register(self, keep_alive: bool = False):
        """Register the regions' packed functions (needed before a VirtualMachine is made).

        The registry holds them by name for the whole process. They reach this executable
        through a weak reference, and are removed when it is freed: a process that
        compiles many models does not keep every one's programs and simulators (hundreds
        of MiB each on ``tsp``). ``keep_alive``: the registry keeps the executable alive
        (for ``tvm.compile(..., relax_pipeline="lpx")``, whose caller holds only the VM).
        """
        if self._registered:
            return
        self._registered = True
        names = [REGION_PREFIX + name for name in self.regions]
        target = (lambda: self) if keep_alive else weakref.ref(self)
        for name, region in self.regions.items():
            tvm.register_global_func(REGION_PREFIX + name, _region_call(target, name), override=True)
        if not keep_alive:
            weakref.finalize(self, _unregister, names)

    def _call(self, name: str, *args):
        """Run region ``name``: ``args`` are its input tensors, then its output tensors."""
        region, sim = self.regions[name], self._sims[name]
        ins, outs = args[:len(region.inputs)], args[len(region.inputs):]
        feed = {inp: to_storage(a.numpy(), region.input_transforms.get(inp))
                for (inp, _), a in zip(region.inputs, ins)}
        t = time.perf_counter()
        result = sim.run(region.program, feed)
        self._account(region, result, time.perf_counter() - t)
        for (out_name, _), out in zip(region.outputs, outs):
            out.copyfrom(np.ascontiguousarray(from_storage(result.outputs[out_name])).astype(out.dtype))

    def _account(self, region, result, wall):
        s = self.stats
        c = result.counters
        s.cycles += c.cycles
        s.macs += c.macs
        s.useful_macs += region.macs
        s.region_calls += 1
        s.sim_wall_s += wall
        s.sram_bytes += c.sram_bytes_read + c.sram_bytes_written
        s.offchip_bytes += c.offchip_bytes_read + c.offchip_bytes_written
        s.calls[region.name] += 1
        for tag, t in c.by_tag.items():
            if t.macs:
                s.layer_macs[region.name, layer_of(tag)] += t.macs

    @cached_property
    def mxm_dtypes(self) -> list:
        """The activation dtypes the regions' MXM multiplies (int8 / uint8: the int8 rate)."""
        return mxm_dtypes(r.program for r in self.regions.values())

    @cached_property
    def _region_layers(self) -> dict:
        # The schedule is static: one run's attribution holds for every run of a region.
        return {name: (layer_cycles(self.config, r.program), layer_instructions(r.program),
                       weight_placement(self.config, r.program))
                for name, r in self.regions.items()}

    def layers(self) -> list:
        """Per-layer numbers of the last run (:class:`~lpx_tvm.runtime.report.Layer`), by
        stable layer name, in the order the regions first ran; their cycles add up to
        ``stats.cycles`` (docs/report.md)."""
        rows = {}
        s = self.stats
        for name, calls in s.calls.items():
            region = self.regions[name]
            cycles, counts, placement = self._region_layers[name]
            for tag, n in cycles.items():
                # A tag without a known name stays apart per region (tags repeat across regions).
                key = region.layer_names.get(tag) or (tag if tag.startswith("(") else f"{name}/{tag}")
                row = rows.setdefault(key, Layer(key))
                if row.weights is None and tag in placement:
                    row.weights = placement[tag]
                row.cycles += n * calls
                row.instructions += counts.get(tag, 0) * calls
                row.macs += s.layer_macs.get((name, tag), 0)
        idle = [r for r in rows.values() if r.name.startswith("(")]
        return [r for r in rows.values() if not r.name.startswith("(")] + idle

    def vm(self, device=None) -> relax.VirtualMachine:
        self.register()
        vm = relax.VirtualMachine(self.vm_exec, device or tvm.cpu())
        if self.instrument is not None:
            vm.set_instrument(self.instrument)
        return vm

    def run(self, inputs: list) -> list:
        """Run ``main`` on numpy inputs (in parameter order); returns numpy outputs."""
        self.stats = RunStats()
        vm = self.vm()
        t = time.perf_counter()
        # np.array, not np.ascontiguousarray: the latter turns a 0-d input into 1-d.
        out = vm["main"](*[tvm.runtime.tensor(np.array(a, copy=True, order="C")) for a in inputs])
        self.stats.total_wall_s = time.perf_counter() - t
        outs = list(out) if isinstance(out, (list, tuple)) or hasattr(out, "__len__") and not hasattr(out, "numpy") \
            else [out]
        return [o.numpy() for o in outs]


def _region_call(executable, name: str):
    """The packed function of region ``name``: ``executable()`` gives its executable."""
    def call(*args):
        exe = executable()
        if exe is None:
            raise RuntimeError(f"LPX region {name} was called after its executable was freed")
        exe._call(name, *args)
    return call


def _unregister(names: list):
    import tvm_ffi

    for name in names:
        tvm_ffi.remove_global_func(name)

"""Tuning tasks and their design spaces.

A task is one distinct MXM layer of a model's LPX regions: its TensorIR workload (a
matmul, a batched matmul's per-batch matmul, a dense or depthwise convolution, in
storage shapes), the composite it came from (which names its fused epilogue), and the
batch count. Its design space is written with :class:`ScheduleFn` and sampling
instructions, over the decisions LPX codegen reads back from the tile block:

- ``rows``: output rows (matmul) or output image rows (convolution) per accumulator
  block, ``sample_perfect_tile`` of that loop with the innermost factor bounded by half
  the accumulators (the other half drains meanwhile);
- ``k_split``: how many MXM planes share one block's reduction tiles
  (``sample_categorical`` over 1 .. planes); each part accumulates its own partial sum;
- ``first_plane``: the plane of the layer's first block (``sample_categorical`` over the
  planes; the others follow round robin), and ``install_ahead``: how many of each
  plane's first installs are issued ahead of the previous layers' remaining work (0, 1
  or 2: the weight buffers). Both place the layer among its neighbours, so they are
  judged in context (:mod:`.refine`); measured alone they change little;
- the loop order of the tile loops (``mnk`` / ``nmk``, ``noc`` / ``nco``): a structural
  choice, so one design space per order;
- for a convolution with few input channels (at most half a tile), whether and how its
  taps are packed side by side into reduction tiles by an im2col built on chip
  (``packings``: ``"taps"`` or ``"rows"``): also structural, so a design space each.

Reduction and channel tiles are whole weight tiles (``lanes``). :class:`LPXFits` rejects
what cannot run (blocks past the accumulators, more parts than reduction tiles), and
:class:`MutateCategorical` lets evolutionary search move the categorical decisions.
The default tiling is one point of this space (:func:`default_decisions`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, fields

import tvm
from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..machine.config import LPXConfig
from ..tir_schedules import Conv2dWorkload, DenseWorkload, DepthwiseWorkload, default_tiling
from ..tir_schedules.schedules import apply_tiling, k_split_rule, packed_tiles, packings, tiling_of
from ..tir_schedules.workloads import MXM_BLOCK

AHEAD = (0, 1, 2)  # install_ahead choices: up to the double weight buffer
WORKLOADS = {c.__name__: c for c in (DenseWorkload, Conv2dWorkload, DepthwiseWorkload)}


def workload_to_json(work) -> str:
    return json.dumps({"kind": type(work).__name__, **{f.name: getattr(work, f.name) for f in fields(work)}},
                      sort_keys=True)


def workload_from_json(text: str):
    d = dict(json.loads(text))
    cls = WORKLOADS[d.pop("kind")]
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@dataclass
class Task:
    """One distinct MXM layer: ``key`` = (workload, composite, batches) as codegen looks it
    up, ``region`` a one-op region that measures it, ``weight`` how often the model has it."""

    key: tuple
    region: object  # lpx_tvm.target.codegen.graph.Region
    precision: str
    weight: int = 1

    @property
    def workload(self):
        return self.key[0]

    @property
    def name(self) -> str:
        w, composite, batches = self.key
        if isinstance(w, DenseWorkload):
            shape = f"{batches}x{w.M}x{w.K}x{w.N}" if batches > 1 else f"{w.M}x{w.K}x{w.N}"
            kind = "bmm" if batches > 1 else "matmul"
        else:
            k = f"{w.KH}x{w.KW}s{w.stride[0]}"
            if isinstance(w, DepthwiseWorkload):
                kind, shape = "dwconv", f"{w.OH}x{w.OW}x{w.C}_{k}"
            else:
                kind, shape = "conv", f"{w.OH}x{w.OW}x{w.C}x{w.CO}_{k}"
        epi = composite.removeprefix("lpx.")
        return f"{kind}_{shape}_{w.dtype}_{epi}"


def workload_module(task: Task, cfg: LPXConfig) -> tvm.IRModule:
    """The task's TensorIR workload as MetaSchedule stores it: the PrimFunc, with the
    machine's config hash, the composite and the batch count as attributes, so that a
    record is keyed by workload *and* machine."""
    w, composite, batches = task.key
    func = w.prim_func().with_attr({
        "global_symbol": "main",
        "lpx_config_hash": cfg.hash,
        "lpx_preset": cfg.name,
        "lpx_workload": workload_to_json(w),
        "lpx_composite": composite,
        "lpx_batches": batches,
    })
    return tvm.IRModule({"main": func})


def task_key_of(mod: tvm.IRModule) -> tuple:
    """(workload, composite, batches, config hash) of a workload module."""
    a = mod["main"].attrs
    return (workload_from_json(str(a["lpx_workload"])), str(a["lpx_composite"]), int(a["lpx_batches"]),
            str(a["lpx_config_hash"]))


def _rows_loop_and_limit(sch: s_tir.Schedule, w, cfg: LPXConfig):
    half = cfg.mxm_acc_rows // 2
    loops = sch.get_loops(sch.get_sblock(MXM_BLOCK))
    if isinstance(w, DenseWorkload):
        return loops[0], w.M, half
    return loops[1], w.OH, max(1, half // w.OW)


def orders(w) -> tuple:
    return ("mnk", "nmk") if isinstance(w, DenseWorkload) else ("noc", "nco")


def structures(w, lanes: int) -> list:
    """The structural choices of a workload, one design space each: (order, tap packing)."""
    return [(order, pack) for pack in ("",) + packings(w, lanes) for order in orders(w)]


def reduction_tiles(w, lanes: int, pack: str = "") -> int:
    if isinstance(w, DenseWorkload):
        return w.K // lanes
    if isinstance(w, DepthwiseWorkload):
        return w.KH * w.KW
    if pack:
        return packed_tiles(w, lanes, pack)
    return w.KH * w.KW * (w.C // lanes)


def output_blocks(w, rows: int, lanes: int, batches: int = 1) -> int:
    if isinstance(w, DenseWorkload):
        return batches * (w.M // rows) * (w.N // lanes)
    channels = w.C if isinstance(w, DepthwiseWorkload) else w.CO
    return w.N * (w.OH // rows) * (channels // lanes)


def space_fn(w, cfg: LPXConfig):
    """The ScheduleFn body: one design space per structural choice (:func:`structures`)."""
    planes, lanes = cfg.mxm_planes, cfg.lanes

    def fn(sch: s_tir.Schedule):
        spaces = []
        for order, pack in structures(w, lanes):
            s = sch.copy()
            loop, _, limit = _rows_loop_and_limit(s, w, cfg)
            _, rows = s.sample_perfect_tile(loop, n=2, max_innermost_factor=limit)
            k_split = s.sample_categorical(list(range(1, planes + 1)), [1.0 / planes] * planes)
            first_plane = s.sample_categorical(list(range(planes)), [1.0 / planes] * planes)
            ahead = s.sample_categorical(list(AHEAD), [1.0 / len(AHEAD)] * len(AHEAD))
            apply_tiling(s, w, rows, lanes, lanes, order, k_split, pack, first_plane, ahead)
            spaces.append(s)
        return spaces

    return fn


def default_decisions(task: Task, cfg: LPXConfig) -> dict:
    """The default tiling as a point of the space: order, rows, k_split (the value codegen's
    rule gives), so that it compiles to the very program an untuned build makes."""
    w, _, batches = task.key
    t = default_tiling(cfg, w)
    rows = t.m if isinstance(w, DenseWorkload) else t.oh
    k_split = k_split_rule(cfg, output_blocks(w, rows, cfg.lanes, batches))
    return {"order": t.order, "rows": rows, "k_split": k_split, "pack": "", "first_plane": 0, "install_ahead": 0}


def fits(w, tiling, cfg: LPXConfig) -> "str | None":
    """Why a tiling cannot run (None when it can)."""
    rows = tiling.m if isinstance(w, DenseWorkload) else tiling.oh
    pixels = rows if isinstance(w, DenseWorkload) else rows * w.OW
    if pixels > cfg.mxm_acc_rows:
        return f"a block of {pixels} rows exceeds the {cfg.mxm_acc_rows} accumulators"
    pack = getattr(tiling, "pack", "")
    if pack and pack not in packings(w, cfg.lanes):
        return f"packing {pack!r} (this convolution can pack: {', '.join(packings(w, cfg.lanes)) or 'none'})"
    tiles = reduction_tiles(w, cfg.lanes, pack)
    if tiling.k_split is not None and tiling.k_split > max(1, tiles):
        return f"{tiling.k_split} K parts for {tiles} reduction tiles"
    if tiling.k_split is not None and tiling.k_split > cfg.mxm_planes:
        return f"{tiling.k_split} K parts on {cfg.mxm_planes} planes"
    if not 0 <= tiling.first_plane < cfg.mxm_planes:
        return f"first plane {tiling.first_plane} of {cfg.mxm_planes} planes"
    if tiling.install_ahead not in AHEAD:
        return f"{tiling.install_ahead} installs ahead (the choices: {', '.join(map(str, AHEAD))})"
    return None


@derived_object
class LPXFits(ms.postproc.PyPostproc):
    """Reject a candidate whose tiling cannot run on the machine (see :func:`fits`)."""

    def __init__(self, cfg: LPXConfig, workload):
        super().__init__()
        self.cfg, self.work = cfg, workload

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch: s_tir.Schedule) -> bool:
        try:
            return fits(self.work, tiling_of(self.work, sch.mod["main"]), self.cfg) is None
        except (ValueError, KeyError):
            return False

    def clone(self):
        return LPXFits(self.cfg, self.work)


@derived_object
class MutateCategorical(ms.mutator.PyMutator):
    """Move one ``sample_categorical`` decision of a trace to another candidate."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.rng = random.Random(seed)

    def _initialize_with_tune_context(self, context) -> None:
        self.rng = random.Random(int(context.rand_state) if context.rand_state >= 0 else 0)

    def apply(self, trace, _):
        insts = [i for i in trace.insts if i.kind.name == "SampleCategorical"]
        insts = [i for i in insts if len(i.attrs[0]) > 1]
        if not insts:
            return None
        inst = self.rng.choice(insts)
        current = int(trace.decisions[inst])
        choice = self.rng.choice([c for c in range(len(inst.attrs[0])) if c != current])
        return trace.with_decision(inst, tvm.runtime.convert(choice), remove_postproc=True)

    def clone(self):
        return MutateCategorical(self.rng.randrange(1 << 30))


def design_space(task: Task, cfg: LPXConfig) -> ms.space_generator.ScheduleFn:
    w = task.workload
    return ms.space_generator.ScheduleFn(
        space_fn(w, cfg), sch_rules=[], postprocs=[LPXFits(cfg, w)],
        mutator_probs={ms.mutator.MutateTileSize(): 0.5, MutateCategorical(): 0.5})


def trace_for(task: Task, cfg: LPXConfig, order: str, rows: int, k_split: int, pack: str = "",
              first_plane: int = 0, install_ahead: int = 0):
    """A schedule of the design space with the given decisions (None when they are not in it)."""
    if install_ahead not in AHEAD or not 0 <= first_plane < cfg.mxm_planes:
        return None
    w = task.workload
    if (order, pack) not in structures(w, cfg.lanes):
        return None
    i = structures(w, cfg.lanes).index((order, pack))
    sch = s_tir.Schedule(workload_module(task, cfg))
    space = space_fn(w, cfg)(sch)[i]
    trace = space.trace
    categorical = iter([k_split - 1, first_plane, AHEAD.index(install_ahead)])  # in the order space_fn samples
    for inst in trace.insts:
        if inst.kind.name == "SamplePerfectTile":
            extent = _rows_loop_and_limit(s_tir.Schedule(workload_module(task, cfg)), w, cfg)[1]
            if extent % rows:
                return None
            trace = trace.with_decision(inst, [extent // rows, rows], remove_postproc=True)
        elif inst.kind.name == "SampleCategorical":
            trace = trace.with_decision(inst, tvm.runtime.convert(next(categorical)), remove_postproc=True)
    out = s_tir.Schedule(workload_module(task, cfg))
    trace.apply_to_schedule(out, remove_postproc=False)
    return out

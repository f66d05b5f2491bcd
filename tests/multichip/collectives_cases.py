"""Random valid systems and collective calls, checked bit for bit against numpy.

``case(kind, index, seed)`` draws, from ``numpy.random.default_rng([seed, k, index, 0])``
(``k`` the kind's number; inputs from stream 1), as docs/fuzz.md's graphs are named:

- a machine: ``mini`` or ``tsp`` by name, or a machine file derived from ``mini`` with
  other C2C ports (4..24), link bandwidth (1e8..1e11 bytes/s, log-uniform), link latency
  (1..3000 cycles), lanes (16 or 32), slice size (so tensors span several SRAM chunks)
  and VXM/SRAM latencies;
- a system file over it, read through ``load_system`` from a folder (its machine file a
  relative path): ``topology: all_to_all`` with ``links_per_pair``, or a list of links
  in random order, orientation and ports: a group of pairwise linked chips (1..3 links a
  pair) among other chips and extra links, or a connected graph (a random tree plus
  extra edges, 1..3 links a pair) for a transfer along a path;
- a call: ``all_reduce``, ``reduce_scatter``, ``all_gather`` (``collective``), a
  multi-tile ``all_reduce_tiles`` (``emit_all_reduce`` on a tensor of several column
  tiles and SRAM chunks, as tensor parallelism calls it) or ``point_to_point``, over a
  group in random rank order, with random rows and dtype.

``run(case)`` builds the programs, runs them on the system simulator and returns the
problems found (empty when right): every chip's outputs against numpy bit for bit (a sum
in the documented order, each add rounded to the dtype; int32 wrapping; transfers of
random bit patterns), every message's arrival against ``n * ceil(lanes * itemsize /
bytes_per_cycle) + latency``, its ports against the system file's links, the bytes moved
against the algorithm's, a transfer's path against a breadth-first search, and the cycles
the programs claim against a functional and a timing-only run.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lpx_tvm.machine.config import preset_path
from lpx_tvm.machine.isa import DType
from lpx_tvm.machine import timing as tm
from lpx_tvm.machine.system import all_to_all, load_system
from lpx_tvm.sim.multichip import SystemSimulator
from lpx_tvm.target.system_programs import build_together, collective, emit_all_reduce, point_to_point, shards

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_reduce_tiles", "point_to_point")
ADDABLE = ("fp32", "fp16", "bf16", "int32")
ANY = ("fp32", "fp16", "bf16", "int32", "int8", "uint8", "fp8")
MINI = json.loads(preset_path("mini").read_text())


@dataclass
class Case:
    kind: str
    index: int
    seed: int
    machine: "dict | str"  # a machine file's JSON, or a preset's name
    system: dict  # the system file's JSON (its preset "chip.json" when machine is a dict)
    chips: tuple  # the group in rank order; for point_to_point (src, dst)
    rows: int
    dtype: str
    cols: int = 0  # all_reduce_tiles: columns (several tiles)
    spread: tuple = (1, 1)  # all_reduce_tiles: SRAM chunks asked for X and Y
    links: list = field(default_factory=list)  # every link [a, la, b, lb] of the system

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}-s{self.seed}"

    def describe(self) -> str:
        m = self.machine if isinstance(self.machine, str) else \
            f"{self.machine['name']} (lanes {self.machine['lanes']}, c2c {self.machine['c2c']})"
        how = self.system.get("topology", f"{len(self.links)} links")
        return (f"{self.name}: {self.system['chips']} chips of {m}, {how}; {self.kind} over {list(self.chips)}, "
                f"{self.rows} rows{f' x {self.cols} cols' if self.cols else ''} of {self.dtype}")


def case(kind: str, index: int, seed: int = 0) -> Case:
    """Case ``index`` of ``kind`` for ``seed`` (the same on every machine and run)."""
    rng = np.random.default_rng([seed, KINDS.index(kind), index, 0])
    machine = _machine(rng)
    ports, lanes = (machine["c2c"]["links"], machine["lanes"]) if isinstance(machine, dict) else \
        ({"mini": 4, "tsp": 16}[machine], {"mini": 16, "tsp": 320}[machine])
    if kind == "point_to_point":
        chips, links = _connected(rng, ports)
        src, dst = (int(c) for c in rng.choice(chips, 2, replace=False))
        system = {"links": links}
        group = (src, dst)
    elif rng.random() < 0.3:
        g = int(rng.integers(2, min(ports + 1, 8) + 1))
        per_pair = int(rng.integers(1, ports // (g - 1) + 1))
        chips = g + (1 if per_pair * g <= ports and rng.random() < 0.4 else 0)  # all_to_all joins every chip
        system = {"topology": "all_to_all"} if per_pair == 1 and rng.random() < 0.5 else \
            {"topology": "all_to_all", "links_per_pair": per_pair}
        links = [k.to_json() for k in all_to_all(chips, per_pair)]
        group = tuple(int(c) for c in rng.permutation(chips)[:g])
    else:
        chips, links, group = _group(rng, ports)
        system = {"links": links}
    kind_of = {"all_reduce": ADDABLE, "reduce_scatter": ADDABLE, "all_reduce_tiles": ADDABLE,
               "all_gather": ANY, "point_to_point": ANY}[kind]
    dtype = str(rng.choice(kind_of))
    n = len(group)
    big = machine != "tsp" and rng.random() < 0.15  # rows past one SRAM chunk
    if kind == "all_reduce":
        rows = int(rng.integers(1, 3 * n + 20)) if not big else int(rng.integers(100, 700))
    elif kind == "point_to_point":
        rows = int(rng.integers(1, 40)) if not big else int(rng.integers(100, 700))
    else:
        rows = int(rng.integers(n, 3 * n + 20)) if not big else int(rng.integers(100, 500))
    cols, spread = 0, (1, 1)
    if kind == "all_reduce_tiles":
        cols = int(rng.integers(lanes + 1, 3 * lanes + 1)) if rng.random() < 0.8 else lanes
        rows = int(rng.integers(1, 3 * n + 12)) if not big else int(rng.integers(60, 300))
        spread = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    # X and Y in at most half the SRAM (a valid call, not one the machine cannot hold)
    itemsize, ntiles = DType.parse(dtype).itemsize, -(-(cols or lanes) // lanes)
    rows = max(min(rows, _sram_lines(machine) // (4 * itemsize * ntiles)), n if kind != "point_to_point" else 1)
    system = {"name": f"fuzz-{kind}-{index}", "preset": "chip.json" if isinstance(machine, dict) else machine,
              "chips": chips, **system}
    return Case(kind, index, seed, machine, system, group, rows, dtype, cols, spread, links)


def _sram_lines(machine) -> int:
    return _slice_lines(machine) * _json(machine)["mem"]["slices"]


def _slice_lines(machine) -> int:
    m = _json(machine)
    return m["mem"]["slice_bytes"] // m["lanes"]


def _json(machine) -> dict:
    return machine if isinstance(machine, dict) else json.loads(preset_path(machine).read_text())


def _machine(rng):
    u = rng.random()
    if u < 0.15:
        return "mini"
    if u < 0.22:
        return "tsp"
    m = copy.deepcopy(MINI)
    m["name"] = "mini-fuzz"
    m["lanes"] = int(rng.choice([16, 32]))
    m["mem"]["slice_bytes"] = int(rng.choice([4096, 8192, 16384, 65536])) * (m["lanes"] // 16)
    m["c2c"] = {"links": int(rng.integers(4, 25)), "bytes_per_s": float(10 ** rng.uniform(8, 11)),
                "latency_cycles": int(rng.integers(1, 3001))}
    for key, hi in (("vxm_alu", 8), ("mem_read", 5), ("mem_write", 5)):
        m["latency"][key] = int(rng.integers(1, hi + 1))
    return m


def _join(rng, links: list, used: set, a: int, b: int, ports: int, keep: int = 0) -> bool:
    """Link chips ``a`` and ``b`` on random free ports (leaving ``keep`` free on each)."""
    free_a = [p for p in range(ports) if (a, p) not in used]
    free_b = [p for p in range(ports) if (b, p) not in used]
    if len(free_a) <= keep or len(free_b) <= keep:
        return False
    pa, pb = int(rng.choice(free_a)), int(rng.choice(free_b))
    used |= {(a, pa), (b, pb)}
    links.append([a, pa, b, pb] if rng.random() < 0.5 else [b, pb, a, pa])
    return True


def _group(rng, ports: int):
    """(chips, links, group): a group of pairwise linked chips (1..3 links a pair) among
    other chips, and extra links between any chips."""
    g = int(rng.integers(2, min(ports, 7) + 2))
    chips = g + int(rng.integers(0, 4))
    group = tuple(int(c) for c in rng.choice(chips, g, replace=False))
    links, used = [], set()
    pairs = [(a, b) for i, a in enumerate(group) for b in group[i + 1:]]
    for a, b in pairs:  # one link a pair first: g - 1 <= ports, so every pair gets one
        assert _join(rng, links, used, a, b, ports), "the generator left a pair of the group unlinked"
    for a, b in pairs:
        for _ in range(int(rng.integers(0, 3))):
            _join(rng, links, used, a, b, ports)
    for _ in range(int(rng.integers(0, chips + 1))):
        a, b = (int(c) for c in rng.choice(chips, 2, replace=False))
        _join(rng, links, used, a, b, ports)
    return chips, [links[i] for i in rng.permutation(len(links))], group


def _connected(rng, ports: int):
    """(chips, links): a random connected system (a line or a random tree, 1..3 links
    an edge, then extra links), its chips numbered at random."""
    chips = int(rng.integers(2, 11))
    links, used = [], set()
    line = rng.random() < 0.4
    for c in range(1, chips):
        # a parent with a port to spare (each chip keeps one for a child of its own)
        parents = [c - 1] if line else [int(p) for p in rng.permutation(c)]
        parent = next(p for p in parents if _join(rng, links, used, p, c, ports))
        for _ in range(int(rng.integers(0, 3))):
            _join(rng, links, used, parent, c, ports, keep=2)
    for _ in range(int(rng.integers(0, chips + 1))):
        a, b = (int(c) for c in rng.choice(chips, 2, replace=False))
        _join(rng, links, used, a, b, ports, keep=1)
    perm = [int(c) for c in rng.permutation(chips)]
    links = [[perm[a], la, perm[b], lb] for a, la, b, lb in links]
    return chips, [links[i] for i in rng.permutation(len(links))]


# ---- running and checking ---------------------------------------------------------------


def write(c: Case, folder: Path) -> Path:
    """The case's system file (and machine file) in ``folder``; the system file's path."""
    if isinstance(c.machine, dict):
        (folder / "chip.json").write_text(json.dumps(c.machine))
    path = folder / "system.json"
    path.write_text(json.dumps(c.system))
    return path


def build(c: Case, system):
    """(programs, transfers, chips) of the case's call."""
    if c.kind == "point_to_point":
        col = point_to_point(system, c.chips[0], c.chips[1], c.rows, c.dtype)
        return col.programs, col.transfers, col.chips
    if c.kind != "all_reduce_tiles":
        col = collective(c.kind, system, c.chips, c.rows, c.dtype)
        return col.programs, col.transfers, col.chips
    cfg = system.config

    def one(chip, place):
        b = place.builder(cfg, f"all_reduce chip {chip}")
        x = b.input("X", (c.rows, c.cols), c.dtype, spread=c.spread[0])
        y = b.output("Y", (c.rows, c.cols), c.dtype, spread=c.spread[1])
        emit_all_reduce(b, place, x, y)
        return b.build()

    programs, transfers = build_together(system, c.chips, one, "all_reduce")
    return programs, transfers, c.chips


def inputs(c: Case, lanes: int) -> dict:
    """{chip: X}: random values (sums in range of the dtype) or, for transfers, random bits."""
    rng = np.random.default_rng([c.seed, KINDS.index(c.kind), c.index, 1])
    dt = DType.parse(c.dtype)
    n = len(c.chips)
    width = c.cols or lanes
    out = {}
    for k, chip in enumerate(c.chips if c.kind != "point_to_point" else c.chips[:1]):
        rows = shards(c.rows, n)[k][1] if c.kind == "all_gather" else c.rows
        shape = (rows, width)
        if c.kind in ("all_gather", "point_to_point") and rng.random() < 0.5:
            bits = rng.integers(0, 256, size=(rows, width * dt.itemsize), dtype=np.uint8)
            x = bits.view(dt.np).reshape(shape)
            if dt.is_float:  # NaN payloads aside, every pattern: a move keeps bits
                x = np.where(np.isnan(x.astype(np.float32)), dt.np.type(1.5), x).astype(dt.np)
        elif dt == DType.INT32:
            x = rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)  # sums wrap
        elif dt.is_int:
            info = np.iinfo(dt.np)
            x = rng.integers(info.min, info.max + 1, size=shape).astype(dt.np)
        else:
            scale = {"fp16": 100.0, "fp8": 20.0}.get(c.dtype, 1e4)
            x = (rng.standard_normal(shape) * 10 ** rng.uniform(-3, 0) * scale).astype(dt.np)
        out[chip] = x
    return out


def reduction(c: Case, xs: dict, rows: slice, owner: int, dt) -> np.ndarray:
    """Rows ``rows`` of the sum as chip ``owner`` adds them (the documented order: its
    own copy first, then its peers' in the group's order), each add rounded to the dtype,
    int32 wrapping."""
    acc = xs[owner][rows].copy()
    for chip in c.chips:
        if chip != owner:
            acc = (acc + xs[chip][rows]).astype(dt.np)
    return acc


def expected(c: Case, xs: dict, dt) -> dict:
    """{chip: Y} as numpy computes it."""
    n = len(c.chips)
    parts = shards(c.rows, n)
    if c.kind == "point_to_point":
        return {c.chips[1]: xs[c.chips[0]]}
    if c.kind == "all_gather":
        whole = np.concatenate([xs[chip] for chip in c.chips])
        return {chip: whole for chip in c.chips}
    if c.kind == "reduce_scatter":
        return {chip: reduction(c, xs, slice(a, a + m), chip, dt) for chip, (a, m) in zip(c.chips, parts)}
    if c.kind == "all_reduce":
        whole = np.concatenate([reduction(c, xs, slice(a, a + m), chip, dt)
                                for chip, (a, m) in zip(c.chips, parts) if m])
        return {chip: whole for chip in c.chips}
    # all_reduce_tiles: the vectors column tile by column tile, row by row, in n shards
    return {chip: _tiles_sum(c, xs, dt) for chip in c.chips}


def _tiles_sum(c: Case, xs: dict, dt) -> np.ndarray:
    lanes = _lanes_of(c)
    ntiles = -(-c.cols // lanes)
    out = np.zeros((c.rows, c.cols), dt.np)
    for k, (first, size) in enumerate(shards(c.rows * ntiles, len(c.chips))):
        owner = c.chips[k]
        for v in range(first, first + size):  # vector v: tile v // rows, row v % rows
            j, r = divmod(v, c.rows)
            cols = slice(j * lanes, min((j + 1) * lanes, c.cols))
            acc = xs[owner][r, cols].copy()
            for chip in c.chips:
                if chip != owner:
                    acc = (acc + xs[chip][r, cols]).astype(dt.np)
            out[r, cols] = acc
    return out


def _lanes_of(c: Case) -> int:
    return c.machine["lanes"] if isinstance(c.machine, dict) else {"mini": 16, "tsp": 320}[c.machine]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def _bfs(links: list, chips: int, src: int) -> list:
    adj = {c: set() for c in range(chips)}
    for a, _, b, _ in links:
        adj[a].add(b)
        adj[b].add(a)
    dist = [-1] * chips
    dist[src] = 0
    todo = deque([src])
    while todo:
        a = todo.popleft()
        for b in sorted(adj[a]):
            if dist[b] < 0:
                dist[b] = dist[a] + 1
                todo.append(b)
    return dist


def check(c: Case, system, programs, transfers, chips) -> list:
    """The problems of the built programs, run on the system simulator (empty: right)."""
    cfg = system.config
    dt = DType.parse(c.dtype)
    problems = []
    xs = inputs(c, cfg.lanes)
    sim = SystemSimulator(system)
    r = sim.run(programs, {chip: {"X": x} for chip, x in xs.items()})
    for chip, want in expected(c, xs, dt).items():
        got = r.chips[chip].outputs["Y"]
        if got.shape != want.shape or got.dtype != want.dtype:
            problems.append(f"wrong: chip {chip}: Y is {got.dtype}{got.shape}, numpy {want.dtype}{want.shape}")
        elif not np.array_equal(_bits(got), _bits(want)):
            bad = np.argwhere(_bits(got).reshape(got.shape[0], -1) != _bits(want).reshape(want.shape[0], -1))
            problems.append(f"wrong: chip {chip}: {len(bad)} byte(s) of Y differ from numpy, first at row "
                            f"{bad[0][0]}")
    cycles = max(max((tm.timing(cfg, i).done for i in p.instrs), default=0) for p in programs.values())
    if r.cycles != cycles:
        problems.append(f"timing: the simulator ran {r.cycles} cycles, the programs claim {cycles}")
    timed = SystemSimulator(system).run(programs, timing_only=True)
    if timed.cycles != r.cycles:
        problems.append(f"timing: a timing-only run gives {timed.cycles} cycles, a functional run {r.cycles}")
    per_vector = math.ceil(cfg.lanes * dt.itemsize / (cfg.c2c_bytes_per_s / cfg.clock_hz))
    joined = {(a, la): (b, lb) for a, la, b, lb in c.links} | {(b, lb): (a, la) for a, la, b, lb in c.links}
    for t in transfers:
        if t.arrival != t.send_cycle + t.vectors * per_vector + cfg.c2c_latency:
            problems.append(f"timing: message {t.src}.{t.src_link} -> {t.dst}.{t.dst_link} of {t.vectors} vectors "
                            f"sent at {t.send_cycle} arrives at {t.arrival}")
            break
        if joined.get((t.src, t.src_link)) != (t.dst, t.dst_link):
            problems.append(f"wrong: a message from chip {t.src} port {t.src_link} to chip {t.dst} port "
                            f"{t.dst_link}, which the system file does not join")
            break
    n = len(chips)
    vectors = sum(t.vectors for t in transfers)
    ntiles = -(-c.cols // cfg.lanes) if c.cols else 1
    want = {"all_reduce": 2 * (n - 1) * c.rows, "all_reduce_tiles": 2 * (n - 1) * c.rows * ntiles,
            "reduce_scatter": (n - 1) * c.rows, "all_gather": (n - 1) * c.rows,
            "point_to_point": (n - 1) * c.rows}[c.kind]
    if vectors != want:
        problems.append(f"wrong: {vectors} vectors cross the links, the algorithm moves {want}")
    if c.kind == "point_to_point":
        dist = _bfs(c.links, c.system["chips"], c.chips[1])
        if len(chips) - 1 != dist[c.chips[0]]:
            problems.append(f"wrong: a path of {len(chips) - 1} links, the shortest has {dist[c.chips[0]]}")
        # the documented tie-break: from each chip, the lowest-numbered neighbour one step nearer
        nearest = [c.chips[0]]
        adj = {}
        for a, _, b, _ in c.links:
            adj.setdefault(a, set()).add(b)
            adj.setdefault(b, set()).add(a)
        while nearest[-1] != c.chips[1]:
            nearest.append(min(d for d in adj[nearest[-1]] if dist[d] == dist[nearest[-1]] - 1))
        if list(chips) != nearest:
            problems.append(f"wrong: path {list(chips)}, the documented one is {nearest}")
    return problems


def run(c: Case) -> list:
    """Load the case's system file from a folder, build its call, check it: the problems."""
    with tempfile.TemporaryDirectory() as folder:
        system = load_system(write(c, Path(folder)))
    programs, transfers, chips = build(c, system)
    return check(c, system, programs, transfers, chips)

"""Systems of LPX chips: N chips of one machine preset and the C2C links between them.

A link joins one link port of one chip to one link port of another (``c2c.send`` on
chip ``a`` link ``la`` arrives at ``c2c.recv`` on chip ``b`` link ``lb``, and back), at
the preset's per-link bandwidth and latency (docs/multichip.md). Nothing arbitrates at
run time: every transfer is scheduled by the compiler, so a system is only this graph.

A system file is JSON::

    {"name": "two-tsp", "preset": "tsp", "chips": 2,
     "links": [[0, 0, 1, 0], [0, 1, 1, 1]]}          # [chip a, link a, chip b, link b]

or names a generated topology instead of listing links::

    {"name": "my-node", "preset": "tsp", "chips": 8, "topology": "all_to_all", "links_per_pair": 2}

The presets (:data:`SYSTEM_PRESETS`) are generated; their assumptions are stated with
them.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from .config import LPXConfig, load_config


@dataclass(frozen=True)
class Link:
    """One bidirectional C2C link: port ``link_a`` of chip ``chip_a`` to port ``link_b``
    of chip ``chip_b``."""

    chip_a: int
    link_a: int
    chip_b: int
    link_b: int

    def to_json(self) -> list:
        return [self.chip_a, self.link_a, self.chip_b, self.link_b]


@dataclass
class System:
    """``chips`` chips of machine ``config`` joined by ``links``."""

    name: str
    config: LPXConfig
    chips: int
    links: tuple
    description: str = ""
    assumptions: tuple = ()
    sources: tuple = ()
    _peer: dict = field(default=None, repr=False, compare=False)
    _between: dict = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.links = tuple(self.links)
        problems = _link_problems(self)
        if problems:
            raise ConfigError("\n".join(f"system {self.name}: {p}" for p in problems))
        peer, between = {}, {}
        for k in self.links:
            peer[k.chip_a, k.link_a] = (k.chip_b, k.link_b)
            peer[k.chip_b, k.link_b] = (k.chip_a, k.link_a)
            between.setdefault((k.chip_a, k.chip_b), []).append((k.link_a, k.link_b))
            between.setdefault((k.chip_b, k.chip_a), []).append((k.link_b, k.link_a))
        self._peer, self._between = peer, {key: sorted(v) for key, v in between.items()}
        self._adj = [[] for _ in range(self.chips)]
        for a, b in self._between:
            self._adj[a].append(b)
        self._adj = [sorted(n) for n in self._adj]
        self._distances = {}  # chip -> its distances to every chip, as asked

    # ---- the graph -------------------------------------------------------------------
    def peer(self, chip: int, link: int) -> "tuple | None":
        """(chip, link) at the other end of ``chip``'s port ``link``, or None (unconnected)."""
        return self._peer.get((chip, link))

    def links_between(self, a: int, b: int) -> list:
        """Ports of chip ``a`` that reach chip ``b`` directly, ascending: [(link of a, link of b)]."""
        return list(self._between.get((a, b), ()))

    def neighbours(self, chip: int) -> list:
        return self._adj[chip]

    def hops(self, a: int, b: int) -> int:
        """Links on a shortest path from chip ``a`` to chip ``b`` (a chip forwards what it
        receives: the TSP is its own network switch)."""
        return self.distances(a)[b]

    def path(self, a: int, b: int) -> list:
        """The chips on a shortest path from ``a`` to ``b``, both included (the lowest
        chip numbers where paths tie)."""
        dist = self.distances(b)
        out = [a]
        while out[-1] != b:
            out.append(min(d for d in self.neighbours(out[-1]) if dist[d] == dist[out[-1]] - 1))
        return out

    def distances(self, a: int) -> list:
        """Links on a shortest path from chip ``a`` to every chip (computed once a chip:
        paths, hops and the planner's placements ask for them again and again)."""
        if a in self._distances:
            return self._distances[a]
        dist = [-1] * self.chips
        dist[a] = 0
        todo = deque([a])
        while todo:
            c = todo.popleft()
            for d in self.neighbours(c):
                if dist[d] < 0:
                    dist[d] = dist[c] + 1
                    todo.append(d)
        if min(dist) < 0:
            raise ConfigError(f"system {self.name}: chip {dist.index(-1)} cannot be reached from chip {a}")
        self._distances[a] = dist
        return dist

    def stage_groups(self, size: int, stages: int) -> list:
        """Chips for a pipeline of ``stages`` stages of ``size`` (tensor parallel) chips:
        [tuple of chips] in stage order, each group pairwise linked, the ranks of
        consecutive groups as few links apart as the topology allows (directly linked
        where it can: inside a node, or across nodes through the links joining the chips
        of one index). The groups are aligned blocks of ``size`` chips, walked greedily
        from chip 0: each next group is the unused one nearest the last (the lowest chips
        where they tie), which snakes through the nodes of a two-level system."""
        if size < 1 or stages < 1:
            raise ConfigError(f"{stages} stages of {size} chips")
        blocks = [tuple(range(c, c + size)) for c in range(0, self.chips - size + 1, size)]
        blocks = [g for g in blocks if all(self._between.get((a, b)) for a in g for b in g if a != b)]
        if len(blocks) < stages:
            raise ConfigError(f"system {self.name} has {len(blocks)} aligned groups of {size} pairwise linked chips; "
                              f"a pipeline of {stages} stages needs {stages}")
        def apart(g, h):
            return max(self.distances(a)[b] for a, b in zip(g, h))

        out, free = [blocks[0]], blocks[1:]
        while len(out) < stages:
            nxt = min(free, key=lambda g: (apart(out[-1], g), g))
            out.append(nxt)
            free.remove(nxt)
        return out

    @property
    def diameter(self) -> int:
        return max(max(self.distances(a)) for a in range(self.chips))

    @property
    def sram_bytes(self) -> int:
        return self.chips * self.config.sram_bytes

    def to_json(self) -> dict:
        return {"name": self.name, "preset": self.config.name, "chips": self.chips,
                "links": [k.to_json() for k in self.links], "description": self.description,
                "assumptions": list(self.assumptions), "sources": list(self.sources)}


def _link_problems(s: System) -> list:
    problems = []
    if s.chips < 1:
        problems.append(f"{s.chips} chips: a system has at least one")
    used = {}
    for n, k in enumerate(s.links):
        for chip, link in ((k.chip_a, k.link_a), (k.chip_b, k.link_b)):
            if not 0 <= chip < s.chips:
                problems.append(f"link {n} {k.to_json()}: chip {chip} out of range 0..{s.chips - 1}")
            elif not 0 <= link < s.config.c2c_links:
                problems.append(f"link {n} {k.to_json()}: port {link} out of range 0..{s.config.c2c_links - 1} "
                                f"({s.config.name} has {s.config.c2c_links} C2C links)")
            elif (chip, link) in used:
                problems.append(f"link {n} {k.to_json()}: port {link} of chip {chip} is already link "
                                f"{used[chip, link]}")
            else:
                used[chip, link] = n
        if k.chip_a == k.chip_b:
            problems.append(f"link {n} {k.to_json()}: joins chip {k.chip_a} to itself")
    return problems


# ---- generated topologies -------------------------------------------------------------

def all_to_all(chips: int, links_per_pair: int = 1, first_port: int = 0) -> list:
    """Every pair of ``chips`` joined by ``links_per_pair`` links; chip ``c`` reaches
    chip ``d`` on ports ``first_port + links_per_pair * (d if d < c else d - 1) + k``."""
    links = []
    for a in range(chips):
        for b in range(a + 1, chips):
            for k in range(links_per_pair):
                links.append(Link(a, first_port + links_per_pair * (b - 1) + k, b,
                                  first_port + links_per_pair * a + k))
    return links


def two_level(groups: int, per_group: int, local_per_pair: int, global_per_pair: int, offset: int = 0) -> list:
    """``groups`` groups of ``per_group`` chips: all-to-all inside each group
    (``local_per_pair`` links a pair), and the chips of one index in every group all-to-all
    across groups (``global_per_pair`` links a pair, on the ports after the local ones):
    any two chips are at most two links apart."""
    links = []
    local_ports = local_per_pair * (per_group - 1)
    for g in range(groups):
        base = g * per_group
        links += [Link(base + k.chip_a, k.link_a + offset, base + k.chip_b, k.link_b + offset)
                  for k in all_to_all(per_group, local_per_pair)]
    for i in range(per_group):
        links += [Link(k.chip_a * per_group + i, k.link_a + offset + local_ports,
                       k.chip_b * per_group + i, k.link_b + offset + local_ports)
                  for k in all_to_all(groups, global_per_pair)]
    return links


def _groqnode() -> System:
    return System(
        "groqnode", load_config("tsp"), 8, all_to_all(8, 1),
        description="A GroqNode-like node: 8 TSPs, each pair joined by one C2C link (7 of a TSP's 16 links).",
        assumptions=("Each TSP card has 7 cabled link pairs to the 7 others of its node (HotChips 34); one link "
                     "per pair here, 14 GB/s per direction (the tsp preset's link).",),
        sources=("ISCA 2022 A Software-defined Tensor Streaming Multiprocessor for Large-scale Machine Learning",
                 "HotChips 34 (2022): Groq Software-Defined Scale-out Tensor Streaming Multiprocessor"))


def _tsp_rack() -> System:
    return System(
        "tsp-rack", load_config("tsp"), 72, two_level(9, 8, 1, 1),
        description="A rack of 9 GroqNode-like nodes (72 TSPs): all-to-all inside a node, and each TSP linked to "
                    "the TSP of its index in every other node of the rack (any two chips at most two links apart).",
        assumptions=TSP_ASSUMPTIONS + ("A rack holds 9 nodes (ISCA 2022); 8 ports a TSP to the rest of the rack.",),
        sources=TSP_SOURCES)


def _tsp_576() -> System:
    """8 racks of 72: each rack as ``tsp-rack``; every TSP's last port (its 16th) to a TSP
    of another rack, 10 links between every pair of racks (70 of a rack's 72 spare ports)."""
    racks, per_rack, per_pair = 8, 72, 10
    links = []
    for r in range(racks):
        links += [Link(r * per_rack + k.chip_a, k.link_a, r * per_rack + k.chip_b, k.link_b)
                  for k in two_level(9, 8, 1, 1)]

    def slot(r, s, k):  # the chip of rack r holding its k-th link to rack s
        partner = s if s < r else s - 1
        return r * per_rack + per_pair * partner + k

    for r in range(racks):
        for s in range(r + 1, racks):
            links += [Link(slot(r, s, k), 15, slot(s, r, k), 15) for k in range(per_pair)]
    return System(
        "tsp-576", load_config("tsp"), racks * per_rack, links,
        description="576 TSPs: 8 racks of 9 GroqNode-like nodes (tsp-rack), the racks all-to-all by 10 links a "
                    "pair, each from the 16th port of one TSP to the 16th port of a TSP of the other rack "
                    "(a dragonfly: racks are its groups, and chips route through chips).",
        assumptions=TSP_ASSUMPTIONS + (
            "The size of the system Groq served Llama-2-70B on (about 300 tokens/s per user on 576 chips, Groq's "
            "published figure); 8 racks of 9 nodes of 8 TSPs (ISCA 2022).",
            "Per TSP: 7 ports inside its node, 8 to the other nodes of its rack, 1 global port to another rack; a "
            "transfer between racks forwards through the TSPs on its path (hops())."),
        sources=TSP_SOURCES + ("Groq: Llama-2-70B at 300 tokens/s per user (public announcement, 2023)",))


def _lp30_rack() -> System:
    return System(
        "lp30-rack", load_config("lp30"), 256, two_level(32, 8, 4, 2),
        description="An LP30 rack: 32 trays of 8 chips (256), all-to-all inside a tray by 4 links a pair, and each "
                    "chip linked to the chip of its index in every other tray by 2 links (any two chips at most two "
                    "links apart; 28 + 62 = 90 of the 96 ports).",
        assumptions=("NVIDIA's Groq 3 LPX rack: 256 LP30 chips in 32 trays of 8, 128 GB of SRAM in all (published). "
                     "Its link topology is not public: this two-level all-to-all uses 90 of each chip's 96 links "
                     "(the lp30 preset: 112 Gbps, 14 GB/s per direction, 0.5 us).",),
        sources=("NVIDIA Groq 3 LPX product announcement (published per-rack and per-chip figures)",))


TSP_ASSUMPTIONS = (
    "Each TSP has 16 C2C links of 4 lanes (14 GB/s per direction when cabled, the tsp preset's link, 450 cycles "
    "= 0.5 us of latency); a card has 7 cabled link pairs to the other 7 of its node (HotChips 34), one link per "
    "pair here.",
    "Nothing arbitrates: the compiler schedules every transfer, and a TSP forwards what it receives (the TSP is "
    "its own network switch, ISCA 2022).")
TSP_SOURCES = ("ISCA 2022 A Software-defined Tensor Streaming Multiprocessor for Large-scale Machine Learning",
               "HotChips 34 (2022): Groq Software-Defined Scale-out Tensor Streaming Multiprocessor")

SYSTEM_PRESETS = {"groqnode": _groqnode, "tsp-rack": _tsp_rack, "tsp-576": _tsp_576, "lp30-rack": _lp30_rack}
_LOADED = {}


def load_system(system) -> System:
    """A system preset by name (:data:`SYSTEM_PRESETS`), a system JSON file, a dict of
    one, or a :class:`System`."""
    if isinstance(system, System):
        return system
    if isinstance(system, str) and system in SYSTEM_PRESETS:
        if system not in _LOADED:
            _LOADED[system] = SYSTEM_PRESETS[system]()
        return _LOADED[system]
    if isinstance(system, dict):
        return parse_system(system, "system")
    path = Path(os.fspath(system))
    if not path.exists():
        raise ConfigError(f"system {system!r}: not a preset ({', '.join(SYSTEM_PRESETS)}) and no such file")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"system file {path}: not valid JSON ({e})") from None
    return parse_system(data, f"system file {path}")


TOPOLOGIES = {"all_to_all": lambda d: all_to_all(d["chips"], d.get("links_per_pair", 1))}
_KEYS = {"name", "preset", "chips", "links", "topology", "links_per_pair", "description", "assumptions", "sources"}


def parse_system(data: dict, source: str = "system") -> System:
    """A :class:`System` from the JSON form (module docstring); every problem is named."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown} (expected {sorted(_KEYS)})")
    for key in ("name", "preset", "chips"):
        if key not in data:
            raise ConfigError(f"{source}: missing key {key!r}")
    if not isinstance(data["chips"], int) or isinstance(data["chips"], bool) or data["chips"] < 1:
        raise ConfigError(f"{source}: key 'chips': expected an integer >= 1, got {data['chips']!r}")
    if ("links" in data) == ("topology" in data):
        raise ConfigError(f"{source}: give 'links' (a list of [chip a, link a, chip b, link b]) or 'topology' "
                          f"({', '.join(TOPOLOGIES)}), one of them")
    if "topology" in data:
        if data["topology"] not in TOPOLOGIES:
            raise ConfigError(f"{source}: unknown topology {data['topology']!r} (expected one of "
                              f"{', '.join(TOPOLOGIES)})")
        links = TOPOLOGIES[data["topology"]](data)
    else:
        links = []
        for n, k in enumerate(data["links"]):
            if not (isinstance(k, list) and len(k) == 4 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 for v in k)):
                raise ConfigError(f"{source}: links[{n}] = {k!r}: expected [chip a, link a, chip b, link b] "
                                  "(integers)")
            links.append(Link(*k))
    cfg = load_config(data["preset"])
    try:
        return System(str(data["name"]), cfg, data["chips"], links, data.get("description", ""),
                      tuple(data.get("assumptions", ())), tuple(data.get("sources", ())))
    except ConfigError as e:
        raise ConfigError(str(e).replace("system ", f"{source}: system ", 1)) from None

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

A system file is validated against the schema of ``system_schema.py``: whatever is
wrong is one :class:`ConfigError` line naming the key. A relative ``preset`` path is read
from the system file's folder. The presets (:data:`SYSTEM_PRESETS`) are generated; their
assumptions are stated with them.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from .config import PRESETS, LPXConfig, load_config
from .system_schema import MAX_CHIPS, MAX_LINK_CYCLES, one_line, validate_system_file


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
        problems = _problems(self.config, self.chips, self.links)
        if problems:
            raise ConfigError(one_line(f"system {self.name}", [
                text if isinstance(where, str) else f"link {where} {self.links[where].to_json()}: {text}"
                for where, text in problems]))
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


def _problems(cfg: LPXConfig, chips: int, links: tuple) -> list:
    """[(where, problem)] of ``chips`` chips of machine ``cfg`` joined by ``links``:
    ``where`` is the index of the link at fault, or the key of the system file whose value
    is (``"chips"``, ``"preset"``, ``"links"``)."""
    if not isinstance(chips, int) or isinstance(chips, bool) or not 1 <= chips <= MAX_CHIPS:
        return [("chips", f"{chips!r} chips: a system has 1..{MAX_CHIPS}")]
    problems = [("preset", p) for p in _link_rate_problems(cfg)]
    ports = chips * cfg.c2c_links
    if 2 * len(links) > ports:  # refused before looking at each link: a long list gets one line
        return problems + [("links", f"{len(links)} links, but {chips} chips of {cfg.name} have "
                                     f"{ports} ports ({cfg.c2c_links} a chip), two a link")]
    used, seen = {}, {}
    for n, k in enumerate(links):
        same = seen.setdefault(frozenset(((k.chip_a, k.link_a), (k.chip_b, k.link_b))), n)
        if same != n:
            problems.append((n, f"the same link as link {same}"))
            continue
        if k.chip_a == k.chip_b:
            problems.append((n, f"joins chip {k.chip_a} to itself"))
            continue
        for chip, link in ((k.chip_a, k.link_a), (k.chip_b, k.link_b)):
            if not 0 <= chip < chips:
                problems.append((n, f"chip {chip} out of range 0..{chips - 1}"))
            elif not 0 <= link < cfg.c2c_links:
                problems.append((n, f"port {link} out of range 0..{cfg.c2c_links - 1} "
                                    f"({cfg.name} has {cfg.c2c_links} C2C links)"))
            elif (chip, link) in used:
                problems.append((n, f"port {link} of chip {chip} is already link {used[chip, link]}"))
            else:
                used[chip, link] = n
    return problems


def _link_rate_problems(cfg: LPXConfig) -> list:
    """A link that takes more than MAX_LINK_CYCLES a vector, or as latency: cycles past
    what the schedulers count in (a c2c.bytes_per_s of 1e-300 is a positive number)."""
    out = []
    per_vector = cfg.lanes * 4 * cfg.clock_hz / cfg.c2c_bytes_per_s  # fp32, the widest dtype a link carries
    if not math.isfinite(per_vector) or per_vector > MAX_LINK_CYCLES:
        out.append(f"machine {cfg.name}: a link of c2c.bytes_per_s={cfg.c2c_bytes_per_s:g} (at clock_hz="
                   f"{cfg.clock_hz:g}) takes {per_vector:.3g} cycles a vector of fp32, more than the "
                   f"{MAX_LINK_CYCLES} a system allows")
    if cfg.c2c_latency > MAX_LINK_CYCLES:
        out.append(f"machine {cfg.name}: c2c.latency_cycles={cfg.c2c_latency} is more than the {MAX_LINK_CYCLES} "
                   "a system allows")
    return out


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
    one (its relative ``preset`` path read from the current folder), or a :class:`System`."""
    if isinstance(system, System):
        return system
    if isinstance(system, str) and system in SYSTEM_PRESETS:
        if system not in _LOADED:
            _LOADED[system] = SYSTEM_PRESETS[system]()
        return _LOADED[system]
    if isinstance(system, dict):
        return parse_system(system, "system")
    if not isinstance(system, (str, os.PathLike)):
        raise ConfigError(f"system {_short(repr(system))}: expected a preset name ({', '.join(SYSTEM_PRESETS)}), a "
                          f"system file, a dict or a System, got {type(system).__name__}")
    path = Path(os.fspath(system))
    try:
        found = path.exists()
    except (OSError, ValueError):  # a name too long for the file system
        found = False
    if not found:
        raise ConfigError(f"system {_short(repr(os.fspath(system)))}: not a preset ({', '.join(SYSTEM_PRESETS)}) "
                          "and no such file")
    if path.is_dir():
        raise ConfigError(f"system {path}: a folder, not a system file")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"system file {path}: not a JSON system file (not UTF-8 text: byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"system file {path}: not valid JSON ({e})") from None
    except RecursionError:
        raise ConfigError(f"system file {path}: not a system file (JSON nested too deeply)") from None
    except OSError as e:
        raise ConfigError(f"system file {path}: cannot be read ({e.strerror or e})") from None
    return parse_system(data, f"system file {path}", base=path.parent)


def _short(text: str, most: int = 80) -> str:
    return text if len(text) <= most else f"{text[:most - 3]}..."


def _topology_links(d, cfg: LPXConfig, source: str) -> list:
    """The links of ``d["topology"]``, once the ports it needs are known to exist."""
    chips, per_pair = d.chips, d.links_per_pair or 1
    if per_pair * (chips - 1) > cfg.c2c_links:
        raise ConfigError(f"{source}: key 'topology': all_to_all of {chips} chips by {per_pair} link(s) a pair needs "
                          f"{per_pair * (chips - 1)} ports a chip, machine {cfg.name} has {cfg.c2c_links} "
                          "(c2c.links)")
    return all_to_all(chips, per_pair)


def _machine(preset: str, base: "Path | None", source: str) -> LPXConfig:
    """The machine ``preset`` names: a machine preset, or a machine file (relative to
    ``base``, the system file's folder)."""
    if preset in PRESETS:
        return load_config(preset)
    path = Path(preset)
    if base is not None and not path.is_absolute():
        path = base / path
    try:
        return load_config(path)
    except ConfigError as e:
        lines = str(e).splitlines()
        more = f" (and {len(lines) - 1} more problems of that machine file)" if len(lines) > 1 else ""
        raise ConfigError(f"{source}: key 'preset': {_short(lines[0], 300)}{more}") from None
    except RecursionError:
        raise ConfigError(f"{source}: key 'preset': machine file {path}: JSON nested too deeply") from None
    except OSError as e:
        raise ConfigError(f"{source}: key 'preset': machine file {path} cannot be read ({e.strerror or e})") from None


def parse_system(data: dict, source: str = "system", base=None) -> System:
    """A :class:`System` from the JSON form (module docstring), ``source`` first on the
    error line. A relative ``preset`` path is read from ``base`` (the system file's
    folder; the current folder without one).

    Raises
    ------
    ConfigError
        One line naming each key that is wrong (the first few, and how many more).
    """
    d = validate_system_file(data, source)
    cfg = _machine(d.preset, None if base is None else Path(base), source)
    if d.topology is not None:
        links = _topology_links(d, cfg, source)
    else:
        links = tuple(Link(*k) for k in d.links)
    problems = _problems(cfg, d.chips, links)
    if problems:
        raise ConfigError(one_line(source, [
            f"key '{where}': {text}" if isinstance(where, str)
            else f"key 'links[{where}]' = {links[where].to_json()}: {text}" for where, text in problems]))
    return System(d.name, cfg, d.chips, links, d.description, tuple(d.assumptions), tuple(d.sources))

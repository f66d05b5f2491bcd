"""The LPX machine model: one frozen config object read by the compiler, encoder and simulator.

A config comes from a JSON file: a bundled preset (``tsp``, ``mini``, ``lp30``) or a
user's own file. Every field is validated with an error naming the field. Everything
else (positions on the floorplan, lines per slice, peak rates) is derived here, so no
number exists twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources

from ..errors import ConfigError

PRESETS = ("tsp", "mini", "lp30")
DEFAULT_PRESET = "tsp"

# dtypes the MXM multiplies; their cycles-per-vector must be given by every preset.
MXM_DTYPES = ("int8", "uint8", "fp16", "bf16", "fp32")

LATENCY_FIELDS = (
    "mem_read",
    "mem_write",
    "mem_gather",
    "mxm_install",
    "mxm_mul",
    "mxm_drain",
    "vxm_alu",
    "vxm_transcendental",
    "vxm_reduce",
    "vxm_convert",
    "sxm",
    "sxm_transpose",
)

# Keys that describe a config but do not change what the machine does: left out of the hash.
_DESCRIPTIVE_KEYS = ("name", "description", "assumptions", "sources")


def _require(obj, key, where):
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise ConfigError(f"{where}.{key}: missing field")
    return obj[key]


def _int(obj, key, where, *, minimum=1, maximum=None):
    value = _require(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where}.{key}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{where}.{key}: must be <= {maximum}, got {value}")
    return value


def _number(obj, key, where):
    value = _require(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}.{key}: expected a finite number, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{where}.{key}: must be > 0, got {value}")
    return float(value)


def _expand_floorplan(items, where):
    """Expand ``["MXM", "MEM*44", ...]`` into one unit kind per position, west to east."""
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{where}: expected a non-empty list such as ['MXM', 'MEM*44', 'VXM']")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ConfigError(f"{where}[{i}]: expected a string, got {item!r}")
        kind, _, times = item.partition("*")
        if kind not in ("MXM", "SXM", "MEM", "VXM"):
            raise ConfigError(f"{where}[{i}]: unknown unit kind {kind!r} (MXM, SXM, MEM or VXM)")
        try:
            n = int(times) if times else 1
        except ValueError:
            raise ConfigError(f"{where}[{i}]: bad repeat count in {item!r}") from None
        if n < 1:
            raise ConfigError(f"{where}[{i}]: repeat count must be >= 1 in {item!r}")
        out.extend([kind] * n)
    return tuple(out)


@dataclass(frozen=True)
class LPXConfig:
    """One LPX machine. Build it with :func:`load_config`; fields mirror the JSON."""

    name: str
    clock_hz: float
    lanes: int
    superlanes: int
    floorplan: tuple  # one unit kind per position, west to east
    mem_slices: int
    slice_bytes: int
    mem_read_ports: int
    mem_write_ports: int
    streams_east: int
    streams_west: int
    mxm_planes: int
    mxm_rows: int
    mxm_cols: int
    mxm_weight_buffers: int
    mxm_acc_rows: int
    mxm_cycles_per_vector: dict = field(hash=False)
    vxm_alus: int = 16
    offchip_bytes_per_s: float = 32e9
    offchip_latency: int = 1000
    dma_engines: int = 1
    c2c_links: int = 16
    c2c_bytes_per_s: float = 14e9
    c2c_latency: int = 500
    latency: dict = field(default_factory=dict, hash=False)
    raw: dict = field(default_factory=dict, hash=False, repr=False, compare=False)

    # ---- derived sizes -------------------------------------------------
    @property
    def lines_per_slice(self) -> int:
        """SRAM address units per slice; one line holds ``lanes`` bytes."""
        return self.slice_bytes // self.lanes

    @property
    def sram_bytes(self) -> int:
        return self.mem_slices * self.slice_bytes

    @property
    def peak_macs_per_cycle(self) -> int:
        """int8 MACs per cycle over all planes (the rate every other dtype is a fraction of)."""
        return self.mxm_planes * self.mxm_rows * self.mxm_cols

    def peak_macs_per_cycle_for(self, dtype: str) -> float:
        return self.peak_macs_per_cycle / self.mxm_cycles_per_vector[dtype]

    @property
    def offchip_bytes_per_cycle(self) -> float:
        return self.offchip_bytes_per_s / self.clock_hz

    @property
    def c2c_bytes_per_cycle(self) -> float:
        return self.c2c_bytes_per_s / self.clock_hz

    @cached_property
    def positions(self) -> dict:
        """Floorplan position of every unit instance: ("MEM", slice) -> position, and so on."""
        pos = {}
        counters = {"MXM": 0, "SXM": 0, "MEM": 0, "VXM": 0}
        for p, kind in enumerate(self.floorplan):
            pos[(kind, counters[kind])] = p
            counters[kind] += 1
        return pos

    def position(self, kind: str, index: int = 0) -> int:
        return self.positions[(kind, index)]

    @cached_property
    def hash(self) -> str:
        """Stable hash of everything that changes what the machine does (not its name)."""
        body = {k: v for k, v in self.raw.items() if k not in _DESCRIPTIVE_KEYS}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def seconds(self, cycles: int) -> float:
        return cycles / self.clock_hz

    def to_json(self) -> dict:
        return json.loads(json.dumps(self.raw))


def parse_config(data: dict, source: str = "<config>") -> LPXConfig:
    """Validate a config dict and build the :class:`LPXConfig`."""
    w = source
    if not isinstance(data, dict):
        raise ConfigError(f"{w}: the config must be a JSON object")
    name = _require(data, "name", w)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{w}.name: expected a non-empty string")
    clock = _number(data, "clock_hz", w)
    lanes = _int(data, "lanes", w, maximum=4096)
    superlanes = _int(data, "superlanes", w)
    if lanes % superlanes:
        raise ConfigError(f"{w}.lanes: {lanes} is not a multiple of superlanes={superlanes}")
    floorplan = _expand_floorplan(_require(data, "floorplan", w), f"{w}.floorplan")

    mem = _require(data, "mem", w)
    slices = _int(mem, "slices", f"{w}.mem", maximum=65535)
    slice_bytes = _int(mem, "slice_bytes", f"{w}.mem")
    if slice_bytes % lanes:
        raise ConfigError(f"{w}.mem.slice_bytes: {slice_bytes} is not a multiple of lanes={lanes}")
    if slice_bytes // lanes > 2**31 - 1:
        raise ConfigError(f"{w}.mem.slice_bytes: too many lines per slice for 32-bit addresses")
    read_ports = _int(mem, "read_ports", f"{w}.mem", maximum=1)
    write_ports = _int(mem, "write_ports", f"{w}.mem", maximum=1)

    streams = _require(data, "streams", w)
    east = _int(streams, "east", f"{w}.streams", maximum=63)
    west = _int(streams, "west", f"{w}.streams", maximum=63)

    mxm = _require(data, "mxm", w)
    planes = _int(mxm, "planes", f"{w}.mxm", maximum=255)
    rows = _int(mxm, "rows", f"{w}.mxm")
    cols = _int(mxm, "cols", f"{w}.mxm")
    if rows > lanes or cols > lanes:
        raise ConfigError(f"{w}.mxm: rows={rows} and cols={cols} must not exceed lanes={lanes}")
    wbufs = _int(mxm, "weight_buffers", f"{w}.mxm", maximum=255)
    acc_rows = _int(mxm, "acc_rows", f"{w}.mxm")
    cpv = _require(mxm, "cycles_per_vector", f"{w}.mxm")
    rates = {}
    for dt in MXM_DTYPES:
        rates[dt] = _int(cpv, dt, f"{w}.mxm.cycles_per_vector", maximum=1024)

    vxm = _require(data, "vxm", w)
    alus = _int(vxm, "alus", f"{w}.vxm", maximum=255)

    off = _require(data, "offchip", w)
    off_bw = _number(off, "bytes_per_s", f"{w}.offchip")
    off_lat = _int(off, "latency_cycles", f"{w}.offchip", minimum=1)
    dma_engines = _int(off, "dma_engines", f"{w}.offchip", maximum=255)

    c2c = _require(data, "c2c", w)
    links = _int(c2c, "links", f"{w}.c2c", maximum=255)
    link_bw = _number(c2c, "bytes_per_s", f"{w}.c2c")
    link_lat = _int(c2c, "latency_cycles", f"{w}.c2c", minimum=1)

    lat_obj = _require(data, "latency", w)
    latency = {k: _int(lat_obj, k, f"{w}.latency", minimum=1, maximum=100000) for k in LATENCY_FIELDS}
    unknown = set(lat_obj) - set(LATENCY_FIELDS)
    if unknown:
        raise ConfigError(f"{w}.latency: unknown field(s) {sorted(unknown)}")

    counts = {k: floorplan.count(k) for k in ("MXM", "SXM", "MEM", "VXM")}
    if counts["MEM"] != slices:
        raise ConfigError(f"{w}.floorplan: has {counts['MEM']} MEM positions but mem.slices={slices}")
    if counts["MXM"] != planes:
        raise ConfigError(f"{w}.floorplan: has {counts['MXM']} MXM positions but mxm.planes={planes}")
    if counts["VXM"] != 1:
        raise ConfigError(f"{w}.floorplan: needs exactly one VXM, has {counts['VXM']}")
    if counts["SXM"] < 1:
        raise ConfigError(f"{w}.floorplan: needs at least one SXM")

    return LPXConfig(
        name=name,
        clock_hz=clock,
        lanes=lanes,
        superlanes=superlanes,
        floorplan=floorplan,
        mem_slices=slices,
        slice_bytes=slice_bytes,
        mem_read_ports=read_ports,
        mem_write_ports=write_ports,
        streams_east=east,
        streams_west=west,
        mxm_planes=planes,
        mxm_rows=rows,
        mxm_cols=cols,
        mxm_weight_buffers=wbufs,
        mxm_acc_rows=acc_rows,
        mxm_cycles_per_vector=rates,
        vxm_alus=alus,
        offchip_bytes_per_s=off_bw,
        offchip_latency=off_lat,
        dma_engines=dma_engines,
        c2c_links=links,
        c2c_bytes_per_s=link_bw,
        c2c_latency=link_lat,
        latency=latency,
        raw=json.loads(json.dumps(data)),
    )


def preset_path(name: str):
    return resources.files("lpx_tvm.machine").joinpath("presets", f"{name}.json")


def load_config(preset_or_path: "str | os.PathLike | LPXConfig | None" = None) -> LPXConfig:
    """Load a preset by name (``tsp``, ``mini``, ``lp30``) or a user's JSON file."""
    if isinstance(preset_or_path, LPXConfig):
        return preset_or_path
    if preset_or_path is None:
        preset_or_path = DEFAULT_PRESET
    key = os.fspath(preset_or_path)
    if key in PRESETS:
        return _load_preset(key)
    if not os.path.exists(key):
        raise ConfigError(
            f"machine config {key!r}: not a preset ({', '.join(PRESETS)}) and no such file"
        )
    try:
        with open(key) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{key}: not valid JSON ({e})") from None
    return parse_config(data, key)


_preset_cache: dict = {}


def _load_preset(name: str) -> LPXConfig:
    if name not in _preset_cache:
        data = json.loads(preset_path(name).read_text())
        _preset_cache[name] = parse_config(data, f"preset {name}")
    return _preset_cache[name]

"""The LPX machine model: one frozen config object read by the compiler, encoder and simulator.

A config comes from a JSON file: a bundled preset (``tsp``, ``mini``, ``lp30``) or a
user's own file, validated against the schema in ``schema.py`` (an unknown, missing or
wrongly typed key is an error naming the key). Everything else (positions on the
floorplan, lines per slice, peak rates) is derived here, so no number exists twice.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources

from ..errors import ConfigError
from .schema import DESCRIPTIVE_KEYS, CyclesPerVector, Latency, MachineFile, validate_machine_file

PRESETS = ("tsp", "mini", "lp30")
DEFAULT_PRESET = "tsp"

# dtypes the MXM multiplies, and the pipeline latencies: the keys of the machine file.
MXM_DTYPES = tuple(CyclesPerVector.model_fields)
LATENCY_FIELDS = tuple(Latency.model_fields)


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
    mxm_install_streams: int
    vxm_alus: int
    offchip_bytes_per_s: float
    offchip_latency: int
    dma_engines: int
    c2c_links: int
    c2c_bytes_per_s: float
    c2c_latency: int
    latency: dict = field(hash=False)
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
        if dtype not in self.mxm_cycles_per_vector:
            raise ConfigError(f"machine {self.name}: the MXM does not multiply {dtype} "
                              "(mxm.cycles_per_vector has no rate for it)")
        return self.peak_macs_per_cycle / self.mxm_cycles_per_vector[dtype]

    @property
    def install_vectors_per_cycle(self) -> int:
        """Weight vectors all planes install a cycle: one from each plane's install streams."""
        return self.mxm_planes * self.mxm_install_streams

    @property
    def install_bytes_per_cycle(self) -> int:
        """Weight bytes all planes install a cycle (a vector of ``lanes`` bytes a stream)."""
        return self.install_vectors_per_cycle * self.lanes

    @property
    def sram_read_vectors_per_cycle(self) -> int:
        """Vectors all slices read a cycle: one from each read port."""
        return self.mem_slices * self.mem_read_ports

    @property
    def sram_read_bytes_per_cycle(self) -> int:
        return self.sram_read_vectors_per_cycle * self.lanes

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
        body = {k: v for k, v in self.raw.items() if k not in DESCRIPTIVE_KEYS}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def seconds(self, cycles: int) -> float:
        return cycles / self.clock_hz

    def to_json(self) -> dict:
        return json.loads(json.dumps(self.raw))


def parse_config(data: dict, source: str = "machine config") -> LPXConfig:
    """Validate a machine JSON object and build its :class:`LPXConfig`.

    Parameters
    ----------
    data
        The parsed JSON of a machine file.
    source
        What the data came from, first on every error line.

    Raises
    ------
    ConfigError
        One line per problem, each naming the key (see :mod:`lpx_tvm.machine.schema`).
    """
    machine = validate_machine_file(data, source)
    return _config_of(machine, raw=json.loads(json.dumps(data)))


def _config_of(m: MachineFile, raw: dict) -> LPXConfig:
    return LPXConfig(
        name=m.name,
        clock_hz=float(m.clock_hz),
        lanes=m.lanes,
        superlanes=m.superlanes,
        floorplan=m.expanded_floorplan(),
        mem_slices=m.mem.slices,
        slice_bytes=m.mem.slice_bytes,
        mem_read_ports=m.mem.read_ports,
        mem_write_ports=m.mem.write_ports,
        streams_east=m.streams.east,
        streams_west=m.streams.west,
        mxm_planes=m.mxm.planes,
        mxm_rows=m.mxm.rows,
        mxm_cols=m.mxm.cols,
        mxm_weight_buffers=m.mxm.weight_buffers,
        mxm_acc_rows=m.mxm.acc_rows,
        mxm_cycles_per_vector=m.mxm.cycles_per_vector.model_dump(exclude_none=True),
        mxm_install_streams=m.mxm.install_streams,
        vxm_alus=m.vxm.alus,
        offchip_bytes_per_s=float(m.offchip.bytes_per_s),
        offchip_latency=m.offchip.latency_cycles,
        dma_engines=m.offchip.dma_engines,
        c2c_links=m.c2c.links,
        c2c_bytes_per_s=float(m.c2c.bytes_per_s),
        c2c_latency=m.c2c.latency_cycles,
        latency=m.latency.model_dump(),
        raw=raw,
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
        with open(key, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{key}: not valid JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{key}: not a JSON machine file (not UTF-8 text: byte {e.start})") from None
    except IsADirectoryError:
        raise ConfigError(f"{key}: a folder, not a machine file") from None
    return parse_config(data, f"machine file {key}")


_preset_cache: dict = {}


def _load_preset(name: str) -> LPXConfig:
    if name not in _preset_cache:
        data = json.loads(preset_path(name).read_text())
        _preset_cache[name] = parse_config(data, f"machine preset {name}")
    return _preset_cache[name]

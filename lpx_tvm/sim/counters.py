"""Performance counters of one simulated run, overall and per tag (graph op)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields, replace


@dataclass
class TagCounters:
    instructions: int = 0
    busy_cycles: int = 0
    macs: int = 0
    sram_bytes_read: int = 0
    sram_bytes_written: int = 0
    offchip_bytes: int = 0
    first_cycle: int = -1
    last_cycle: int = 0  # cycle by which the tag's last effect landed

    @property
    def span_cycles(self) -> int:
        return max(0, self.last_cycle - self.first_cycle)


@dataclass
class Counters:
    """Counter names read ``<unit>_<resource>_<event>`` where they are unit-specific."""

    cycles: int = 0
    instructions: int = 0
    macs: int = 0
    sram_bytes_read: int = 0
    sram_bytes_written: int = 0
    offchip_bytes_read: int = 0  # dma.load: off-chip -> SRAM
    offchip_bytes_written: int = 0  # dma.store
    c2c_bytes_sent: int = 0
    port_busy_cycles: dict = field(default_factory=lambda: defaultdict(int))  # "mxm0.compute" -> cycles
    by_tag: dict = field(default_factory=lambda: defaultdict(TagCounters))

    def copy(self) -> "Counters":
        c = replace(self, port_busy_cycles=defaultdict(int, self.port_busy_cycles), by_tag=defaultdict(TagCounters))
        c.by_tag.update((tag, replace(t)) for tag, t in self.by_tag.items())
        return c

    def utilization(self, port: str) -> float:
        return self.port_busy_cycles.get(port, 0) / self.cycles if self.cycles else 0.0

    def mxm_mac_utilization(self, peak_macs_per_cycle: float) -> float:
        """Useful MACs over what the planes could do in ``cycles`` at ``peak_macs_per_cycle``."""
        return self.macs / (peak_macs_per_cycle * self.cycles) if self.cycles else 0.0

    def to_json(self) -> dict:
        # Not asdict(self): on Python 3.11 it cannot rebuild the defaultdict fields.
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("port_busy_cycles", "by_tag")}
        d["port_busy_cycles"] = dict(sorted(self.port_busy_cycles.items()))
        d["by_tag"] = {t: asdict(c) for t, c in self.by_tag.items()}
        return d


def port_name(port: tuple) -> str:
    """('mxm.compute', 2) -> 'mxm2.compute'; ('mxm.install', 1, 7) -> 'mxm1.install7' (install stream 7)."""
    kind, index, *sub_index = port
    unit, _, sub = kind.partition(".")
    name = f"{unit}{index}.{sub}" if sub else f"{unit}{index}"
    return name + "".join(str(k) for k in sub_index)

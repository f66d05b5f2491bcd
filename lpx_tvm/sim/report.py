"""A run's counters as a report: JSON-able summary and per-tag rows, with a reader.

The report is what ``lpx-tvm run --report`` writes and what ``lpx-tvm demo`` prints.
"""

from __future__ import annotations

import json

from ..machine.config import LPXConfig
from ..machine.timing import unit_count
from ..machine.isa import Unit
from .simulator import SimResult

# Port kinds whose utilization the report shows, with the unit count they divide by.
_KINDS = (("mxm.compute", Unit.MXM), ("mxm.install", Unit.MXM), ("mxm.drain", Unit.MXM),
          ("vxm", Unit.VXM), ("sxm", Unit.SXM), ("mem.rd", Unit.MEM), ("mem.wr", Unit.MEM),
          ("dma", Unit.DMA), ("c2c.tx", Unit.C2C))


def summarize(result: SimResult, mxm_dtype: str = "int8") -> dict:
    """Summary of one run. ``mxm_dtype`` picks the peak that ``mxm_utilization`` divides by."""
    cfg: LPXConfig = result.config
    c = result.counters
    peak = cfg.peak_macs_per_cycle_for(mxm_dtype)
    return {
        "preset": cfg.name,
        "config_hash": cfg.hash,
        "cycles": c.cycles,
        "latency_s": result.latency_s,
        "instructions": c.instructions,
        "macs": c.macs,
        "mxm_dtype": mxm_dtype,
        "mxm_utilization": c.mxm_mac_utilization(peak),
        "effective_tops": 2 * c.macs / result.latency_s / 1e12 if c.cycles else 0.0,
        "unit_utilization": {k: c.kind_utilization(k, unit_count(cfg, u)) for k, u in _KINDS},
        "sram_bytes_read": c.sram_bytes_read,
        "sram_bytes_written": c.sram_bytes_written,
        "offchip_bytes_read": c.offchip_bytes_read,
        "offchip_bytes_written": c.offchip_bytes_written,
        "layers": [
            {"name": tag or "(untagged)", "cycles": t.span_cycles, "busy_cycles": t.busy_cycles, "macs": t.macs,
             "instructions": t.instructions, "sram_bytes": t.sram_bytes_read + t.sram_bytes_written,
             "offchip_bytes": t.offchip_bytes}
            for tag, t in sorted(c.by_tag.items(), key=lambda kv: kv[1].first_cycle)
        ],
        "counters": c.to_json(),
    }


def save_report(report: dict, path: str):
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def load_report(path: str) -> dict:
    with open(path) as f:
        return json.load(f)

"""Many chips: systems of LPX chips and their C2C links (docs/multichip.md)."""

from .topology import SYSTEM_PRESETS, Link, System, load_system, parse_system

__all__ = ["SYSTEM_PRESETS", "Link", "System", "load_system", "parse_system"]

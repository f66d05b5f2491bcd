"""The LPX processor simulator: functional and cycle-exact execution with schedule checks."""

from .counters import Counters, TagCounters
from .simulator import SimResult, Simulator

__all__ = ["Simulator", "SimResult", "Counters", "TagCounters"]

"""A tuning log as the compiler's tiling policy: what ``build(tuning_log=...)`` compiles with.

The pipeline takes a :class:`~lpx_tvm.target.codegen.TilingPolicy` and never reads a log;
:func:`policy_from_log` makes one from a log, and it names what it applied for the
report's ``tuning`` (:meth:`LogPolicy.summary`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..machine.config import LPXConfig
from ..target.codegen import TilingPolicy
from .database import load_tuned
from .space import Task


@dataclass
class LogPolicy(TilingPolicy):
    """The tilings of the tuning log at ``log`` (for one machine)."""

    log: str = ""

    def summary(self, precision: str) -> dict:
        """``{"log", "tuned_layers", "default_layers"}``: the distinct MXM layers (tuning
        tasks, by name) the compile applied a tuned tiling to, and the others."""
        def names(keys):
            return sorted(Task(k, None, precision).name for k in keys)

        return {"log": self.log, "tuned_layers": names(self.used), "default_layers": names(set(self.tasks) - self.used)}


def policy_from_log(path, cfg: LPXConfig) -> LogPolicy:
    """The policy of the tuning log folder ``path`` for machine ``cfg`` (see
    :func:`~lpx_tvm.tune.database.load_tuned`: a log made for another machine applies
    nothing, with a warning)."""
    return LogPolicy(load_tuned(str(path), cfg), log=str(path))


__all__ = ["LogPolicy", "policy_from_log"]

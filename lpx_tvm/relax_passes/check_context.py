"""Where the ``lpx.`` check functions find the machine, and where they leave their reasons.

Patterns are registered once, globally, so their check functions cannot take
arguments: :func:`check_settings` sets the machine config and precision for the
checks run inside it, and collects every refusal in a :class:`RejectionLog`.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

from ..machine.config import LPXConfig, load_config
from ..precision import Precision
from .errors import PartitionError

__all__ = [
    "CheckSettings",
    "Rejection",
    "RejectionLog",
    "check_settings",
    "current_settings",
]



@dataclass(frozen=True)
class Rejection:
    """One check's refusal: which pattern, which op, and the hardware reason."""

    pattern: str
    op: str
    reason: str


class RejectionLog:
    """Reasons recorded by the check functions, keyed by the variable bound to the op."""

    def __init__(self):
        self._by_key = {}

    def record(self, key, rejection: Rejection) -> None:
        self._by_key.setdefault(key, []).append(rejection)

    def reason_for(self, var) -> str | None:
        """The reason the op bound to ``var`` was last refused, or None.

        Patterns are tried from the most fused to the single op, so the last refusal is
        the one of the smallest pattern: the reason the op itself cannot run on LPX.
        """
        found = self._by_key.get(var)
        return found[-1].reason if found else None

    def __len__(self) -> int:
        return sum(len(rs) for rs in self._by_key.values())


@dataclass(frozen=True)
class CheckSettings:
    """The machine and precision the check functions judge against."""

    config: LPXConfig
    precision: str = "fp16"
    log: RejectionLog = field(default_factory=RejectionLog, compare=False)

    @property
    def activation_bytes(self) -> int:
        return Precision(self.precision).value_bytes


_SETTINGS: contextvars.ContextVar = contextvars.ContextVar("lpx_check_settings", default=None)


def _validated_precision(precision: str) -> str:
    if precision not in Precision.names():
        raise PartitionError(
            f"precision {precision!r} is not one of {', '.join(sorted(Precision.names()))}"
        )
    return precision


@contextlib.contextmanager
def check_settings(config=None, precision: str = "fp16", log: RejectionLog | None = None):
    """Set the machine config and precision that the ``lpx.`` check functions use.

    Parameters
    ----------
    config : LPXConfig, str or os.PathLike, optional
        A config, a preset name or a JSON path (default: the ``tsp`` preset).
    precision : str
        ``fp32``, ``fp16``, ``bf16`` or ``int8``: the size of an activation element.
    log : RejectionLog, optional
        Where refusals are recorded; a new log by default.

    Yields
    ------
    CheckSettings
        The settings in force; ``.log`` holds the reasons after partitioning.
    """
    settings = CheckSettings(
        load_config(config), _validated_precision(precision), log or RejectionLog()
    )
    token = _SETTINGS.set(settings)
    try:
        yield settings
    finally:
        _SETTINGS.reset(token)


def current_settings() -> CheckSettings:
    """The settings of the innermost :func:`check_settings`, else ``tsp`` at fp16."""
    settings = _SETTINGS.get()
    return settings if settings is not None else CheckSettings(load_config(None))

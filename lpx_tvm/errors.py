"""Typed errors raised by lpx_tvm library code. Only the CLI prints and exits."""


class LPXError(Exception):
    """Base class of every error lpx_tvm raises on purpose."""


class ConfigError(LPXError):
    """A machine config file or field is invalid."""


class EncodingError(LPXError):
    """A program binary or assembly text is malformed, truncated or incompatible."""


class ProgramError(LPXError):
    """A program is structurally invalid (bad operand, bad binding) before it runs."""


class ScheduleHazard(LPXError):
    """The simulator found a violation of the static schedule.

    Carries the offending instruction's index and text, the unit and the cycle,
    so a compiler engineer can find it in the assembly listing.
    """

    def __init__(self, kind, message, *, index=None, instr=None, unit=None, cycle=None, chip=None):
        self.kind = kind
        self.message = message
        self.chip = chip  # in a system of chips: the chip whose instruction it is
        self.index = index
        self.instr = instr
        self.unit = unit
        self.cycle = cycle
        where = [] if chip is None else [f"chip {chip}"]
        if index is not None:
            where.append(f"instruction #{index}")
        if unit is not None:
            where.append(f"unit {unit}")
        if cycle is not None:
            where.append(f"cycle {cycle}")
        text = f"{kind}: {message}"
        if where:
            text += f" [{', '.join(where)}]"
        if instr is not None:
            text += f"\n  {instr}"
        super().__init__(text)

    def __reduce__(self):  # to cross process boundaries (a system's chips checked by workers)
        return (_schedule_hazard, (type(self), self.kind, self.message, self.index, self.instr, self.unit,
                                   self.cycle, self.chip))


def _schedule_hazard(cls, kind, message, index, instr, unit, cycle, chip):
    return cls(kind, message, index=index, instr=instr, unit=unit, cycle=cycle, chip=chip)


class SchedulingError(LPXError):
    """The program builder could not produce a valid schedule (e.g. inconsistent stream timing)."""


class SramFull(SchedulingError):
    """The SRAM has no room for a tensor (the region compiler then keeps activations off chip)."""

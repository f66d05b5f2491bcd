"""ICU: ``icu.sync`` checks that everything issued before it is done; NOPs only hold ports."""

from __future__ import annotations

from ...machine.isa import NOPS
from ..memory import Race


def sync(run, i, ins, t, done_before):
    if done_before > ins.cycle:
        raise Race("sync-in-flight", f"sync at cycle {ins.cycle} while earlier instructions complete "
                                     f"only at cycle {done_before}")


def nop(run, i, ins, t, _):
    pass


HANDLERS = {"icu.sync": sync, **{op: nop for op in NOPS}}

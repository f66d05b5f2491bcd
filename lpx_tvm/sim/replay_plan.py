"""The replay plan of a verified program: its steps, and what only the whole run tells.

While the checker runs (``simulator._Run``), the unit checks record each instruction's
step (:mod:`lpx_tvm.sim.replay_steps`) and, in :class:`PlanNotes`, what each step reads and
writes. :func:`finalize` then works out, from the whole run, when each value is read
for the last time (it is dropped then), which concatenated MXM operands later blocks
reuse (kept until then), which float blocks are computed together, which ``mem.read``
may hand out views of the SRAM, and which fp32 VXM ops may compute in place
(docs/design.md, "Verify once, replay"). A :class:`ReplayPlan` keeps the result with what
identifies the program it was made from.
"""

from __future__ import annotations

import bisect
import operator
import weakref
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from ..machine.program import Program
from .counters import Counters
from .mxm import Accumulators
from .replay_steps import MemRead, MxmSettle, MxmSettleEarly, Vxm, VxmInPlace


@dataclass
class Block:
    """Float accumulator rows whose K splits wait for one concatenated matmul."""

    width: int
    splits: list = field(default_factory=list)  # (activation producer, weight producer, xkey, K, wkey)
    last_split: int = -1  # step of its last split


def concat_keys(block: Block) -> tuple:
    """Keys naming a block's concatenated activations and weights; None where a split's
    operand did not come straight from SRAM lines (unchanged since)."""
    xs = tuple((xkey, k) for _, _, xkey, k, _ in block.splits)
    ws = tuple(wkey for *_, wkey in block.splits)
    return (None if any(x is None for x, _ in xs) else xs,
            None if any(w is None for w in ws) else (ws, block.width))


@dataclass
class PlanNotes:
    """What the checks record about the steps, for :func:`finalize`."""

    uses: list = field(default_factory=list)  # (step, producers whose values it reads)
    made: dict = field(default_factory=dict)  # producer -> step that makes its value
    reads: list = field(default_factory=list)  # (step, instruction, slice, lowest, highest line) of mem.reads
    writes: list = field(default_factory=list)  # (step, slice, lowest line, highest line) of every SRAM write
    fresh: dict = field(default_factory=dict)  # producer -> vector count, of values made as new arrays
    views: list = field(default_factory=list)  # (producer, producer whose value it is a view of)
    fp32_binary: list = field(default_factory=list)  # (step, producer, a, b) of fp32 binary VXM steps
    blocks: dict = field(default_factory=dict)  # block id -> Block
    settles: list = field(default_factory=list)  # (step, block id)


def finalize(recorded: list, notes: PlanNotes) -> list:
    """The steps for replays of a verified program (see the module doc)."""
    steps = list(recorded)
    last = {}  # producer -> last step reading its value directly
    live = {}  # producer -> last step reading it or a view of it (MXM operands, at the settle)
    for k, ps in notes.uses:
        for p in ps:
            last[p] = live[p] = k
    # Concatenated operands: the same key at several settles is computed once.
    at = (defaultdict(list), defaultdict(list))  # activations, weights: key -> settle steps
    for k, bid in notes.settles:
        for which, key in enumerate(concat_keys(notes.blocks[bid])):
            if key is not None:
                at[which][key].append(k)
    action = {}  # (step, 0 for activations / 1 for weights) -> (id, how)
    put_at = {}  # (0 or 1, id) -> the step that computes and keeps it
    for which in (0, 1):
        for cid, ks in enumerate(at[which].values()):
            if len(ks) > 1:
                action[ks[0], which] = (cid, Accumulators.PUT)
                put_at[which, cid] = ks[0]
                for k in ks[1:-1]:
                    action[k, which] = (cid, Accumulators.GET)
                action[ks[-1], which] = (cid, Accumulators.POP)
    early, batches = _batch_settles(notes, at[1], action, put_at)
    pop = Accumulators.POP
    for k, bid in notes.settles:
        xa, wa = action.get((k, 0)), action.get((k, 1))
        s = steps[k]
        assert isinstance(s, MxmSettle)
        if k in early:  # computed at step early[k] with an earlier block that has the same weights
            steps[k] = MxmSettleEarly(plane=s.plane, block=s.block, addr=s.addr, count=s.count,
                                      xdrop=xa[0] if xa and xa[1] == pop else None,
                                      wdrop=wa[0] if wa and wa[1] == pop else None)
            for xp, wp, *_ in notes.blocks[bid].splits:
                live[xp] = max(live.get(xp, k), early[k])
                live[wp] = max(live.get(wp, k), early[k])
            continue
        steps[k] = replace(s, xkeep=xa, wkeep=wa, batch=batches.get(bid, ()))
        for xp, wp, *_ in notes.blocks[bid].splits:
            if xa is None or xa[1] == Accumulators.PUT:
                live[xp] = max(live.get(xp, k), k)
            if wa is None or wa[1] == Accumulators.PUT:
                live[wp] = max(live.get(wp, k), k)
    for i, p in notes.views:
        live[p] = max(live.get(p, -1), live.get(i, -1))
    # In place: an fp32 binary VXM step whose first operand is a whole new array that
    # nothing reads after it.
    for k, i, a, b in notes.fp32_binary:
        s = steps[k]
        assert isinstance(s, Vxm)
        p, off = a
        if notes.fresh.get(p) == s.count and off == 0 and last.get(p) == k == live.get(p) \
                and (b is None or b.producer != p):
            steps[k] = VxmInPlace(producer=i, op=s.op, a=p, b=b, imm=s.imm)
    # Views: a read whose lines no write changes while any of its values is read.
    writes = defaultdict(list)
    for k, bank, lo, hi in notes.writes:
        writes[bank].append((k, lo, hi))
    starts = {bank: [w[0] for w in ws] for bank, ws in writes.items()}
    for k, i, bank, lo, hi in notes.reads:
        end = live.get(i, k)
        ws = writes.get(bank, ())
        j, stop = bisect.bisect_right(starts.get(bank, ()), k), bisect.bisect_right(starts.get(bank, ()), end)
        if any(wlo <= hi and lo <= whi for _, wlo, whi in ws[j:stop]):
            continue
        assert isinstance(steps[k], MemRead)
        steps[k] = replace(steps[k], copy=False)
    # Drop each value after its last direct read (at once when nothing reads it).
    drop = defaultdict(list)
    for p, k in notes.made.items():
        drop[last.get(p, k)].append(p)
    return [replace(s, drop=tuple(drop[k])) if k in drop else s for k, s in enumerate(steps)]


def _batch_settles(notes: PlanNotes, by_weights: dict, action: dict, put_at: dict) -> tuple:
    """Blocks with the same weights whose splits are all in by the time the first of
    them settles are computed with it, in one matmul of all their rows (a layer's row
    blocks: small ones make slow matmuls). Returns ({step of a block computed early:
    the step computing it}, {id of a first block: ((block id, its activations' action), ...)})."""
    settle_of = dict(notes.settles)
    early, batches = {}, {}
    for ks in by_weights.values():
        lead = ks[0]
        batch = []
        for k in ks[1:]:
            bid = settle_of[k]
            if notes.blocks[bid].last_split > lead:
                continue
            xa = action.get((k, 0))
            if xa is not None and xa[1] != Accumulators.PUT:
                if put_at[0, xa[0]] > lead:
                    continue  # its activations are kept only later
                xa = (xa[0], Accumulators.GET)  # the block's own step drops them
            batch.append((bid, xa))
            early[k] = lead
        if batch:
            batches[settle_of[lead]] = tuple(batch)
    return early, batches


def addresses_from_data(program: Program) -> bool:
    """Whether ``program`` reads or writes SRAM at addresses taken from data
    (``mem.gather``, ``mem.scatter``): its functional runs compute while they are checked."""
    return any(ins.op in ("mem.gather", "mem.scatter") for ins in program.instrs)


@dataclass
class ReplayPlan:
    """A verified program's steps, with what identifies the program they were made from."""

    program: weakref.ref
    parts: tuple  # the program's fields when it was verified (instructions, images, ...)
    tables: list  # copies of its permutation tables
    steps: list
    written: dict  # bank -> (lowest, highest) line its instructions write
    counters: Counters
    # Steps whose addresses are data (``mem.gather``) are not in ``steps``: such a
    # program is never replayed, only run checked.
    replayable: bool = True

    @staticmethod
    def _parts(p: Program) -> tuple:
        return (p.config_hash, p.isa_version, p.host_bytes, p.host_init, tuple(p.instrs), tuple(p.sram_init),
                tuple(p.bindings))

    @classmethod
    def record(cls, program: Program, run, ref) -> "ReplayPlan":
        return cls(ref, cls._parts(program), [np.array(t, copy=True) for t in program.tables],
                   finalize(run.steps, run.notes), dict(run.written), run.counters.copy(),
                   not addresses_from_data(program))

    def matches(self, p: Program) -> bool:
        """Whether ``p`` is still the program verified (instructions are immutable: compared by identity)."""
        if self.program() is not p:
            return False
        mine = self.parts
        now = self._parts(p)
        return mine[:3] == now[:3] and (mine[3] is now[3] or mine[3] == now[3]) \
            and all(len(a) == len(b) and all(map(operator.is_, a, b)) for a, b in zip(mine[4:], now[4:])) \
            and len(self.tables) == len(p.tables) \
            and all(np.array_equal(a, b) for a, b in zip(self.tables, p.tables))

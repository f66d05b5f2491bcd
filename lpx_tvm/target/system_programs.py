"""Collectives over C2C links, scheduled statically: all-reduce, reduce-scatter and
all-gather of a ``rows x lanes`` tensor over a group of chips that are pairwise linked
(a GroqNode, an LP30 tray: the groups tensor parallelism uses), and a point-to-point
transfer along a path of links (a pipeline stage's hand-off).

The algorithm is the direct one: the rows are cut into one shard per chip (in the
group's order, its ranks); in the reduce-scatter each chip sends shard ``d`` to chip
``d`` (all N - 1 transfers at once, on N - 1 links) and chip ``d`` adds the N copies of
its shard, its own first, then its peers' in the group's order, on the VXM as they
arrive; in the all-gather each chip sends its shard to every peer. A shard is sent one
message per SRAM chunk of the tensors it is read from and written to (one message for a
tensor a slice holds). An all-reduce is the two, pipelined: its shards go in several
messages each (``MESSAGES_PER_SHARD``), and each message's sum is sent on as soon as its
copies are in, so the all-gather runs one message behind the reduce-scatter: 2 (N - 1)
/ N of the tensor crosses each chip's links, in two link latencies.

Each chip gets one program (inputs ``X``, outputs ``Y``), built by the program builder.
A chip's receive waits for its data's arrival, which its sender's schedule fixes: the
programs are built until every arrival they assume is the one their senders' programs
give (arrivals only move later, so this ends). The cycles are the simulator's
(:class:`~lpx_tvm.sim.multichip.SystemSimulator`), and docs/multichip.md gives them by
hand.
"""

from __future__ import annotations

import functools
import operator
import threading
from dataclasses import dataclass

from ..errors import LPXError
from ..machine import timing as tm
from ..machine.isa import DType
from ..machine.system import System, load_system
from .builder import ProgramBuilder

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
MESSAGES_PER_SHARD = 8  # an all-reduce's messages a shard (fewer for a shard of fewer vectors)
ADDABLE = (DType.FP32, DType.FP16, DType.BF16, DType.INT32)


@dataclass
class Transfer:
    """One message: ``vectors`` of ``dtype`` from ``src`` port ``src_link`` to ``dst``
    port ``dst_link``, sent at ``send_cycle``, all arrived at ``arrival``."""

    src: int
    src_link: int
    dst: int
    dst_link: int
    vectors: int
    dtype: DType
    send_cycle: int
    arrival: int


@dataclass
class Collective:
    """A collective's programs, one per chip of ``chips``, and its transfers."""

    kind: str
    system: System
    chips: tuple
    rows: int
    dtype: DType
    programs: dict  # chip -> Program
    transfers: list

    @property
    def bytes_moved(self) -> int:
        return sum(t.vectors for t in self.transfers) * self.system.config.lanes * self.dtype.itemsize

    @property
    def cycles(self) -> int:
        """The last instruction's end over all chips' programs (what the simulator counts)."""
        return max(max((tm.timing(self.system.config, i).done for i in p.instrs), default=0)
                   for p in self.programs.values())

    @property
    def link_floor(self) -> int:
        """Cycles no schedule of this collective's algorithm can beat on its links: its
        link latencies in series plus the vectors that cross one link in series before
        the last one lands (``hops L + n c``, ``c`` a vector's cycles on a link), or its
        busiest link's vectors and one latency, whichever is longer. An all-reduce (and
        a sharded hand-off): two latencies, a shard's ``S`` vectors on its first link and
        the last one's sum (``n = S + 1``); a reduce-scatter or all-gather: one, ``S``; a
        transfer along a path of ``h`` links: ``h`` latencies, all its vectors and one
        more a chip between (forwarding as the first vector arrives, at best); a whole
        hand-off: one latency, all its vectors."""
        cfg = self.system.config
        c, latency = tm.c2c_cycles_per_vector(cfg, self.dtype), cfg.c2c_latency
        groups = 2 if self.kind == "handoff" else 1
        group = len(self.chips) // groups
        shard = max(size for _, size in shards(self.rows, group))
        if self.kind == "send":
            hops, serial = len(self.chips) - 1, self.rows + len(self.chips) - 2
        elif self.kind == "all_reduce" or (self.kind == "handoff" and
                                           handoff_sharded(cfg, group, self.rows, self.dtype)):
            hops, serial = 2, shard + 1
        elif self.kind == "handoff":
            hops, serial = 1, self.rows
        else:
            hops, serial = 1, shard
        busiest = {}
        for t in self.transfers:
            busiest[t.src, t.src_link] = busiest.get((t.src, t.src_link), 0) + t.vectors
        return max(hops * latency + serial * c, latency + max(busiest.values(), default=0) * c)

    def shard(self, chip: int) -> tuple:
        """(first row, rows) of ``chip``'s shard."""
        return shards(self.rows, len(self.chips))[self.chips.index(chip)]


def shards(rows: int, n: int) -> list:
    """(first row, rows) of n balanced shards of ``rows`` (the first ``rows % n`` one larger)."""
    base, extra = divmod(rows, n)
    out, start = [], 0
    for k in range(n):
        size = base + (k < extra)
        out.append((start, size))
        start += size
    return out


def collective(kind: str, system, chips, rows: int, dtype="fp32") -> Collective:
    """The programs of collective ``kind`` over ``chips`` of ``system`` on a ``rows x
    lanes`` tensor of ``dtype``: ``X`` is each chip's input (all rows; for all_gather its
    shard) and ``Y`` its result (all rows; for reduce_scatter its shard)."""
    system = load_system(system)
    if kind not in KINDS:
        raise LPXError(f"collective {kind!r}: expected one of {', '.join(KINDS)}")
    chips = _chips(system, chips)
    dt = _dtype(dtype)
    rows = _rows(rows, f"{kind} of")
    if len(set(chips)) != len(chips) or len(chips) < 2:
        raise LPXError(f"collective over chips {list(chips)}: needs two or more distinct chips")
    for a in chips:
        for b in chips:
            if a != b and not system.links_between(a, b):
                raise LPXError(f"chips {a} and {b} of system {system.name} are not linked: the direct "
                               f"{kind} needs a group of pairwise linked chips")
    if kind != "all_gather" and dt not in ADDABLE:
        raise LPXError(f"{kind} of {dt.short}: the VXM adds fp32, fp16, bf16 or int32")
    if rows < len(chips) and kind != "all_reduce":  # an all-reduce leaves the chips past the rows no shard
        raise LPXError(f"{kind} of {rows} rows over {len(chips)} chips: at least one row per chip")
    return _settle(kind, system, chips, rows, dt, lambda c, place: _program(kind, place, rows, dt))


def point_to_point(system, src: int, dst: int, rows: int, dtype="fp16") -> Collective:
    """``rows x lanes`` of ``dtype`` from chip ``src`` (input ``X``) to chip ``dst``
    (output ``Y``) along a shortest path of links; each chip between forwards the
    message as it receives it (a receive's stream straight into the next send), once
    the whole message has arrived. ``Collective.chips`` is the path."""
    system = load_system(system)
    src, dst = _chip(system, src), _chip(system, dst)
    dt = _dtype(dtype)
    rows = _rows(rows, "a transfer of")
    if src == dst:
        raise LPXError(f"a transfer from chip {src} to itself")
    path = tuple(system.path(src, dst))
    return _settle("send", system, path, rows, dt, lambda c, place: _forward(place, rows, dt))


def handoff(system, senders, receivers, rows: int, dtype="fp16") -> Collective:
    """A pipeline stage's hand-off of a ``rows x lanes`` tensor of ``dtype`` that every
    chip of the group ``senders`` holds (input ``X``) to every chip of the group
    ``receivers`` (output ``Y``), rank to rank over a link
    (:func:`emit_send`, :func:`emit_receive`): each sender sends its shard alone and the
    receivers gather the rest from each other. ``Collective.chips`` is the senders, then
    the receivers."""
    system = load_system(system)
    senders, receivers = _chips(system, senders), _chips(system, receivers)
    dt = _dtype(dtype)
    rows = _rows(rows, "a hand-off of")
    if len(senders) != len(receivers) or len(set(senders + receivers)) != 2 * len(senders):
        raise LPXError(f"a hand-off from chips {list(senders)} to {list(receivers)}: expected two groups of as "
                       "many distinct chips")
    for group in (senders, receivers):
        for a in group:
            for c in group:
                if a != c and not system.links_between(a, c):
                    raise LPXError(f"chips {a} and {c} of system {system.name} are not linked: a group's "
                                   "chips gather the hand-off from each other")
    for a, c in zip(senders, receivers):
        if not system.links_between(a, c):
            raise LPXError(f"chips {a} and {c} of system {system.name} are not linked: each chip hands its rows "
                           "to the next group's chip of its rank over a link")
    roles = {a: dict(chips=senders, downstream=c) for a, c in zip(senders, receivers)}
    roles.update({c: dict(chips=receivers, upstream=a) for a, c in zip(senders, receivers)})

    def build(c, place):
        b = place.builder(system.config, f"handoff chip {c}")
        if c in senders:
            emit_send(b, place, b.input("X", (rows, system.config.lanes), dt))
        else:
            emit_receive(b, place, b.output("Y", (rows, system.config.lanes), dt))
        return b.build()

    programs, transfers = build_together(system, senders + receivers, build, "a hand-off", roles)
    return Collective("handoff", system, senders + receivers, rows, dt, programs, transfers)


def _whole(v) -> "int | None":
    """``v`` as an int when it is a whole number (numpy's too), else None."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _chips(system: System, chips) -> tuple:
    try:
        chips = tuple(chips)
    except TypeError:
        raise LPXError(f"chips {chips!r}: expected a list of chip numbers") from None
    return tuple(_chip(system, c) for c in chips)


def _chip(system: System, c) -> int:
    n = _whole(c)
    if n is None or not 0 <= n < system.chips:
        raise LPXError(f"chip {c!r}: system {system.name} has chips 0..{system.chips - 1}")
    return n


def _dtype(dtype) -> DType:
    try:
        return DType.parse(dtype)
    except ValueError:
        names = ", ".join(d.short for d in DType if d is not DType.NONE)
        raise LPXError(f"dtype {dtype!r}: expected one of {names}") from None


def _rows(rows, what: str) -> int:
    n = _whole(rows)
    if n is None or n < 1:
        raise LPXError(f"{what} {rows!r} rows: expected a whole number of rows, at least 1")
    return n


def _settle(kind, system, chips, rows, dt, build) -> Collective:
    programs, transfers = build_together(system, chips, build, kind)
    return Collective(kind, system, chips, rows, dt, programs, transfers)


def build_together(system: System, chips, build, what: str = "programs", roles: "dict | None" = None) -> tuple:
    """({chip: Program}, [Transfer]): ``build(chip, place)`` (``place`` a
    :class:`ChipPlace`) for every chip, side by side in threads. A chip's receive is
    placed once its sender has placed the send (it waits for it), so each program is
    built once with its messages' true arrivals; programs whose receives wait on each
    other are refused. The arrivals are checked against the programs' transfers after;
    a build that placed differently the second time is rebuilt until they agree
    (:func:`settle`). ``roles``: ``{chip: {field: value}}`` of each chip's
    :class:`ChipPlace` past the default (all ``chips`` one group): its group
    (``chips``), ``upstream``, ``downstream``, ``received``."""
    board = ArrivalBoard(system, chips)
    programs, errors = {}, {}
    roles = {c: {"chips": tuple(chips), **(roles or {}).get(c, {})} for c in chips}

    def work(c):
        try:
            programs[c] = build(c, ChipPlace(system, chip=c, board=board, **roles[c]))
        except BaseException as e:  # raised in the caller's thread below
            errors[c] = e
        finally:
            board.finish(c)

    threads = [threading.Thread(target=work, args=(c,), name=f"build chip {c}") for c in chips]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        first = next((e for e in errors.values() if not isinstance(e, _Deadlock)), next(iter(errors.values())))
        raise first
    transfers = _transfers(system, programs)
    if board.agrees(transfers):
        return programs, transfers
    return settle(system, chips, lambda c, arrivals: build(c, ChipPlace(system, chip=c, arrivals=arrivals,
                                                                         **roles[c])), what)


def settle(system: System, chips, build, what: str = "programs") -> tuple:
    """({chip: Program}, [Transfer]): ``build(chip, arrivals)`` for every chip, again
    until the arrivals each program assumes (``{(chip, port): [cycles]}``, in the order
    its messages come) are those its senders' programs give. Arrivals only move later,
    so this ends: each build fixes at least the earliest message whose arrival was still
    assumed, so there are at most as many builds as messages."""
    arrivals, builds, limit = {}, 0, 2
    while builds < limit:
        programs = {c: build(c, arrivals) for c in chips}
        transfers = _transfers(system, programs)
        builds, limit = builds + 1, max(limit, len(transfers) + 2)
        seen = {}
        for t in transfers:
            seen.setdefault((t.dst, t.dst_link), []).append(t.arrival)
        if seen == arrivals:
            return programs, transfers
        arrivals = seen
    raise LPXError(f"{what} over {len(chips)} chips: the arrivals did not settle")


class _Deadlock(LPXError):
    pass


class ArrivalBoard:
    """The arrivals of the messages of chips whose programs are being built side by side
    (:func:`build_together`): each chip's builder posts its sends as it places them, and
    a receive's placement waits for its message's."""

    def __init__(self, system: System, chips):
        self.system = system
        self.cond = threading.Condition()
        self.posted = {}  # (receiving chip, its port) -> {k: arrival of its k-th message}
        self.sent = {}  # (sending chip, port) -> messages placed by its current build
        self.used = {}  # (receiving chip, port) -> {k: the arrival its build used}
        self.building = set(chips)
        self.blocked = {}  # chip -> (port, k) its build waits for

    def start(self, chip: int):
        """``chip``'s builder starts a build: its sends are counted afresh."""
        with self.cond:
            for key in [k for k in self.sent if k[0] == chip]:
                self.sent[key] = 0

    def post(self, chip: int, instrs):
        with self.cond:
            for ins in sorted((i for i in instrs if i.op == "c2c.send"), key=lambda i: i.cycle):
                far = self.system.peer(chip, ins.unit)
                k = self.sent.get((chip, ins.unit), 0)
                self.sent[chip, ins.unit] = k + 1
                self.posted.setdefault(far, {})[k] = tm.timing(self.system.config, ins).done
            self.cond.notify_all()

    def wait(self, chip: int, port: int, k: int) -> int:
        """The arrival of the ``k``-th message to ``chip``'s ``port``, once its sender has
        placed it."""
        with self.cond:
            self.blocked[chip] = (port, k)
            try:
                while k not in self.posted.get((chip, port), {}):
                    if self._stuck():
                        self.cond.notify_all()
                        raise _Deadlock(f"the programs of chips {sorted(self.building)} wait on each other: chip "
                                        f"{chip} receives message {k + 1} on link {port} before any program sends "
                                        "it")
                    self.cond.wait()
            finally:
                del self.blocked[chip]
            arrival = self.posted[chip, port][k]
            self.used.setdefault((chip, port), {})[k] = arrival
            return arrival

    def _stuck(self) -> bool:
        """Every chip still building waits for a message no one has placed."""
        return all(c in self.blocked for c in self.building) and \
            not any(k in self.posted.get((c, p), {}) for c, (p, k) in self.blocked.items())

    def finish(self, chip: int):
        with self.cond:
            self.building.discard(chip)
            self.cond.notify_all()

    def agrees(self, transfers) -> bool:
        """Whether every arrival a build used is its message's in the final programs."""
        final = {}
        for t in sorted(transfers, key=lambda t: t.send_cycle):
            final.setdefault((t.dst, t.dst_link), []).append(t.arrival)
        return all(k < len(final.get(key, ())) and final[key][k] == a
                   for key, used in self.used.items() for k, a in used.items())


@dataclass(frozen=True)
class BoardPoster:
    """A :class:`~lpx_tvm.target.builder.BuildObserver` posting one chip's placed sends
    to the board of the programs built beside it."""

    board: "ArrivalBoard"
    chip: int

    def started(self) -> None:
        self.board.start(self.chip)

    def placed(self, instrs: list) -> None:
        self.board.post(self.chip, instrs)


@dataclass
class ChipPlace:
    """One chip's place in a group of pairwise linked chips of a system, as a program
    built for it sees it: its messages' arrivals come from ``board`` (programs built side
    by side, :func:`build_together`) or from ``arrivals`` (``{(chip, port): [cycles]}``
    of a previous build, :func:`settle`). In a pipeline the chip also receives the inputs
    named ``received`` from chip ``upstream`` and sends its outputs (those not updated in
    place) to chip ``downstream`` (:func:`emit_receive`, :func:`emit_send`)."""

    system: System
    chips: tuple  # the group, in rank order
    chip: int
    arrivals: dict = None
    board: "ArrivalBoard | None" = None
    upstream: "int | None" = None
    downstream: "int | None" = None
    received: tuple = ()

    def __post_init__(self):
        self.heard = {}  # port -> messages received so far by the program being built

    @property
    def observer(self) -> "BoardPoster | None":
        """What this chip's program builders are told to post their sends to the board
        (None: built alone, its arrivals given)."""
        return BoardPoster(self.board, self.chip) if self.board is not None else None

    def builder(self, cfg, name: str) -> ProgramBuilder:
        """A builder of this chip's program: its links reach other chips."""
        return ProgramBuilder(cfg, name, loopback=False, observer=self.observer)

    @property
    def peers(self) -> list:
        return [d for d in self.chips if d != self.chip]

    def port(self, peer: int) -> int:
        """This chip's port to ``peer`` (and from it): of the links joining them, the one
        on the lower-numbered chip's lowest port, so that both ends pick the same link
        (each end's own lowest port may belong to different links)."""
        low, high = sorted((self.chip, peer))
        port_low, port_high = self.system.links_between(low, high)[0]
        return port_low if self.chip == low else port_high

    def check_builder(self, b: ProgramBuilder):
        """``b`` builds this chip's program: made by :meth:`builder` (or given this
        chip's interface), its links reach other chips and its sends reach the board."""
        if b.loopback or b.observer != self.observer:
            raise LPXError(f"program {b.name!r}: its builder was not made for chip {self.chip} of a system "
                           "(ChipPlace.builder, or the ProgramInterface's chip)")

    def expect(self, b: ProgramBuilder, *senders):
        """The next message from each of ``senders`` arrives when its sender's program
        says: call before the group that receives them."""
        for d in senders:
            p = self.port(d)
            k = self.heard.get(p, 0)
            self.heard[p] = k + 1
            if self.board is not None:
                b.arrival(p, functools.partial(self.board.wait, self.chip, p, k))
            else:
                times = (self.arrivals or {}).get((self.chip, p), [])
                b.arrival(p, times[k] if k < len(times) else 0)


def emit_all_reduce(b: ProgramBuilder, place: ChipPlace, x, y, tag: str = "all_reduce"):
    """Groups of ``b`` that all-reduce SRAM tensor ``x`` over ``place``'s group into ``y``
    (same shape): the direct algorithm of this module, on the value's vectors (column
    tile by column tile, row by row) cut into one shard per chip, each shard's rows in
    messages of a few vectors (:func:`_message_vectors`), cut again where the SRAM chunks
    of ``x`` and of ``y`` change. Every chip adds its shard's copies in the
    same order (its own, then its peers' in the group's order), so every chip's ``y`` is
    the same, bit for bit."""
    parts = shards(x.layout.rows * x.ntiles, len(place.chips))
    most = _message_vectors(parts)

    def pieces(k):
        # cut again where y's chunks change: a value goes to one slice, on one side
        return _shard_messages(x, parts, k, most, y)

    def write(g, v, j, r):
        for r0, reg in y.segments(j, r, r + v.count):
            g.write(v.part(r0 - r, reg.count) if v.count != reg.count else v, reg)

    me, peers = place.chips.index(place.chip), place.peers
    place.check_builder(b)
    for d in peers:  # reduce-scatter: each peer's shard to it
        for j, r, reg in pieces(place.chips.index(d)):
            g = b.group(f"{tag}.send")
            g.send(place.port(d), g.read(reg))
    for j, r, reg in pieces(me):
        g, v = _reduced(b, place, reg, tag)
        for d in peers:  # the reduced rows to every peer, from the stream
            g.send(place.port(d), v)
        write(g, v, j, r)
    for d in peers:  # all-gather: the peers' reduced shards
        for j, r, reg in pieces(place.chips.index(d)):
            place.expect(b, d)
            g = b.group(f"{tag}.gather")
            write(g, g.recv(place.port(d), reg.count, reg.dtype), j, r)


def emit_receive(b: ProgramBuilder, place: ChipPlace, t, tag: str = "handoff"):
    """Groups of ``b`` that write SRAM tensor ``t`` with the rows ``place.upstream``
    sends (:func:`emit_send` of a tensor of the same layout), message by message. In a
    group of several chips (tensor parallelism), the chip of each rank before sends
    this chip's shard of the rows alone (every chip of a group holds the same rows):
    this chip forwards each message to its peers as it arrives, from the stream, and
    writes theirs as they come, so the link between the stages carries 1 / N of the
    rows and the exchange within the group runs one message behind it."""
    port = place.port(place.upstream)
    place.check_builder(b)
    if not _sharded_handoff(place, t):
        for reg in _messages(t):
            place.expect(b, place.upstream)
            g = b.group(f"{tag}.recv")
            g.write(g.recv(port, reg.count, reg.dtype), reg)
        return
    parts = shards(t.layout.rows * t.ntiles, len(place.chips))
    most = _message_vectors(parts)
    for _, _, reg in _shard_messages(t, parts, place.chips.index(place.chip), most):
        place.expect(b, place.upstream)
        g = b.group(f"{tag}.recv")
        v = g.recv(port, reg.count, reg.dtype)
        for d in place.peers:
            g.send(place.port(d), v)
        g.write(v, reg)
    for d in place.peers:
        for _, _, reg in _shard_messages(t, parts, place.chips.index(d), most):
            place.expect(b, d)
            g = b.group(f"{tag}.gather")
            g.write(g.recv(place.port(d), reg.count, reg.dtype), reg)


def emit_send(b: ProgramBuilder, place: ChipPlace, t, tag: str = "handoff"):
    """Groups of ``b`` that send SRAM tensor ``t`` to ``place.downstream``, as
    :func:`emit_receive` takes it: all its rows from a chip alone, this chip's shard of
    them from a group of several."""
    port = place.port(place.downstream)
    place.check_builder(b)
    if not _sharded_handoff(place, t):
        regions = _messages(t)
    else:
        parts = shards(t.layout.rows * t.ntiles, len(place.chips))
        regions = [reg for _, _, reg in _shard_messages(t, parts, place.chips.index(place.chip),
                                                        _message_vectors(parts))]
    for reg in regions:
        g = b.group(f"{tag}.send")
        g.send(port, g.read(reg))


def _sharded_handoff(place: ChipPlace, t) -> bool:
    return handoff_sharded(place.system.config, len(place.chips), t.layout.rows * t.ntiles, t.layout.dtype)


def handoff_sharded(cfg, chips: int, vectors: int, dtype) -> bool:
    """Whether a hand-off of ``vectors`` vectors of ``dtype`` from a group of ``chips``
    chips goes in shards (:func:`emit_receive`): when the group has several chips and
    the vectors a link no longer carries save more than the second link latency the
    gather adds. A whole tensor of ``V`` vectors arrives ``V c + L`` after it is sent; a
    shard of ``S``, sent and forwarded in messages of ``m``, about ``(S + m) c + 2 L``.
    The sender and the receiver decide alike, from the tensor's shape."""
    if chips == 1:
        return False
    shard = -(-vectors // chips)
    message = _message_vectors([(0, shard)])
    return (vectors - shard - message) * tm.c2c_cycles_per_vector(cfg, _dtype(dtype)) > cfg.c2c_latency


def _message_vectors(parts) -> int:
    """The most vectors a message of a sharded exchange carries: about
    MESSAGES_PER_SHARD a shard, so that a chip passes a message on (its sum, or a copy)
    as soon as it is in, one message behind the first link's, not a whole shard."""
    return max(1, -(-max(size for _, size in parts) // MESSAGES_PER_SHARD))


def _shard_messages(x, parts, k: int, most: int, y=None) -> list:
    """[(tile, first row, SramSpan of x)] of shard ``k`` of ``x``'s vectors (column tile by
    column tile, row by row; ``parts`` from :func:`shards`), one a message: cut where x's
    SRAM chunks change (and ``y``'s, a tensor of the same shape, when given), and into
    at most ``most`` vectors."""
    rows = x.layout.rows
    first, size = parts[k]
    out = []
    for j in range(x.ntiles):
        lo, hi = max(first, j * rows), min(first + size, (j + 1) * rows)
        if lo >= hi:
            continue
        for r, reg in x.segments(j, lo - j * rows, hi - j * rows):
            for r0, part in (y.segments(j, r, r + reg.count) if y is not None else [(r, reg)]):
                for a in range(r0 - r, r0 - r + part.count, most):
                    end = min(a + most, r0 - r + part.count)
                    out.append((j, r + a, reg if (a, end) == (0, reg.count) else reg.rows(a, end)))
    return out


def _messages(t) -> list:
    """The Regions of SRAM tensor ``t`` a hand-off sends one message each, in order: each
    column tile's rows, one per SRAM chunk (chunks follow from the layout, so a sender
    and a receiver of the same layout cut alike)."""
    return [reg for j in range(t.ntiles) for _, reg in t.segments(j, 0, t.layout.rows)]


def _reduced(b: ProgramBuilder, place: ChipPlace, reg, tag: str) -> tuple:
    """(group, value): this chip's rows ``reg`` plus each peer's copy of them as it
    arrives, its own first and then its peers' in the group's order (the order every chip
    adds in)."""
    place.expect(b, *place.peers)
    g = b.group(f"{tag}.reduce")
    recvs = [g.recv(place.port(d), reg.count, reg.dtype) for d in place.peers]
    v = g.read(reg)
    for other in recvs:
        v = g.vxm("vxm.add", v, other)
    return g, v


@functools.lru_cache(maxsize=None)
def _rows_per_chunk(cfg, rows: int, dt: DType) -> int:
    """Rows a chunk of a ``rows x lanes`` tensor of ``dt`` holds, as the program builder
    lays out a chip's input or output (a peer's tensors are cut as this chip's own)."""
    return ProgramBuilder(cfg, "layout", loopback=False).tensor("t", (rows, cfg.lanes), dt).layout.rows_per_chunk


def _cut(first: int, size: int, grids) -> list:
    """[(row, rows)] of rows ``first .. first + size - 1`` cut at each chunk boundary of
    the tensors ``grids`` ([(the row their row 0 is, rows a chunk)]): each piece lies in
    one chunk of every tensor, so it is one message, read from and written to one slice."""
    points = {first, first + size}
    for origin, step in grids:
        points.update(range(origin + step * -(-(first - origin + 1) // step), first + size, step))
    points = sorted(points)
    return list(zip(points, (b - a for a, b in zip(points, points[1:]))))


def _region(t, r: int, n: int):
    """Rows ``r .. r + n - 1`` of column tile 0 of ``t``, one chunk's (a :func:`_cut` piece)."""
    (_, reg), = t.segments(0, r, r + n)
    return reg


def _forward(place: ChipPlace, rows: int, dt: DType):
    """Chip ``place.chip``'s part of a transfer along the path ``place.chips``: a message
    per SRAM chunk of the tensor, each forwarded as it arrives."""
    system, path, c = place.system, place.chips, place.chip
    cfg = system.config
    k = path.index(c)
    b = place.builder(cfg, f"send chip {c}")
    x = b.input("X", (rows, cfg.lanes), dt) if k == 0 else None
    y = b.output("Y", (rows, cfg.lanes), dt) if k == len(path) - 1 else None
    for r, n in _cut(0, rows, [(0, _rows_per_chunk(cfg, rows, dt))]):
        if k == 0:
            g = b.group("send")
            v = g.read(_region(x, r, n))
        else:
            place.expect(b, path[k - 1])
            g = b.group("send.forward" if k < len(path) - 1 else "send.receive")
            v = g.recv(place.port(path[k - 1]), n, dt)
        if k < len(path) - 1:
            g.send(place.port(path[k + 1]), v)
        else:
            g.write(v, _region(y, r, n))
    return b.build()


def _program(kind, place: ChipPlace, rows: int, dt: DType):
    """Chip ``place.chip``'s program of collective ``kind`` over ``place.chips``."""
    system, chips, c = place.system, place.chips, place.chip
    cfg = system.config
    parts = shards(rows, len(chips))
    me = chips.index(c)
    b = place.builder(cfg, f"{kind} chip {c}")
    x = b.input("X", (parts[me][1] if kind == "all_gather" else rows, cfg.lanes), dt)
    y = b.output("Y", (parts[me][1] if kind == "reduce_scatter" else rows, cfg.lanes), dt)
    if kind == "all_reduce":
        emit_all_reduce(b, place, x, y, kind)
        return b.build()
    first, size = parts[me]
    if kind == "reduce_scatter":
        def pieces(d):  # shard d's messages: chunks of x (alike on every chip) and of chip d's y
            a, n = parts[chips.index(d)]
            return _cut(a, n, [(0, x.layout.rows_per_chunk), (a, _rows_per_chunk(cfg, n, dt))])

        for d in place.peers:  # each peer's shard to it
            for r, n in pieces(d):
                g = b.group(f"{kind}.send")
                g.send(place.port(d), g.read(_region(x, r, n)))
        for r, n in pieces(c):
            g, v = _reduced(b, place, _region(x, r, n), kind)
            g.write(v, _region(y, r - first, n))
        return b.build()

    def pieces(d):  # all-gather: shard d's messages, chunks of chip d's x and of y (alike on every chip)
        a, n = parts[chips.index(d)]
        return _cut(a, n, [(a, _rows_per_chunk(cfg, n, dt)), (0, y.layout.rows_per_chunk)])

    for r, n in pieces(c):  # this chip's shard to every peer, and in place
        g = b.group(f"{kind}.send")
        v = g.read(_region(x, r - first, n))
        for d in place.peers:
            g.send(place.port(d), v)
        # Copied in a pass of its own: a value flows one way from its slice, and the links
        # attach at the VXM, which may lie on the other side of it from y's slice.
        g = b.group(f"{kind}.copy")
        g.write(g.read(_region(x, r - first, n)), _region(y, r, n))
    for d in place.peers:
        for r, n in pieces(d):
            place.expect(b, d)
            g = b.group(f"{kind}.gather")
            g.write(g.recv(place.port(d), n, dt), _region(y, r, n))
    return b.build()


def _transfers(system: System, programs: dict) -> list:
    cfg = system.config
    out = []
    for c, prog in programs.items():
        for ins in sorted((i for i in prog.instrs if i.op == "c2c.send"), key=lambda i: i.cycle):
            d, dl = system.peer(c, ins.unit)
            out.append(Transfer(c, ins.unit, d, dl, ins.count, ins.dtype, ins.cycle, tm.timing(cfg, ins).done))
    return out

"""Collectives over C2C links, alone: each chip's program run on the system simulator
against numpy (the documented summation order), the link schedule against hand
arithmetic (a message arrives n * cycles-per-vector + latency after it is sent; the
all-gather of a reduced shard leaves as the last add's result reaches the links), the
bytes moved, and the cycles the programs claim against the simulator's."""

import math

import numpy as np
import pytest

from lpx_tvm.errors import LPXError
from lpx_tvm.machine.isa import DType
from lpx_tvm.sim.multichip import SystemSimulator
from lpx_tvm.machine.system import parse_system
from lpx_tvm.target.system_programs import collective, shards

QUAD = parse_system({"name": "quad", "preset": "mini", "chips": 5, "topology": "all_to_all"})
CFG = QUAD.config
NP = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32}


def _inputs(col, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for c in col.chips:
        shape = col.programs[c].binding("X").layout.shape
        x = rng.standard_normal(shape) * 8
        out[c] = x.astype(NP[col.dtype.short]) if col.dtype.is_float else rng.integers(-2**20, 2**20, shape,
                                                                                          dtype=np.int32)
    return out


def _reduced(col, xs, first, size):
    """Rows first..first+size of the sum as chip d adds them: its own, then its peers' in
    ascending chip order, each add rounded to the dtype."""
    d = col.chips[[s[0] for s in shards(col.rows, len(col.chips))].index(first)]
    acc = xs[d][first:first + size].copy()
    for c in col.chips:
        if c != d:
            acc = (acc + xs[c][first:first + size]).astype(acc.dtype)
    return acc


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int32"])
@pytest.mark.parametrize("chips", [(0, 1), (0, 2, 3), (4, 0, 1, 2, 3)])
def test_all_reduce(dtype, chips):
    col = collective("all_reduce", QUAD, chips, 11, dtype)
    xs = _inputs(col)
    r = SystemSimulator(QUAD).run(col.programs, {c: {"X": xs[c]} for c in chips})
    want = np.concatenate([_reduced(col, xs, a, n) for a, n in shards(11, len(chips))])
    for c in chips:
        np.testing.assert_array_equal(r.chips[c].outputs["Y"], want)
    assert not np.array_equal(want, xs[chips[0]])  # a sum, not a copy
    assert r.cycles == col.cycles


def test_reduce_scatter_and_all_gather():
    chips = (0, 1, 2, 3)
    rs = collective("reduce_scatter", QUAD, chips, 10, "fp32")
    xs = _inputs(rs, 1)
    r = SystemSimulator(QUAD).run(rs.programs, {c: {"X": xs[c]} for c in chips})
    for c in chips:
        a, n = rs.shard(c)
        np.testing.assert_array_equal(r.chips[c].outputs["Y"], _reduced(rs, xs, a, n))
    ag = collective("all_gather", QUAD, chips, 10, "fp16")
    parts = {c: np.full((ag.shard(c)[1], CFG.lanes), c + 0.5, np.float16) for c in chips}
    r = SystemSimulator(QUAD).run(ag.programs, {c: {"X": parts[c]} for c in chips})
    want = np.concatenate([parts[c] for c in chips])
    for c in chips:
        np.testing.assert_array_equal(r.chips[c].outputs["Y"], want)


@pytest.mark.parametrize("chips", [(0, 1), (0, 1, 2, 3)])
def test_link_schedule_by_hand(chips):
    n, rows, dt = len(chips), 12, "fp32"
    col = collective("all_reduce", QUAD, chips, rows, dt)
    cpv = math.ceil(CFG.lanes * 4 / CFG.c2c_bytes_per_cycle)  # 5 on mini
    alu, latency = CFG.latency["vxm_alu"], CFG.c2c_latency
    size = rows // n  # 6 or 3 vectors a shard: under MESSAGES_PER_SHARD, a message each
    for t in col.transfers:
        assert t.vectors == 1 and t.dtype == DType.FP32
        assert t.arrival == t.send_cycle + cpv + latency
        assert QUAD.peer(t.src, t.src_link) == (t.dst, t.dst_link)
    # Each chip sends its N - 1 shards, then its reduced shard to its N - 1 peers.
    assert len(col.transfers) == 2 * n * (n - 1) * size
    assert col.bytes_moved == 2 * n * (n - 1) * size * CFG.lanes * 4
    for c in chips:
        peers = [d for d in chips if d != c]
        inbound = {d: sorted((t for t in col.transfers if (t.src, t.dst) == (d, c)), key=lambda t: t.send_cycle)
                   for d in peers}
        outbound = {d: sorted((t for t in col.transfers if (t.src, t.dst) == (c, d)), key=lambda t: t.send_cycle)
                    for d in peers}
        for k in range(size):
            # the k-th vector of c's shard is summed once every peer's copy is in: its last
            # add issues a cycle after the last arrival and the sum leaves L_alu later
            last = max(inbound[d][k].arrival for d in peers)
            for d in peers:
                sent = outbound[d][size + k].send_cycle
                assert sent >= last + 1 + alu
                if n == 2:
                    assert sent == last + 1 + alu
        # pipelined: c's first sum is on its way before the last copies of its shard arrive
        assert max(outbound[d][size].send_cycle for d in peers) < min(inbound[d][-1].arrival for d in peers)
    # the last vector crosses twice, behind the shard's other vectors on its first link:
    # the link floor, which the reads, adds and writes around the messages leave it above
    assert col.link_floor == (size + 1) * cpv + 2 * latency < col.cycles


def test_refusals():
    with pytest.raises(LPXError, match="needs two or more distinct chips"):
        collective("all_reduce", QUAD, (1, 1), 4)
    with pytest.raises(LPXError, match="the VXM adds fp32, fp16, bf16 or int32"):
        collective("all_reduce", QUAD, (0, 1), 4, "int8")
    with pytest.raises(LPXError, match="expected one of"):
        collective("broadcast", QUAD, (0, 1), 4)
    pair = parse_system({"name": "line", "preset": "mini", "chips": 3, "links": [[0, 0, 1, 0], [1, 1, 2, 1]]})
    with pytest.raises(LPXError, match="chips 0 and 2 of system line are not linked"):
        collective("all_reduce", pair, (0, 1, 2), 6)
    with pytest.raises(LPXError, match="at least one row per chip"):
        collective("reduce_scatter", QUAD, (0, 1, 2), 2)


def test_all_reduce_of_fewer_rows_than_chips():
    """A decode step's hidden row over a group of more chips than its vectors: the chips
    past the rows own no shard and only send and gather."""
    col = collective("all_reduce", QUAD, (0, 1, 2), 2, "fp32")
    xs = {c: np.full((2, CFG.lanes), c + 1, np.float32) * [[1], [10]] for c in col.chips}
    r = SystemSimulator(QUAD).run(col.programs, {c: {"X": xs[c]} for c in col.chips})
    for c in col.chips:
        np.testing.assert_array_equal(r.chips[c].outputs["Y"], xs[0] + xs[1] + xs[2])
    # Each of the two rows: from two peers to its owner, then back to both.
    assert col.bytes_moved == 2 * (2 + 2) * CFG.lanes * 4
    assert r.cycles == col.cycles


LINE = parse_system({"name": "line", "preset": "mini", "chips": 4,
                     "links": [[0, 0, 1, 1], [1, 2, 2, 3], [2, 0, 3, 1]]})


@pytest.mark.parametrize("dtype", ["fp16", "int8"])
def test_point_to_point_forwards_along_the_path(dtype):
    """Three hops: each chip between forwards the message one cycle after it has all
    arrived (the receive emits the next cycle, the send reads it there)."""
    from lpx_tvm.target.system_programs import point_to_point

    rows = 5
    col = point_to_point(LINE, 0, 3, rows, dtype)
    assert col.chips == (0, 1, 2, 3)
    cpv = math.ceil(CFG.lanes * DType.parse(dtype).itemsize / CFG.c2c_bytes_per_cycle)
    hop = rows * cpv + CFG.c2c_latency
    sends = [t.send_cycle for t in col.transfers]
    assert [t.arrival - t.send_cycle for t in col.transfers] == [hop] * 3
    assert sends[1] == col.transfers[0].arrival + 1 and sends[2] == col.transfers[1].arrival + 1
    assert col.bytes_moved == 3 * rows * CFG.lanes * DType.parse(dtype).itemsize
    # at best each chip between forwards as the first vector arrives
    assert col.link_floor == 3 * CFG.c2c_latency + (rows + 2) * cpv < col.cycles
    x = (np.arange(rows * CFG.lanes) % 100 - 50).reshape(rows, CFG.lanes).astype(NP.get(dtype, np.int8))
    r = SystemSimulator(LINE).run(col.programs, {0: {"X": x}})
    np.testing.assert_array_equal(r.chips[3].outputs["Y"], x)
    assert r.cycles == col.cycles


def test_point_to_point_across_racks():
    """Between two racks of tsp-576: a shortest path through the racks' global link."""
    from lpx_tvm.machine.system import load_system
    from lpx_tvm.target.system_programs import point_to_point

    s = load_system("tsp-576")
    col = point_to_point(s, 5, 72 + 40, 2, "fp16")
    assert len(col.chips) - 1 == s.hops(5, 72 + 40) >= 2
    for a, b in zip(col.chips, col.chips[1:]):
        assert s.links_between(a, b)
    r = SystemSimulator(s).run(col.programs, timing_only=True)
    assert r.cycles == col.cycles
    assert r.cycles >= (len(col.chips) - 1) * (2 * 42 + s.config.c2c_latency)  # 42 cycles an fp16 vector on tsp


@pytest.mark.parametrize("rows", [20, 240])
def test_handoff_between_groups(rows):
    """A stage's hand-off from chips (0, 1) to (2, 3), rank to rank: 20 fp32 vectors go
    whole from each chip (100 cycles on a link against 450 of latency: a shard would save
    less than the second latency it adds); 240 go as each rank's shard of 120 in messages
    of 15, which each receiver forwards to its peer a cycle after it arrives (the
    receive emits the next cycle, the send takes it from the stream)."""
    from lpx_tvm.target.system_programs import handoff, handoff_sharded, point_to_point

    col = handoff(QUAD, (0, 1), (2, 3), rows, "fp32")
    cpv = math.ceil(CFG.lanes * 4 / CFG.c2c_bytes_per_cycle)
    x = _inputs(collective("all_reduce", QUAD, (0, 1), rows), 3)[0]
    r = SystemSimulator(QUAD).run(col.programs, {0: {"X": x}, 1: {"X": x}})
    for c in (2, 3):
        np.testing.assert_array_equal(r.chips[c].outputs["Y"], x)
    assert r.cycles == col.cycles
    for t in col.transfers:
        assert t.arrival == t.send_cycle + t.vectors * cpv + CFG.c2c_latency
    whole = point_to_point(QUAD, 0, 2, rows, "fp32")
    if rows == 20:
        assert not handoff_sharded(CFG, 2, rows, "fp32")
        assert {(t.src, t.dst) for t in col.transfers} == {(0, 2), (1, 3)}
        assert col.bytes_moved == 2 * rows * CFG.lanes * 4 and col.cycles == whole.cycles
        assert col.link_floor == CFG.c2c_latency + rows * cpv < col.cycles
        return
    assert handoff_sharded(CFG, 2, rows, "fp32")
    across = [t for t in col.transfers if (t.src, t.dst) in ((0, 2), (1, 3))]
    assert sum(t.vectors for t in across) == rows and {t.vectors for t in across} == {15}
    for src, dst in ((0, 2), (1, 3)):
        came = [t for t in across if t.src == src]
        went = [t for t in col.transfers if t.src == dst]
        assert [t.send_cycle for t in went] == [t.arrival + 1 for t in came]
    for a, b in ((2, 3), (3, 2)):  # each receiver passes its rank's shard on to its peer
        assert sum(t.vectors for t in col.transfers if (t.src, t.dst) == (a, b)) == rows // 2
    assert col.bytes_moved == 2 * rows * CFG.lanes * 4  # each vector over two links
    assert col.cycles < whole.cycles  # 120 vectors a link instead of 240, one more latency
    assert col.link_floor == 2 * CFG.c2c_latency + (rows // 2 + 1) * cpv < col.cycles


def test_handoff_refusals():
    from lpx_tvm.target.system_programs import handoff

    with pytest.raises(LPXError, match="expected two groups of as many distinct chips"):
        handoff(QUAD, (0, 1), (1, 2), 4)
    with pytest.raises(LPXError, match="expected two groups of as many distinct chips"):
        handoff(QUAD, (0, 1), (2,), 4)
    with pytest.raises(LPXError, match="chips 0 and 2 of system line are not linked: a group's chips gather"):
        handoff(LINE, (0, 2), (1, 3), 4)
    with pytest.raises(LPXError, match="chips 0 and 2 of system line are not linked: each chip hands its rows"):
        handoff(LINE, (0,), (2,), 4)

"""The systems-and-collectives fuzzer's CI sample (collectives_cases.py; bench/fuzz_systems.py
runs more): random valid system files and collective calls, each right bit for bit
against numpy, with the right messages and cycles. Then proof that the checks can fail:
the implementation mutated (another summation order, shards in another order, a peer's
copy dropped, the old port choice) is caught; and the bugs the fuzzer found, as plain
regression tests."""

import numpy as np
import pytest

import collectives_cases as cc
from lpx_tvm.errors import LPXError
from lpx_tvm.machine.system import parse_system
from lpx_tvm.sim.multichip import SystemSimulator
from lpx_tvm.target import system_programs
from lpx_tvm.target.system_programs import collective, point_to_point

PER_KIND = 40
SAMPLE = [(kind, i) for kind in cc.KINDS for i in range(PER_KIND)]


@pytest.mark.parametrize("kind", cc.KINDS)
def test_sample(kind):
    bad = {}
    for i in range(PER_KIND):
        problems = cc.run(cc.case(kind, i, seed=0))
        if problems:
            bad[cc.case(kind, i, 0).describe()] = problems
    assert not bad


def test_cases_are_reproducible_and_varied():
    cases = [cc.case(kind, i, 0) for kind, i in SAMPLE]
    assert [c.describe() for c in cases[:20]] == [cc.case(c.kind, c.index, 0).describe() for c in cases[:20]]
    assert cc.case("all_reduce", 0, 1).describe() != cc.case("all_reduce", 0, 0).describe()
    seen = set()
    for c in cases:
        lanes = cc._lanes_of(c)
        seen.add(("machine", c.machine if isinstance(c.machine, str) else "file"))
        seen.add(("links", "topology" if "topology" in c.system else "list"))
        seen.add(("dtype", c.dtype))
        if list(c.chips) != sorted(c.chips) and c.kind != "point_to_point":
            seen.add("group not ascending")
        per_pair = {}
        for a, la, b, lb in c.links:
            per_pair.setdefault((min(a, b), max(a, b)), []).append((la, lb) if a < b else (lb, la))
        if any(min(p)[1] != min(q for _, q in p) for p in per_pair.values()):
            seen.add("a pair whose lowest ports belong to different links")
        if c.rows > cc._slice_lines(c.machine) // system_programs.DType.parse(c.dtype).itemsize:
            seen.add(("rows past a chunk", c.kind))
        if c.kind == "point_to_point":
            dist = cc._bfs(c.links, c.system["chips"], c.chips[1])
            seen.add(("hops", min(dist[c.chips[0]], 3)))
        if c.cols and c.cols % lanes:
            seen.add("a partial column tile")
    want = {("machine", "mini"), ("machine", "tsp"), ("machine", "file"), ("links", "topology"), ("links", "list"),
            "group not ascending", "a pair whose lowest ports belong to different links", "a partial column tile",
            ("hops", 1), ("hops", 2), ("hops", 3)} | {("dtype", d) for d in cc.ANY} | \
        {("rows past a chunk", k) for k in cc.KINDS}
    assert want <= seen, want - seen


def test_reference_sees_every_contribution():
    """Each chip's copy changes numpy's answer: a result missing any one of them cannot
    match (the data has no copy that adds nothing)."""
    for kind in ("all_reduce", "reduce_scatter", "all_reduce_tiles"):
        for i in range(8):
            c = cc.case(kind, i, 0)
            dt = system_programs.DType.parse(c.dtype)
            xs = cc.inputs(c, cc._lanes_of(c))
            want = cc.expected(c, xs, dt)
            for dropped in c.chips:
                zeroed = {**xs, dropped: np.zeros_like(xs[dropped])}
                got = cc.expected(c, zeroed, dt)
                assert any(not np.array_equal(cc._bits(want[k]), cc._bits(got[k])) for k in c.chips), (c.name, dropped)


def _fails(monkeypatch, cases, **patches) -> int:
    for name, value in patches.items():
        monkeypatch.setattr(system_programs, name, value)
    caught = 0
    for kind, i in cases:
        try:
            caught += bool(cc.run(cc.case(kind, i, 0)))
        except LPXError:
            caught += 1
    return caught


REDUCING = [(k, i) for k in ("all_reduce", "reduce_scatter", "all_reduce_tiles") for i in range(12)]


def test_a_wrong_summation_order_is_caught(monkeypatch):
    def reversed_order(b, place, reg, tag):
        place.expect(b, *place.peers)
        g = b.group(f"{tag}.reduce")
        recvs = [g.recv(place.port(d), reg.count, reg.dtype) for d in place.peers]
        v = g.read(reg)
        for other in reversed(recvs):
            v = g.vxm("vxm.add", v, other)
        return g, v

    floats = [(k, i) for k, i in REDUCING if cc.case(k, i, 0).dtype != "int32" and len(cc.case(k, i, 0).chips) > 2]
    assert len(floats) >= 8
    assert _fails(monkeypatch, floats, _reduced=reversed_order) >= len(floats) // 2


def test_a_missing_contribution_is_caught(monkeypatch):
    def one_dropped(b, place, reg, tag):
        place.expect(b, *place.peers)
        g = b.group(f"{tag}.reduce")
        recvs = [g.recv(place.port(d), reg.count, reg.dtype) for d in place.peers]
        v = g.read(reg)
        for k, other in enumerate(recvs):
            v = g.vxm("vxm.add", v, g.vxm("vxm.mul", other, imm=0) if k == len(recvs) - 1 else other)
        return g, v

    assert _fails(monkeypatch, REDUCING, _reduced=one_dropped) == len(REDUCING)


def test_a_wrong_chunk_order_is_caught(monkeypatch):
    real = system_programs.shards
    cases = [(k, i) for k in ("all_reduce", "reduce_scatter", "all_gather") for i in range(10)]
    assert _fails(monkeypatch, cases, shards=lambda rows, n: real(rows, n)[::-1]) >= len(cases) - 2


def test_the_old_port_choice_is_caught(monkeypatch):
    """Each end of a pair joined by several links used its own lowest port: when those
    belong to different links, a receive waited on a port nothing was sent to."""
    monkeypatch.setattr(system_programs.ChipPlace, "port", lambda self, peer: self.system.links_between(self.chip, peer)[0][0])
    assert _fails(monkeypatch, [(k, i) for k in cc.KINDS for i in range(6)]) >= 10


# ---- the bugs the fuzzer found, as plain tests --------------------------------------------

CROSSED = parse_system({"name": "crossed", "preset": "mini", "chips": 3,
                        "links": [[0, 3, 1, 0], [0, 1, 1, 2], [0, 0, 2, 1], [1, 1, 2, 0], [1, 3, 2, 3]]})


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather"])
def test_pairs_of_several_links_whose_lowest_ports_differ(kind):
    """Chips 0 and 1 are joined by 0.3-1.0 and 0.1-1.2: chip 0's lowest port (1) and chip
    1's (0) are on different links. Both ends now use the link of chip 0's lowest."""
    col = collective(kind, CROSSED, (0, 1, 2), 6, "int32")
    rows = (2, 16) if kind == "all_gather" else (6, 16)
    xs = {c: np.arange(np.prod(rows), dtype=np.int32).reshape(rows) * (c + 1) for c in col.chips}
    r = SystemSimulator(CROSSED).run(col.programs, {c: {"X": xs[c]} for c in col.chips})
    whole = sum(xs.values()) if kind != "all_gather" else np.concatenate([xs[c] for c in col.chips])
    for c in col.chips:
        a, n = col.shard(c)
        np.testing.assert_array_equal(r.chips[c].outputs["Y"], whole[a:a + n] if kind == "reduce_scatter" else whole)


def test_tensors_larger_than_a_slice():
    """reduce_scatter, all_gather and a transfer of more rows than a slice holds: one
    message per chunk (they asked for one region of the whole tensor before)."""
    system = parse_system({"name": "pair", "preset": "mini", "chips": 3, "links": [[0, 0, 1, 0], [1, 1, 2, 1],
                                                                                   [0, 2, 2, 2]]})
    fit = system.config.lines_per_slice // 4  # fp32 rows a slice holds
    rows = fit + fit // 2 + 3
    rng = np.random.default_rng(0)
    for kind in ("reduce_scatter", "all_gather", "all_reduce"):
        col = collective(kind, system, (2, 0, 1), 3 * rows if kind == "reduce_scatter" else rows, "fp32")
        shape = {ch: col.programs[ch].binding("X").layout.shape for ch in col.chips}
        xs = {ch: rng.integers(-100, 100, shape[ch]).astype(np.float32) for ch in col.chips}
        r = SystemSimulator(system).run(col.programs, {ch: {"X": xs[ch]} for ch in col.chips})
        whole = np.concatenate([xs[ch] for ch in col.chips]) if kind == "all_gather" else sum(xs.values())
        for ch in col.chips:
            a, n = col.shard(ch)
            np.testing.assert_array_equal(r.chips[ch].outputs["Y"], whole[a:a + n] if kind == "reduce_scatter"
                                          else whole)
        assert len(col.transfers) > 2 * len(col.chips)  # several messages a shard
    col = point_to_point(system, 1, 2, 2 * fit + 1, "fp32")
    x = rng.standard_normal((2 * fit + 1, 16)).astype(np.float32)
    r = SystemSimulator(system).run(col.programs, {1: {"X": x}})
    np.testing.assert_array_equal(r.chips[2].outputs["Y"], x)
    assert len(col.transfers) == 3 and r.cycles == col.cycles


def test_all_reduce_of_tensors_chunked_unlike():
    """emit_all_reduce of an x and a y cut into different SRAM chunks: a reduced piece
    whose rows fell on two slices of y, on both sides of the VXM, could not be placed."""
    c = cc.case("all_reduce_tiles", 2, 0)
    assert c.spread[0] != c.spread[1] and not cc.run(c)


@pytest.mark.parametrize("call, message", [
    (lambda s: collective("all_reduce", s, (0, 1), 0), "all_reduce of 0 rows: expected a whole number of rows"),
    (lambda s: collective("all_reduce", s, (0, 1), 2.5), "all_reduce of 2.5 rows"),
    (lambda s: collective("all_gather", s, (0, 1), 4, "fp99"), "dtype 'fp99': expected one of int8"),
    (lambda s: collective("all_reduce", s, ("0", 1), 4), "chip '0': system crossed has chips 0..2"),
    (lambda s: collective("all_reduce", s, (0, True), 4), "chip True"),
    (lambda s: collective("all_reduce", s, 5, 4), "chips 5: expected a list of chip numbers"),
    (lambda s: point_to_point(s, 0, 7, 4), "chip 7: system crossed has chips 0..2"),
    (lambda s: point_to_point(s, 0, 1, -2), "a transfer of -2 rows"),
])
def test_hostile_calls_refused(call, message):
    with pytest.raises(LPXError, match=None) as e:
        call(CROSSED)
    assert message in str(e.value)


def test_numpy_integers_accepted():
    col = collective("all_reduce", CROSSED, np.array([0, 2]), np.int64(3), "fp32")
    assert col.chips == (0, 2) and col.rows == 3

"""System descriptions: the presets' shapes against their stated assumptions, the JSON
form, and every malformed system refused with the problem named."""

import json

import pytest

from lpx_tvm.errors import ConfigError
from lpx_tvm.machine.system import SYSTEM_PRESETS, Link, System, load_system, parse_system
from lpx_tvm.machine.config import load_config


@pytest.mark.parametrize("name, chips, preset, diameter", [
    ("groqnode", 8, "tsp", 1), ("tsp-rack", 72, "tsp", 2), ("lp30-rack", 256, "lp30", 2)])
def test_presets(name, chips, preset, diameter):
    s = load_system(name)
    assert s.chips == chips and s.config.name == preset
    assert s.diameter == diameter
    assert s.assumptions and s.sources
    ports = {(k.chip_a, k.link_a) for k in s.links} | {(k.chip_b, k.link_b) for k in s.links}
    assert len(ports) == 2 * len(s.links)  # every port used at most once
    assert max(link for _, link in ports) < s.config.c2c_links


def test_groqnode_is_all_to_all_one_link_a_pair():
    s = load_system("groqnode")
    assert len(s.links) == 28
    for a in range(8):
        assert s.neighbours(a) == [b for b in range(8) if b != a]
        for b in s.neighbours(a):
            (la, lb), = s.links_between(a, b)
            assert s.peer(a, la) == (b, lb) and s.peer(b, lb) == (a, la)


def test_lp30_rack_trays():
    s = load_system("lp30-rack")
    assert len(s.links_between(0, 1)) == 4  # same tray
    assert len(s.links_between(0, 8)) == 2  # chip 0 of the next tray
    assert s.links_between(0, 9) == [] and s.hops(0, 9) == 2
    assert s.sram_bytes == 256 * load_config("lp30").sram_bytes  # 128 GB, the published rack figure
    assert 127e9 < s.sram_bytes < 129e9


def test_tsp_576():
    s = load_system("tsp-576")
    assert s.chips == 576
    ports_used = {(k.chip_a, k.link_a) for k in s.links} | {(k.chip_b, k.link_b) for k in s.links}
    assert len({c for c, _ in ports_used}) == 576
    assert max(s.distances(0)) <= 5
    assert s.hops(0, 72) == 1 and s.links_between(0, 72) == [(15, 15)]  # its global link to rack 1
    assert s.hops(0, 72 + 11) > 1  # another chip of that rack


def test_json_round_trip(tmp_path):
    s = parse_system({"name": "pair", "preset": "mini", "chips": 2, "links": [[0, 2, 1, 3], [0, 1, 1, 0]]})
    assert s.peer(0, 2) == (1, 3) and s.peer(1, 0) == (0, 1) and s.peer(0, 0) is None
    path = tmp_path / "pair.json"
    path.write_text(json.dumps(s.to_json()))
    again = load_system(path)
    assert again.links == s.links and again.config is s.config
    gen = parse_system({"name": "n", "preset": "mini", "chips": 3, "topology": "all_to_all"})
    assert gen.diameter == 1 and len(gen.links) == 3


BAD = [
    ({"chips": 2, "links": [[0, 4, 1, 0]]}, "port 4 out of range 0..3 (mini has 4 C2C links)"),
    ({"chips": 2, "links": [[0, 0, 2, 0]]}, "chip 2 out of range 0..1"),
    ({"chips": 2, "links": [[0, 0, 1, 0], [0, 0, 1, 1]]}, "port 0 of chip 0 is already link 0"),
    ({"chips": 2, "links": [[1, 0, 1, 1]]}, "joins chip 1 to itself"),
    ({"chips": 2, "links": [[0, 0, 1]]}, "links[0]' = [0, 0, 1]: expected [chip a, link a, chip b, link b]"),
    ({"chips": 0, "links": []}, "key 'chips': expected an integer >= 1, got 0"),
    ({"chips": 2}, "give 'links'"),
    ({"chips": 2, "topology": "torus"}, "unknown topology 'torus'"),
    ({"chips": 2, "links": [], "linkz": 1}, "unknown key(s) ['linkz']"),
]


@pytest.mark.parametrize("extra, message", BAD, ids=[m for _, m in BAD])
def test_bad_system_named(extra, message):
    with pytest.raises(ConfigError, match=None) as e:
        parse_system({"name": "bad", "preset": "mini", **extra}, "sys.json")
    assert message in str(e.value) and str(e.value).startswith("sys.json")


def test_unknown_system():
    with pytest.raises(ConfigError, match="not a preset"):
        load_system("groqrack-9000")
    with pytest.raises(ConfigError, match="not valid JSON"):
        import tempfile, os
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write("{")
        try:
            load_system(f.name)
        finally:
            os.unlink(f.name)


def test_disconnected_system_refused_when_asked_for_paths():
    s = System("split", load_config("mini"), 4, [Link(0, 0, 1, 0), Link(2, 0, 3, 0)])
    with pytest.raises(ConfigError, match="chip 2 cannot be reached from chip 0"):
        s.hops(0, 2)
    assert set(SYSTEM_PRESETS) == {"groqnode", "tsp-rack", "tsp-576", "lp30-rack"}


def test_stage_groups_snake_through_the_nodes():
    """Pipeline stages of 4 chips on a TSP rack: nodes are chips 8n..8n+7, all-to-all,
    and chip 8n+i is linked to chip 8m+i. From chips 0-3 the next group of the node
    (4-7) is one link away rank for rank; from 4-7 the groups 12-15 (the same indices,
    node 1) are, while 8-11 (node 1, indices 0-3) are two; and so on."""
    rack = load_system("tsp-rack")
    groups = rack.stage_groups(4, 4)
    assert groups == [(0, 1, 2, 3), (4, 5, 6, 7), (12, 13, 14, 15), (8, 9, 10, 11)]
    for g, h in zip(groups, groups[1:]):
        assert all(rack.links_between(a, b) for a, b in zip(g, h))
    # 8 a stage: a node each, linked index by index
    assert rack.stage_groups(8, 9) == [tuple(range(8 * n, 8 * n + 8)) for n in range(9)]
    with pytest.raises(ConfigError, match="has 9 aligned groups of 8 pairwise linked chips; a pipeline of 10"):
        rack.stage_groups(8, 10)
    # groups of 3 straddling a node are not pairwise linked: 2 a node, 18 in all
    assert len(rack.stage_groups(3, 18)) == 18
    with pytest.raises(ConfigError, match="has 18 aligned groups of 3"):
        rack.stage_groups(3, 19)

"""System files against their schema: every hostile file refused in one short line that
names the key and the reason (never a foreign exception, never a megabyte of text, never
minutes of work first), a relative machine path read from the system file's folder, the
built-in systems unchanged, and the docs' key table generated from the schema."""

import copy
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest

from lpx_tvm.cli import main
from lpx_tvm.errors import ConfigError
from lpx_tvm.machine.config import preset_path
from lpx_tvm.machine.system import SYSTEM_PRESETS, Link, System, all_to_all, load_system, parse_system
from lpx_tvm.machine.system_schema import MAX_CHIPS, MAX_LINK_CYCLES, SystemFile, docs_with_schema
from lpx_tvm.machine.config import load_config

DOCS = Path(__file__).resolve().parents[2] / "docs"
BASE = {"name": "s", "preset": "mini", "chips": 2}
MINI = json.loads(preset_path("mini").read_text())


def _refused(data, *parts, source="sys.json"):
    """The one line ``parse_system`` refuses ``data`` with; it holds every one of ``parts``."""
    with pytest.raises(ConfigError) as e:
        parse_system(data, source)
    line = str(e.value)
    assert "\n" not in line and len(line) < 600 and line.startswith(source), line
    for p in parts:
        assert p in line, line
    return line


# Each: the file's keys beyond BASE, and what its one line must say.
HOSTILE = [
    ({"links": 5}, "key 'links': expected a list, got the number 5"),
    ({"links": None}, "key 'links': expected a list of [chip a, link a, chip b, link b], got null"),
    ({"topology": None}, "key 'topology': expected one of all_to_all, got null"),
    ({"topology": "all_to_all", "links_per_pair": "2"}, "key 'links_per_pair': expected an integer, got the string \"2\""),
    ({"topology": "all_to_all", "links_per_pair": -1}, "key 'links_per_pair': expected an integer >= 1, got -1"),
    ({"topology": "all_to_all", "links_per_pair": 0}, "key 'links_per_pair': expected an integer >= 1, got 0"),
    ({"topology": "all_to_all", "links_per_pair": True}, "key 'links_per_pair': expected an integer, got the boolean true"),
    ({"topology": "all_to_all", "links_per_pair": 2.0}, "key 'links_per_pair': expected an integer, got the number 2.0"),
    ({"topology": "all_to_all", "links_per_pair": 5}, "needs 5 ports a chip, machine mini has 4 (c2c.links)"),
    ({"links": [], "links_per_pair": 2}, "key 'links_per_pair': only with 'topology'"),
    ({"topology": 5}, "key 'topology': unknown topology the number 5"),
    ({"preset": 5, "links": []}, "key 'preset': expected a string, got the number 5"),
    ({"preset": "", "links": []}, "key 'preset': must not be empty"),
    ({"preset": None, "links": []}, "key 'preset': expected a string, got null"),
    ({"links": [], "assumptions": 5}, "key 'assumptions': expected a list, got the number 5"),
    ({"links": [], "assumptions": [5]}, "key 'assumptions[0]': expected a string, got the number 5"),
    ({"links": [], "sources": "a paper"}, "key 'sources': expected a list, got the string \"a paper\""),
    ({"links": [], "description": 5}, "key 'description': expected a string, got the number 5"),
    ({"links": [], "name": 5}, "key 'name': expected a string, got the number 5"),
    ({"links": [], "name": ""}, "key 'name': must not be empty"),
    ({"links": [], "chips": 10**9}, f"key 'chips': expected an integer <= {MAX_CHIPS} (the largest system lpx_tvm "
                                    "builds), got 1000000000"),
    ({"links": [], "chips": 10**400}, f"key 'chips': expected an integer <= {MAX_CHIPS}"),
    ({"links": [], "chips": -3}, "key 'chips': expected an integer >= 1, got -3"),
    ({"links": [], "chips": "2"}, "key 'chips': expected an integer, got the string \"2\""),
    ({"links": [], "chips": float("nan")}, "key 'chips': expected an integer, got the number NaN"),
    ({"links": [], "chips": float("inf")}, "key 'chips': expected an integer, got the number Infinity"),
    ({"links": [], "chips": True}, "key 'chips': expected an integer, got the boolean true"),
    ({"links": [[0, 0, 1, float("nan")]]}, "key 'links[0]' = [0, 0, 1, NaN]: expected [chip a, link a, chip b, link b]"),
    ({"links": [[0, 0, 1, 1.0]]}, "key 'links[0]' = [0, 0, 1, 1.0]: expected"),
    ({"links": [[0, 0, 1, "1"]]}, "key 'links[0]' = [0, 0, 1, \"1\"]: expected"),
    ({"links": [[0, 0, 1, 0, 5]]}, "key 'links[0]' = [0, 0, 1, 0, 5]: expected"),
    ({"links": [{"a": 0}]}, "key 'links[0]': expected a list, got the object"),
    ({"links": [[0, 0, 0, 1]]}, "key 'links[0]' = [0, 0, 0, 1]: joins chip 0 to itself"),
    ({"links": [[0, 0, 1, 0], [1, 0, 0, 0]]}, "key 'links[1]' = [1, 0, 0, 0]: the same link as link 0"),
    ({"links": [[0, 0, 1, 0], [0, 0, 1, 0]]}, "key 'links[1]' = [0, 0, 1, 0]: the same link as link 0"),
    ({"links": [[0, 0, 1, 0], [0, 0, 1, 1]]}, "key 'links[1]' = [0, 0, 1, 1]: port 0 of chip 0 is already link 0"),
    ({"links": [[0, 0, 5, 0]]}, "key 'links[0]' = [0, 0, 5, 0]: chip 5 out of range 0..1"),
    ({"links": [[-1, 0, 1, 0]]}, "key 'links[0]' = [-1, 0, 1, 0]: chip -1 out of range 0..1"),
    ({"links": [[0, -1, 1, 0]]}, "key 'links[0]' = [0, -1, 1, 0]: port -1 out of range 0..3 (mini has 4 C2C links)"),
    ({"links": [[0, 0, 1, 2**70]]}, "port 1180591620717411303424 out of range 0..3"),
    ({"links": [[0, 0, 1, 0]], "topology": "all_to_all"}, "give 'links'"),
    ({"linkz": []}, "unknown key(s) ['linkz'] (expected ['assumptions', 'chips', 'description', 'links', "
                    "'links_per_pair', 'name', 'preset', 'sources', 'topology']); did you mean 'linkz' -> 'links'?"),
    ({"links": [], "chips": None}, "key 'chips': expected an integer, got null"),
]


@pytest.mark.parametrize("extra, message", HOSTILE, ids=[str(h[0])[:50] for h in HOSTILE])
def test_hostile_system_refused_in_one_line(extra, message):
    _refused({**BASE, **extra}, message)


def test_many_unknown_keys_one_short_line():
    line = _refused({**BASE, "links": [], **{f"k{i}" * 500: i for i in range(1000)}}, "unknown key(s) ['k0",
                    "... 995 more']")
    assert len(line) < 500


def test_missing_and_not_an_object():
    _refused({"preset": "mini", "chips": 2, "links": []}, "missing key 'name'")
    _refused({"name": "s", "links": []}, "missing key 'preset'", "missing key 'chips'")
    _refused([1, 2], "a system file must be a JSON object, got the list [1, 2]")
    _refused("groqnode.json", "a system file must be a JSON object, got the string")


def test_many_problems_are_summarized():
    """200 chips all-to-all by a list of links on a 16-port machine: one short line,
    refused before each link is looked at; a list within the ports but mostly wrong: the
    first three problems and a count of the rest."""
    t = time.perf_counter()
    line = _refused({"name": "big", "preset": "tsp", "chips": 200, "links": [k.to_json() for k in all_to_all(200)]},
                    "key 'links': 19900 links, but 200 chips of tsp have 3200 ports (16 a chip), two a link")
    assert time.perf_counter() - t < 5
    links = [[c, 0, c + 1, 20 + c] for c in range(0, 98, 2)]  # every far port out of range
    line = _refused({"name": "big", "preset": "tsp", "chips": 100, "links": links},
                    "key 'links[0]' = [0, 0, 1, 20]: port 20 out of range 0..15", "; and 46 more problems")
    assert line.count("out of range") == 3
    _refused({"name": "big", "preset": "tsp", "chips": 200, "topology": "all_to_all"},
             "key 'topology': all_to_all of 200 chips by 1 link(s) a pair needs 199 ports a chip, machine tsp has 16")


def test_huge_system_refused_at_once():
    t = time.perf_counter()
    _refused({"name": "big", "preset": "mini", "chips": 10**9, "topology": "all_to_all"}, "key 'chips'")
    with pytest.raises(ConfigError, match=f"1000000000 chips: a system has 1..{MAX_CHIPS}"):
        System("big", load_config("mini"), 10**9, [])
    assert time.perf_counter() - t < 2
    # The largest allowed builds quickly (its tables are per chip).
    assert parse_system({"name": "wide", "preset": "mini", "chips": MAX_CHIPS, "links": [[0, 0, 1, 0]]}).chips \
        == MAX_CHIPS


def _machine_file(folder: Path, name="chip.json", **c2c) -> Path:
    m = copy.deepcopy(MINI)
    m["name"] = "mini-variant"
    m["c2c"].update(c2c)
    path = folder / name
    path.write_text(json.dumps(m))
    return path


@pytest.mark.parametrize("c2c, message", [
    ({"bytes_per_s": 1e-300}, "a link of c2c.bytes_per_s=1e-300 (at clock_hz=9e+08) takes inf cycles a vector of fp32, "
                              f"more than the {MAX_LINK_CYCLES} a system allows"),
    ({"bytes_per_s": 1e-290}, "takes 5.76e+300 cycles a vector of fp32"),
    ({"bytes_per_s": 5e-324}, "takes inf cycles a vector of fp32"),  # bytes a cycle: 0.0
    ({"latency_cycles": 10**20}, f"c2c.latency_cycles=100000000000000000000 is more than the {MAX_LINK_CYCLES}"),
    ({"latency_cycles": -5}, "key 'preset': machine file"),
    ({"bytes_per_s": float("nan")}, "key 'c2c.bytes_per_s'"),
    ({"bytes_per_s": "fast"}, "key 'c2c.bytes_per_s': expected a number"),
])
def test_machine_of_the_chips_checked(tmp_path, c2c, message):
    """A system's machine file whose links a scheduler cannot count (an OverflowError
    before) or that its own schema refuses: one line, under key 'preset'."""
    _machine_file(tmp_path, **c2c)
    (tmp_path / "sys.json").write_text(json.dumps({**BASE, "preset": "chip.json", "topology": "all_to_all"}))
    with pytest.raises(ConfigError) as e:
        load_system(tmp_path / "sys.json")
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"system file {tmp_path / 'sys.json'}: key 'preset'"), line
    assert message in line


def test_slow_but_countable_links_accepted(tmp_path):
    _machine_file(tmp_path, bytes_per_s=1e3, latency_cycles=MAX_LINK_CYCLES)
    (tmp_path / "sys.json").write_text(json.dumps({**BASE, "preset": "chip.json", "topology": "all_to_all"}))
    s = load_system(tmp_path / "sys.json")
    assert s.config.c2c_bytes_per_s == 1e3 and s.config.c2c_latency == MAX_LINK_CYCLES


def test_relative_preset_read_from_the_system_files_folder(tmp_path, monkeypatch):
    """A relative machine path is the system file's neighbour, wherever the user stands;
    an absolute one is itself; a dict's is read from the current folder."""
    folder = tmp_path / "cluster"
    folder.mkdir()
    _machine_file(folder, "fast.json", bytes_per_s=5e10)
    _machine_file(tmp_path, "fast.json", bytes_per_s=1e9)  # a decoy beside the current folder
    (folder / "sys.json").write_text(json.dumps({**BASE, "preset": "fast.json", "topology": "all_to_all"}))
    monkeypatch.chdir(tmp_path)
    assert load_system("cluster/sys.json").config.c2c_bytes_per_s == 5e10
    monkeypatch.chdir(folder)
    assert load_system("sys.json").config.c2c_bytes_per_s == 5e10
    assert load_system(folder / "sys.json").config.c2c_bytes_per_s == 5e10
    monkeypatch.chdir(tmp_path)
    assert parse_system({**BASE, "preset": "fast.json", "topology": "all_to_all"}).config.c2c_bytes_per_s == 1e9
    (folder / "abs.json").write_text(json.dumps({**BASE, "preset": str(tmp_path / "fast.json"),
                                                 "topology": "all_to_all"}))
    assert load_system(folder / "abs.json").config.c2c_bytes_per_s == 1e9
    (folder / "missing.json").write_text(json.dumps({**BASE, "preset": "nope.json", "topology": "all_to_all"}))
    with pytest.raises(ConfigError, match=r"key 'preset': machine config '.*cluster/nope.json': not a preset"):
        load_system(folder / "missing.json")


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe{}", "not a JSON system file (not UTF-8 text: byte 0)"),
    (b'{"name": "s",', "not valid JSON"),
    (b"[" * 100000 + b"]" * 100000, "JSON nested too deeply"),
    (b"[1, 2]", "a system file must be a JSON object, got the list [1, 2]"),
    (b"null", "a system file must be a JSON object, got null"),
    (b"", "not valid JSON"),
    (b'{"name": "s", "preset": "mini", "chips": NaN, "links": []}', "key 'chips': expected an integer, got the number NaN"),
])
def test_unreadable_files(tmp_path, content, message):
    path = tmp_path / "sys.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        load_system(path)
    assert str(e.value).startswith(f"system file {path}: ") and message in str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_not_a_system(tmp_path):
    with pytest.raises(ConfigError, match="a folder, not a system file"):
        load_system(tmp_path)
    with pytest.raises(ConfigError, match="expected a preset name .* got int"):
        load_system(5)
    with pytest.raises(ConfigError, match="not a preset .* and no such file"):
        load_system(str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match=r"^system 'aaaa.*\.\.\.: not a preset") as e:
        load_system("a" * 5000)  # longer than a file name may be
    assert len(str(e.value)) < 200
    with pytest.raises(ConfigError, match=r"got list$") as e:
        load_system(list(range(10**5)))
    assert len(str(e.value)) < 300
    (tmp_path / "machine_is_folder.json").write_text(json.dumps({**BASE, "preset": ".", "links": []}))
    with pytest.raises(ConfigError, match="key 'preset': .*a folder, not a machine file"):
        load_system(tmp_path / "machine_is_folder.json")


def test_cli_refuses_a_bad_system_file_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "s", "preset": "tsp", "chips": 2, "topology": "all_to_all",
                               "links_per_pair": -1}))
    cfg = tmp_path / "config.json"
    cfg.write_text("{}")
    assert main(["plan", "--config", str(cfg), "--system", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"lpx-tvm: error: system file {bad}: key 'links_per_pair': expected an integer >= 1, got -1"


# Digests of each built-in system as it was before the schema (its JSON form, its graph
# and its distances): the schema must not change what they are.
PRESET_DIGESTS = {
    "groqnode": (8, 28, 1, "3b96cedd1caa7f548d7bf33e7a8b73442f65aa8f45c9e58f4924a7ad6b15fbb0",
                 "38b74b626a53cbc83481c701f13cd3c05860e24a42e3b3291da64622e7d9bbb0",
                 "9b8e038f9cc08abf142a024b3fb955d33a4bcf7ac9b1fa15e4ca509ee4f7ba8e"),
    "tsp-rack": (72, 540, 2, "cf2cfbfb95a1127b66455b0ec166238657f29c8f66638432bc8e4075bd3b251c",
                 "f3f1495e8a03006210a94afd768029cd8412e27971a05a24edf39903c2b4fb25",
                 "01e0599067ac9de497cf198368031a4e5ed1c2405d45d7ef3e86058020763817"),
    "tsp-576": (576, 4600, 4, "b4192140aa9e730a9388d70864ce28cd3f112577edfb799bd570d9a8cc3feaa2",
                "af3cbd165901439fe5b94afb0448dc4d35b9a9853a22edc41412d79e2e86521e",
                "e30dbdbd8fa3928730e0d341ce98767faa8456e0b25d9d476a0a8eb7b21c3b43"),
    "lp30-rack": (256, 11520, 2, "91a65a20ab6937dabaa8d5bcc06d96f32fb8fe3771d287c148c5ce190a2d134c",
                  "ff09406a4f35da36696f77acdb6a1dca40de4741c64504bc6d0e30818b638e4c",
                  "655f6a0a5239e7b9376c25a6ed3a677b148c518d2475d9079616a204728ad152"),
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(SYSTEM_PRESETS))
def test_built_in_systems_unchanged(name, tmp_path):
    s = load_system(name)
    got = (s.chips, len(s.links), s.diameter, _sha(json.dumps(s.to_json(), sort_keys=True)),
           _sha(repr(sorted(s._between.items()))), _sha(repr([s.distances(a) for a in range(0, s.chips, 7)])))
    assert got == PRESET_DIGESTS[name]
    # Written out and read back through the schema: the same system.
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(s.to_json()))
    again = load_system(path)
    assert again.links == s.links and again.config == s.config and again.assumptions == s.assumptions


def test_every_link_pattern_of_a_valid_file_kept():
    """The schema keeps each link as written (ports, order, multiplicity)."""
    links = [[0, 3, 1, 0], [1, 1, 2, 2], [2, 0, 0, 1], [0, 2, 1, 3]]
    s = parse_system({**BASE, "chips": 3, "links": links})
    assert [k.to_json() for k in s.links] == links
    assert s.links_between(0, 1) == [(2, 3), (3, 0)] and s.peer(2, 0) == (0, 1)
    s = parse_system({**BASE, "chips": 3, "topology": "all_to_all", "links_per_pair": 2})
    assert s.links == tuple(all_to_all(3, 2)) and all(len(s.links_between(a, b)) == 2
                                                      for a in range(3) for b in range(3) if a != b)
    assert parse_system({**BASE, "links": []}).links == ()  # two chips, unlinked: valid until a path is asked
    assert Link(0, 0, 1, 0) in parse_system({**BASE, "links": [[0, 0, 1, 0]]}).links


def test_docs_table_generated_from_the_schema():
    page = (DOCS / "multichip.md").read_text()
    assert docs_with_schema(page) == page, 'run lpx_tvm.machine.system_schema.write_docs("docs")'
    for key in SystemFile.model_fields:
        assert f"| `{key}` |" in page


HOSTILE_VALUES = [None, True, -1, 0, 1, 3, 2**70, -2**70, 1e-300, 2.5, float("nan"), float("inf"), "", "2", "mini",
                  "x" * 5000, [], [0], [[0, 0, 1, 0]], [[0, 0, 1, 0]] * 3, [[0, 0, 0, 0]], [[0, 99, 1, 0]], {},
                  {"a": 1}, ["a"], [None] * 4, [[1, 2, 3, 4.5]], [[-1, -1, -1, -1]], "all_to_all", "torus"]


def test_random_hostile_values_end_in_a_system_or_one_line():
    """Any key of a valid file, set to any of a list of hostile values (or dropped, or a
    key added), 400 times: a system, or a ConfigError of one short line."""
    rng = np.random.default_rng(0)
    valid = [{**BASE, "links": [[0, 0, 1, 0]]}, {**BASE, "chips": 3, "topology": "all_to_all", "links_per_pair": 1},
             {**BASE, "preset": "tsp", "links": [], "description": "d", "assumptions": ["a"], "sources": []}]
    outcomes = set()
    for _ in range(400):
        data = copy.deepcopy(valid[rng.integers(len(valid))])
        for _ in range(rng.integers(1, 3)):
            key = str(rng.choice([*SystemFile.model_fields, "extra"]))
            if rng.random() < 0.15:
                data.pop(key, None)
            else:
                data[key] = copy.deepcopy(HOSTILE_VALUES[rng.integers(len(HOSTILE_VALUES))])
        try:
            s = parse_system(data, "sys.json")
            outcomes.add("system")
            assert s.chips == data["chips"] and len(s.links) == (len(data["links"]) if "links" in data else len(s.links))
        except ConfigError as e:
            outcomes.add("refused")
            assert "\n" not in str(e) and len(str(e)) < 600 and str(e).startswith("sys.json: "), str(e)
    assert outcomes == {"system", "refused"}

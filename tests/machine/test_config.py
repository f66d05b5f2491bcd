"""Machine configs: the bundled presets, derived numbers, the hash, and invalid fields."""

from __future__ import annotations

import copy
import json

import pytest

from lpx_tvm.errors import ConfigError
from lpx_tvm.machine.config import LATENCY_FIELDS, MXM_DTYPES, PRESETS, load_config, parse_config, preset_path

MIB = 1024 * 1024


def preset_json(name="mini") -> dict:
    return json.loads(preset_path(name).read_text())


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load(name):
    cfg = load_config(name)
    assert cfg.name == name
    assert load_config(name) is cfg  # cached
    assert load_config(cfg) is cfg
    assert set(cfg.latency) == set(LATENCY_FIELDS)
    assert set(cfg.mxm_cycles_per_vector) == set(MXM_DTYPES)
    assert cfg.floorplan.count("MEM") == cfg.mem_slices
    assert cfg.floorplan.count("MXM") == cfg.mxm_planes
    assert cfg.to_json() == preset_json(name)


def test_default_preset_is_tsp():
    assert load_config().name == "tsp"
    assert load_config(None) is load_config("tsp")


def test_tsp_derived_numbers():
    cfg = load_config("tsp")
    assert cfg.lanes == 320 and cfg.mem_slices == 88
    assert cfg.sram_bytes == 220 * MIB  # 88 slices * 2.5 MiB
    assert cfg.lines_per_slice == 8192  # 2621440 / 320
    assert cfg.peak_macs_per_cycle == 409600  # 4 planes * 320 * 320
    assert cfg.peak_macs_per_cycle_for("int8") == 409600
    assert cfg.peak_macs_per_cycle_for("fp16") == 102400
    assert cfg.peak_macs_per_cycle_for("fp32") == 25600
    tops = 2 * cfg.peak_macs_per_cycle * cfg.clock_hz / 1e12
    assert tops == pytest.approx(737.28)
    assert cfg.offchip_bytes_per_cycle == pytest.approx(32e9 / 900e6)
    assert cfg.c2c_bytes_per_cycle == pytest.approx(14e9 / 900e6)
    assert cfg.seconds(900) == pytest.approx(1e-6)
    # floorplan: MXM, MXM, SXM, MEM*44, VXM, MEM*44, SXM, MXM, MXM
    assert len(cfg.floorplan) == 95
    assert cfg.position("MXM", 0) == 0 and cfg.position("MXM", 1) == 1 and cfg.position("SXM", 0) == 2
    assert cfg.position("MEM", 0) == 3 and cfg.position("MEM", 43) == 46
    assert cfg.position("VXM") == 47
    assert cfg.position("MEM", 44) == 48 and cfg.position("MEM", 87) == 91
    assert cfg.position("SXM", 1) == 92 and cfg.position("MXM", 2) == 93 and cfg.position("MXM", 3) == 94


def test_mini_derived_numbers():
    cfg = load_config("mini")
    assert cfg.lanes == 16 and cfg.lines_per_slice == 4096 and cfg.sram_bytes == 8 * 65536
    assert cfg.peak_macs_per_cycle == 2 * 16 * 16
    expected = {("MXM", 0): 0, ("SXM", 0): 1, ("MEM", 0): 2, ("MEM", 1): 3, ("MEM", 2): 4, ("MEM", 3): 5,
                ("VXM", 0): 6, ("MEM", 4): 7, ("MEM", 5): 8, ("MEM", 6): 9, ("MEM", 7): 10, ("SXM", 1): 11,
                ("MXM", 1): 12}
    assert cfg.positions == expected


def test_lp30_derived_numbers():
    cfg = load_config("lp30")
    assert cfg.sram_bytes == 160 * 3125120 == 500019200
    assert cfg.lines_per_slice == 9766
    assert 2 * cfg.peak_macs_per_cycle * cfg.clock_hz == pytest.approx(1.2288e15)


def test_hash_is_stable_and_distinguishes_presets():
    hashes = {name: load_config(name).hash for name in PRESETS}
    assert len(set(hashes.values())) == len(PRESETS)
    for name, h in hashes.items():
        assert len(h) == 32 and int(h, 16) >= 0
        again = parse_config(preset_json(name), "copy")
        assert again.hash == h  # recomputed from the same JSON
    # key order in the file does not matter
    data = preset_json("mini")
    reordered = dict(reversed(list(data.items())))
    assert parse_config(reordered).hash == hashes["mini"]


def test_hash_ignores_descriptive_fields():
    base = load_config("mini").hash
    data = preset_json("mini")
    data["name"] = "renamed"
    data["description"] = "something else"
    data["assumptions"] = ["none"]
    data["sources"] = ["nowhere"]
    cfg = parse_config(data)
    assert cfg.name == "renamed"
    assert cfg.hash == base


@pytest.mark.parametrize("path, value", [
    (("lanes",), 32), (("latency", "mem_read"), 3), (("mxm", "cycles_per_vector", "fp16"), 2),
    (("mem", "slice_bytes"), 32768), (("clock_hz",), 1e9), (("floorplan",), ["MXM", "MEM*4", "SXM", "VXM", "MEM*4",
                                                                             "SXM", "MXM"]),
])
def test_hash_changes_with_machine_fields(path, value):
    data = preset_json("mini")
    obj = data
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
    assert parse_config(data).hash != load_config("mini").hash


def test_user_file_loads(tmp_path):
    data = preset_json("mini")
    data["name"] = "my-chip"
    data["mem"]["slices"] = 4
    data["floorplan"] = ["MXM", "SXM", "MEM*2", "VXM", "MEM*2", "SXM", "MXM"]
    data["lanes"] = 32
    data["mem"]["slice_bytes"] = 32 * 1024
    path = tmp_path / "chip.json"
    path.write_text(json.dumps(data))
    cfg = load_config(path)
    assert cfg.name == "my-chip" and cfg.mem_slices == 4 and cfg.lanes == 32
    assert cfg.lines_per_slice == 1024 and cfg.sram_bytes == 4 * 32 * 1024
    assert cfg.position("VXM") == 4 and cfg.position("MEM", 2) == 5
    assert load_config(str(path)).hash == cfg.hash
    assert cfg.hash != load_config("mini").hash


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "nope.json")
    assert "nope.json" in str(e.value) and "not a preset" in str(e.value)
    with pytest.raises(ConfigError):
        load_config("tsp2")


def test_bad_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"name": "x", ')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "bad.json" in str(e.value) and "not valid JSON" in str(e.value)


def test_not_an_object():
    with pytest.raises(ConfigError) as e:
        parse_config([1, 2], "cfg")
    assert "cfg" in str(e.value) and "JSON object" in str(e.value)


def mutate(path, value=None, delete=False):
    data = preset_json("mini")
    obj = data
    for key in path[:-1]:
        obj = obj[key]
    if delete:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return data


INVALID = [
    # (path, value or "DELETE", words that must appear in the message)
    (("lanes",), "DELETE", ["cfg.lanes", "missing field"]),
    (("mem", "slice_bytes"), "DELETE", ["cfg.mem.slice_bytes", "missing"]),
    (("latency", "vxm_reduce"), "DELETE", ["cfg.latency.vxm_reduce", "missing"]),
    (("mxm", "cycles_per_vector", "bf16"), "DELETE", ["cfg.mxm.cycles_per_vector.bf16", "missing"]),
    (("offchip",), "DELETE", ["cfg.offchip", "missing"]),
    (("name",), "DELETE", ["cfg.name", "missing"]),
    (("lanes",), "16", ["cfg.lanes", "integer"]),
    (("lanes",), 16.0, ["cfg.lanes", "integer"]),
    (("lanes",), True, ["cfg.lanes", "integer"]),
    (("clock_hz",), "fast", ["cfg.clock_hz", "finite number"]),
    (("clock_hz",), float("inf"), ["cfg.clock_hz", "finite number"]),
    (("name",), "", ["cfg.name", "non-empty string"]),
    (("name",), 3, ["cfg.name", "non-empty string"]),
    (("mem",), [1], ["cfg.mem", "expected an object"]),
    (("lanes",), -16, ["cfg.lanes", "must be >= 1"]),
    (("lanes",), 0, ["cfg.lanes", ">= 1"]),
    (("clock_hz",), -9e8, ["cfg.clock_hz", "must be > 0"]),
    (("offchip", "bytes_per_s"), 0, ["cfg.offchip.bytes_per_s", "must be > 0"]),
    (("latency", "mem_read"), 0, ["cfg.latency.mem_read", ">= 1"]),
    (("mxm", "acc_rows"), -1, ["cfg.mxm.acc_rows", ">= 1"]),
    (("mem", "read_ports"), 2, ["cfg.mem.read_ports", "<= 1"]),
    (("streams", "east"), 64, ["cfg.streams.east", "<= 63"]),
    (("lanes",), 5000, ["cfg.lanes", "<= 4096"]),
    (("superlanes",), 3, ["cfg.lanes", "multiple of superlanes=3"]),
    (("mem", "slices"), 9, ["cfg.floorplan", "8 MEM positions", "mem.slices=9"]),
    (("mxm", "planes"), 3, ["cfg.floorplan", "2 MXM positions", "mxm.planes=3"]),
    (("floorplan",), ["MXM", "MEM*4", "MEM*4", "SXM", "MXM"], ["cfg.floorplan", "exactly one VXM"]),
    (("floorplan",), ["MXM", "MEM*4", "VXM", "MEM*4", "MXM"], ["cfg.floorplan", "at least one SXM"]),
    (("floorplan",), ["MXM", "SXM", "MEM*4", "VXM", "MEM*4", "SXM", "TPU"], ["cfg.floorplan[6]", "unknown unit kind"]),
    (("floorplan",), ["MXM", "SXM", "MEM*x", "VXM", "MEM*4", "SXM", "MXM"], ["cfg.floorplan[2]", "repeat count"]),
    (("floorplan",), ["MXM", "SXM", "MEM*0", "VXM", "MEM*4", "SXM", "MXM"], ["cfg.floorplan[2]", ">= 1"]),
    (("floorplan",), ["MXM", "SXM", 4, "VXM", "MEM*4", "SXM", "MXM"], ["cfg.floorplan[2]", "expected a string"]),
    (("floorplan",), [], ["cfg.floorplan", "non-empty list"]),
    (("floorplan",), "MXM,MEM", ["cfg.floorplan", "non-empty list"]),
    (("latency", "mem_raed"), 2, ["cfg.latency", "unknown field", "mem_raed"]),
    (("mem", "slice_bytes"), 65540, ["cfg.mem.slice_bytes", "not a multiple of lanes=16"]),
    (("mxm", "rows"), 17, ["cfg.mxm", "rows=17", "lanes=16"]),
    (("mxm", "cols"), 32, ["cfg.mxm", "cols=32"]),
    (("mxm", "cycles_per_vector", "fp32"), 0, ["cfg.mxm.cycles_per_vector.fp32", ">= 1"]),
    (("c2c", "latency_cycles"), 1.5, ["cfg.c2c.latency_cycles", "integer"]),
]


@pytest.mark.parametrize("path, value, words", INVALID, ids=[".".join(p) + f"={v!r}" for p, v, _ in INVALID])
def test_invalid_field_names_the_field(path, value, words):
    data = mutate(path, delete=True) if value == "DELETE" else mutate(path, value)
    with pytest.raises(ConfigError) as e:
        parse_config(data, "cfg")
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_invalid_user_file_names_the_file(tmp_path):
    data = mutate(("mem", "slice_bytes"), 100)
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) + ".mem.slice_bytes" in str(e.value)


def test_parse_does_not_keep_a_reference_to_the_input():
    data = preset_json("mini")
    cfg = parse_config(data)
    before = copy.deepcopy(cfg.to_json())
    data["lanes"] = 999
    assert cfg.to_json() == before and cfg.hash == load_config("mini").hash


def test_config_is_frozen():
    cfg = load_config("mini")
    with pytest.raises(Exception):
        cfg.lanes = 32

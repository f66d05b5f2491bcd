"""Machine configs: the bundled presets, derived numbers, the hash, invalid keys, the published schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from lpx_tvm.errors import ConfigError
from lpx_tvm.machine.config import LATENCY_FIELDS, MXM_DTYPES, PRESETS, load_config, parse_config, preset_path
from lpx_tvm.machine.schema import (
    DOCS_BEGIN, DOCS_END, FLOORPLAN_ENTRY, MachineFile, docs_with_schema, machine_json_schema,
    machine_schema_markdown, schema_json_text,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"

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
    fp8 = {"fp8"} if name == "lp30" else set()  # the only optional rate: LP30's native format
    assert set(cfg.mxm_cycles_per_vector) == set(MXM_DTYPES) - {"fp8"} | fp8
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


# Every program embeds its machine's hash, so these change only with the machine model (the program hashes in
# tests/program_hashes.json rest on them).
PRESET_HASHES = {
    "tsp": "5528535ca84e64ec714afd1e8c0da2be",
    "mini": "b97e358750dcc8a5ce22cf32dc358f41",  # 32 streams each way (byte-plane groups)
    "lp30": "9c69500ec06f4acc59794459933376c6",  # fp8 rate
}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_hashes_unchanged(name):
    assert load_config(name).hash == PRESET_HASHES[name]
    assert parse_config(preset_json(name), "copy").hash == PRESET_HASHES[name]


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
    # (path, value or "DELETE", the exact one-line message after "cfg: ")
    (("clock_hzz",), 9e8, "unknown key 'clock_hzz' (did you mean 'clock_hz'?)"),
    (("mxm", "planez"), 2, "unknown key 'mxm.planez' (did you mean 'mxm.planes'?)"),
    (("mxm", "cycles_per_vector", "fp4"), 1,
     "unknown key 'mxm.cycles_per_vector.fp4' (did you mean 'mxm.cycles_per_vector.fp8'?)"),
    (("mxm", "cycles_per_vector", "fp8"), 0, "key 'mxm.cycles_per_vector.fp8': must be >= 1, got 0"),
    (("latency", "mem_raed"), 2, "unknown key 'latency.mem_raed' (did you mean 'latency.mem_read'?)"),
    (("zzz",), 1, "unknown key 'zzz'"),
    (("lanes",), "DELETE", "missing key 'lanes'"),
    (("mem", "slice_bytes"), "DELETE", "missing key 'mem.slice_bytes'"),
    (("latency", "vxm_reduce"), "DELETE", "missing key 'latency.vxm_reduce'"),
    (("mxm", "cycles_per_vector", "bf16"), "DELETE", "missing key 'mxm.cycles_per_vector.bf16'"),
    (("offchip",), "DELETE", "missing key 'offchip'"),
    (("name",), "DELETE", "missing key 'name'"),
    (("lanes",), "16", "key 'lanes': expected an integer, got the string \"16\""),
    (("lanes",), 16.0, "key 'lanes': expected an integer, got the number 16.0"),
    (("lanes",), 16.5, "key 'lanes': expected an integer, got the number 16.5"),
    (("lanes",), True, "key 'lanes': expected an integer, got the boolean true"),
    (("lanes",), None, "key 'lanes': expected an integer, got null"),
    (("c2c", "latency_cycles"), 1.5, "key 'c2c.latency_cycles': expected an integer, got the number 1.5"),
    (("clock_hz",), "fast", "key 'clock_hz': expected a number, got the string \"fast\""),
    (("clock_hz",), True, "key 'clock_hz': expected a number, got the boolean true"),
    (("clock_hz",), float("inf"), "key 'clock_hz': expected a finite number, got the number Infinity"),
    (("clock_hz",), float("nan"), "key 'clock_hz': expected a finite number, got the number NaN"),
    (("name",), "", "key 'name': must not be empty"),
    (("name",), 3, "key 'name': expected a string, got the number 3"),
    (("description",), ["x"], "key 'description': expected a string, got the list [\"x\"]"),
    (("assumptions",), "x", "key 'assumptions': expected a list, got the string \"x\""),
    (("mem",), [1], "key 'mem': expected an object, got the list [1]"),
    (("mxm", "cycles_per_vector"), 4, "key 'mxm.cycles_per_vector': expected an object, got the number 4"),
    (("lanes",), -16, "key 'lanes': must be >= 1, got -16"),
    (("lanes",), 0, "key 'lanes': must be >= 1, got 0"),
    (("lanes",), 5000, "key 'lanes': must be <= 4096, got 5000"),
    (("clock_hz",), -9e8, "key 'clock_hz': must be > 0, got -900000000.0"),
    (("clock_hz",), 0, "key 'clock_hz': must be > 0, got 0"),
    (("offchip", "bytes_per_s"), 0, "key 'offchip.bytes_per_s': must be > 0, got 0"),
    (("latency", "mem_read"), 0, "key 'latency.mem_read': must be >= 1, got 0"),
    (("latency", "mem_read"), 100001, "key 'latency.mem_read': must be <= 100000, got 100001"),
    (("mxm", "acc_rows"), 1, "key 'mxm.acc_rows': must be >= 2, got 1"),
    (("mem", "read_ports"), 2, "key 'mem.read_ports': must be <= 1, got 2"),
    (("streams", "east"), 64, "key 'streams.east': must be <= 63, got 64"),
    (("mxm", "cycles_per_vector", "fp32"), 0, "key 'mxm.cycles_per_vector.fp32': must be >= 1, got 0"),
    (("superlanes",), 3, "key 'superlanes': 3 does not divide lanes=16"),
    (("mem", "slices"), 9, "key 'floorplan': has 8 MEM positions but mem.slices=9"),
    (("mxm", "planes"), 3, "key 'floorplan': has 2 MXM positions but mxm.planes=3"),
    (("floorplan",), ["MXM", "MEM*4", "MEM*4", "SXM", "MXM"], "key 'floorplan': needs exactly one VXM, has 0"),
    (("floorplan",), ["MXM", "MEM*4", "VXM", "MEM*4", "MXM"], "key 'floorplan': needs at least one SXM"),
    (("floorplan",), ["MXM", "SXM", "MEM*4", "VXM", "MEM*4", "SXM", "TPU"],
     "key 'floorplan[6]': unknown unit kind 'TPU' (MXM, SXM, MEM or VXM)"),
    (("floorplan",), ["MXM", "SXM", "MEM*x", "VXM", "MEM*4", "SXM", "MXM"],
     "key 'floorplan[2]': bad repeat count in 'MEM*x' (write KIND*n with n >= 1)"),
    (("floorplan",), ["MXM", "SXM", "MEM*0", "VXM", "MEM*4", "SXM", "MXM"],
     "key 'floorplan[2]': bad repeat count in 'MEM*0' (write KIND*n with n >= 1)"),
    (("floorplan",), ["MXM", "SXM", 4, "VXM", "MEM*4", "SXM", "MXM"],
     "key 'floorplan[2]': expected a string, got the number 4"),
    (("floorplan",), [], "key 'floorplan': must not be empty"),
    (("floorplan",), "MXM,MEM", "key 'floorplan': expected a list, got the string \"MXM,MEM\""),
    (("mem", "slice_bytes"), 65540, "key 'mem.slice_bytes': 65540 is not a multiple of lanes=16"),
    (("mxm", "rows"), 17, "key 'mxm.rows': 17 exceeds lanes=16"),
    (("mxm", "cols"), 32, "key 'mxm.cols': 32 exceeds lanes=16"),
]


@pytest.mark.parametrize("path, value, message", INVALID, ids=[".".join(p) + f"={v!r}" for p, v, _ in INVALID])
def test_invalid_key_is_one_line_naming_the_key(path, value, message):
    data = mutate(path, delete=True) if value == "DELETE" else mutate(path, value)
    with pytest.raises(ConfigError) as e:
        parse_config(data, "cfg")
    assert str(e.value) == f"cfg: {message}"


def test_every_problem_is_its_own_line():
    data = mutate(("clock_hzz",), 1)
    data["mxm"]["planez"] = 2
    del data["lanes"]
    data["mem"]["slices"] = "8"
    with pytest.raises(ConfigError) as e:
        parse_config(data, "machine file two.json")
    assert sorted(str(e.value).splitlines()) == sorted([
        "machine file two.json: unknown key 'clock_hzz' (did you mean 'clock_hz'?)",
        "machine file two.json: unknown key 'mxm.planez' (did you mean 'mxm.planes'?)",
        "machine file two.json: missing key 'lanes'",
        "machine file two.json: key 'mem.slices': expected an integer, got the string \"8\"",
    ])


def test_broken_relations_are_each_a_line():
    data = mutate(("superlanes",), 3)
    data["mxm"]["rows"] = 17
    with pytest.raises(ConfigError) as e:
        parse_config(data, "cfg")
    assert str(e.value).splitlines() == ["cfg: key 'superlanes': 3 does not divide lanes=16",
                                         "cfg: key 'mxm.rows': 17 exceeds lanes=16"]


def test_too_many_lines_per_slice():
    data = mutate(("mem", "slice_bytes"), 16 * 2**31)  # 2^31 lines of 16 bytes
    with pytest.raises(ConfigError) as e:
        parse_config(data, "cfg")
    assert str(e.value) == "cfg: key 'mem.slice_bytes': 2147483648 lines per slice do not fit 32-bit addresses"
    data["mem"]["slice_bytes"] = 16 * (2**31 - 1)  # the most that fits (the floorplan still matches)
    assert parse_config(data).lines_per_slice == 2**31 - 1


def test_descriptive_keys_are_optional():
    data = preset_json("mini")
    for key in ("description", "assumptions", "sources"):
        data.pop(key, None)
    cfg = parse_config(data)
    assert cfg.hash == PRESET_HASHES["mini"]


def test_number_keys_take_json_integers_and_floats():
    data = preset_json("mini")
    data["clock_hz"] = 9e8
    data["c2c"]["bytes_per_s"] = 1.4e10
    cfg = parse_config(data)
    assert cfg.clock_hz == 9e8 and isinstance(cfg.clock_hz, float)
    assert cfg.c2c_bytes_per_s == 1.4e10
    assert load_config("mini").offchip_bytes_per_s == 32e9 and isinstance(load_config("mini").offchip_bytes_per_s,
                                                                           float)


def test_unknown_key_in_a_user_file_names_file_and_key(tmp_path):
    data = preset_json("tsp")
    data["mxm"]["planez"] = 4
    path = tmp_path / "tsp_custom.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"machine file {path}: unknown key 'mxm.planez' (did you mean 'mxm.planes'?)"


def test_invalid_user_file_names_the_file(tmp_path):
    data = mutate(("mem", "slice_bytes"), 100)
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"machine file {path}: key 'mem.slice_bytes': 100 is not a multiple of lanes=16"


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


# ---- the published schema ---------------------------------------------------------


def test_docs_table_matches_the_model():
    page = (DOCS / "machine.md").read_text()
    assert page.count(DOCS_BEGIN) == 1 and page.count(DOCS_END) == 1
    assert page == docs_with_schema(page), (
        'docs/machine.md is out of date: run lpx_tvm.machine.schema.write_docs("docs")')


def test_schema_file_matches_the_model():
    assert (DOCS / "machine.schema.json").read_text() == schema_json_text(), (
        'docs/machine.schema.json is out of date: run lpx_tvm.machine.schema.write_docs("docs")')


def _leaf_paths(model, prefix=""):
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _leaf_paths(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def _json_paths(obj, prefix=""):
    for key, value in obj.items():
        if isinstance(value, dict):
            yield from _json_paths(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_docs_table_has_a_row_for_every_key():
    table = machine_schema_markdown()
    for path in _leaf_paths(MachineFile):
        assert f"| `{path}` |" in table, path
    # and the lp30 preset (which has every key, the optional fp8 rate too) has no key the table lacks
    assert set(_json_paths(preset_json("lp30"))) == set(_leaf_paths(MachineFile))


def test_docs_table_rows():
    table = machine_schema_markdown().splitlines()
    assert "| `lanes` | integer | 1..4096 | elements of a vector, one per lane | lanes |" in table
    assert "| `clock_hz` | number | > 0 | clock frequency | Hz |" in table
    assert ("| `mem.slice_bytes` | integer | >= 1; a multiple of `lanes`; at most 2^31 - 1 lines of `lanes` "
            "bytes (32-bit addresses) | capacity of one slice | bytes |") in table
    assert "| `mem.read_ports` | integer | exactly 1 | read ports per slice (`mem.read`, `mem.gather`) | ports |" in table
    assert ("| `sources` | list of string (optional, default `[]`) |  | publications the numbers come from "
            "(not in the config hash) |  |") in table


def test_json_schema_refuses_unknown_keys_everywhere():
    schema = machine_json_schema()
    assert schema["additionalProperties"] is False
    assert all(d["additionalProperties"] is False for d in schema["$defs"].values())
    assert schema["properties"]["floorplan"]["items"]["pattern"] == FLOORPLAN_ENTRY


@pytest.mark.parametrize("name", PRESETS)
def test_presets_valid_under_the_published_schema(name):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((DOCS / "machine.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert list(validator.iter_errors(preset_json(name))) == []
    bad = preset_json(name)
    bad["mxm"]["planez"] = 4
    bad["lanes"] = "320"
    assert sorted(e.json_path for e in validator.iter_errors(bad)) == ["$.lanes", "$.mxm"]

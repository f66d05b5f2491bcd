"""The machine file's schema: every key, its type, range, meaning and unit, as pydantic models.

``validate_machine_file`` checks a machine JSON object against :class:`MachineFile` and
turns every problem (an unknown or misspelt key, a missing key, a wrongly typed or out of
range value, a broken relation between keys) into one line of a :class:`ConfigError`
that names the key by its path, such as ``unknown key 'mxm.planez'``. ``config.py``
builds the :class:`~lpx_tvm.machine.config.LPXConfig` from the validated file.

Each key is declared once, here; the table in docs/machine.md and the JSON schema in
docs/machine.schema.json are generated from these models (``write_docs("docs")``
rewrites both, and a test checks they agree).

Types are strict, as the JSON types are meant: an integer key refuses ``"12"``, ``12.5``,
``12.0`` and ``true``; a number key (``clock_hz``, ``*.bytes_per_s``) takes any finite
JSON number but no string or boolean.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ..errors import ConfigError

# Keys that describe a machine but do not change what it does: left out of the config hash.
DESCRIPTIVE_KEYS = ("name", "description", "assumptions", "sources")

UNIT_KINDS = ("MXM", "SXM", "MEM", "VXM")
# One floorplan entry: a unit kind, optionally repeated (``"MEM*44"``).
FLOORPLAN_ENTRY = rf"^({'|'.join(UNIT_KINDS)})(\*[1-9][0-9]*)?$"


def _key(description: str, unit: str = "", **constraints):
    """A key of the machine file: its meaning, its unit (shown in the docs) and its range."""
    extra = {"unit": unit} if unit else None
    return Field(description=description, json_schema_extra=extra, **constraints)


def _check_floorplan_entry(entry: str) -> str:
    # FLOORPLAN_ENTRY decides; the rest only says which part is wrong.
    if re.fullmatch(FLOORPLAN_ENTRY, entry):
        return entry
    kind = entry.partition("*")[0]
    if kind in UNIT_KINDS:
        reason = f"bad repeat count in {entry!r} (write KIND*n with n >= 1)"
    else:
        reason = f"unknown unit kind {kind!r} ({', '.join(UNIT_KINDS[:-1])} or {UNIT_KINDS[-1]})"
    raise PydanticCustomError("floorplan_entry", "{reason}", {"reason": reason})


FloorplanEntry = Annotated[
    str,
    AfterValidator(_check_floorplan_entry),
    Field(json_schema_extra={"pattern": FLOORPLAN_ENTRY}),
]


class _Section(BaseModel):
    """Every level of the machine file: unknown keys refused, JSON types strict."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Mem(_Section):
    """SRAM: slices of lines, one line holds ``lanes`` bytes."""

    slices: int = _key("SRAM slices, one per `MEM` entry of the floorplan", "slices", ge=1, le=65535)
    slice_bytes: int = _key("capacity of one slice", "bytes", ge=1)
    read_ports: int = _key("read ports per slice (`mem.read`, `mem.gather`)", "ports", ge=1, le=1)
    write_ports: int = _key("write ports per slice (`mem.write`, `mem.scatter`)", "ports", ge=1, le=1)


class Streams(_Section):
    """Stream registers in each direction."""

    east: int = _key("eastward stream registers", "streams", ge=1, le=63)
    west: int = _key("westward stream registers", "streams", ge=1, le=63)


class CyclesPerVector(_Section):
    """Compute-port cycles an MXM plane spends per activation vector, by dtype."""

    int8: int = _key("int8 operands", "cycles", ge=1, le=1024)
    uint8: int = _key("uint8 operands", "cycles", ge=1, le=1024)
    fp16: int = _key("fp16 operands", "cycles", ge=1, le=1024)
    bf16: int = _key("bf16 operands", "cycles", ge=1, le=1024)
    fp32: int = _key("fp32 operands", "cycles", ge=1, le=1024)
    fp8: "int | None" = _key("fp8 e4m3 operands (absent: the MXM does not multiply fp8)", "cycles", default=None,
                             ge=1, le=1024)


class Mxm(_Section):
    """The matrix planes."""

    planes: int = _key("matrix planes, one per `MXM` entry of the floorplan", "planes", ge=1, le=255)
    rows: int = _key("rows of the installed weight matrix (the contracted dimension K)", "rows", ge=1)
    cols: int = _key("columns of the installed weight matrix (output lanes)", "columns", ge=1)
    weight_buffers: int = _key("weight matrices a plane holds at once", "buffers", ge=1, le=255)
    # Two at least: the compiler fills one half of the accumulator while the other drains.
    acc_rows: int = _key("accumulator rows per plane, one lanes-wide vector each", "rows", ge=2)
    cycles_per_vector: CyclesPerVector = _key("compute cycles per activation vector, by dtype")
    install_streams: int = _key("streams a plane installs weight rows from at once (int8: rows / install_streams "
                                "cycles per weight matrix)", "streams", ge=1, le=63)


class Vxm(_Section):
    """The vector unit."""

    alus: int = _key("independent ALUs, each its own queue", "ALUs", ge=1, le=255)


class Offchip(_Section):
    """Off-chip memory and its DMA engines."""

    bytes_per_s: float = _key("off-chip bandwidth", "bytes/s", gt=0, allow_inf_nan=False)
    latency_cycles: int = _key("latency of one DMA transfer", "cycles", ge=1)
    dma_engines: int = _key("DMA engines, one transfer at a time each", "engines", ge=1, le=255)


class C2c(_Section):
    """Chip-to-chip links (loopback on one chip)."""

    links: int = _key("chip-to-chip links", "links", ge=1, le=255)
    bytes_per_s: float = _key("bandwidth of one link, per direction", "bytes/s", gt=0, allow_inf_nan=False)
    latency_cycles: int = _key("latency of one message", "cycles", ge=1)


def _latency(what: str):
    return _key(f"pipeline latency of {what}", "cycles", ge=1, le=100000)


class Latency(_Section):
    """Pipeline latencies, from issue to result."""

    mem_read: int = _latency("`mem.read`")
    mem_write: int = _latency("`mem.write` and `mem.scatter`")
    mem_gather: int = _latency("`mem.gather`")
    mxm_install: int = _latency("`mxm.install`")
    mxm_mul: int = _latency("`mxm.mul` and `mxm.mac`")
    mxm_drain: int = _latency("`mxm.drain`")
    vxm_alu: int = _latency("a VXM arithmetic instruction")
    vxm_transcendental: int = _latency("a VXM transcendental function")
    vxm_reduce: int = _latency("a VXM reduction across lanes")
    vxm_convert: int = _latency("a VXM conversion")
    sxm: int = _latency("an SXM instruction")
    sxm_transpose: int = _latency("`sxm.transpose`")


class MachineFile(_Section):
    """One LPX machine, as its JSON file is written."""

    model_config = ConfigDict(title="LPX machine file")

    name: str = _key("name of the machine", min_length=1)
    description: str = _key("free text", default="")
    assumptions: list[str] = _key("modelling choices the numbers rest on", default=[])
    sources: list[str] = _key("publications the numbers come from", default=[])
    clock_hz: float = _key("clock frequency", "Hz", gt=0, allow_inf_nan=False)
    lanes: int = _key("elements of a vector, one per lane", "lanes", ge=1, le=4096)
    superlanes: int = _key("lane groups (nothing else reads it)", "superlanes", ge=1)
    floorplan: list[FloorplanEntry] = _key(
        "unit kinds from west to east, `KIND*n` standing for n entries; each entry is one position",
        min_length=1)
    mem: Mem = _key("SRAM")
    streams: Streams = _key("stream registers")
    mxm: Mxm = _key("matrix planes")
    vxm: Vxm = _key("vector unit")
    offchip: Offchip = _key("off-chip memory and DMA")
    c2c: C2c = _key("chip-to-chip links")
    latency: Latency = _key("pipeline latencies")

    def expanded_floorplan(self) -> tuple:
        """One unit kind per position, west to east (``"MEM*2"`` gives two ``"MEM"``)."""
        out = []
        for entry in self.floorplan:
            kind, _, times = entry.partition("*")
            out.extend([kind] * int(times or 1))
        return tuple(out)

    @model_validator(mode="after")
    def _check_relations(self):
        problems = [(r.key, p) for r in RELATIONS if (p := r.check(self)) is not None]
        if problems:
            raise PydanticCustomError("machine_relations", "{summary}", {
                "problems": problems, "summary": "; ".join(f"{k}: {p}" for k, p in problems)})
        return self


# ---- relations between keys ---------------------------------------------------------


@dataclass(frozen=True)
class Relation:
    """A rule between keys: the key an error names, the rule as the docs state it, the check."""

    key: str
    rule: str
    check: Callable[[MachineFile], "str | None"]  # the problem, or None when the rule holds


RELATIONS: list[Relation] = []


def relation(key: str, rule: str):
    """Register a check of ``MachineFile`` that returns the problem text, or None."""
    def register(check):
        RELATIONS.append(Relation(key, rule, check))
        return check
    return register


@relation("superlanes", "divides `lanes`")
def _superlanes_divide_lanes(m):
    if m.lanes % m.superlanes:
        return f"{m.superlanes} does not divide lanes={m.lanes}"


@relation("mem.slice_bytes", "a multiple of `lanes`")
def _slices_hold_whole_lines(m):
    if m.mem.slice_bytes % m.lanes:
        return f"{m.mem.slice_bytes} is not a multiple of lanes={m.lanes}"


@relation("mem.slice_bytes", "at most 2^31 - 1 lines of `lanes` bytes (32-bit addresses)")
def _lines_fit_addresses(m):
    if m.mem.slice_bytes // m.lanes > 2**31 - 1:
        return f"{m.mem.slice_bytes // m.lanes} lines per slice do not fit 32-bit addresses"


@relation("mxm.rows", "at most `lanes`")
def _rows_fit_lanes(m):
    if m.mxm.rows > m.lanes:
        return f"{m.mxm.rows} exceeds lanes={m.lanes}"


@relation("mxm.cols", "at most `lanes`")
def _cols_fit_lanes(m):
    if m.mxm.cols > m.lanes:
        return f"{m.mxm.cols} exceeds lanes={m.lanes}"


@relation("mxm.install_streams", "at most `mxm.rows` and at most the streams of each direction")
def _install_streams_exist(m):
    most = min(m.mxm.rows, m.streams.east, m.streams.west)
    if m.mxm.install_streams > most:
        return (f"{m.mxm.install_streams} exceeds min(mxm.rows={m.mxm.rows}, streams.east={m.streams.east}, "
                f"streams.west={m.streams.west})")


@relation("floorplan", "as many `MEM` entries as `mem.slices`")
def _one_position_per_slice(m):
    n = m.expanded_floorplan().count("MEM")
    if n != m.mem.slices:
        return f"has {n} MEM positions but mem.slices={m.mem.slices}"


@relation("floorplan", "as many `MXM` entries as `mxm.planes`")
def _one_position_per_plane(m):
    n = m.expanded_floorplan().count("MXM")
    if n != m.mxm.planes:
        return f"has {n} MXM positions but mxm.planes={m.mxm.planes}"


@relation("floorplan", "exactly one `VXM`")
def _one_vxm(m):
    n = m.expanded_floorplan().count("VXM")
    if n != 1:
        return f"needs exactly one VXM, has {n}"


@relation("floorplan", "at least one `SXM`")
def _some_sxm(m):
    if "SXM" not in m.expanded_floorplan():
        return "needs at least one SXM"


# ---- what the compiler needs beyond the machine model ---------------------------------

# The ISA and the simulator take any weight matrix up to `lanes` x `lanes`; the compiler
# and the GEMM kernel tile K and N by whole stream vectors.
COMPILER_RULE = "`mxm.rows` and `mxm.cols` equal to `lanes`"


def compiler_problem(cfg) -> "str | None":
    """Why the compiler cannot target machine ``cfg`` (an ``LPXConfig``), or None."""
    keys = [f"mxm.{k}={v}" for k, v in (("rows", cfg.mxm_rows), ("cols", cfg.mxm_cols)) if v != cfg.lanes]
    if not keys:
        return None
    return (f"machine {cfg.name}: {' and '.join(keys)} with lanes={cfg.lanes}: the compiler and the GEMM "
            "kernel tile the MXM by whole stream vectors and need mxm.rows = mxm.cols = lanes (programs for "
            "this machine can still be assembled and simulated: lpx-tvm asm, lpx-tvm run)")


# ---- validation with one line per problem ---------------------------------------------


def validate_machine_file(data, source: str) -> MachineFile:
    """Validate a machine JSON object.

    Parameters
    ----------
    data
        The parsed JSON (normally a dict).
    source
        What the data came from, first on every error line (``machine file chip.json``).

    Returns
    -------
    MachineFile
        The validated file.

    Raises
    ------
    ConfigError
        One line per problem, each naming the key by its path.
    """
    try:
        return MachineFile.model_validate(data)
    except ValidationError as e:
        lines = [f"{source}: {problem}" for error in e.errors() for problem in _problems(error)]
        raise ConfigError("\n".join(lines)) from None


_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "list_type": "a list",
    "model_type": "an object",
    "dict_type": "an object",
}
_BOUNDS = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">", "less_than": "<"}
_BOUND_CTX = {"greater_than_equal": "ge", "less_than_equal": "le", "greater_than": "gt", "less_than": "lt"}


def _path(loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _given(value) -> str:
    """A value as its JSON spelling, with its JSON type: ``the string "16"``."""
    if value is None:
        return "null"
    kind = ("boolean" if isinstance(value, bool) else "number" if isinstance(value, (int, float))
            else "string" if isinstance(value, str) else "list" if isinstance(value, (list, tuple))
            else "object" if isinstance(value, dict) else type(value).__name__)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"the {kind} {text}"


def _known_keys(parent_loc) -> list:
    """The keys the model allows at ``parent_loc`` (for a did-you-mean hint)."""
    model = MachineFile
    for part in parent_loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return list(model.model_fields)


def _problems(error) -> list:
    """The one-line problems of one pydantic error (a relation error may carry several)."""
    kind, loc, ctx = error["type"], error["loc"], error.get("ctx", {})
    path = _path(loc)
    if kind == "machine_relations":
        return [f"key '{key}': {problem}" for key, problem in ctx["problems"]]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _known_keys(loc[:-1]), n=1)
        hint = f" (did you mean '{_path((*loc[:-1], close[0]))}'?)" if close else ""
        return [f"unknown key '{path}'{hint}"]
    if kind == "missing":
        return [f"missing key '{path}'"]
    if not loc:
        return [f"the machine file must be a JSON object, got {_given(error['input'])}"]
    if kind in _EXPECTED:
        detail = f"expected {_EXPECTED[kind]}, got {_given(error['input'])}"
    elif kind in _BOUNDS:
        bound = ctx[_BOUND_CTX[kind]]
        bound = int(bound) if float(bound).is_integer() else bound  # "> 0", not "> 0.0", for a number key
        detail = f"must be {_BOUNDS[kind]} {bound}, got {json.dumps(error['input'])}"
    elif kind in ("too_short", "string_too_short"):
        detail = "must not be empty"
    elif kind == "floorplan_entry":
        detail = ctx["reason"]
    else:  # a pydantic check this module does not spell out: its own message
        detail = f"{error['msg'][0].lower()}{error['msg'][1:]}, got {_given(error['input'])}"
    return [f"key '{path}': {detail}"]


# ---- the published schema -------------------------------------------------------------


def machine_json_schema() -> dict:
    """The JSON schema of the machine file, with each relation as a ``$comment`` on its key."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **MachineFile.model_json_schema()}
    for key in DESCRIPTIVE_KEYS:
        schema["properties"][key]["description"] += " (not in the config hash)"
    for r in RELATIONS:
        prop = _property(schema, r.key)
        prop["$comment"] = f"{prop['$comment']}; {r.rule}" if "$comment" in prop else r.rule
    return schema


def _resolve(schema: dict, node: dict) -> dict:
    ref = node.get("$ref")
    return schema["$defs"][ref.rsplit("/", 1)[1]] if ref else node


def _property(schema: dict, path: str) -> dict:
    node = schema
    for part in path.split("."):
        node = _resolve(schema, node)["properties"][part]
    return node


def _not_null(node: dict) -> dict:
    """An optional key's own schema (``anyOf`` it and null)."""
    branches = [n for n in node.get("anyOf", ()) if n.get("type") != "null"]
    return branches[0] if len(branches) == 1 else node


def _type_text(schema: dict, node: dict) -> str:
    node = _not_null(node)
    if "$ref" in node:
        return "object"
    if node.get("type") == "array":
        return f"list of {_type_text(schema, node['items'])}"
    return node["type"]


def _range_text(node: dict) -> str:
    node = _not_null(node)
    parts = []
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and high is not None:
        parts.append(f"exactly {low}" if low == high else f"{low}..{high}")
    elif low is not None:
        parts.append(f">= {low}")
    elif high is not None:
        parts.append(f"<= {high}")
    if "exclusiveMinimum" in node:
        parts.append(f"> {node['exclusiveMinimum']}")
    if node.get("minLength") == 1 or node.get("minItems") == 1:
        parts.append("non-empty")
    if "pattern" in node.get("items", {}):
        parts.append(f"each entry matches `{node['items']['pattern']}`")
    if "$comment" in node:
        parts.append(node["$comment"])
    return "; ".join(parts)


def _rows(schema: dict, node: dict, prefix: str = ""):
    target = _resolve(schema, node)
    required = set(target.get("required", ()))
    for name, prop in target["properties"].items():
        path = f"{prefix}{name}"
        optional = "" if name in required else f" (optional, default `{json.dumps(prop.get('default'))}`)"
        yield (f"`{path}`", _type_text(schema, prop) + optional, _range_text(prop),
               prop.get("description", ""), prop.get("unit", ""))
        if "$ref" in prop:
            yield from _rows(schema, prop, f"{path}.")


def schema_markdown(schema: dict) -> str:
    """The docs table of every key of a file's JSON schema (a machine or a system file)."""
    lines = ["| Key | Type | Range | Meaning | Unit |", "|-----|------|-------|---------|------|"]
    for row in _rows(schema, schema):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    return "\n".join(lines) + "\n"


def machine_schema_markdown() -> str:
    """The docs table of every key of the machine file, generated from :class:`MachineFile`."""
    return schema_markdown(machine_json_schema())


# The generated table sits between these markers in docs/machine.md.
DOCS_BEGIN = '<!-- machine-schema: generated by lpx_tvm.machine.schema.write_docs("docs"); do not edit -->'
DOCS_END = "<!-- machine-schema: end -->"


def with_generated_table(markdown: str, begin: str, end: str, table: str, missing: str) -> str:
    """``markdown`` with the text between the markers ``begin`` and ``end`` replaced by
    ``table``; ``missing``: the ValueError's message when a marker is not there."""
    head, found_begin, rest = markdown.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found_begin or not found_end:
        raise ValueError(missing)
    return f"{head}{begin}\n{table}{end}{tail}"


def docs_with_schema(markdown: str) -> str:
    """``markdown`` (docs/machine.md) with its generated table replaced by the current one."""
    return with_generated_table(markdown, DOCS_BEGIN, DOCS_END, machine_schema_markdown(),
                                "docs/machine.md has no machine-schema markers")


def schema_json_text() -> str:
    """docs/machine.schema.json as it should be written."""
    return json.dumps(machine_json_schema(), indent=2) + "\n"


def write_docs(docs_dir) -> None:
    """Rewrite the generated table in ``docs_dir/machine.md`` and ``docs_dir/machine.schema.json``."""
    docs = Path(docs_dir)
    page = docs / "machine.md"
    page.write_text(docs_with_schema(page.read_text()))
    (docs / "machine.schema.json").write_text(schema_json_text())


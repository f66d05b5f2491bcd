"""The system file's schema: every key, its type, range and meaning, as a pydantic model.

``validate_system_file`` checks a system JSON object against :class:`SystemFile` and
turns what is wrong (an unknown key, a missing key, a wrongly typed or out of range
value, a malformed link) into one :class:`ConfigError` line naming the key, such as
``key 'links_per_pair': expected an integer >= 1, got -1``. What needs the chips'
machine (ports in range, ports used once, the link rate) is checked by ``system.py``
once the machine is loaded, in the same one-line form (:func:`one_line`).

The docs table in docs/multichip.md is generated from the model (``write_docs("docs")``
rewrites it, and a test checks it agrees).

Types are strict, as the JSON types are meant: ``chips`` refuses ``"2"``, ``2.0``,
``NaN`` and ``true``.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ..errors import ConfigError
from .schema import _BOUND_CTX, _BOUNDS, _EXPECTED, _given, _path, schema_markdown, with_generated_table

# Bounds checked before anything is built: a system of a billion chips is refused at
# once instead of exhausting memory building its tables.
MAX_CHIPS = 65536
# The most cycles one vector may take on a link, and a message's latency: the
# schedulers keep cycles in 64-bit integers.
MAX_LINK_CYCLES = 2**31 - 1
# An error line lists at most this many problems, then counts the rest.
SHOWN_PROBLEMS = 3

TOPOLOGIES = ("all_to_all",)
LINK_FORM = "[chip a, link a, chip b, link b]"


def _key(description: str, unit: str = "", **constraints):
    extra = {"unit": unit} if unit else None
    return Field(description=description, json_schema_extra=extra, **constraints)


def _check_link(entry: list) -> list:
    if len(entry) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in entry):
        return entry
    raise PydanticCustomError("link_entry", "expected {form} (4 integers)", {"form": LINK_FORM})


LinkEntry = Annotated[
    list,
    AfterValidator(_check_link),
    Field(json_schema_extra={"items": {"type": "integer"}, "minItems": 4, "maxItems": 4}),
]


class SystemFile(BaseModel):
    """N chips of one machine and the C2C links between them, as the JSON file is written."""

    model_config = ConfigDict(title="LPX system file", extra="forbid", strict=True, frozen=True)

    name: str = _key("name of the system", min_length=1)
    preset: str = _key("machine of every chip: a machine preset (`tsp`, `mini`, `lp30`) or a machine file "
                       "(a relative path is read from the system file's folder)", min_length=1)
    chips: int = _key("chips, numbered from 0", "chips", ge=1, le=MAX_CHIPS)
    links: "list[LinkEntry] | None" = _key(
        "the links, each `[chip a, link a, chip b, link b]`: port `link a` of chip `chip a` joined to port `link b` "
        "of chip `chip b`, both ways; give `links` or `topology`", default=None)
    topology: "Literal['all_to_all'] | None" = _key(
        "a generated topology instead of `links`: `all_to_all` joins every pair of chips", default=None)
    links_per_pair: "int | None" = _key("links joining each pair of chips (with `topology`; default 1)", "links",
                                        default=None, ge=1, le=255)
    description: str = _key("free text", default="")
    assumptions: list[str] = _key("modelling choices the system rests on", default=[])
    sources: list[str] = _key("publications the system comes from", default=[])

    @model_validator(mode="after")
    def _links_or_topology(self):
        if (self.links is None) == (self.topology is None):
            raise PydanticCustomError("links_or_topology", "give 'links' (a list of {form}) or 'topology' "
                                      "({topologies}), one of them",
                                      {"form": LINK_FORM, "topologies": ", ".join(TOPOLOGIES)})
        if self.links_per_pair is not None and self.topology is None:
            raise PydanticCustomError("links_per_pair_alone", "key 'links_per_pair': only with 'topology' (a "
                                      "list of links gives each link itself)")
        return self


KEYS = tuple(SystemFile.model_fields)
OPTIONAL = {"links": f"a list of {LINK_FORM}", "topology": f"one of {', '.join(TOPOLOGIES)}",
            "links_per_pair": "an integer >= 1"}


def one_line(source: str, problems: list) -> str:
    """``source: problem; problem; problem; and N more problems``: an error line stays
    short however many problems a file has."""
    shown = "; ".join(problems[:SHOWN_PROBLEMS])
    rest = len(problems) - SHOWN_PROBLEMS
    more = f"; and {rest} more problem{'s' * (rest > 1)}" if rest > 0 else ""
    return f"{source}: {shown}{more}"


def validate_system_file(data, source: str) -> SystemFile:
    """Validate a system JSON object.

    Parameters
    ----------
    data
        The parsed JSON (normally a dict).
    source
        What the data came from, first on the error line (``system file node.json``).

    Raises
    ------
    ConfigError
        One line naming each key that is wrong (the first few, and how many more).
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a system file must be a JSON object, got {_given(data)}")
    unknown = sorted(str(k) for k in data if k not in KEYS)
    if unknown:
        shown = [k if len(k) <= 40 else f"{k[:37]}..." for k in unknown[:5]]
        hints = [f"'{k}' -> '{close[0]}'" for k in shown if (close := difflib.get_close_matches(k, KEYS, n=1))]
        hint = f"; did you mean {', '.join(hints)}?" if hints else ""
        more = [f"... {len(unknown) - 5} more"] if len(unknown) > 5 else []
        raise ConfigError(f"{source}: unknown key(s) {shown + more} (expected {sorted(KEYS)}){hint}")
    nulls = [f"key '{k}': expected {what}, got null" for k, what in OPTIONAL.items() if k in data and data[k] is None]
    if nulls:  # null is how the model says "not given": written in a file, it is a mistake
        raise ConfigError(one_line(source, nulls))
    try:
        return SystemFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(source, [_problem(err) for err in e.errors()])) from None


def _problem(error) -> str:
    kind, loc, ctx = error["type"], error["loc"], error.get("ctx", {})
    path = _path(loc)
    if kind in ("links_or_topology", "links_per_pair_alone"):
        return error["msg"]
    if kind == "missing":
        return f"missing key '{path}'"
    if kind == "link_entry":
        return f"key '{path}' = {_given(error['input']).split(' ', 2)[2]}: {error['msg']}"
    if kind == "literal_error":
        value = error["input"]
        value = repr(value) if isinstance(value, str) and len(value) <= 40 else _given(value)
        return f"key '{path}': unknown {path} {value} (expected one of {', '.join(TOPOLOGIES)})"
    if kind in _EXPECTED:
        return f"key '{path}': expected {_EXPECTED[kind]}, got {_given(error['input'])}"
    if kind in _BOUNDS:
        bound = ctx[_BOUND_CTX[kind]]
        what = "an integer" if isinstance(error["input"], int) else "a number"
        note = " (the largest system lpx_tvm builds)" if path == "chips" and kind == "less_than_equal" else ""
        return f"key '{path}': expected {what} {_BOUNDS[kind]} {bound}{note}, got {json.dumps(error['input'])}"
    if kind == "string_too_short":
        return f"key '{path}': must not be empty"
    return f"key '{path}': {error['msg'][0].lower()}{error['msg'][1:]}, got {_given(error['input'])}"


# ---- the published schema -------------------------------------------------------------


# The rules the model checks in code, shown in the docs beside the key's range.
RULES = {
    "links": "4 integers each: chips 0..`chips` - 1, ports 0..`c2c.links` - 1 of the machine, each port in one "
             "link; at most `chips` x `c2c.links` / 2 links",
    "topology": "`all_to_all`; `links_per_pair` x (`chips` - 1) at most `c2c.links`",
    "preset": "its links take at most 2^31 - 1 cycles a vector of fp32, and as latency",
}


def system_json_schema() -> dict:
    """The JSON schema of the system file, with the rules checked in code as ``$comment``."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **SystemFile.model_json_schema()}
    for key, rule in RULES.items():
        node = schema["properties"][key]
        branches = [n for n in node.get("anyOf", ()) if n.get("type") != "null"]
        (branches[0] if branches else node)["$comment"] = rule
    return schema


def system_schema_markdown() -> str:
    """The docs table of every key of the system file, generated from :class:`SystemFile`."""
    return schema_markdown(system_json_schema())


DOCS_BEGIN = '<!-- system-schema: generated by lpx_tvm.machine.system_schema.write_docs("docs"); do not edit -->'
DOCS_END = "<!-- system-schema: end -->"


def docs_with_schema(markdown: str) -> str:
    """``markdown`` (docs/multichip.md) with its generated table replaced by the current one."""
    return with_generated_table(markdown, DOCS_BEGIN, DOCS_END, system_schema_markdown(),
                                "docs/multichip.md has no system-schema markers")


def write_docs(docs_dir) -> None:
    """Rewrite the generated table in ``docs_dir/multichip.md``."""
    page = Path(docs_dir) / "multichip.md"
    page.write_text(docs_with_schema(page.read_text()))


__all__ = ["SystemFile", "validate_system_file", "one_line", "MAX_CHIPS", "MAX_LINK_CYCLES", "TOPOLOGIES"]

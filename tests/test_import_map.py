"""The package map of docs/design.md holds: each package imports only the packages the map
allows, and no module imports itself back through others (no import cycles, lazy imports
inside functions included).

The map is parsed from docs/design.md (the ``imports`` table), so the page and the code
cannot drift apart."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lpx_tvm"
DESIGN = ROOT / "docs" / "design.md"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    rel = pathlib.Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists() or (ROOT / rel).is_dir()


def _runtime_nodes(tree):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (annotations only:
    never imported when the program runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _imports(path: pathlib.Path) -> set:
    """Every lpx_tvm module ``path`` imports when it runs, at module level or inside functions."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "lpx_tvm"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "lpx_tvm":
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{alias.name}"
                out.add(sub if _is_module(sub) else target)
    out.discard(me)
    return out


def _graph() -> dict:
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _top(module: str) -> str:
    """The map's unit of a module: its first-level package or module (lpx_tvm itself for
    the package's __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "lpx_tvm"


def _allowed() -> dict:
    """{package: set of packages it may import}, from the ``imports`` table of docs/design.md."""
    text = DESIGN.read_text()
    table = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*`([\w.]+)/?`\s*\|\s*([^|]*)\|\s*([^|]*)\|", line)
        if m and m.group(1) not in ("package",):
            allowed = {x.strip().strip("`").rstrip("/") for x in m.group(2).split(",") if x.strip() not in ("", "—")}
            table[m.group(1).rstrip("/")] = allowed
    assert table, "docs/design.md has no package map table"
    return table


def test_every_package_is_on_the_map():
    allowed = _allowed()
    tops = {_top(m) for m in _graph()}
    missing = sorted(tops - set(allowed))
    assert not missing, f"packages missing from docs/design.md's map: {missing}"
    stale = sorted(set(allowed) - tops)
    assert not stale, f"docs/design.md's map names packages that do not exist: {stale}"


def test_packages_import_only_what_the_map_allows():
    allowed = _allowed()
    bad = []
    for module, deps in sorted(_graph().items()):
        top = _top(module)
        for dep in sorted(deps):
            d = _top(dep)
            if d != top and d not in allowed.get(top, set()):
                bad.append(f"{module} imports {dep} ({top} -> {d} is not on the map)")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = _graph()
    # Tarjan's strongly connected components over modules.
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("source, expect_cycle", [
    ("a imports b, b imports a", True),
    ("a imports b", False),
])
def test_the_cycle_check_can_fail(source, expect_cycle, tmp_path, monkeypatch):
    """The checks above see a cycle when there is one."""
    pkg = tmp_path / "lpx_tvm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from . import a\n" if expect_cycle else "x = 1\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    graph = _graph()
    assert ("lpx_tvm.a" in graph["lpx_tvm.b"]) == expect_cycle
    assert "lpx_tvm.b" in graph["lpx_tvm.a"]

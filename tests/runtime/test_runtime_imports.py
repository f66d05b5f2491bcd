"""A loaded artifact runs without the compiler: the runtime's executable and artifact
modules reach none of its packages through their imports (module-level or in functions)."""

import ast
import os

import lpx_tvm

ROOT = os.path.dirname(lpx_tvm.__file__)
COMPILER = ("lpx_tvm.target", "lpx_tvm.tir_schedules", "lpx_tvm.relax_passes", "lpx_tvm.tune",
            "lpx_tvm.pipeline")


def _path(module: str) -> "str | None":
    rel = module.split(".")[1:]
    for path in (os.path.join(ROOT, *rel) + ".py", os.path.join(ROOT, *rel, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _imports(module: str) -> set:
    """The lpx_tvm modules ``module`` imports (resolved: ``from . import x`` -> package.x)."""
    path = _path(module)
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if _path(sub) else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("lpx_tvm.") and _path(m)}


def _closure(start: str) -> set:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m in seen or _path(m) is None:  # a namespace package runs no code
            continue
        seen.add(m)
        # A package's __init__ runs before any of its modules.
        parts = m.split(".")
        todo.extend(".".join(parts[:k]) for k in range(2, len(parts)))
        todo.extend(_imports(m))
    return seen


def test_runtime_modules_do_not_reach_the_compiler():
    for start in ("lpx_tvm.runtime.executable", "lpx_tvm.runtime.artifact", "lpx_tvm.runtime.compiled_model"):
        reached = _closure(start)
        assert "lpx_tvm.sim" in reached or start != "lpx_tvm.runtime.executable"
        bad = sorted(m for m in reached if m.startswith(COMPILER))
        assert not bad, f"{start} imports {bad}"


def test_the_pipeline_does_not_import_tune():
    assert not any(m.startswith("lpx_tvm.tune") for m in _closure("lpx_tvm.pipeline"))

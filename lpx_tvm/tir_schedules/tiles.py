"""Walk a scheduled PrimFunc and list its MXM tiles in execution order.

Codegen does not re-derive the tiling: it executes the schedule's loop nest, and at
every instance of the tile block (the LPX tensor intrinsic) records the buffer regions
the tile reads and writes, with concrete bounds. The order of the list is the order of
the schedule's loops, so a schedule's loop order becomes the program's tile order.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from .schedules import INTRIN_KEY, MXM_TILE


@dataclass(frozen=True)
class TileStep:
    """One tile: for each buffer, ((start, extent), ...) per dimension."""

    reads: dict
    writes: dict


_BINARY = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "FloorDiv": lambda a, b: a // b,
    "FloorMod": lambda a, b: a % b,
    "Min": min,
    "Max": max,
}


def _eval(expr, env) -> int:
    if isinstance(expr, int):
        return expr
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.Var):
        return env[expr.name]
    if isinstance(expr, tirx.Cast):
        return _eval(expr.value, env)
    fn = _BINARY.get(type(expr).__name__)
    if fn is None:
        raise NotImplementedError(f"cannot evaluate {type(expr).__name__} in a tile index: {expr}")
    return fn(_eval(expr.a, env), _eval(expr.b, env))


def _regions(buffer_regions, env) -> dict:
    return {br.source.name: tuple((_eval(r.min, env), _eval(r.extent, env)) for r in br.region)
            for br in buffer_regions}


def tile_steps(func) -> list:
    """Every instance of the MXM tile block in ``func``, in loop order."""
    steps = []

    def visit(stmt, env):
        kind = type(stmt).__name__
        if kind == "SeqStmt":
            for s in stmt.seq:
                visit(s, env)
        elif kind == "For":
            lo = _eval(stmt.min, env)
            for i in range(lo, lo + _eval(stmt.extent, env)):
                visit(stmt.body, {**env, stmt.loop_var.name: i})
        elif kind == "SBlockRealize":
            block = stmt.block
            inner = dict(env)
            for iv, value in zip(block.iter_vars, stmt.iter_values):
                inner[iv.var.name] = _eval(value, env)
            if block.annotations.get(INTRIN_KEY) == MXM_TILE:
                steps.append(TileStep(_regions(block.reads, inner), _regions(block.writes, inner)))
            else:
                visit(block.body, inner)
        elif kind in ("AttrStmt", "LetStmt", "DeclBuffer", "AllocateConst", "Allocate"):
            visit(stmt.body, env)
        # Evaluate / BufferStore outside a tile block carry no MXM work.

    visit(func.body, {})
    return steps

"""Helpers for hand-written LPX test programs and independent numeric references.

Programs are written instruction by instruction with explicit issue cycles; the tests
compute those cycles themselves from the preset's latencies and floorplan positions,
so a program that runs without a hazard is also a check of the timing rules.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from lpx_tvm.sim import Simulator
from lpx_tvm.machine.config import load_config
from lpx_tvm.machine.isa import DType, Instr, Stream
from lpx_tvm.machine.program import Binding, Program, TensorLayout

BF16 = ml_dtypes.bfloat16


# A value of a w-byte dtype travels on w stream registers (its byte-planes) from a multiple
# of w. Hand programs name whole 4-register groups, which hold a value of any dtype, so their
# stream choices never depend on the dtype; the byte-plane rule itself is tested with Stream().
GROUP = 4


def E(i: int) -> Stream:
    """Eastward stream group ``i``: registers ``E<4i>`` .. ``E<4i+3>``."""
    return Stream("E", GROUP * i)


def W(i: int) -> Stream:
    """Westward stream group ``i``: registers ``W<4i>`` .. ``W<4i+3>``."""
    return Stream("W", GROUP * i)


class Hand:
    """A program written by hand: tensors pinned to (slice, line), instructions with cycles."""

    def __init__(self, preset="mini", name: str = "hand"):
        self.cfg = load_config(preset)
        self.lanes = self.cfg.lanes
        self.lat = self.cfg.latency
        self.name = name
        self.instrs: list = []
        self.bindings: list = []
        self.tables: list = []
        self.host_init = b""
        self.host_bytes = 0

    # -- floorplan ---------------------------------------------------------
    def pos(self, kind: str, index: int = 0) -> int:
        return self.cfg.position(kind, index)

    def mem(self, s: int) -> int:
        return self.cfg.position("MEM", s)

    # -- tensors -----------------------------------------------------------
    def _bind(self, name, role, rows, dtype, slice_, addr, stride):
        dt = DType.parse(dtype)
        layout = TensorLayout((rows, self.lanes), dt, ((slice_, addr),), stride or dt.itemsize)
        self.bindings.append(Binding(name, role, layout))
        return layout

    def input(self, name, rows, dtype, slice_, addr=0, stride=None):
        return self._bind(name, "input", rows, dtype, slice_, addr, stride)

    def output(self, name, rows, dtype, slice_, addr=0, stride=None):
        return self._bind(name, "output", rows, dtype, slice_, addr, stride)

    def table(self, entries) -> int:
        self.tables.append(np.asarray(entries, np.int32))
        return len(self.tables) - 1

    # -- instructions --------------------------------------------------------
    def add(self, op: str, cycle: int, **kw) -> int:
        """Append one instruction; returns its index in the program. dtypes may be names."""
        for f in ("dtype", "out_dtype"):
            if isinstance(kw.get(f), str):
                kw[f] = DType.parse(kw[f])
        self.instrs.append(Instr(op, cycle, **kw))
        return len(self.instrs) - 1

    def program(self) -> Program:
        return Program(self.cfg.hash, list(self.instrs), host_init=self.host_init, host_bytes=self.host_bytes,
                       bindings=list(self.bindings), tables=list(self.tables), name=self.name)

    def run(self, inputs=None, **kw):
        """Run on a fresh simulator. A functional run that passes is run again on the same
        simulator, which replays the verified program: both must agree bit for bit."""
        sim, prog = Simulator(self.cfg), self.program()
        result = sim.run(prog, inputs, **kw)
        if not kw.get("timing_only") and not kw.get("trace"):
            again = sim.run(prog, inputs, **kw)
            assert_same_result(again, result)
        return result


def assert_same_result(got, want):
    """Bitwise-equal outputs and equal counters."""
    assert got.outputs.keys() == want.outputs.keys()
    for name, w in want.outputs.items():
        g = got.outputs[name]
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), f"output {name} differs"
    assert got.counters.to_json() == want.counters.to_json()


# ---- independent numeric references ---------------------------------------------

_FLOAT = {
    # dtype: (significand bits incl. the implicit one, min normal exponent, largest finite)
    DType.FP16: (11, -14, 65504.0),
    DType.BF16: (8, -126, float(ml_dtypes.finfo(BF16).max)),
    DType.FP32: (24, -126, float(np.finfo(np.float32).max)),
}


def round_to(values, dtype) -> np.ndarray:
    """Round exact (float64) values once, to nearest even, to a float dtype.

    Written from the IEEE definition (scale to an integer significand, rint, scale
    back), not through numpy/ml_dtypes casts, so it is a reference for them.
    """
    dt = DType.parse(dtype)
    p, emin, fmax = _FLOAT[dt]
    v = np.asarray(values, np.float64)
    out = v.copy()
    fin = np.isfinite(v) & (v != 0)
    _, ex = np.frexp(np.where(fin, v, 1.0))  # v = m * 2**ex, 0.5 <= |m| < 1
    e = np.maximum(ex.astype(np.int64) - 1, emin)  # exponent of the leading bit, clamped: subnormals
    q = np.ldexp(1.0, (e - (p - 1)).astype(np.int32))
    r = np.rint(v / q) * q
    out = np.where(fin, r, v)
    with np.errstate(invalid="ignore"):
        out = np.where(np.abs(out) > fmax, np.copysign(np.inf, v), out)
    return out.astype(dt.np)  # exact: every value is representable now


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def same_float(got, want) -> bool:
    """Bitwise-equal floats (NaN equals NaN, +0 differs from -0)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    g, w = f64(got), f64(want)
    both_nan = np.isnan(g) & np.isnan(w)
    eq = (g == w) & (np.signbit(g) == np.signbit(w))
    return bool(np.all(both_nan | eq))


def assert_same_float(got, want, what=""):
    if not same_float(got, want):
        g, w = f64(got), f64(want)
        bad = ~((g == w) & (np.signbit(g) == np.signbit(w)) | (np.isnan(g) & np.isnan(w)))
        idx = np.argwhere(bad)[:5]
        detail = [(tuple(int(x) for x in i), g[tuple(i)], w[tuple(i)]) for i in idx]
        raise AssertionError(f"{what}: {int(bad.sum())} values differ (index, got, want): {detail}")


def clip_int(v, dtype) -> np.ndarray:
    dt = DType.parse(dtype)
    info = np.iinfo(dt.np)
    return np.clip(np.asarray(v, np.int64), info.min, info.max).astype(dt.np)


def wrap_int32(v) -> np.ndarray:
    v = np.asarray(v, np.int64)
    return (((v + 2**31) % 2**32) - 2**31).astype(np.int32)


def ceil_div(a, b) -> int:
    return math.ceil(a / b)


# ---- the reference interpreter ---------------------------------------------------

# Where the simulator computed fp32 accumulator blocks with the same weights in one
# matmul (docs/design.md, "Lazy MXM accumulation"), BLAS may order a row's fp32 sum
# differently from the block's own matmul, which the reference computes: float outputs
# of such programs may then differ by rounding, within this relative L2 error.
BATCHED_FP32_RTOL = 1e-3


def batched_fp32_blocks(sim: Simulator, program) -> bool:
    """Whether ``sim``'s replay of ``program`` computes some fp32 blocks together."""
    from lpx_tvm.sim.replay_steps import MxmSettleEarly

    plan = sim._plans.get(id(program))
    return plan is not None and any(isinstance(s, MxmSettleEarly) for s in plan.steps)


def assert_same_as_reference(sim: Simulator, program, inputs, *results):
    """``results`` (of ``sim`` running ``program`` on ``inputs``) have the reference
    interpreter's outputs, bit for bit, and its cycle count."""
    from lpx_tvm.sim import reference

    want = reference.run(sim.config, program, inputs or {})
    batched = batched_fp32_blocks(sim, program)
    for got in results:
        assert got.cycles == want.cycles, f"{got.cycles} cycles, the reference {want.cycles}"
        assert got.outputs.keys() == want.outputs.keys()
        for name, w in want.outputs.items():
            g = got.outputs[name]
            assert g.dtype == w.dtype and g.shape == w.shape, name
            if np.array_equal(g.view(np.uint8), w.view(np.uint8)):
                continue
            assert batched and w.dtype.kind == "f", f"output {name} differs from the reference"
            err = np.linalg.norm(f64(g) - f64(w)) / max(np.linalg.norm(f64(w)), 1e-30)
            assert err <= BATCHED_FP32_RTOL, f"output {name}: relative error {err} against the reference"


def compare_runs_with_reference(monkeypatch):
    """From now on (for one test), every functional ``Simulator.run`` that passes is
    compared with the reference interpreter (see tests/sim/conftest.py)."""
    run = Simulator.run

    def run_and_compare(self, program, inputs=None, *, timing_only=False, trace=False):
        result = run(self, program, inputs, timing_only=timing_only, trace=trace)
        if not timing_only:
            assert_same_as_reference(self, program, inputs, result)
        return result

    monkeypatch.setattr(Simulator, "run", run_and_compare)

"""fp8 (e4m3) on the machine: conversions against a reference written from the format's
definition, the MXM's fp8 products on a machine with an fp8 rate, and the refusal on one
without (mini and tsp have none; lp30 does)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lpx_tvm.machine.config import parse_config, preset_path
from lpx_tvm.machine.isa import DType
from lpx_tvm.errors import ScheduleHazard

from lpx_hand import E, Hand, W, assert_same_float, f64
from test_opcodes import LANES, RNG, mxm_program, run_vxm, vec

FP8_MAX = 448.0


def fp8_ref(values) -> np.ndarray:
    """Round float64 values once to e4m3 (4 significant bits, smallest normal 2^-6,
    subnormals down to 2^-9), to nearest even, saturating at +-448; NaN stays NaN.
    Written from the format's definition, not through ml_dtypes."""
    v = np.asarray(values, np.float64)
    fin = np.isfinite(v) & (v != 0)
    _, ex = np.frexp(np.where(fin, v, 1.0))
    e = np.maximum(ex.astype(np.int64) - 1, -6)
    q = np.ldexp(1.0, (e - 3).astype(np.int32))
    out = np.where(fin, np.rint(v / q) * q, v)
    with np.errstate(invalid="ignore"):
        out = np.clip(out, -FP8_MAX, FP8_MAX)  # inf saturates too
    return out.astype(DType.FP8.np)  # exact now


def mini_with_fp8():
    data = json.loads(preset_path("mini").read_text())
    data["name"] = "mini-fp8"
    data["mxm"]["cycles_per_vector"]["fp8"] = 1
    return parse_config(data, "mini-fp8")


ONE = 1.0
CASES = [ONE + 2**-4, ONE + 3 * 2**-4, ONE + 2**-4 + 2**-12, 448.0, 463.9, 464.0, 500.0, 1e6, -1e6, np.inf,
         -np.inf, 2.0**-10, 2.0**-10 * 1.5, 2.0**-9 * 2.5, -0.0, 0.1, -3.3, 240.0, 232.0, 2.0**-7]


@pytest.mark.parametrize("src", ["fp32", "fp16", "bf16"])
def test_cvt_to_fp8_rounds_once_and_saturates(src):
    with np.errstate(over="ignore"):
        a = vec(CASES, src, 2)
    out = run_vxm("vxm.cvt", a, src, to="fp8")
    assert out.dtype == DType.FP8.np
    assert_same_float(out, fp8_ref(f64(a)), f"cvt {src}->fp8")
    if src == "fp32":  # a few by hand: ties to even, saturation, subnormals
        assert f64(out[0, :3]).tolist() == [1.0, 1.25, 1.125]
        assert f64(out[0, 3:11]).tolist() == [448.0] * 5 + [-448.0, 448.0, -448.0]
        assert f64(out[0, 11:14]).tolist() == [0.0, 2.0**-9, 2.0**-8]


def test_cvt_fp8_nan_and_back_to_fp32_exact():
    a = vec([np.nan, 1.5, -2.0**-9, 448.0], "fp32", 1)
    q = run_vxm("vxm.cvt", a, "fp32", to="fp8")
    assert np.isnan(f64(q[0, 0]))
    back = run_vxm("vxm.cvt", q, "fp8", to="fp32")
    assert_same_float(back, f64(q).astype(np.float32), "fp8 -> fp32")


def test_cvt_fp8_to_int8_rounds_half_even():
    a = fp8_ref(vec([2.5, 3.5, -2.5, 448.0, -448.0, 0.5, 1.5, 0.0], "fp32", 1))
    out = run_vxm("vxm.cvt", a, "fp8", to="int8")
    assert out[0, :8].tolist() == [2, 4, -2, 127, -128, 0, 2, 0]


def test_fp8_matmul_products_exact_sum_in_fp32():
    """fp8 x fp8 products (4 + 4 significant bits) are exact in fp32; with these ranges every
    partial sum is exact too, so the result equals the float64 product."""
    cfg = mini_with_fp8()
    M, K, N = 5, 16, 13
    x = fp8_ref(RNG.integers(-15, 16, (M, LANES)) * 2.0 ** RNG.integers(-3, 3, (M, LANES)))
    wts = fp8_ref(RNG.integers(-15, 16, (K, LANES)) * 2.0 ** RNG.integers(-3, 3, (K, LANES)))
    h, inputs, _ = mxm_program(x, wts, "fp8", "fp8", width=N, preset=cfg)
    r = h.run(inputs)
    y = r.outputs["Y"]
    assert y.dtype == np.float32
    assert np.array_equal(f64(y[:, :N]), f64(x) @ f64(wts[:, :N]))
    assert np.all(y[:, N:] == 0)
    assert r.counters.macs == M * K * N


def test_fp8_multiplies_at_its_own_rate():
    """The fp8 rate sets when results land: a program timed for a rate of 1 is refused on a
    machine whose fp8 rate is 2 (its drain reads rows that have not landed)."""
    data = json.loads(preset_path("mini").read_text())
    data["mxm"]["cycles_per_vector"]["fp8"] = 2
    slow = parse_config(data, "mini-fp8-slow")
    x = fp8_ref(RNG.standard_normal((4, LANES)))
    h_slow, inputs, t_slow = mxm_program(x, x, "fp8", "fp8", width=LANES, preset=slow)
    h_slow.run(inputs)
    h_fast, _, t_fast = mxm_program(x, x, "fp8", "fp8", width=LANES, preset=mini_with_fp8())
    assert t_slow > t_fast
    h_fast.cfg = slow
    with pytest.raises(ScheduleHazard) as e:
        h_fast.run(inputs, timing_only=True)
    assert "mxm.drain" in str(e.value)


@pytest.mark.parametrize("preset", ["mini", "tsp"])
def test_fp8_multiply_refused_without_a_rate(preset):
    h = Hand(preset)
    h.add("icu.sync", 0)
    i = h.add("mxm.mul", 3, unit=0, dtype="fp8", src0=W(0))
    with pytest.raises(ScheduleHazard) as e:
        h.run(timing_only=True)
    assert e.value.kind == "bad-operand" and e.value.index == i
    assert f"does not multiply fp8 on {preset} (mxm.cycles_per_vector has no fp8)" in str(e.value)


def test_fp8_peak_needs_a_rate():
    from lpx_tvm.errors import ConfigError
    from lpx_tvm.machine.config import load_config
    assert load_config("lp30").peak_macs_per_cycle_for("fp8") == load_config("lp30").peak_macs_per_cycle_for("int8")
    with pytest.raises(ConfigError, match="does not multiply fp8"):
        load_config("tsp").peak_macs_per_cycle_for("fp8")

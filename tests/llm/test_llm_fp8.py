"""The fp8 (e4m3) path of decoder LLMs on lp30 (W8A8 dense layers in a float build): the
layers against numpy with ml_dtypes' fp8, and whole decoders against the same
quantization in torch."""

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.errors import LPXError  # noqa: E402
from lpx_tvm.frontends import decoders  # noqa: E402
from lpx_tvm.llm.session import LLMSession  # noqa: E402
from lpx_tvm.machine.config import load_config  # noqa: E402

from decoder_models import check_8bit_layers, check_8bit_session, random_decoder as _model  # noqa: E402

F8 = torch.float8_e4m3fn
TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
U = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}  # unit roundoff of the output


class TwoFp8Layers(torch.nn.Module):
    """One fp8-quantized input read by two fp8 dense layers, the second with a bias."""

    def __init__(self, k, n1, n2, inv):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.inv = inv
        self.register_buffer("w1", (torch.randn((k, n1), generator=g) * 40).to(F8).float())
        self.register_buffer("w2", (torch.randn((k, n2), generator=g) * 40).to(F8).float())
        self.register_buffer("s1", torch.rand(n1, generator=g) * 1e-3)
        self.register_buffer("s2", torch.rand(n2, generator=g) * 1e-3)
        self.register_buffer("b2", torch.randn(n2, generator=g))

    def forward(self, x):
        xq = torch.clamp(x * self.inv, -448, 448).to(F8)
        return ((xq.to(torch.float32) @ self.w1) * self.s1,
                (xq.to(torch.float32) @ self.w2) * self.s2 + self.b2)


def _fp8(v):
    """fp8 e4m3 values of fp32 ``v`` (ml_dtypes rounds to nearest even; its overflow is NaN,
    so the clip comes first, as in the model)."""
    return np.clip(v.astype(np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _reference(m, x, nudge=0.0):
    """The layers in float64 from numpy's fp8 values, and each output's bound on the fp32
    sum's rounding (the MXM sums exact products in fp32, in an order of its own).
    ``nudge`` pushes ties away from zero: a wrongly rounding reference."""
    xq = _fp8(x.astype(np.float32) * np.float32(m.inv) * np.float32(1 + nudge))
    out = []
    for w, s, b in ((m.w1, m.s1, None), (m.w2, m.s2, m.b2)):
        w, s = w.numpy().astype(np.float64), s.numpy().astype(np.float64)
        y = (xq @ w) * s + (0 if b is None else b.numpy())
        bound = (w.shape[0] + 2) * 2.0**-24 * (np.abs(xq) @ np.abs(w)) * s + 2.0**-23 * np.abs(y)
        out.append((y, bound))
    return out


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("rows, k, n1, n2", [(3, 200, 72, 40), (2, 700, 650, 330)])
def test_fp8_dense_layers_match_numpy(precision, rows, k, n1, n2):
    inv = 4.0
    m = TwoFp8Layers(k, n1, n2, inv).eval()
    rng = np.random.default_rng(1)
    x = rng.normal(0, 12, (rows, k)).astype(np.float32)
    # x * 4: fp8 ties (1.0625 -> 1, 1.1875 -> 1.25, -1.0625 -> -1, 9.5 -> 10? no: 9.5 is exact... ties
    # between 9 and 10 are 9.5 -> 10 (even mantissa 10 = 1.25 * 8)), saturation at +-448, a subnormal tie.
    x[0, :8] = [1.0625 / 4, 1.1875 / 4, -1.0625 / 4, 9.5 / 4, 200.0, -200.0, 2.0**-10 * 1.5 / 4, 17.0 / 4]
    x = torch.from_numpy(x).to(TORCH_DTYPE[precision]).float().numpy()  # values the build stores exactly
    compiled = lpx_tvm.from_torch(m, (torch.from_numpy(x),), preset="lp30", precision=precision)
    rep = compiled.report
    assert rep.offload.composites == {"lpx.fp8_quant": 1, "lpx.qlinear": 1, "lpx.qlinear_bias": 1}, rep.offload
    assert not rep.offload.cpu
    assert rep.mxm_dtypes == ["fp8"]
    assert rep.weight_bytes == k * 320 * (-(-n1 // 320) + -(-n2 // 320))  # one byte a weight, in lane tiles
    out = compiled.run([x])
    wrong = _reference(m, x, nudge=2.0**-20)
    for got, (want, bound), (away, _) in zip((out["output_0"], out["output_1"]), _reference(m, x), wrong):
        tol = bound + U[precision] * np.abs(want)  # the drain writes the result at the precision
        assert np.all(np.abs(got - want) <= tol), np.max(np.abs(got - want) / tol)
        assert np.any(np.abs(away - want) > tol)  # a tie rounded away would be caught


def test_fp8_layers_stay_on_cpu_without_an_fp8_rate():
    m = TwoFp8Layers(48, 16, 8, 4.0).eval()
    x = torch.randn(2, 48) * 10
    compiled = lpx_tvm.from_torch(m, (x,), preset="tsp", precision="fp32")
    offload = compiled.report.offload
    assert "lpx.fp8_quant" not in offload.composites and "lpx.qlinear" not in offload.composites
    reasons = " ".join(r for rs in offload.reasons.values() for r in rs)
    assert "the MXM of tsp does not multiply fp8" in reasons, offload.reasons
    out = compiled.run([x.numpy()])
    for got, want in zip((out["output_0"], out["output_1"]), m(x)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_fp8_needs_a_machine_that_multiplies_it():
    model = _model("llama", seed=3, scale=2.0)
    with pytest.raises(LPXError, match="the MXM of tsp does not multiply fp8"):
        lpx_tvm.compile_llm(model, preset="tsp", precision="fp8", max_context=32)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_fp8_decoder_matches_torch_quantized_reference(kind):
    """Around fp32 float ops, the fp8 arithmetic alone against the torch steps with the
    same scales: the fp8 values agree, only the fp32 sums' order differs."""
    model = _model(kind, 3, 2.0 if kind == "llama" else 4.0)
    ids = np.random.default_rng(1).integers(0, 320, (1, 13))
    spec = decoders.spec_of(model, 48)
    quant = decoders.calibrate(model, spec, np.random.default_rng(2).integers(0, 320, (1, 16)), fmt="fp8")
    assert set(quant.act_scales) >= {"0.attn", "1.down", "head"}
    session = LLMSession(model, spec, load_config("lp30"), "fp8", quant, float_precision="fp32")
    check_8bit_layers(session, model, ids, 24)


def test_fp8_session_against_its_reference_and_the_floor():
    model = _model("llama", seed=3, scale=2.0)
    ids = np.random.default_rng(4).integers(0, 320, (1, 9))
    session = lpx_tvm.compile_llm(model, preset="lp30", precision="fp8", max_context=32)
    assert session.quantization.fmt == "fp8"
    check_8bit_session(session, model, ids, 12)
    rep = session.report
    assert rep["precision"] == "fp8" and "fp8 W8A8" in rep["on_chip"]["dense_layers"]
    muls = {i.dtype.short for i in session.decode.program.instrs if i.op in ("mxm.mul", "mxm.mac")}
    assert "fp8" in muls and "int8" not in muls, muls  # attention's products stay fp16
    cfg = load_config("lp30")
    assert rep["mxm_weight_bytes"] == session.matrix_parameters  # one byte a matrix value
    assert rep["floors"]["weights_over_install"] == pytest.approx(
        session.matrix_parameters / (cfg.mxm_planes * cfg.mxm_install_streams * cfg.lanes))
    assert rep["decode_cycles_per_token"] > rep["decode_floor_cycles"]
    assert rep["decode_cycles_per_token"] >= rep["decode_latency_floor_cycles"] > rep["decode_floor_cycles"]


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_tie_distance_finds_rounding_boundaries(fmt):
    """The near-tie finder the 8-bit decoder checks rely on: a value just off a midpoint
    between two 8-bit values is found at that distance; an 8-bit value itself is far."""
    from decoder_models import tie_distance

    rng = np.random.default_rng(0)
    if fmt == "fp8":
        grid = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)))
        grid = grid[np.isfinite(grid)]
    else:
        grid = np.arange(0.0, 128.0)
    mids = (grid[:-1] + grid[1:]) / 2
    for m in rng.choice(mids[1:], 20):
        eps = 10.0 ** rng.uniform(-8, -4)
        assert tie_distance(np.array([m * (1 + eps), 1.0]), fmt) == pytest.approx(eps, rel=1e-3)
    assert tie_distance(grid[1:], fmt) > 3e-3  # half a step of 127, the least

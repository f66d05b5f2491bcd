"""The int8 path of decoder LLMs (W8A8 dense layers in a float build): the layers against
numpy's integer arithmetic, and whole decoders against the same quantization in torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.frontends import decoders  # noqa: E402
from lpx_tvm.llm.session import LLMSession  # noqa: E402
from lpx_tvm.machine.config import load_config  # noqa: E402

from decoder_models import check_8bit_layers, check_8bit_session, random_decoder as _model  # noqa: E402

TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class TwoInt8Layers(torch.nn.Module):
    """One quantized input read by two int8 dense layers (as q, k and v share one): the
    second with a bias."""

    def __init__(self, k, n1, n2, inv):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.inv = inv
        self.register_buffer("w1", torch.randint(-127, 128, (k, n1), generator=g, dtype=torch.int32))
        self.register_buffer("w2", torch.randint(-127, 128, (k, n2), generator=g, dtype=torch.int32))
        self.register_buffer("s1", torch.rand(n1, generator=g) * 1e-3)
        self.register_buffer("s2", torch.rand(n2, generator=g) * 1e-3)
        self.register_buffer("b2", torch.randn(n2, generator=g))

    def forward(self, x):
        xq = torch.clamp(torch.round(x * self.inv), -128, 127).to(torch.int8)
        return ((xq.to(torch.int32) @ self.w1).to(torch.float32) * self.s1,
                (xq.to(torch.int32) @ self.w2).to(torch.float32) * self.s2 + self.b2)


def _int8_reference(m, x):
    """The layers in numpy: int8 values by round half to even and saturation, exact int64
    sums, then fp32 scaling."""
    xq = np.clip(np.rint(x.astype(np.float32) * np.float32(m.inv)), -128, 127).astype(np.int64)
    y1 = (xq @ m.w1.numpy().astype(np.int64)).astype(np.float32) * m.s1.numpy()
    y2 = (xq @ m.w2.numpy().astype(np.int64)).astype(np.float32) * m.s2.numpy() + m.b2.numpy()
    return y1, y2


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("rows, k, n1, n2", [(3, 200, 72, 40), (2, 700, 650, 330)])
def test_int8_dense_layers_equal_integer_arithmetic(precision, rows, k, n1, n2):
    inv = 4.0  # a power of two: x * inv lands exactly on halves, where the rounding shows
    m = TwoInt8Layers(k, n1, n2, inv).eval()
    rng = np.random.default_rng(1)
    x = rng.normal(0, 12, (rows, k)).astype(np.float32)
    x[0, :8] = [0.125, 0.375, -0.125, -0.375, 0.625, 40.0, -40.0, 31.875]  # halves: 0, 2, 0, -2, 2; saturation
    x = torch.from_numpy(x).to(TORCH_DTYPE[precision]).float().numpy()  # values the build stores exactly
    compiled = lpx_tvm.from_torch(m, (torch.from_numpy(x),), preset="tsp", precision=precision)
    out = compiled.run([x])
    rep = compiled.report
    assert rep.offload.composites == {"lpx.act_quant": 1, "lpx.qlinear": 1, "lpx.qlinear_bias": 1}, rep.offload
    assert not rep.offload.cpu
    assert rep.mxm_dtypes == ["int8"]
    assert rep.weight_bytes == k * 320 * (-(-n1 // 320) + -(-n2 // 320))  # one byte a weight, in lane tiles
    for got, want in zip((out["output_0"], out["output_1"]), _int8_reference(m, x)):
        # The drain writes the fp32 result at the build's precision, rounded once.
        want = torch.from_numpy(want).to(TORCH_DTYPE[precision]).float().numpy()
        np.testing.assert_array_equal(got, want)


def test_int8_layer_outside_the_int8_range_stays_on_cpu():
    class Wide(torch.nn.Module):
        def forward(self, x):
            xq = torch.clamp(torch.round(x * 4.0), -1000, 1000).to(torch.int32)
            return (xq @ torch.full((48, 8), 3, dtype=torch.int32)).to(torch.float32) * 0.5

    # fp16 values: the multiply and round before the CPU's matmul run on LPX at fp16
    x = torch.randn(2, 48, generator=torch.Generator().manual_seed(7)).half().float()
    compiled = lpx_tvm.from_torch(Wide(), (x,), preset="tsp", precision="fp16")
    offload = compiled.report.offload
    assert "lpx.act_quant" not in offload.composites and "lpx.qlinear" not in offload.composites
    assert offload.cpu.get("matmul") == 1 and "dtype int32" in offload.reasons["matmul"][0], offload.reasons
    np.testing.assert_allclose(compiled.run([x.numpy()])["output_0"], Wide()(x).numpy())


class FromInt8(torch.nn.Module):
    """An int8 dense layer of int8 values the host sends."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.register_buffer("w", torch.randint(-128, 128, (100, 24), generator=g, dtype=torch.int32))
        self.register_buffer("s", torch.rand(24, generator=g))

    def forward(self, xq):
        return (xq.to(torch.int32) @ self.w).to(torch.float32) * self.s


def test_int8_values_from_the_host():
    xq = torch.randint(-128, 128, (3, 100), dtype=torch.int8, generator=torch.Generator().manual_seed(6))
    xq[0, :2] = torch.tensor([-128, 127], dtype=torch.int8)
    m = FromInt8()
    compiled = lpx_tvm.from_torch(m, (xq,), preset="tsp", precision="fp32")
    assert compiled.report.offload.composites == {"lpx.qlinear": 1}
    want = (xq.numpy().astype(np.int64) @ m.w.numpy()).astype(np.float32) * m.s.numpy()
    np.testing.assert_array_equal(compiled.run([xq.numpy()])["output_0"], want)


@pytest.mark.parametrize("kind, seed, scale", [("llama", 3, 2.0), ("qwen2", 3, 2.0), ("gpt2", 0, 4.0)])
def test_int8_decoder_matches_torch_quantized_reference(kind, seed, scale):
    """Around fp32 float ops, the int8 arithmetic alone, against the torch steps with the
    same scales. The two compute the fp32 ops (norms, softmax) in different orders, so
    an activation within an ulp of a rounding boundary may land one quantization step
    apart (on this machine these models' logits are equal bit for bit; the llama of
    ``_model("llama")``, whose weights are twice as large, has an input of its first
    layer one ulp from a boundary, and its chaotic layers carry that one step to 4% of
    the logits). So the logits must stay far closer to the reference than the float model
    is, and the tokens agree wherever the margin is clear. (GPT-2's smaller weights
    repeat one token.)"""
    model = _model(kind, seed, scale)
    ids = np.random.default_rng(1).integers(0, 320, (1, 13))
    spec = decoders.spec_of(model, 48)
    quant = decoders.calibrate(model, spec, np.random.default_rng(2).integers(0, 320, (1, 16)))
    session = LLMSession(model, spec, load_config("tsp"), "int8", quant, float_precision="fp32")
    tokens = check_8bit_layers(session, model, ids, 32)
    # the greedy loop of the reference picks the same tokens up to the first unclear step
    prefill, decode, _ = decoders.decoder_steps(model, 48, 13, quant=quant)
    ref = decoders.generate(prefill, decode, spec, ids, 32).numpy()
    assert len(set(ref.ravel().tolist())) > 4
    np.testing.assert_array_equal(tokens[:, :8], ref[:, :8])


def test_int8_session_against_its_reference_and_the_floor():
    """The int8 path as compiled (fp16 around the int8 layers): the logits stay as close
    to the torch int8 reference as that reference is to the float model (fp16 moves an
    activation across a rounding boundary now and then: one quantization step), and
    the tokens agree wherever the reference's top-2 margin exceeds that."""
    model = _model("llama", seed=3, scale=2.0)
    ids = np.random.default_rng(4).integers(0, 320, (1, 9))
    session = lpx_tvm.compile_llm(model, preset="tsp", precision="int8", max_context=32)
    check_8bit_session(session, model, ids, 12)
    rep = session.report
    assert rep["precision"] == "int8" and "int8 W8A8" in rep["on_chip"]["dense_layers"]
    # The floor counts one byte per matrix value: half the fp16 floor.
    install_bw = 4 * 16 * 320
    assert rep["mxm_weight_bytes"] == session.matrix_parameters
    assert rep["floors"]["weights_over_install"] == pytest.approx(session.matrix_parameters / install_bw)
    assert rep["decode_cycles_per_token"] > rep["decode_floor_cycles"]
    assert rep["decode_cycles_per_token"] >= rep["decode_latency_floor_cycles"] > rep["decode_floor_cycles"]

"""Values beyond fp16's range are never a silent wrong answer.

Compiling: a constant that fp16 would store as inf (weights of 1e5) is refused with a
message naming the layer and suggesting bf16; additive attention masks (-3.4e38, -1e9
before a softmax) are meant as -inf and compile, and match onnxruntime; immediates and
values that merely underflow pass. Running: activations that overflow (weights in range,
sums beyond it) are counted per output in the report and warned about."""

import os
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm
from lpx_tvm import cli
from lpx_tvm.kernels import gemm
from lpx_tvm.machine.config import load_config
from lpx_tvm.relax_passes.constant_range import ConstantRangeError, out_of_range
from lpx_tvm.runtime.compiled_model import NonFiniteOutputWarning
from lpx_tvm.runtime.report import Report, program_report
from lpx_tvm.sim import Simulator

F32_MIN = float(np.finfo(np.float32).min)  # -3.4028235e38, torch's "minus infinity" in masks
M, K, N = 4, 32, 16


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "range", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v, np.float32), n)
                                           for n, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _matmul(w: np.ndarray) -> onnx.ModelProto:
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], [("x", [M, w.shape[0]])],
                  [("y", [M, w.shape[1]])], {"w": w})


def _masked_softmax(mask: np.ndarray, op="Add", also_return_scores=False) -> onnx.ModelProto:
    """softmax(x @ wk  (op)  mask) over the last axis: attention scores with a constant mask."""
    wk = np.random.default_rng(1).standard_normal((16, 8)) / 4
    nodes = [helper.make_node("MatMul", ["x", "wk"], ["s"], name="scores"),
             helper.make_node(op, ["s", "mask"], ["masked"], name="mask"),
             helper.make_node("Softmax", ["masked"], ["y"], name="softmax", axis=-1)]
    outputs = [("y", [2, 8, 8])] + ([("masked", [2, 8, 8])] if also_return_scores else [])
    return _model(nodes, [("x", [2, 8, 16])], outputs, {"wk": wk, "mask": mask})


def _causal(fill: float) -> np.ndarray:
    """A (2, 8, 8) causal mask: 0 on and below the diagonal, ``fill`` above it."""
    return np.broadcast_to(np.triu(np.full((8, 8), fill, np.float32), 1), (2, 8, 8)).copy()


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> dict:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _run_quietly(compiled, feeds: dict) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteOutputWarning)  # a clean run must not warn
        return compiled.run(feeds)


def _rel_l2(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


# ---- the rule itself ---------------------------------------------------------------

def test_out_of_range_is_rounding_to_inf():
    """65504 is fp16's largest value and 65519.99 rounds down to it; from 65520 a value
    rounds to inf. Infinities and NaN are not "finite values beyond the range"; tiny
    values round to 0, which is ordinary rounding."""
    v = np.array([65504, 65519.99, 65520, -1e9, np.inf, -np.inf, np.nan, 1e-30, F32_MIN], np.float32)
    assert out_of_range(v, np.float16).tolist() == [False, False, True, True, False, False, False, False, True]
    assert out_of_range(v, np.dtype(ml_dtypes.bfloat16)).tolist() == [False] * 8 + [True]  # float32's min is beyond bf16's max


# ---- compile time: weights -----------------------------------------------------------

def test_weights_beyond_fp16_are_refused_naming_the_layer():
    w = np.random.default_rng(0).standard_normal((K, N)) * 1e5
    with pytest.raises(ConstantRangeError) as e:
        lpx_tvm.compile_model(_matmul(w), preset="mini", precision="fp16")
    msg = str(e.value)
    assert isinstance(e.value, lpx_tvm.LPXError) and "\n" not in msg
    assert "layer 'fc'" in msg and "weight (32, 16)" in msg
    assert f"{np.abs(w).max():.4g}" in msg  # the largest magnitude, as the user's float32 holds it
    assert "fp16's range (largest 65504)" in msg and msg.endswith("--precision bf16 (or fp32)")


def test_every_constant_out_of_range_is_counted():
    """One line names the first; the others are counted."""
    w1, w2 = np.full((K, N), 1e5), np.full((N, N), -2e5)
    model = _model([helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
                    helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2")],
                   [("x", [M, K])], [("y", [M, N])], {"w1": w1, "w2": w2})
    with pytest.raises(ConstantRangeError, match=r"^layer 'fc1' .* up to 1e\+05 .*; 1 more constant out of range;"):
        lpx_tvm.compile_model(model, preset="mini", precision="fp16")


def test_weights_beyond_bf16_too_suggest_fp32():
    w = np.full((K, N), 1.0, np.float32)
    w[3, 5] = -3.4e38  # beyond bf16 too (largest 3.39e38)
    with pytest.raises(ConstantRangeError, match=r"up to 3.4e\+38 .*compile with --precision fp32$"):
        lpx_tvm.compile_model(_matmul(w), preset="mini", precision="fp16")
    with pytest.raises(ConstantRangeError, match=r"beyond bf16's range .*--precision fp32$"):
        lpx_tvm.compile_model(_matmul(w), preset="mini", precision="bf16")


def test_the_cli_refuses_in_one_line(tmp_path, capsys):
    path = tmp_path / "big.onnx"
    onnx.save(_matmul(np.full((K, N), 1e5)), str(path))
    out = tmp_path / "art"
    assert cli.main(["compile", str(path), "-o", str(out), "--preset", "mini"]) == 2  # fp16, the default
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("lpx-tvm: error: layer 'fc'") and "--precision bf16" in err[0]
    assert not out.exists()


def test_the_same_weights_at_bf16_match_onnxruntime():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((K, N)) * 1e5
    model = _matmul(w)
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="bf16")
    assert compiled.report.offload.lpx == {"matmul": 1} and not compiled.report.offload.cpu
    x = rng.standard_normal((M, K)).astype(np.float32)
    got = _run_quietly(compiled, {"x": x})["y"]
    want = _onnxruntime(model, {"x": x})["y"]
    assert np.abs(want).max() > 1e5  # the outputs are beyond fp16's range too
    assert _rel_l2(got, want) < 1e-2  # bf16 keeps 8 bits of mantissa
    assert compiled.report.nonfinite_outputs == {"y": 0}


def test_tiny_weights_that_round_to_zero_are_not_refused():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((K, N))
    w[::2] *= 1e-9  # below fp16's smallest subnormal (6e-8): stored as 0
    model = _matmul(w)
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="fp16")
    x = rng.standard_normal((M, K)).astype(np.float32)
    assert _rel_l2(_run_quietly(compiled, {"x": x})["y"], _onnxruntime(model, {"x": x})["y"]) < 5e-3


def test_a_scalar_immediate_is_held_in_fp32():
    """``x * 1e5`` multiplies by an fp32 immediate: with small x the results fit fp16."""
    model = _model([helper.make_node("Mul", ["x", "k"], ["y"], name="scale")], [("x", [M, N])], [("y", [M, N])],
                   {"k": np.float32(1e5)})
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="fp16")
    assert compiled.report.offload.lpx == {"multiply": 1}
    x = np.random.default_rng(3).uniform(-5e-3, 5e-3, (M, N)).astype(np.float32)
    np.testing.assert_allclose(_run_quietly(compiled, {"x": x})["y"], x * np.float32(1e5), rtol=2e-3)


# ---- compile time: additive masks ------------------------------------------------------

@pytest.mark.parametrize("fill", [F32_MIN, -1e9])
def test_an_attention_mask_before_softmax_compiles_at_fp16_and_matches(fill):
    model = _masked_softmax(_causal(fill))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the -inf it becomes is meant: no overflow noise
        compiled = lpx_tvm.compile_model(model, preset="mini", precision="fp16")
    off = compiled.report.offload
    assert not off.cpu and {"add", "nn.softmax", "matmul"} <= set(off.lpx)  # the mask is applied on LPX
    x = np.random.default_rng(4).standard_normal((2, 8, 16)).astype(np.float32)
    got = _run_quietly(compiled, {"x": x})["y"]
    want = _onnxruntime(model, {"x": x})["y"]
    assert np.all(got[:, np.triu_indices(8, 1)[0], np.triu_indices(8, 1)[1]] == 0)  # masked: exactly 0
    np.testing.assert_allclose(got, want, atol=2e-3)
    assert compiled.report.nonfinite_outputs == {"y": 0}


def test_a_subtracted_mask_compiles_too():
    """``scores - 1e9 * padding``: positive values subtracted push towards -inf."""
    pad = np.zeros((2, 8, 8), np.float32)
    pad[:, :, 6:] = 1e9  # the last two keys are padding
    model = _masked_softmax(pad, op="Sub")
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="fp16")
    x = np.random.default_rng(5).standard_normal((2, 8, 16)).astype(np.float32)
    got = _run_quietly(compiled, {"x": x})["y"]
    np.testing.assert_allclose(got, _onnxruntime(model, {"x": x})["y"], atol=2e-3)
    assert np.all(got[:, :, 6:] == 0)


@pytest.mark.parametrize("case", ["returned", "positive", "whole_row"])
def test_what_is_not_an_additive_mask_is_refused(case):
    """Each of these would be a wrong answer at fp16: the masked scores returned as an
    output (-inf where onnxruntime gives -1e9), a fill of +1e9 (+inf: NaN after the
    softmax), a row masked whole (all -inf: NaN, where float32 gives a uniform row)."""
    mask = _causal(-1e9)
    if case == "positive":
        mask = -mask
    if case == "whole_row":
        mask[1, 3, :] = -1e9
    model = _masked_softmax(mask, also_return_scores=case == "returned")
    with pytest.raises(ConstantRangeError, match=r"layer 'mask' \(lpx.add\): its constant operand of add "
                                                 r"\(2, 8, 8\) holds finite values up to 1e\+09"):
        lpx_tvm.compile_model(model, preset="mini", precision="fp16")


# ---- run time: activations that overflow ------------------------------------------------

def _overflowing():
    """Weights in fp16's range whose sums over K = 512 are not: column j of ``w`` is 300
    for odd j (512 x 300 x ~0.75 = 115,200 > 65504) and 0.01 for even j."""
    w = np.where(np.arange(N) % 2 == 1, 300.0, 0.01)[None, :].repeat(512, 0).astype(np.float32)
    x = np.random.default_rng(6).uniform(0.5, 1.0, (M, 512)).astype(np.float32)
    return _matmul(w), x, w


def test_activations_beyond_fp16_are_counted_and_warned():
    model, x, w = _overflowing()
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="fp16")  # the weights fit: compiles
    with pytest.warns(NonFiniteOutputWarning) as caught:
        y = compiled.run({"x": x})["y"]
    expected = int(np.count_nonzero(np.isinf((x.astype(np.float64) @ w).astype(np.float16))))
    assert expected == M * N // 2  # the odd columns
    assert int(np.count_nonzero(~np.isfinite(y))) == expected
    assert compiled.report.nonfinite_outputs == {"y": expected}
    assert compiled.report.to_json()["nonfinite_outputs"] == {"y": expected}
    assert [str(c.message) for c in caught] == [
        f"output 'y': {expected} of {M * N} values are not finite (inf/NaN): fp16 overflow? try --precision bf16"]
    # The next clean run clears the count.
    _run_quietly(compiled, {"x": x * 1e-3})
    assert compiled.report.nonfinite_outputs == {"y": 0}


def test_the_same_model_at_bf16_runs_clean_and_matches():
    model, x, _ = _overflowing()
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="bf16")
    got = _run_quietly(compiled, {"x": x})["y"]
    assert _rel_l2(got, _onnxruntime(model, {"x": x})["y"]) < 1e-2
    assert compiled.report.nonfinite_outputs == {"y": 0}


def test_cli_run_shows_the_warning(tmp_path):
    model, x, _ = _overflowing()
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "x.npz", x=x)
    done = subprocess.run([sys.executable, "-m", "lpx_tvm.cli", "run", str(tmp_path / "m.onnx"), "--preset", "mini",
                           "--inputs", str(tmp_path / "x.npz"), "--report", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"output 'y': {M * N // 2} of {M * N} values are not finite (inf/NaN): fp16 overflow? " \
           "try --precision bf16" in done.stderr
    assert "RuntimeWarning" not in done.stderr  # numpy's overflow noise is replaced by the count
    assert Report.load(str(tmp_path / "r.json")).nonfinite_outputs == {"y": M * N // 2}


def test_a_program_binary_report_counts_too():
    cfg = load_config("mini")
    prog = gemm(cfg, 8, 16, 16, "fp16", out_dtype="fp16")
    a = np.full((8, 16), 100.0, np.float32)
    b = np.ones((16, 16), np.float32)
    b[:, :3] = 50.0  # 16 x 100 x 50 = 80,000: three columns beyond fp16
    with np.errstate(over="ignore"):
        result = Simulator(cfg).run(prog, {"A": a, "B": b})
    assert program_report(result, prog).nonfinite_outputs == {"C": 8 * 3}


def test_a_report_written_before_the_field_reads_back():
    rep = Report(preset="mini", precision="fp16", cycles=1, latency_s=1e-9, macs=0, mxm_utilization=0.0,
                 nonfinite_outputs={"y": 3})
    data = rep.to_json()
    assert Report.from_json(data).nonfinite_outputs == {"y": 3}
    del data["nonfinite_outputs"]
    assert Report.from_json(data).nonfinite_outputs == {}

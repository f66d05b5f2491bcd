"""The VXM elementwise ops and activations (docs/ops.md) on seeded random values over
the whole float range — both signs, zeros, subnormals, huge values, infinities and NaN
where ONNX defines the result — at fp32, fp16 and bf16 on ``mini``.

One ONNX model per precision holds every op as a separate output, all on LPX. The
reference is numpy in float64 on the inputs rounded to the compile precision (the
model's fp32 inputs are stored at that precision), rounded once to it: what a
correctly rounded machine gives. Exact compositions (Abs, Neg, Sign, Min, Max, the
leaky ReLUs, constant minus tensor) must match it exactly at fp32; every op must match
within the ulps docs/ops.md states (at fp16 / bf16 one more, for the rounding of an
fp32 immediate's product). The activations the importer writes as several ops
(HardSigmoid, HardSwish, Elu) are compared with onnxruntime at fp32.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm

SHAPE = (2, 8, 5, 7)  # NCHW: 8 channels (a per-channel PReLU slope), 70 pixels each
DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, -3e-39, 3.4e38, -3.4e38,
                     6e-8, -6e-5, 65504.0, -70000.0, 1.0, -1.0, 0.5], np.float32)
SLOPES = np.array([0.0, 0.1, 0.25, 1.0, -0.5, 2.0, 0.01, 0.3], np.float32)  # per channel of PRelu


def _wide(rng, n: int, lo: int = -150, hi: int = 128) -> np.ndarray:
    """n values of random sign and magnitude 2^U(lo, hi) (fp32 overflows to inf past 2^128)."""
    with np.errstate(over="ignore"):
        mags = np.exp2(rng.uniform(lo, hi, n)) * rng.uniform(1, 2, n)
        return (rng.choice([-1.0, 1.0], n) * mags).astype(np.float32)


def _with_specials(values: np.ndarray) -> np.ndarray:
    values = values.copy()
    values[: SPECIALS.size] = SPECIALS
    return values.reshape(SHAPE)


RNG = np.random.default_rng(2026)
N = int(np.prod(SHAPE))
X = _with_specials(_wide(RNG, N))
Y = _with_specials(_wide(RNG, N))[::-1].copy()  # the specials meet other values
# Denominators where 1/y is a normal number at every precision (docs/ops.md, Div), and
# bases where the powers' intermediates stay normal; the specials are checked apart.
DENOMINATORS = _wide(RNG, N, -12, 12).reshape(SHAPE)
BASES = _wide(RNG, N, -3, 3).reshape(SHAPE)

# (output, ONNX node (op, inputs, attrs), reference in float64, ulps allowed at fp32)
OPS = [
    ("abs", ("Abs", ["x"], {}), np.abs, 0),
    ("neg", ("Neg", ["x"], {}), np.negative, 0),
    ("sign", ("Sign", ["x"], {}), np.sign, 0),
    ("min", ("Min", ["x", "y"], {}), np.minimum, 0),
    ("max", ("Max", ["x", "y"], {}), np.maximum, 0),
    ("max3", ("Max", ["x", "y", "x3"], {}), lambda x, y, z: np.maximum(np.maximum(x, y), z), 0),
    ("leaky", ("LeakyRelu", ["x"], {"alpha": 0.1}), lambda x: np.where(x < 0, x * np.float64(np.float32(0.1)), x), 0),
    ("leaky_steep", ("LeakyRelu", ["x"], {"alpha": 3.0}), lambda x: np.where(x < 0, x * 3.0, x), 0),
    ("prelu", ("PRelu", ["x", "slope"], {}),
     lambda x: np.where(x < 0, x * SLOPES.astype(np.float64).reshape(8, 1, 1), x), 0),
    ("rsub", ("Sub", ["two", "x"], {}), lambda x: 2.0 - x, 0),
    ("exp", ("Exp", ["x"], {}), np.exp, 1),
    ("sqrt", ("Sqrt", ["x"], {}), np.sqrt, 2),
    ("reciprocal", ("Reciprocal", ["d"], {}), lambda d: 1.0 / d, 1),
    ("div", ("Div", ["x", "d"], {}), np.divide, 2),
    ("pow_half", ("Pow", ["b", "half"], {}), np.sqrt, 2),
    ("pow_minus_half", ("Pow", ["b", "minus_half"], {}), lambda b: 1.0 / np.sqrt(b), 1),
    ("pow_4", ("Pow", ["b", "four"], {}), lambda b: b**4, 3),
    ("pow_5", ("Pow", ["b", "five"], {}), lambda b: b**5, 4),
    ("pow_minus_2", ("Pow", ["b", "minus_two"], {}), lambda b: b**-2.0, 2),
]
CONSTS = {"slope": SLOPES.reshape(8, 1, 1), "two": np.float32(2.0), "half": np.float32(0.5),
          "minus_half": np.float32(-0.5), "four": np.float32(4.0), "five": np.float32(5.0),
          "minus_two": np.float32(-2.0)}
FEEDS = {"x": X, "y": Y, "x3": np.roll(X, 3), "d": DENOMINATORS, "b": BASES}


def _model(ops):
    nodes = [helper.make_node(op, ins, [name], **attrs) for name, (op, ins, attrs), *_ in ops]
    used = {i for _, (_, ins, _), *_ in ops for i in ins}
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, SHAPE) for k in FEEDS if k in used]
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in CONSTS.items() if k in used]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, SHAPE) for name, *_ in ops]
    graph = helper.make_graph(nodes, "elementwise", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@functools.lru_cache(maxsize=None)
def _run(precision: str):
    model = _model(OPS)
    compiled = lpx_tvm.compile_model(model, preset="mini", precision=precision)
    feeds = {i.name: FEEDS[i.name] for i in model.graph.input}
    return compiled.report["offload"], compiled.run(feeds)


def _at(values, precision):
    """The fp32 values as stored at ``precision``, in float64."""
    return np.asarray(values, np.float32).astype(DTYPES[precision]).astype(np.float64)


def _compare(got, want, precision, ulps):
    dt = DTYPES[precision]
    want = np.asarray(want, np.float64).astype(dt).astype(np.float64)  # rounded once
    got = np.asarray(got, np.float64)
    info = ml_dtypes.finfo(dt)
    both_nan = np.isnan(got) & np.isnan(want)
    ok = both_nan | (got == want)
    if ulps:
        finite = np.isfinite(want) & np.isfinite(got)
        err = np.abs(got - want)
        ok |= finite & (err <= ulps * (np.abs(want) * float(info.eps) + float(info.smallest_subnormal)))
    bad = np.flatnonzero(~ok)
    assert bad.size == 0, (f"{bad.size} of {ok.size} differ (allowed {ulps} ulp), first at {bad[:5]}: "
                           f"got {got.reshape(-1)[bad[:5]]}, want {want.reshape(-1)[bad[:5]]}")


@pytest.mark.parametrize("precision", list(DTYPES))
def test_every_op_runs_on_lpx(precision):
    offload, _ = _run(precision)
    assert offload["cpu"] == {}, offload["reasons"]


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("name", [name for name, *_ in OPS])
def test_op_matches_the_rounded_reference(name, precision):
    _, got = _run(precision)
    (node, ref, ulps), = [rest for n, *rest in OPS if n == name]
    args = [_at(FEEDS[i], precision) for i in node[1] if i in FEEDS]
    with np.errstate(all="ignore"):
        want = ref(*args)
    # fp16 / bf16: a product with an fp32 immediate is rounded to fp32, then to the dtype.
    _compare(got[name], want, precision, ulps + (precision != "fp32"))


SPECIAL_CASES = [  # (op, inputs, want): what ONNX (IEEE) defines at the edges
    ("Sqrt", [np.array([0.0, np.inf, -1.0, np.nan, 1e-45, 4.0])], [0.0, np.inf, np.nan, np.nan, np.sqrt(np.float64(np.float32(1e-45))), 2.0]),
    ("Div", [np.array([1.0, -1.0, 0.0, np.inf, 0.0, 6.0]), np.array([0.0, 0.0, 0.0, np.inf, 5.0, 3.0])],
     [np.inf, -np.inf, np.nan, np.nan, 0.0, 2.0]),
    ("Reciprocal", [np.array([0.0, np.inf, -np.inf, np.nan, 4.0, -0.5])], [np.inf, 0.0, -0.0, np.nan, 0.25, -2.0]),
    ("Sign", [np.array([1e-45, -1e-45, 0.0, np.inf, -np.inf, np.nan])], [1.0, -1.0, 0.0, 1.0, -1.0, np.nan]),
    ("Exp", [np.array([-np.inf, np.inf, 0.0, 100.0, -104.0, np.nan])], [0.0, np.inf, 1.0, np.inf, 0.0, np.nan]),
]


@pytest.mark.parametrize("op, inputs, want", SPECIAL_CASES, ids=[c[0] for c in SPECIAL_CASES])
def test_special_values(op, inputs, want):
    shape = (1, len(want))
    names = [f"i{k}" for k in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["out"])], op,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in names],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)])
    compiled = lpx_tvm.compile_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]),
                                     preset="mini", precision="fp32")
    assert compiled.report["offload"]["cpu"] == {}
    with np.errstate(all="ignore"):
        got = compiled.run({n: np.asarray(v, np.float32).reshape(shape) for n, v in zip(names, inputs)})["out"]
    np.testing.assert_allclose(got.reshape(-1), np.asarray(want, np.float32), rtol=1e-6, equal_nan=True)


ACTIVATIONS = [("HardSigmoid", {"alpha": 0.2, "beta": 0.5}), ("HardSigmoid", {}), ("HardSwish", {}),
               ("Elu", {"alpha": 0.7}), ("Selu", {})]


@pytest.mark.parametrize("op, attrs", ACTIVATIONS, ids=[f"{op}{i}" for i, (op, _) in enumerate(ACTIVATIONS)])
def test_activations_match_onnxruntime(op, attrs):
    x = _with_specials(_wide(np.random.default_rng(7), N, -20, 8))
    graph = helper.make_graph([helper.make_node(op, ["x"], ["out"], **attrs)], op,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, SHAPE)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    assert compiled.report["offload"]["cpu"] == {}, compiled.report["offload"]["reasons"]
    with np.errstate(all="ignore"):
        got = compiled.run({"x": x})["out"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # 1 - exp(x) cancels for x near 0 (no expm1 on the VXM): an absolute error of ulps of 1.
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=4e-7, equal_nan=True)


@pytest.mark.parametrize("shape, slope_shape, runtime", [
    ((3, 6, 10), (10,), False),  # per channel of a 3-D value: nn.prelu along the last axis
    ((2, 3, 4, 5), (1,), False),  # one slope: a leaky ReLU
    ((2, 3, 4, 5), (2, 3, 4, 5), False),  # a slope per element: relu(x) + min(x, 0) * s
    ((2, 3, 4, 5), (2, 3, 4, 5), True),  # the same with a runtime slope
])
def test_prelu_forms_match_onnxruntime_exactly(shape, slope_shape, runtime):
    rng = np.random.default_rng(5)
    x = _wide(rng, int(np.prod(shape)), -30, 30).reshape(shape)
    x.reshape(-1)[:5] = [0.0, -np.inf, np.inf, np.nan, -1e-45]
    slope = rng.uniform(-1, 2, slope_shape).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    inits = []
    if runtime:
        inputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, slope_shape))
    else:
        inits.append(numpy_helper.from_array(slope, "s"))
    graph = helper.make_graph([helper.make_node("PRelu", ["x", "s"], ["out"])], "prelu", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    compiled = lpx_tvm.compile_model(model, preset="mini", precision="fp32")
    assert compiled.report["offload"]["cpu"] == {}, compiled.report["offload"]["reasons"]
    feeds = {"x": x, "s": slope} if runtime else {"x": x}
    got = compiled.run(feeds)["out"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)  # x * s rounded once, as onnxruntime


@pytest.mark.parametrize("precision", list(DTYPES))
def test_silu_forks_in_step(precision):
    """nn.silu (torch's SiLU) is x * sigmoid(x): x waits on the stream for the sigmoid."""
    from tvm import relax

    shape = (6, 40)
    x = _wide(np.random.default_rng(3), 240, -20, 7).reshape(shape)
    x.reshape(-1)[:4] = [0.0, -np.inf, np.inf, np.nan]
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.silu(xv))
        bb.emit_func_output(y)
    (got,) = lpx_tvm.build(bb.get(), preset="mini", precision=precision).run([x])
    xs = _at(x, precision)
    with np.errstate(all="ignore"):
        sig = np.asarray(1.0 / (1.0 + np.exp(-xs)), np.float64).astype(DTYPES[precision]).astype(np.float64)
        want = np.where(np.isneginf(xs), np.nan, xs * sig)  # -inf * sigmoid(-inf) = -inf * 0
    _compare(got, want, precision, 1)

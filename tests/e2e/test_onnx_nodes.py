"""ONNX backend node tests through lpx_tvm: fp32 on the ``mini`` preset.

Every node test case of Conv, Gemm, MatMul, Relu, Add, Mul, Sub, MaxPool, AveragePool,
GlobalAveragePool, Flatten, Concat, BatchNormalization (inference), Sigmoid, Tanh,
Clip, Softmax, LayerNormalization (output Y), Gelu, Erf, Transpose, Where, Resize and the VXM
elementwise ops and activations (Abs, Neg, Exp, Sqrt, Div, Min, Max, Reciprocal, Pow,
Sign, Floor, Log, LeakyRelu, PRelu, HardSigmoid, HardSwish, Elu, Selu, Softplus, Mish)
is compiled and run, and each output is compared with the case's expected output.
The offload report must then match docs/ops.md exactly: the Relax ops the ONNX node
becomes run on LPX, unless the table "Node test cases that run on the CPU" lists them
with the reason the report gives. Cases the docs list as not importable by TVM are
skipped (after checking that the importer still refuses them), and cases the docs list
as failing must still fail with the error given there.

Each case runs as given, where weights, biases, BatchNorm statistics, clip bounds and
the second operand of Add/Sub/Mul are graph inputs fed at run time, and, for those ops,
also as ``<case>-const``: every graph input but the first becomes an initializer holding
the case's test data, as in a deployed model.
"""

from __future__ import annotations

import glob
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm.testing
from onnx import numpy_helper

import lpx_tvm
from lpx_tvm.errors import LPXError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ops.md"

PRESET, PRECISION = "mini", "fp32"
RTOL = ATOL = 1e-4

# ONNX op -> case name prefixes; a case is "test_<op>" or "test_<op>_*".
PREFIXES = {
    "Conv": ("conv", "basic_conv"),
    "Gemm": ("gemm",),
    "MatMul": ("matmul",),
    "Relu": ("relu",),
    "Add": ("add",),
    "Mul": ("mul",),
    "Sub": ("sub",),
    "MaxPool": ("maxpool",),
    "AveragePool": ("averagepool",),
    "GlobalAveragePool": ("globalaveragepool",),
    "Flatten": ("flatten",),
    "Concat": ("concat",),
    "BatchNormalization": ("batchnorm",),
    "Sigmoid": ("sigmoid",),
    "Tanh": ("tanh",),
    "Clip": ("clip",),
    "Softmax": ("softmax",),
    "LayerNormalization": ("layer_normalization",),
    "Gelu": ("gelu",),
    "Erf": ("erf",),
    "Transpose": ("transpose",),
    "Where": ("where",),
    "Resize": ("resize",),
    # The VXM elementwise ops and activations.
    "Abs": ("abs",),
    "Neg": ("neg",),
    "Exp": ("exp",),
    "Sqrt": ("sqrt",),
    "Div": ("div",),
    "Min": ("min",),
    "Max": ("max",),
    "Reciprocal": ("reciprocal",),
    "Pow": ("pow",),
    "Sign": ("sign",),
    "Floor": ("floor",),
    "Log": ("log",),
    "LeakyRelu": ("leakyrelu",),
    "PRelu": ("prelu",),
    "HardSigmoid": ("hardsigmoid",),
    "HardSwish": ("hardswish",),
    "Elu": ("elu",),
    "Selu": ("selu",),
    "Softplus": ("softplus",),
    "Mish": ("mish",),
    "Pad": ("constant_pad", "edge_pad", "reflect_pad", "wrap_pad"),
    "ConvTranspose": ("convtranspose",),
}

# The Relax ops an ONNX node becomes after canonicalization (BatchNormalization
# without a producer to fold into becomes one multiply and one add).
MAIN_OPS = {
    "Conv": ("nn.conv2d",),
    "Gemm": ("matmul",),
    "MatMul": ("matmul",),
    "Relu": ("nn.relu",),
    "Add": ("add",),
    "Mul": ("multiply",),
    "Sub": ("subtract",),
    "MaxPool": ("nn.max_pool2d",),
    "AveragePool": ("nn.avg_pool2d",),
    "GlobalAveragePool": ("mean",),
    "Flatten": ("reshape",),
    "Concat": ("concat",),
    "BatchNormalization": ("multiply", "add"),
    "Sigmoid": ("sigmoid",),
    "Tanh": ("tanh",),
    "Clip": ("clip",),
    "Softmax": ("nn.softmax",),
    "LayerNormalization": ("nn.layer_norm",),
    "Gelu": ("nn.gelu",),
    "Erf": ("erf",),
    "Transpose": ("permute_dims",),
    "Where": ("where",),
    "Resize": ("image.resize2d",),
    # The VXM elementwise ops and activations (HardSigmoid is an affine then a clip,
    # HardSwish x * clip(x + 3, 0, 6) / 6, Elu and Selu relus of x and of 1 - exp(x)).
    "Abs": ("abs",),
    "Neg": ("negative",),
    "Exp": ("exp",),
    "Sqrt": ("sqrt",),
    "Div": ("divide",),
    "Min": ("minimum",),
    "Max": ("maximum",),
    "Reciprocal": ("divide",),
    "Pow": ("power",),
    "Sign": ("sign",),
    "Floor": ("floor",),
    "Log": ("log",),
    "LeakyRelu": ("nn.leakyrelu",),
    "PRelu": ("nn.prelu",),
    "HardSigmoid": ("multiply", "add", "clip"),
    "HardSwish": ("add", "clip", "multiply"),
    "Elu": ("exp", "subtract", "nn.relu", "multiply", "add"),
    "Selu": ("exp", "subtract", "nn.relu", "multiply", "add"),
    "Softplus": ("nn.relu", "abs", "negative", "exp", "add", "log"),
    "Mish": ("exp", "add", "log", "tanh", "multiply"),
    "Pad": ("nn.pad",),
    "ConvTranspose": ("nn.conv2d",),  # zero-stuffing and a conv2d (lpx.ConvTransposeAsConv)
}
# Cases whose node becomes other ops: Clip with no bounds and Transpose (0, 1, 2) are the
# identity (no op at all), Clip(min=0) with no max is a ReLU, Clip with only a max is a minimum, min > max
# stays a maximum and a minimum, and int8 bounds become TIR functions. 1-D and 3-D
# pooling are handled in _main_ops.
MAIN_OPS_OF_CASE = {
    "test_gelu_tanh_1": ("nn.gelu_tanh",),
    "test_gelu_tanh_2": ("nn.gelu_tanh",),
    "test_transpose_all_permutations_0": (),  # the identity permutation: no op
    "test_clip_default_inbounds": (),
    "test_clip_default_int8_inbounds": (),
    "test_clip_default_min-const": ("nn.relu",),
    "test_clip_default_max-const": ("minimum",),
    "test_clip_min_greater_than_max-const": ("maximum", "minimum"),
    "test_clip_default_int8_min-const": ("call_tir",),
    "test_clip_default_int8_max-const": ("call_tir",),
    # A tensor over a constant is a multiply by its reciprocal (lpx.CollapseAffine), a
    # constant exponent 2 multiplies, a one-input Min / Max a stack and a reduction, and a
    # PRelu slope of the input's shape where(x < 0, x * slope, x), which lpx.Decompose
    # writes as relu(x) + minimum(x, 0) * slope.
    **{f"test_div{c}-const": ("multiply",) for c in ("", "_example", "_bcast")},
    "test_pow_bcast_scalar-const": ("multiply",),
    "test_wrap_pad-const": ("call_tir",),  # wrap mode: the importer's generated TIR circular pad
    "test_min_one_input": ("stack", "min"),
    "test_max_one_input": ("stack", "max"),
    **{case: ("nn.relu", "minimum", "multiply", "add") for case in ("test_prelu_example", "test_prelu_example-const")},
    # Runtime clip bounds: the importer emits generated TIR maximum / minimum (with NaN
    # handling for floats), which run on the CPU; docs/ops.md lists them.
    **{case: ("call_tir",) for case in (
        "test_clip", "test_clip_example", "test_clip_inbounds", "test_clip_outbounds", "test_clip_splitbounds",
        "test_clip_min_greater_than_max", "test_clip_default_min", "test_clip_default_max",
        "test_clip_default_int8_min", "test_clip_default_int8_max")},
    # A runtime ConvTranspose weight: the transposed convolution stays as it is, on the CPU.
    **{case: ("nn.conv2d_transpose",) for case in (
        "test_convtranspose", "test_convtranspose_autopad_same", "test_convtranspose_dilations",
        "test_convtranspose_group_2", "test_convtranspose_group_2_image_3", "test_convtranspose_kernel_shape",
        "test_convtranspose_pad", "test_convtranspose_pads")},
    **{f"test_convtranspose_{d}d{v}": (f"nn.conv{d}d_transpose",) for d in (1, 3) for v in ("", "-const")},
}

# Ops whose outputs past the first few are not compared (see _load_cases).
OUTPUTS_COMPARED = {"LayerNormalization": 1}

# Ops whose inputs after the first are parameters in a deployed model: these cases also
# run as "-const".
CONST_VARIANT_OPS = {"Conv", "Gemm", "MatMul", "BatchNormalization", "Clip", "Add", "Sub", "Mul", "LayerNormalization",
                     "Div", "Min", "Max", "Pow", "PRelu", "Pad", "ConvTranspose"}
CONST_VARIANT_OPS |= {"Resize"}  # roi, scales and sizes


# ---- the cases ----------------------------------------------------------------------


@dataclass
class NodeCase:
    id: str
    op_type: str
    model: onnx.ModelProto
    feeds: dict
    expected: list  # [(output name, array)]
    rtol: float
    atol: float
    main_ops: tuple = field(default=())


def _read_pb(path):
    with open(path, "rb") as f:
        return numpy_helper.to_array(onnx.TensorProto.FromString(f.read()))


def _numbered(paths):
    return sorted(paths, key=lambda p: int(re.search(r"_(\d+)\.pb$", p).group(1)))


def _model_and_data(case):
    """The model and [(inputs, outputs)] of a case, in memory or from its directory."""
    if getattr(case, "model", None) is not None:
        return case.model, case.data_sets
    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    data_sets = []
    for d in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*"))):
        ins = [_read_pb(p) for p in _numbered(glob.glob(os.path.join(d, "input_*.pb")))]
        outs = [_read_pb(p) for p in _numbered(glob.glob(os.path.join(d, "output_*.pb")))]
        data_sets.append((ins, outs))
    return model, data_sets


def _selected(name):
    if "_expanded" in name or "training_mode" in name:
        return False
    return any(name == f"test_{p}" or name.startswith(f"test_{p}_") for ps in PREFIXES.values() for p in ps)


def _with_constants(model, values):
    """``model`` with every graph input but the first turned into an initializer."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = m.graph.input[0]
    for vi in list(m.graph.input)[1:]:
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(values[vi.name]), vi.name))
    del m.graph.input[:]
    m.graph.input.append(keep)
    return m


def _main_ops(case_id, op_type, model):
    if case_id in MAIN_OPS_OF_CASE:
        return MAIN_OPS_OF_CASE[case_id]
    if op_type in ("MaxPool", "AveragePool"):
        spatial = len(model.graph.input[0].type.tensor_type.shape.dim) - 2
        return (f"nn.{'max' if op_type == 'MaxPool' else 'avg'}_pool{spatial}d",)
    return MAIN_OPS[op_type]


def _load_cases():
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators warn about their own data
        tests = [t for t in load_model_tests(kind="node") if _selected(t.name)]
    cases = []
    for t in sorted(tests, key=lambda t: t.name):
        model, data_sets = _model_and_data(t)
        (ins, outs), = data_sets
        op_type = model.graph.node[0].op_type
        assert len(model.graph.node) == 1 and op_type in PREFIXES, t.name
        names = [vi.name for vi in model.graph.input]
        values = dict(zip(names, ins))
        expected = [(vi.name, out) for vi, out in zip(model.graph.output, outs)]
        # LayerNormalization's Mean and InvStdDev outputs (training-only) are not computed
        # by TVM's importer (it returns empty tensors): only Y is compared.
        expected = expected[:OUTPUTS_COMPARED.get(op_type, len(expected))]
        tol = dict(rtol=max(RTOL, t.rtol), atol=max(ATOL, t.atol))
        variants = [(t.name, model, values)]
        if op_type in CONST_VARIANT_OPS and len(names) > 1:
            variants.append((f"{t.name}-const", _with_constants(model, values), {names[0]: values[names[0]]}))
        for case_id, m, feeds in variants:
            main = _main_ops(case_id, op_type, m)
            cases.append(NodeCase(case_id, op_type, m, feeds, expected, main_ops=main, **tol))
    return cases


CASES = _load_cases()


# ---- what docs/ops.md says ------------------------------------------------------------


def _section_rows(text, heading):
    """The table rows (lists of cells) under ``## heading``, header and rule left out."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/ops.md has no section '## {heading}'"
    lines = [ln.strip() for ln in match.group(1).splitlines() if ln.strip().startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


def _ticks(cell):
    return re.findall(r"`([^`]+)`", cell)


def _docs():
    text = DOCS.read_text()
    cpu = {}  # case -> {op: [reason substrings]}
    for cases, ops, reason in (row[:3] for row in _section_rows(text, "Node test cases that run on the CPU")):
        for case in _ticks(cases):
            for op in _ticks(ops):
                cpu.setdefault(case, {}).setdefault(op, []).append(_ticks(reason)[0])
    not_imported = {c: _ticks(row[1])[0] for row in _section_rows(text, "Node test cases TVM cannot import")
                    for c in _ticks(row[0])}
    failing = {c: _ticks(row[1])[0] for row in _section_rows(text, "Node test cases that fail")
               for c in _ticks(row[0])}
    return cpu, not_imported, failing


CPU_CASES, NOT_IMPORTED, FAILING = _docs()


# ---- the tests ------------------------------------------------------------------------


def _compile_run_compare(case):
    m = lpx_tvm.compile_model(case.model, preset=PRESET, precision=PRECISION)
    got = m.run(case.feeds)
    for name, want in case.expected:
        tvm.testing.assert_allclose(got[name], want, rtol=case.rtol, atol=case.atol)
    return m


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_node(case):
    if case.id in NOT_IMPORTED:
        with pytest.raises(LPXError, match=re.escape(NOT_IMPORTED[case.id])):
            lpx_tvm.compile_model(case.model, preset=PRESET, precision=PRECISION)
        pytest.skip(f"TVM's ONNX importer cannot import it: {NOT_IMPORTED[case.id]}")

    if case.id in FAILING:
        try:
            _compile_run_compare(case)
        except Exception as e:  # noqa: BLE001 - the docs name the error text
            if FAILING[case.id] in str(e):
                pytest.xfail(f"docs/ops.md lists it as failing: {FAILING[case.id]}")
            raise
        pytest.fail("docs/ops.md lists this case as failing, but it passes: update the docs")

    m = _compile_run_compare(case)
    report = m.report
    offload = report["offload"]
    want_cpu = CPU_CASES.get(case.id, {})
    assert set(offload["cpu"]) == set(want_cpu), (
        f"ops on the CPU {offload['cpu']} (reasons {offload['reasons']}); docs/ops.md lists {sorted(want_cpu)}"
    )
    for op, substrings in want_cpu.items():
        for s in substrings:
            assert any(s in r for r in offload["reasons"][op]), (op, s, offload["reasons"][op])
    for op in case.main_ops:
        if op not in want_cpu:
            assert offload["lpx"].get(op, 0) > 0, f"{op} did not run on LPX: {offload}"
    if not case.main_ops:
        assert offload["lpx"] == {} and offload["cpu"] == {}, offload
    if offload["lpx"]:
        assert report["cycles"] > 0


def test_docs_name_only_real_cases():
    ids = {c.id for c in CASES}
    for table, names in (("run on the CPU", CPU_CASES), ("cannot import", NOT_IMPORTED), ("fail", FAILING)):
        unknown = sorted(set(names) - ids)
        assert not unknown, f"docs/ops.md ('{table}') names cases that are not run: {unknown}"
    both = (set(CPU_CASES) & (set(NOT_IMPORTED) | set(FAILING))) | (set(NOT_IMPORTED) & set(FAILING))
    assert not both, f"docs/ops.md lists these cases in two tables: {sorted(both)}"


def test_every_op_has_cases():
    ops = {c.op_type for c in CASES}
    assert ops == set(PREFIXES), sorted(set(PREFIXES) - ops)

"""PyTorch in: lpx_tvm.from_torch (torch.export -> Relax -> LPX) and
torch.compile(backend="lpx"), against torch eager."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm.testing
from tvm import relax

torch = pytest.importorskip("torch")

import lpx_tvm  # noqa: E402
from lpx_tvm.errors import LPXError  # noqa: E402
from lpx_tvm.relax_passes import ModelError, canonicalize, partition_for_lpx  # noqa: E402
from lpx_tvm.machine.config import load_config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class MLP(torch.nn.Module):
    def __init__(self, d_in=64, d_hidden=96, d_out=40):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(torch.nn.Module):
    """Conv-BN-ReLU, max pool, a strided conv with a residual-free ReLU, a depthwise
    conv, global average pool and a linear head."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, c, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.pool = torch.nn.MaxPool2d(2)
        self.conv2 = torch.nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=False)
        self.dw = torch.nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2 * c)
        self.fc = torch.nn.Linear(2 * c, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = torch.relu(self.conv2(x))
        x = torch.nn.functional.relu6(self.dw(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Branchy(torch.nn.Module):
    """A data-dependent Python branch between two linear layers: TorchDynamo breaks the
    graph there and runs the branch eagerly. torch.export cannot export it."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 16)

    def forward(self, x):
        h = self.fc1(x)
        if h.sum() > 0:
            h = h * 2.0
        else:
            h = -h
        return self.fc2(torch.relu(h))


class ExplicitBreak(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 48)
        self.fc2 = torch.nn.Linear(48, 8)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        torch._dynamo.graph_break()
        return self.fc2(h), h


class Spectrum(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()


class PrintsShape(torch.nn.Module):
    """A print breaks the graph; the graph before it also hands a size to eager code."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = self.fc1(x)
        print("hidden", tuple(h.shape))
        return self.fc2(torch.relu(h))


def _eager(module, *args):
    with torch.no_grad():
        return module(*args)


def _randomized(module):
    """Random BatchNorm statistics, so folding them is checked with real numbers."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return module.eval()


# MACs of matmul and conv2d, on LPX and on the CPU ---------------------------------------

def _shape(expr):
    return [int(d) for d in expr.ty.shape.values]


def _call_macs(call) -> int:
    op = call.op.name if isinstance(call.op, tvm.ir.Op) else None
    if op == "relax.matmul":
        return int(np.prod(_shape(call))) * _shape(call.args[0])[-1]
    if op == "relax.nn.conv2d":
        _, cin_per_group, kh, kw = _shape(call.args[1])
        return int(np.prod(_shape(call))) * cin_per_group * kh * kw
    return 0


def mac_split(mod, preset, precision):
    """(MACs on LPX, MACs left on the CPU) of matmuls and convolutions: all of them in the
    canonicalized module, less those the partitioned ``main`` still calls directly (the
    same canonicalization and partitioning lpx_tvm.build runs)."""
    mod = canonicalize(mod)

    def direct_macs(func):
        total = []
        relax.analysis.post_order_visit(
            func.body, lambda e: total.append(_call_macs(e)) if isinstance(e, relax.Call)
            and not isinstance(e.op, (relax.GlobalVar, relax.Var)) else None)
        return sum(total)

    total = direct_macs(mod["main"])
    partitioned, _ = partition_for_lpx(mod, load_config(preset), precision)
    cpu = direct_macs(partitioned["main"])
    return total - cpu, cpu


# from_torch -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(16, 64)
    return model, x


def test_mlp_from_torch_fp32(mlp, tmp_path):
    model, x = mlp
    compiled = lpx_tvm.from_torch(model, (x,), preset="mini", precision="fp32")
    assert compiled.inputs == [("x", (16, 64), "float32")]
    assert compiled.outputs == ["output_0"]
    want = _eager(model, x).numpy()
    got = compiled.run({"x": x.numpy()})["output_0"]
    tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # A list in input order works too.
    tvm.testing.assert_allclose(compiled.run([x.numpy()])["output_0"], want, rtol=1e-4, atol=1e-4)
    report = compiled.report
    offload = report["offload"]
    assert offload["lpx"].get("matmul") == 2 and "matmul" not in offload["cpu"], offload
    assert report["macs"] == 16 * 64 * 96 + 16 * 96 * 40
    assert report["cycles"] > 0
    # Artifacts work as for ONNX models.
    compiled.save(str(tmp_path / "mlp.lpxa"))
    loaded = lpx_tvm.load(str(tmp_path / "mlp.lpxa"))
    assert loaded.inputs == compiled.inputs and loaded.outputs == compiled.outputs
    tvm.testing.assert_allclose(loaded.run([x.numpy()])["output_0"], want, rtol=1e-4, atol=1e-4)


def test_cnn_from_torch_fp32():
    torch.manual_seed(1)
    model = _randomized(CNN())
    x = torch.randn(1, 3, 16, 16)
    compiled = lpx_tvm.from_torch(model, x, preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    tvm.testing.assert_allclose(got, _eager(model, x).numpy(), rtol=1e-4, atol=1e-4)
    offload = compiled.report["offload"]
    assert offload["lpx"].get("nn.conv2d") == 3, offload
    assert offload["lpx"].get("matmul") == 1, offload
    assert "nn.conv2d" not in offload["cpu"] and "matmul" not in offload["cpu"], offload
    lpx_macs, cpu_macs = mac_split(lpx_tvm.import_torch(model, x).mod, "tsp", "fp32")
    # The report's count also has the global average pool's sums, which run on the MXM.
    assert cpu_macs == 0 and lpx_macs + 16 * 4 * 4 == compiled.report["macs"]


def test_import_torch_gives_a_module_build_takes(mlp):
    model, x = mlp
    imported = lpx_tvm.import_torch(model, (x,))
    assert isinstance(imported.mod, tvm.IRModule)
    assert imported.inputs == [("x", (16, 64), "float32")] and imported.outputs == ["output_0"]
    # The weights are constants: main takes the input only.
    assert len(imported.mod["main"].params) == 1
    exe = lpx_tvm.build(imported.mod, preset="mini", precision="fp32")
    tvm.testing.assert_allclose(exe.run([x.numpy()])[0], _eager(model, x).numpy(), rtol=1e-4, atol=1e-4)


def test_from_torch_multiple_outputs():
    torch.manual_seed(2)
    model = ExplicitBreak().eval()  # outside TorchDynamo graph_break() does nothing
    x = torch.randn(8, 32)
    compiled = lpx_tvm.from_torch(model, (x,), preset="mini", precision="fp32")
    assert compiled.outputs == ["output_0", "output_1"]
    out = compiled.run([x.numpy()])
    want = _eager(model, x)
    for name, w in zip(compiled.outputs, want):
        tvm.testing.assert_allclose(out[name], w.numpy(), rtol=1e-4, atol=1e-4)


class LastRows(torch.nn.Module):
    """Rows picked by negative indices (``x[:, -1]``, as a decoder picks its last token's
    hidden state): TVM's converter hands -1 to ``take``, which reads out of bounds."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(24, 16)

    def forward(self, x):
        return self.fc(x[:, -1]) + x[:, -3, :16] * 2.0


def test_negative_select_index_counts_from_the_end():
    torch.manual_seed(3)
    model = LastRows().eval()
    x = torch.randn(2, 5, 24)
    compiled = lpx_tvm.from_torch(model, (x,), preset="mini", precision="fp32")
    out = compiled.run([x.numpy()])
    tvm.testing.assert_allclose(out[compiled.outputs[0]], _eager(model, x).numpy(), rtol=1e-5, atol=1e-5)


def test_from_torch_errors(mlp):
    model, x = mlp
    with pytest.raises(ModelError, match="torch.export could not export Branchy"):
        lpx_tvm.from_torch(Branchy().eval(), (torch.randn(4, 32),), preset="mini")
    with pytest.raises(ModelError, match="expects a torch.nn.Module, got function"):
        lpx_tvm.from_torch(lambda t: t, (x,))
    with pytest.raises(ModelError, match="example input 1 is a int"):
        lpx_tvm.from_torch(model, (x, 3))
    with pytest.raises(ModelError, match=r"not supported by TVM's PyTorch importer: _fft_r2c\.default"):
        lpx_tvm.from_torch(Spectrum(), (torch.randn(4, 16),))
    with pytest.raises(LPXError, match="precision 'fp8'"):
        lpx_tvm.from_torch(model, (x,), precision="fp8")
    with pytest.raises(LPXError, match="nosuchchip"):
        lpx_tvm.from_torch(model, (x,), preset="nosuchchip")


# BERT-tiny, GPT-2 tiny and BERT-base ---------------------------------------------------------

SEQ = {"bert": 64, "gpt2": 64, "bert_base": 128}
# Per layer: BERT's Q, K, V, attention output and two FFN matmuls, GPT-2's fused QKV,
# attention output and two MLP matmuls; both: the two per-head batched matmuls.
MATMULS = {"bert": 2 * 8, "gpt2": 2 * 6, "bert_base": 12 * 8}


def _transformer(name):
    pytest.importorskip("transformers")
    from transformer_models import LastHiddenState, bert, gpt2

    torch.manual_seed(0)
    make, hidden, layers, heads = {"bert_base": (bert, 768, 12, 12), "bert": (bert, 128, 2, 2),
                                   "gpt2": (gpt2, 128, 2, 2)}[name]
    return LastHiddenState(make(hidden, layers, heads, positions=SEQ[name]).eval()).eval()


@pytest.fixture(scope="module", params=["bert", "gpt2", "bert_base"])
def transformer(request):
    model = _transformer(request.param)
    ids = torch.randint(0, 1000, (1, SEQ[request.param]), generator=torch.Generator().manual_seed(1))
    return request.param, model, ids, _eager(model, ids).numpy(), {}


def _compiled(transformer, precision):
    name, model, ids, _, cache = transformer
    if precision not in cache:
        cache[precision] = lpx_tvm.from_torch(model, (ids,), preset="tsp", precision=precision)
    return cache[precision]


def test_transformer_fp32_matches_torch(transformer):
    name, model, ids, want, _ = transformer
    compiled = _compiled(transformer, "fp32")
    assert compiled.inputs == [("input_ids", (1, SEQ[name]), "int64")]
    got = compiled.run([ids.numpy()])["output_0"]
    tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    offload = compiled.report["offload"]
    assert offload["lpx"].get("matmul") == MATMULS[name] and "matmul" not in offload["cpu"], offload


def test_transformer_fp16_within_relative_l2(transformer):
    name, model, ids, want, _ = transformer
    got = _compiled(transformer, "fp16").run([ids.numpy()])["output_0"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


def test_transformer_macs_on_lpx(transformer):
    name, model, ids, _, _ = transformer
    compiled = _compiled(transformer, "fp16")
    compiled.run([ids.numpy()])  # the report counts the MACs of the last run
    lpx_macs, cpu_macs = mac_split(lpx_tvm.import_torch(model, (ids,)).mod, "tsp", "fp16")
    # The partitioned module's count agrees with what the regions ran.
    assert lpx_macs == compiled.report["macs"]
    share = lpx_macs / (lpx_macs + cpu_macs)
    assert share >= 0.9, f"{name}: {share:.1%} of matmul MACs on LPX ({lpx_macs} LPX, {cpu_macs} CPU)"


# torch.compile(backend="lpx") -------------------------------------------------------------

@pytest.fixture
def backend():
    torch._dynamo.reset()
    yield lpx_tvm.DynamoBackend(preset="mini", precision="fp32")
    torch._dynamo.reset()


def test_compile_mlp_caches_per_signature(mlp, backend):
    model, x = mlp
    fast = torch.compile(model, backend=backend)
    tvm.testing.assert_allclose(fast(x).numpy(), _eager(model, x).numpy(), rtol=1e-4, atol=1e-4)
    assert backend.compilations == 1
    x2 = torch.randn(16, 64)
    tvm.testing.assert_allclose(fast(x2).numpy(), _eager(model, x2).numpy(), rtol=1e-4, atol=1e-4)
    assert backend.compilations == 1  # same shapes: the compiled graph is reused
    x3 = torch.randn(5, 64)
    tvm.testing.assert_allclose(fast(x3).numpy(), _eager(model, x3).numpy(), rtol=1e-4, atol=1e-4)
    assert backend.compilations == 2  # a new shape compiles again
    fast(torch.randn(5, 64))
    assert backend.compilations == 2
    for graph in backend.graphs:
        # The weights are bound as constants: the compiled models take x only.
        assert all(len(m.inputs) == 1 for m in graph.models.values())
        offload = graph.last_model.report["offload"]
        assert offload["lpx"].get("matmul") == 2 and "matmul" not in offload["cpu"], offload


def test_compile_weight_change_recompiles(backend):
    torch.manual_seed(3)
    model = MLP(32, 32, 8).eval()
    x = torch.randn(4, 32)
    fast = torch.compile(model, backend=backend)
    fast(x)
    with torch.no_grad():
        model.fc1.weight.mul_(-1.5)
    tvm.testing.assert_allclose(fast(x).numpy(), _eager(model, x).numpy(), rtol=1e-4, atol=1e-4)
    assert backend.compilations == 2


def test_compile_graph_break_runs_eagerly_between_graphs(backend):
    torch.manual_seed(4)
    model = Branchy().eval()
    fast = torch.compile(model, backend=backend)
    xs = [torch.randn(4, 32) for _ in range(6)]
    signs = set()
    for x in xs:
        signs.add(bool(_eager(model.fc1, x).sum() > 0))
        tvm.testing.assert_allclose(fast(x).numpy(), _eager(model, x).numpy(), rtol=1e-4, atol=1e-4)
    assert signs == {True, False}  # both branches ran
    assert len(backend.graphs) >= 2  # the graph before the branch and the one after


def test_compile_explicit_graph_break(backend):
    torch.manual_seed(5)
    model = ExplicitBreak().eval()
    x = torch.randn(8, 32)
    out, hidden = torch.compile(model, backend=backend)(x)
    want_out, want_hidden = _eager(model, x)
    tvm.testing.assert_allclose(out.numpy(), want_out.numpy(), rtol=1e-4, atol=1e-4)
    tvm.testing.assert_allclose(hidden.numpy(), want_hidden.numpy(), rtol=1e-4, atol=1e-4)
    assert len(backend.graphs) == 2 and backend.compilations == 2


def test_compile_print_with_symbolic_shapes(backend, capsys):
    torch.manual_seed(6)
    model = PrintsShape().eval()
    fast = torch.compile(model, backend=backend, dynamic=True)  # graphs with symbolic sizes
    for n in (4, 4, 6):
        x = torch.randn(n, 16)
        tvm.testing.assert_allclose(fast(x).numpy(), _eager(model, x).numpy(), rtol=1e-4, atol=1e-4)
        assert capsys.readouterr().out.count(f"hidden ({n}, 32)") == 2  # compiled and eager
    assert len(backend.graphs) == 2
    assert backend.compilations == 4  # two graphs, compiled for n=4 and for n=6


@pytest.mark.parametrize("name", ["bert", "gpt2", "bert_base"])
def test_compile_transformer_matches_eager(name):
    torch._dynamo.reset()
    backend = lpx_tvm.DynamoBackend(preset="tsp", precision="fp32")
    model = _transformer(name)
    ids = torch.randint(0, 1000, (1, SEQ[name]), generator=torch.Generator().manual_seed(2))
    got = torch.compile(model, backend=backend)(ids)
    tvm.testing.assert_allclose(got.numpy(), _eager(model, ids).numpy(), rtol=1e-4, atol=1e-4)
    assert backend.compilations == 1
    offload = backend.graphs[0].last_model.report["offload"]
    assert offload["lpx"].get("matmul") == MATMULS[name] and "matmul" not in offload["cpu"], offload
    # Every float op on LPX: only the embedding lookup and its integer index work stay.
    assert set(offload["cpu"]) <= {"take", "reshape", "astype", "add", "less", "where"}, offload
    torch._dynamo.reset()


def test_registered_name_and_options(mlp):
    model, x = mlp
    torch._dynamo.reset()
    assert "lpx" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("lpx") is lpx_tvm.dynamo_backend
    before = lpx_tvm.dynamo_backend.compilations
    fast = torch.compile(model, backend="lpx", options={"preset": "mini", "precision": "fp32"})
    tvm.testing.assert_allclose(fast(x).numpy(), _eager(model, x).numpy(), rtol=1e-4, atol=1e-4)
    assert lpx_tvm.dynamo_backend.compilations == before + 1
    graph = lpx_tvm.dynamo_backend.graphs[-1]
    assert (graph.preset, graph.precision) == ("mini", "fp32")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown lpx backend option") as err:
        torch.compile(model, backend="lpx", options={"tile": 4})(x)
    assert _caused_by(err.value, LPXError)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="_fft_r2c") as err:
        torch.compile(Spectrum(), backend="lpx")(torch.randn(4, 16))
    assert _caused_by(err.value, ModelError)
    torch._dynamo.reset()


def _caused_by(exc, kind):
    while exc is not None:
        if isinstance(exc, kind):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def test_backend_from_entry_point_without_importing_lpx_tvm():
    code = (
        "import sys, torch\n"
        "m = torch.nn.Linear(8, 4)\n"
        "x = torch.randn(2, 8)\n"
        "assert 'lpx_tvm' not in sys.modules\n"
        "f = torch.compile(m, backend='lpx', options={'preset': 'mini', 'precision': 'fp32'})\n"
        "assert 'lpx_tvm' in sys.modules\n"  # torch loaded the entry point
        "y = f(x)\n"
        "assert (y - m(x)).abs().max().item() < 1e-4\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_import_without_torch():
    """torch is optional: lpx_tvm imports without it and from_torch says what is missing."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
        "import lpx_tvm\n"
        "try:\n"
        "    lpx_tvm.from_torch(None, ())\n"
        "except lpx_tvm.LPXError as e:\n"
        "    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "PyTorch is not installed" in result.stdout and "lpx-tvm[torch]" in result.stdout


# RMSNorm, written out (LLaMA / T5 style) and as torch.nn.RMSNorm ---------------------------

class WrittenRMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(n) + 0.5)
        self.eps = 1e-6

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps))


class NormAfterLinear(torch.nn.Module):
    def __init__(self, norm, n=64):
        super().__init__()
        self.linear = torch.nn.Linear(n, n)
        self.norm = norm

    def forward(self, x):
        return self.norm(self.linear(x))


@pytest.mark.parametrize("norm", ["written", "torch.nn.RMSNorm"])
def test_rms_norm_runs_on_lpx(norm):
    torch.manual_seed(0)
    if norm == "written":
        layer = WrittenRMSNorm(64)
    else:
        layer = torch.nn.RMSNorm(64, eps=1e-6)
        with torch.no_grad():
            layer.weight.copy_(torch.rand(64) + 0.5)
    model, x = NormAfterLinear(layer).eval(), torch.randn(1, 8, 64)
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    tvm.testing.assert_allclose(got, _eager(model, x).numpy(), rtol=1e-4, atol=1e-4)
    offload = compiled.report["offload"]
    assert offload["cpu"] == {} and offload["lpx"].get("nn.rms_norm") == 1, offload

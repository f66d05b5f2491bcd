"""ViT, Llama and Qwen2 from ``transformers`` (small configs, random weights) each compile
into one LPX region on ``tsp``: the class-token concat, the patch flatten, the softmax
guard of sdpa, rotary embeddings and grouped-query attention's repeat_kv run on LPX, and
only the embedding lookup and its integer index arithmetic stay on the CPU. Each runs in
fp32 and matches torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm import pipeline  # noqa: E402
from lpx_tvm.frontends.torch import import_torch  # noqa: E402
from lpx_tvm.machine.config import load_config  # noqa: E402
from lpx_tvm.relax_passes._binding_rewrite import bindings  # noqa: E402


from architecture_models import TORCH  # noqa: E402

ARCHITECTURES = {name: TORCH[name] for name in ("vit", "llama", "qwen2")}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def architecture(request):
    torch.manual_seed(0)
    model, (x,) = ARCHITECTURES[request.param]()
    return request.param, model.eval(), x


def test_one_region_and_only_index_math_on_the_cpu(architecture):
    name, model, x = architecture
    mod = pipeline.canonicalize_model(import_torch(model, (x,)).mod, "fp32")
    partitioned, report = pipeline.partition(mod, load_config("tsp"), "fp32")
    assert report.regions == 1, report.cpu_ops
    dtypes = {var.name: str(var.ty.dtype) for var, _ in bindings(partitioned["main"])}
    for op in report.cpu_ops:
        # The lookup itself, and the int casts and reshapes of its token ids.
        assert op.op == "take" or dtypes[op.var].startswith("int"), op
    assert bool(report.cpu_ops) == (name != "vit")  # ViT has no embedding lookup


def test_fp32_matches_torch(architecture):
    name, model, x = architecture
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    with torch.no_grad():
        want = model(x).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

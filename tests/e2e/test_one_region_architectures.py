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


class LastHiddenState(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).last_hidden_state


def _vit():
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=128)
    return transformers.ViTModel(cfg, add_pooling_layer=False), torch.randn(1, 3, 32, 32)


def _decoder(config_cls, model_cls):
    def make():
        cfg = config_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
        return model_cls(cfg), torch.randint(0, 100, (1, 16))
    return make


ARCHITECTURES = {
    "vit": _vit,
    "llama": _decoder(transformers.LlamaConfig, transformers.LlamaModel),
    "qwen2": _decoder(transformers.Qwen2Config, transformers.Qwen2Model),
}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def architecture(request):
    torch.manual_seed(0)
    model, x = ARCHITECTURES[request.param]()
    return request.param, LastHiddenState(model.eval()).eval(), x


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

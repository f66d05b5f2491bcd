"""ConvNeXt (transformers ConvNextModel) on LPX: the NHWC section of its blocks and its
channels-first LayerNorms run on pixel-rows views (lpx.ChannelsLast), so the whole
model is one LPX region, and it matches torch."""

import collections

import numpy as np
import pytest
import tvm.testing

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm import pipeline  # noqa: E402
from lpx_tvm.machine.config import load_config  # noqa: E402


from architecture_models import convnext  # noqa: E402


def _convnext(image, hidden_sizes):
    torch.manual_seed(0)
    return convnext(image, hidden_sizes)[0]


def _partition(model, x):
    imp = lpx_tvm.import_torch(model, (x,))
    mod = pipeline.canonicalize_model(imp.mod, "fp32")
    return pipeline.partition(mod, load_config("tsp"), "fp32")[1]


def test_convnext_is_one_region():
    x = torch.randn(1, 3, 64, 64)
    report = _partition(_convnext(64, [16, 32, 64, 128]), x)
    assert report.regions == 1
    assert dict(collections.Counter(op.op for op in report.cpu_ops)) == {}


def test_convnext_matches_torch_on_tsp():
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    model = _convnext(32, [16, 32, 48])
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    with torch.no_grad():
        want = model(x).numpy()
    assert got.shape == want.shape == (1, 48, 2, 2)
    tvm.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    offload = compiled.report["offload"]
    assert not offload["cpu"], offload


def test_channels_first_layer_norm_matches_torch():
    """ConvNeXt's downsampling LayerNorm alone ("channels_first": permute, layer norm over
    C, permute back), between two convolutions, with odd sizes."""
    norm_cls = transformers.models.convnext.modeling_convnext.ConvNextLayerNorm

    class Down(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 24, 3, padding=1)
            self.norm = norm_cls(24, eps=1e-6, data_format="channels_first")
            self.down = torch.nn.Conv2d(24, 40, 2, stride=2)

        def forward(self, x):
            return self.down(self.norm(self.conv(x)))

    torch.manual_seed(2)
    model = Down().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(1, 3, 14, 10)
    assert _partition(model, x).regions == 1
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    with torch.no_grad():
        want = model(x).numpy()
    tvm.testing.assert_allclose(compiled.run([x.numpy()])["output_0"], want, rtol=1e-4, atol=1e-4)
    assert not compiled.report["offload"]["cpu"]
    assert np.abs(want).max() > 0.1


def test_channels_first_layer_norm_off_chip():
    """The pixel-rows views are aliases off chip too (a region whose values do not fit
    the mini SRAM runs by bands)."""
    norm_cls = transformers.models.convnext.modeling_convnext.ConvNextLayerNorm

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.norm = norm_cls(16, eps=1e-6, data_format="channels_first")
            self.out = torch.nn.Conv2d(16, 8, 1)

        def forward(self, x):
            return self.out(self.norm(self.conv(x)))

    torch.manual_seed(3)
    model = Block().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(1, 3, 72, 80)  # 16 x 72 x 80 fp32 values: 360 KiB each, the SRAM is 512 KiB
    compiled = lpx_tvm.from_torch(model, (x,), preset="mini", precision="fp32")
    with torch.no_grad():
        want = model(x).numpy()
    tvm.testing.assert_allclose(compiled.run([x.numpy()])["output_0"], want, rtol=1e-4, atol=1e-4)
    assert not compiled.report["offload"]["cpu"]

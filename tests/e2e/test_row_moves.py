"""Whole-row data movement on LPX, against torch: the patch flatten of an NCHW value
(an alias), concats and slices along axes other than the last (rows placed or picked,
constant operands included), and attention with rotary embeddings and repeated key /
value heads written out as transformers does, kept on (heads, seq, dim) values by
lpx.HeadsTo3D."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lpx_tvm  # noqa: E402
from lpx_tvm import pipeline  # noqa: E402
from lpx_tvm.frontends.torch import import_torch  # noqa: E402
from lpx_tvm.machine.config import load_config  # noqa: E402
from lpx_tvm.target.codegen import codegen_options  # noqa: E402


def _regions_and_cpu_ops(model, inputs, preset):
    mod = pipeline.canonicalize_model(import_torch(model, inputs).mod, "fp32")
    _, report = pipeline.partition(mod, load_config(preset), "fp32")
    return report.regions, [op.op for op in report.cpu_ops]


def _check(model, inputs, preset="tsp"):
    """One region, nothing on the CPU, and the fp32 result of torch."""
    model = model.eval()
    assert _regions_and_cpu_ops(model, inputs, preset) == (1, [])
    got = lpx_tvm.from_torch(model, inputs, preset=preset, precision="fp32").run([x.numpy() for x in inputs])
    with torch.no_grad():
        want = model(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for i, w in enumerate(want):
        np.testing.assert_allclose(got[f"output_{i}"], w.numpy(), rtol=1e-5, atol=1e-5)


class PatchTokens(torch.nn.Module):
    """A ViT embedding: patches by a strided conv, flatten(2).transpose(1, 2), a class
    token before them, position embeddings, then a linear layer."""

    def __init__(self, c=24, positions=True):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, c, 4, stride=4)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, c))
        self.pos = torch.nn.Parameter(torch.randn(1, 17, c)) if positions else None
        self.fc = torch.nn.Linear(c, 8)

    def forward(self, x):
        t = torch.cat([self.cls, self.patch(x).flatten(2).transpose(1, 2)], dim=1)
        return self.fc(t if self.pos is None else t + self.pos)


class Pixels(torch.nn.Module):
    """flatten(2).transpose(1, 2) of a batch of two images, a LayerNorm over channels."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 40, 3, padding=1)
        self.norm = torch.nn.LayerNorm(40)

    def forward(self, x):
        return self.norm(self.conv(x).flatten(2).transpose(1, 2))


class Rows(torch.nn.Module):
    """Concats and slices along the row axes of 3-D and 2-D values, with a constant."""

    def __init__(self):
        super().__init__()
        self.register_buffer("pad", torch.randn(2, 3, 20))

    def forward(self, x, y):  # x (2, 7, 20), y (2, 5, 20)
        a = torch.cat([x, self.pad, y], dim=1)  # (2, 15, 20): rows per batch
        b = torch.cat([a[:, 3:11], x[:, :2] * 2.0], dim=1)  # (2, 10, 20)
        c = torch.cat([b, b[1:]], dim=0)  # (3, 10, 20): whole batches
        flat = c.reshape(30, 20)
        return c * 0.5, torch.cat([flat[4:9], flat[25:]], dim=0)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryGQA(torch.nn.Module):
    """Causal attention with rotary embeddings and grouped-query heads, written with 4-D
    (1, heads, seq, dim) values as transformers writes Llama's."""

    def __init__(self, width=48, heads=4, kv_heads=2, seq=12):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, width // heads
        self.q = torch.nn.Linear(width, width)
        self.k = torch.nn.Linear(width, kv_heads * self.d)
        self.v = torch.nn.Linear(width, kv_heads * self.d)
        self.o = torch.nn.Linear(width, width)
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        angles = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat([angles, angles], dim=-1)[None, None]
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))

    def _heads(self, t, n):
        return t.view(1, -1, n, self.d).transpose(1, 2)

    def _repeat_kv(self, t):
        n = self.h // self.kv
        _, k, s, d = t.shape
        return t[:, :, None].expand(1, k, n, s, d).reshape(1, k * n, s, d)

    def forward(self, x):  # x (1, seq, width)
        q, k, v = self._heads(self.q(x), self.h), self._heads(self.k(x), self.kv), self._heads(self.v(x), self.kv)
        q = q * self.cos + _rotate_half(q) * self.sin
        k = k * self.cos + _rotate_half(k) * self.sin
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        p = torch.softmax(q @ k.transpose(-1, -2) / self.d ** 0.5 + self.mask, dim=-1)
        return self.o((p @ v).transpose(1, 2).reshape(1, -1, self.h * self.d))


def test_patch_tokens_class_token_concat():
    torch.manual_seed(0)
    _check(PatchTokens(), (torch.randn(1, 3, 16, 16),))


def test_flatten_of_two_images():
    torch.manual_seed(1)
    _check(Pixels(), (torch.randn(2, 3, 5, 6),))


@pytest.mark.parametrize("preset", ["mini", "tsp"])
def test_concats_and_slices_of_rows(preset):
    torch.manual_seed(2)
    _check(Rows(), (torch.randn(2, 7, 20), torch.randn(2, 5, 20)), preset)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1), (3, 3)])
def test_rotary_grouped_query_attention(heads, kv_heads):
    torch.manual_seed(3)
    _check(RotaryGQA(width=12 * heads, heads=heads, kv_heads=kv_heads), (torch.randn(1, 12, 12 * heads),))


class BigRows(torch.nn.Module):
    def forward(self, x, y):
        return torch.cat([x, y], dim=1)[:, 100:] * 2.0


def test_rows_larger_than_a_quarter_of_the_sram_stay_on_the_cpu():
    # (2, 640, 64) fp32 is 320 KiB of mini's 512 KiB: a concat of rows runs as one band,
    # so it stays on the CPU, with its reason; the slice of its result (270 KiB) too.
    x, y = torch.randn(2, 300, 64), torch.randn(2, 340, 64)
    mod = pipeline.canonicalize_model(import_torch(BigRows(), (x, y)).mod, "fp32")
    _, report = pipeline.partition(mod, load_config("mini"), "fp32")
    assert sorted(op.op for op in report.cpu_ops) == ["concat", "strided_slice"]
    assert all("larger than a quarter of the SRAM" in op.reason for op in report.cpu_ops)
    got = lpx_tvm.from_torch(BigRows(), (x, y), preset="mini", precision="fp32").run([x.numpy(), y.numpy()])
    np.testing.assert_allclose(got["output_0"], BigRows()(x, y).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model,inputs", [
    (PatchTokens(positions=False), (torch.randn(1, 3, 16, 16),)),
    (PatchTokens(positions=True), (torch.randn(1, 3, 16, 16),)),
    (Rows(), (torch.randn(2, 7, 20), torch.randn(2, 5, 20))),
], ids=["patch_tokens", "patch_tokens_positions", "rows"])
def test_row_moves_off_chip(model, inputs):
    """Compiled as if the activations overflowed the SRAM: the patch flatten stays an
    alias of the spilled image, row concats and slices run as one band each, and the
    position embeddings (a full-shape constant) are cut to each band's rows."""
    model = model.eval()
    with codegen_options(force_offchip=True):
        compiled = lpx_tvm.from_torch(model, inputs, preset="mini", precision="fp32")
    got = compiled.run([x.numpy() for x in inputs])
    with torch.no_grad():
        want = model(*inputs)
    for i, w in enumerate(want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(got[f"output_{i}"], w.numpy(), rtol=1e-5, atol=1e-5)
    assert compiled.report["offchip_bytes"] > 0

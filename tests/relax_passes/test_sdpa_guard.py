"""torch's scaled_dot_product_attention exports a guard after its softmax that zeroes
fully masked rows, ``where(not(any(z != -inf)), full_like(p, 0), p)``. lpx.Decompose
drops it when no row can be fully masked (no mask, or a causal one), so the attention
runs on LPX; the result still matches torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lpx_tvm  # noqa: E402
from lpx_tvm import pipeline  # noqa: E402
from lpx_tvm.frontends.torch import import_torch  # noqa: E402
from lpx_tvm.machine.config import load_config  # noqa: E402
from lpx_tvm.relax_passes._binding_rewrite import bindings, op_is  # noqa: E402

GUARD_OPS = ("relax.where", "relax.equal", "relax.logical_not", "relax.full_like")


class Sdpa(torch.nn.Module):
    def __init__(self, width=32, heads=4, causal=False):
        super().__init__()
        self.h, self.causal = heads, causal
        self.qkv = torch.nn.Linear(width, 3 * width)

    def forward(self, x):  # (1, s, width)
        q, k, v = (t.view(1, x.shape[1], self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return o.transpose(1, 2).reshape(x.shape)


def _guard_ops(mod):
    return [v for _, v in bindings(mod["main"]) if op_is(v, *GUARD_OPS)]


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_guard_is_dropped_and_attention_matches(causal):
    torch.manual_seed(0)
    model, x = Sdpa(causal=causal).eval(), torch.randn(1, 9, 32)
    imported = import_torch(model, (x,)).mod
    assert _guard_ops(imported), "the export no longer writes the guard: this test checks nothing"
    mod = pipeline.canonicalize_model(imported, "fp32")
    assert not _guard_ops(mod)
    _, report = pipeline.partition(mod, load_config("tsp"), "fp32")
    assert (report.regions, report.cpu_ops) == (1, [])
    got = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32").run([x.numpy()])["output_0"]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)

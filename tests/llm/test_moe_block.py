"""A sparse mixture-of-experts MLP for one token on LPX (docs/moe.md): the router's top-k
and the chosen experts' SwiGLU, compiled from ``RoutedExperts`` built from transformers'
own Mixtral and Qwen3-MoE blocks (random weights, odd sizes), against those blocks; every
op on LPX, and one cycle count whichever experts a token picks."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import lpx_tvm  # noqa: E402
from lpx_tvm.frontends.moe_modules import RoutedExperts  # noqa: E402


def mixtral_block(experts, top_k):
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    cfg = transformers.MixtralConfig(hidden_size=48, intermediate_size=80, num_local_experts=experts,
                                     num_experts_per_tok=top_k)
    return MixtralSparseMoeBlock(cfg)


def qwen3_block(experts, top_k, normalize):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    cfg = transformers.Qwen3MoeConfig(hidden_size=48, moe_intermediate_size=40, num_experts=experts,
                                      num_experts_per_tok=top_k, norm_topk_prob=normalize)
    return Qwen3MoeSparseMoeBlock(cfg)


def randomized(block, seed=0):
    """The block with seeded random weights (transformers leaves them uninitialized)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return block.eval()


@pytest.mark.parametrize("name, make", [
    ("mixtral, top-2 of 5", lambda: mixtral_block(5, 2)),
    ("qwen3-moe, top-3 of 7, normalized", lambda: qwen3_block(7, 3, True)),
    ("qwen3-moe, top-3 of 7, not normalized", lambda: qwen3_block(7, 3, False)),
])
def test_routed_experts_match_transformers(name, make):
    block = randomized(make())
    routed = RoutedExperts.from_block(block).eval()
    rows = [torch.randn(1, 48, generator=torch.Generator().manual_seed(s)) for s in range(8)]
    compiled = lpx_tvm.from_torch(routed, (rows[0],), preset="tsp", precision="fp32")
    offload = compiled.report["offload"]
    assert not offload["cpu"], offload
    assert offload["composites"].get("lpx.expert_dense") == 3 * routed.top_k, offload["composites"]
    routes, cycles = set(), set()
    for h in rows:
        out = compiled.run([h.numpy()])
        with torch.no_grad():
            want = block(h.reshape(1, 1, 48)).reshape(1, 48).numpy()
            _, _, top = block.gate(h)
        picked = tuple(int(out[f"output_{j + 1}"][0]) for j in range(routed.top_k))
        assert picked == tuple(top[0].tolist()), f"{name}: experts {picked}, transformers {top[0].tolist()}"
        np.testing.assert_allclose(out["output_0"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        routes.add(picked)
        cycles.add(compiled.report["cycles"])
    assert len(routes) > 1, "the rows route to different experts"
    assert len(cycles) == 1, f"{name}: cycles differ by route: {cycles}"


def test_routed_experts_refuse_what_they_do_not_run():
    from lpx_tvm.relax_passes.errors import ModelError

    block = randomized(mixtral_block(3, 2))
    routed = RoutedExperts.from_block(block)
    with pytest.raises(ModelError, match="one token's row"):
        routed(torch.randn(2, 48))
    e = block.experts
    with pytest.raises(ModelError, match="top-4 of 3 experts"):
        RoutedExperts(block.gate.weight, e.gate_up_proj, e.down_proj, 4, True, e.act_fn)
    with pytest.raises(ModelError, match="expected"):
        RoutedExperts(block.gate.weight[:, :40], e.gate_up_proj, e.down_proj, 2, True, e.act_fn)

"""A product by the expert a router picks on chip (docs/moe.md): ``x @ W[e]`` with ``e``
the argmax of a gate product, compiled from torch, against torch; the chosen expert's
weights installed through gathers, with the same cycles whichever expert is chosen."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lpx_tvm  # noqa: E402


class ChosenExpert(torch.nn.Module):
    """A router's pick (the argmax of ``x @ gate``) and that expert's product."""

    def __init__(self, experts, k, n, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.gate = torch.nn.Parameter(torch.randn(k, experts, generator=g))
        self.experts = torch.nn.Parameter(torch.randn(experts, k, n, generator=g) / k ** 0.5)

    def forward(self, x):
        e = (x @ self.gate).argmax(-1).to(torch.int32)  # [1]
        return x @ torch.index_select(self.experts, 0, e).reshape(self.experts.shape[1:]), e


def inputs_for_each_expert(model, k, tries=400):
    """One input row per expert the router picks for some row (seeded search)."""
    rng = np.random.default_rng(1)
    found = {}
    for _ in range(tries):
        x = rng.standard_normal((1, k)).astype(np.float32)
        e = int(model(torch.from_numpy(x))[1])
        found.setdefault(e, x)
    return found


@pytest.mark.parametrize("preset, precision, experts, k, n", [
    ("tsp", "fp32", 5, 64, 48),       # one tile; fp32: four install lanes
    ("tsp", "fp16", 3, 400, 700),     # two row tiles (accumulated), three column tiles on three planes
    ("lp30", "fp32", 7, 96, 330),     # seven experts, a short second column tile
])
def test_each_expert_matches_torch_in_the_same_cycles(preset, precision, experts, k, n):
    model = ChosenExpert(experts, k, n).eval()
    xs = inputs_for_each_expert(model, k)
    assert len(xs) >= 2, "the router picks more than one expert"
    x0 = next(iter(xs.values()))
    compiled = lpx_tvm.from_torch(model, (torch.from_numpy(x0),), preset=preset, precision=precision)
    offload = compiled.report["offload"]
    assert offload["composites"].get("lpx.expert_dense") == 1 and not offload["cpu"], offload
    instrs = [i for r in compiled.executable.regions.values() for i in r.program.instrs]
    gathers = [i for i in instrs if i.op == "mem.gather"]
    installs = [i for i in instrs if i.op == "mxm.install" and i.tag in {g.tag for g in gathers}]
    assert gathers and len(installs) == len(gathers), "every expert row comes through a gather"
    cycles = set()
    for e, x in xs.items():
        out = compiled.run([x])
        assert int(out["output_1"][0]) == e
        want = model(torch.from_numpy(x))[0].detach().numpy()
        tol = 1e-5 if precision == "fp32" else 2e-2
        np.testing.assert_allclose(out["output_0"], want, rtol=tol, atol=tol * np.abs(want).max())
        cycles.add(compiled.report["cycles"])
    assert len(cycles) == 1, f"cycles differ by route: {cycles}"


def test_a_stack_taken_along_another_axis_stays_on_the_cpu():
    class Sideways(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(16, 3, 16, generator=torch.Generator().manual_seed(2)))

        def forward(self, x):
            e = x.argmax(-1).to(torch.int32) % 3
            return x @ torch.index_select(self.w, 1, e).reshape(16, 16)

    model, x = Sideways().eval(), torch.randn(1, 16, generator=torch.Generator().manual_seed(3))
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    offload = compiled.report["offload"]
    assert "lpx.expert_dense" not in offload["composites"] and "take" in offload["cpu"], offload
    want = model(x).detach().numpy()
    np.testing.assert_allclose(compiled.run([x.numpy()])["output_0"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

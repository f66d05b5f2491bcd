"""An all-reduce inside each chip's compiled program: a dense layer split by rows of its
weight over the chips of a group (tensor parallelism's o and down projections), each
chip's partial product summed over the links by ``lpx.all_reduce``, run on the system
simulator against torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lpx_tvm  # noqa: E402
from lpx_tvm.frontends.torch_collectives import all_reduce  # noqa: E402
from lpx_tvm.frontends.torch import import_torch  # noqa: E402
from lpx_tvm.machine.system import load_system  # noqa: E402
from lpx_tvm.pipeline import lower  # noqa: E402
from lpx_tvm.sim.multichip import SystemSimulator  # noqa: E402
from lpx_tvm.target.codegen.graph import UnsupportedOnLPX  # noqa: E402
from lpx_tvm.target.codegen.interface import ProgramInterface  # noqa: E402
from lpx_tvm.target.system_programs import build_together  # noqa: E402


class RowShard(torch.nn.Module):
    """Rows ``a:b`` of a dense layer's weight: its partial product, summed over the group,
    plus the bias (on every chip, after the sum)."""

    def __init__(self, w, b):
        super().__init__()
        self.register_buffer("w", w)
        self.register_buffer("b", b)

    def forward(self, x):
        return all_reduce(x @ self.w) + self.b


def _compile(system, chips, modules, inputs, precision="fp32"):
    imported = {c: import_torch(modules[c], (inputs[c],)) for c in chips}
    regions = {}

    def build(c, place):
        _, found, offload = lower(imported[c].mod, system.config, precision, interface=ProgramInterface(chip=place))
        assert len(found) == 1 and not (offload and offload.cpu), offload
        (regions[c],) = found.values()
        return regions[c].program

    programs, transfers = build_together(system, chips, build)
    return programs, transfers, regions


@pytest.mark.parametrize("chips", [(0, 1), (0, 1, 2, 3)])
def test_row_split_dense_summed_on_chip(chips):
    system = load_system("groqnode")
    g = torch.Generator().manual_seed(0)
    K, N, M = 64 * len(chips), 700, 3  # N: three column tiles, 9 vectors to all-reduce
    W, B, X = torch.randn(K, N, generator=g), torch.randn(N, generator=g), torch.randn(M, K, generator=g)
    cut = K // len(chips)
    modules = {c: RowShard(W[k * cut:(k + 1) * cut].contiguous(), B) for k, c in enumerate(chips)}
    xs = {c: X[:, k * cut:(k + 1) * cut].contiguous() for k, c in enumerate(chips)}
    programs, transfers, regions = _compile(system, chips, modules, xs)
    # Every chip sends its N - 1 shards and its reduced shard to every peer.
    n = len(chips)
    assert sum(t.vectors for t in transfers) == 2 * (n - 1) * M * 3
    r = SystemSimulator(system).run(programs, {c: {name: xs[c].numpy() for name, _ in regions[c].inputs}
                                                for c in chips})
    outs = [next(iter(r.chips[c].outputs.values())) for c in chips]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])  # the same sum on every chip, bit for bit
    want = (X.double() @ W.double() + B.double()).numpy()
    partial_bound = 2 * K * 2.0**-24 * (X.abs().double() @ W.abs().double()).numpy()  # fp32 sums, any order
    assert np.all(np.abs(outs[0] - want) <= partial_bound + 1e-6)
    assert not np.allclose(outs[0], (xs[chips[0]] @ modules[chips[0]].w + B).numpy())  # not one chip's share
    t = SystemSimulator(system).run(programs, timing_only=True)
    assert t.cycles == r.cycles
    # Two link latencies at least (the reduce-scatter, then the all-gather).
    assert r.cycles > 2 * system.config.c2c_latency


def test_all_reduce_needs_a_system():
    class Alone(torch.nn.Module):
        def forward(self, x):
            return all_reduce(x * 2.0)

    with pytest.raises(UnsupportedOnLPX, match="a program of one chip has no peers to sum with"):
        lpx_tvm.from_torch(Alone(), (torch.randn(2, 40),), preset="tsp", precision="fp32")
    assert torch.equal(all_reduce(torch.ones(3)), torch.ones(3))  # in torch, a group of one

"""A concat along the lanes places two pieces of an output tile per group, one through
each SXM, and adds them: a tile of h pieces is a chain of ceil(h / 2) groups (each after
the last, which it reads back), not h. Counted by hand, and checked against torch."""

import collections

import numpy as np
import pytest
import torch

import lpx_tvm

ROWS, WIDTH = 2, 64  # each piece 64 lanes: up to five share one 320-lane tile on tsp


class Pieces(torch.nn.Module):
    """``n`` different values of x concatenated along the lanes."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        return torch.cat([x * (i + 1.5) - i for i in range(self.n)], dim=1)


@pytest.mark.parametrize("pieces, groups", [(4, 2), (5, 3)])
def test_two_pieces_a_group(pieces, groups):
    torch.manual_seed(0)
    model, x = Pieces(pieces).eval(), torch.randn(ROWS, WIDTH)
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    with torch.no_grad():
        np.testing.assert_array_equal(got, model(x).numpy())  # disjoint lanes added to zeros: exact
    (region,) = compiled.executable.regions.values()
    concat = [i for i in region.program.instrs if i.tag.endswith(".concat")]
    writes = [i for i in concat if i.op == "mem.write"]
    permutes = collections.Counter(i.unit for i in concat if i.op == "sxm.permute")
    # One write a group (both rows in one run); each full pair through SXM 0 and SXM 1,
    # an odd last piece through the SXM nearest its slice.
    assert len(writes) == groups
    assert sum(permutes.values()) == pieces and permutes[0] >= pieces // 2 and permutes[1] >= pieces // 2


class Heads(torch.nn.Module):
    """Lane slices of two values concatenated (a decode step's heads cut from p @ V)."""

    def forward(self, x):
        a, b = x * 1.5, x - 2.0
        return torch.cat([a[:, 0:64], b[:, 64:128], a[:, 192:256], b[:, 256:320], a[:, 300:340]], dim=1)


def test_slices_placed_straight_from_their_sources():
    torch.manual_seed(1)
    model, x = Heads().eval(), torch.randn(ROWS, 400)
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    with torch.no_grad():
        np.testing.assert_array_equal(got, model(x).numpy())
    (region,) = compiled.executable.regions.values()
    permutes = [i for i in region.program.instrs if i.op == "sxm.permute"]
    # No slice of its own: one permute a piece, and the last slice's 40 lanes span two of
    # its source's tiles (300..320 and 320..340): six pieces, all in the output's first
    # 296 lanes (one tile).
    assert all(i.tag.endswith(".concat") for i in permutes) and len(permutes) == 6

"""Softmax and the norms in as few passes over their rows as the VXM allows: each pass is a
read, a trip to the VXM and a write, a step of a decode step's chain of dependent ops.
Counted by hand from the lowerings, and checked against torch."""

import collections

import numpy as np
import pytest
import torch

import lpx_tvm

ROWS, COLS = 2, 700  # three lane tiles on tsp (320, 320 and 60 lanes)


class RowOp(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x):
        return self.op(x * 1.5)


def _writes_by_pass(compiled) -> collections.Counter:
    """How many SRAM writes each pass kind (the last part of its group's tag) issues."""
    (region,) = compiled.executable.regions.values()
    return collections.Counter(i.tag.rsplit(".", 1)[-1] for i in region.program.instrs if i.op == "mem.write")


def _compiled(op):
    torch.manual_seed(0)
    model, x = RowOp(op).eval(), torch.randn(ROWS, COLS) * 3
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)
    return _writes_by_pass(compiled)


def test_softmax_writes_its_reciprocal_in_the_sum_pass():
    writes = _compiled(torch.nn.Softmax(dim=-1))
    # max: one pass over the three tiles (one write); exp: a group a tile, each writing its
    # exp(x - max) and the running sum (6), the last the sum's reciprocal; scale: 3.
    assert writes["max"] == 1 and writes["exp"] == 6 and writes["scale"] == 3
    assert "sum" not in writes


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_a_norm_scales_each_tile_in_one_pass(norm):
    gamma = torch.rand(COLS) + 0.5
    if norm == "rms":
        op = torch.nn.RMSNorm(COLS, eps=1e-6)
        with torch.no_grad():
            op.weight.copy_(gamma)
    else:
        op = torch.nn.LayerNorm(COLS)
        with torch.no_grad():
            op.weight.copy_(gamma)
            op.bias.copy_(torch.rand(COLS) - 0.5)
    writes = _compiled(op)
    # var: a group a tile, each writing its centered values and the running sum of squares
    # (6), the last 1 / sqrt(var + eps); affine: one pass a tile, x * that * gamma (+ beta).
    assert writes["var"] == 6 and writes["affine"] == 3
    assert ("mean" in writes) == (norm == "layer")


def test_a_wide_row_reduces_in_chains_side_by_side():
    """A norm over 10 lane tiles: its sum of squares runs as 4 chains of groups, each into
    an accumulator of its own, and a last group combining them (a chain of 3 groups and
    the combine, not 10)."""
    torch.manual_seed(0)
    cols = 3000  # 9 whole lane tiles and one of 120 lanes on tsp
    op = torch.nn.RMSNorm(cols, eps=1e-6)
    with torch.no_grad():
        op.weight.copy_(torch.rand(cols) + 0.5)
    model, x = RowOp(op).eval(), torch.randn(ROWS, cols) * 3
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)
    (region,) = compiled.executable.regions.values()
    var = [i for i in region.program.instrs if i.tag.endswith(".var")]
    # Each tile's group writes its x (kept) and its chain's sum so far (20 writes), the
    # combine 1 / sqrt of the mean (1). One chain of 10 wrote 20. Reads: the 10 tiles, the
    # sums so far by the 6 groups after each chain's first, and the 4 by the combine.
    assert sum(i.op == "mem.write" for i in var) == 21
    assert sum(i.op == "mem.read" for i in var) == 20
    assert sum(i.op == "vxm.rsqrt" for i in var) == 1

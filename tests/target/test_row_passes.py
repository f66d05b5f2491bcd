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
    # max: one pass over the three tiles (one write); exp: a group for the two whole tiles
    # (the max read once for both, the tiles summed lane by lane, one reduction) and one
    # for the partial tile, each writing its exp(x - max) tiles and the running sum
    # (3 + 2), the last the sum's reciprocal; scale: 3.
    assert writes["max"] == 1 and writes["exp"] == 5 and writes["scale"] == 3
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
    # var: a group for the two whole tiles and one for the partial tile, each writing its
    # centered values and the running sum of squares (3 + 2), the last 1 / sqrt(var +
    # eps); affine: one pass a tile, x * that * gamma (+ beta).
    assert writes["var"] == 5 and writes["affine"] == 3
    assert ("mean" in writes) == (norm == "layer")


def test_a_long_softmax_sums_its_tiles_two_to_a_pass():
    """A 4k decode step's scores row (13 lane tiles): the running sum goes through SRAM
    once per run of two whole tiles, not once per tile, and the result still matches
    torch's."""
    torch.manual_seed(1)
    model, x = RowOp(torch.nn.Softmax(dim=-1)).eval(), torch.randn(3, 4000) * 3
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-6)
    writes = _writes_by_pass(compiled)
    # 13 exp tiles written; the 12 whole tiles in six runs of two (on distinct slices
    # here) and the partial tile alone: 7 running sums, where a group a tile wrote 13.
    assert writes["exp"] == 13 + 7


class SoftmaxOfSum(torch.nn.Module):
    def forward(self, a, b):
        return torch.softmax(a * 1.5 + b * 0.5, dim=-1)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("cols", [300, COLS])
def test_softmax_of_a_sum_reads_the_add_in_its_passes(precision, cols):
    """``softmax(a + b)`` (a decode step's scores: ``q @ cache`` plus the new key's) is one
    composite: a row of one lane tile has no pass of its own for the add; a longer row is
    added first, then a softmax's passes."""
    torch.manual_seed(1)
    a, b = torch.randn(ROWS, cols) * 3, torch.randn(ROWS, cols) * 3
    b[0, 5] = 40.0  # a row maximum set by b alone
    compiled = lpx_tvm.from_torch(SoftmaxOfSum().eval(), (a, b), preset="tsp", precision=precision)
    got = compiled.run([a.numpy(), b.numpy()])["output_0"]
    with torch.no_grad():
        want = SoftmaxOfSum()(a, b).numpy()
    tol = dict(rtol=1e-4, atol=1e-6) if precision == "fp32" else dict(rtol=2e-2, atol=1e-3)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, **tol)
    writes = _writes_by_pass(compiled)  # by the last part of a group's tag
    if cols == 300:  # max 1; exp: the tile's exp(x - max) and the sum's reciprocal; scale 1
        assert "add" not in writes
        assert writes["max"] == 1 and writes["exp"] == 2 and writes["scale"] == 1
    else:  # the add's 3 tiles, then as test_softmax_writes_its_reciprocal_in_the_sum_pass
        assert writes["add"] == 3
        if precision == "fp32":  # (the sum's tiles on three slices)
            assert writes["max"] == 1 and writes["exp"] == 5 and writes["scale"] == 3

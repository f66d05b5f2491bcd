"""A slice of the last axis that starts on a lane tile is that value's tiles, seen as a
value of its own: no lane moves, and the lines stay held while the view is read (a
SwiGLU's gate and up cut from one projection, docs/llm.md). Checked against torch."""

import numpy as np
import torch

import lpx_tvm


class TileSlices(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 700, bias=False)
        self.other = torch.nn.Linear(64, 960, bias=False)

    def forward(self, x):
        y = self.proj(x)  # three lane tiles on tsp: 320, 320, 60
        head, tail, mid = y[:, :320], y[:, 320:], y[:, 100:420]
        # Working space made while the views are live: it must not take their lines.
        z = torch.relu(self.other(x)) * 3.0
        return torch.sigmoid(head) * z[:, :320], tail * 2.0, mid + 1.0, z


def test_slices_from_a_tile_are_views_held_while_read():
    torch.manual_seed(0)
    model, x = TileSlices().eval(), torch.randn(6, 64)
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])
    with torch.no_grad():
        want = model(x)
    for name, w in zip(sorted(got), want):  # output_0 .. output_3
        np.testing.assert_allclose(got[name], w.numpy(), rtol=1e-5, atol=1e-5)
    (region,) = compiled.executable.regions.values()
    moved = {i.tag.rsplit(".", 1)[0] for i in region.program.instrs if i.tag.endswith(".slice")}
    # Of the four slices, only y[:, 100:420] (not from a tile's first lane) moves lanes.
    assert len(moved) == 1, moved

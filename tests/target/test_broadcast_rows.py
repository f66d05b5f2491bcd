"""``broadcast_to`` of one row along the leading axes (a decode step's new key columns,
one row per head dimension): the row read again each cycle and written as a run, on
LPX; checked against torch."""

import collections

import numpy as np
import torch

import lpx_tvm


class Rows(torch.nn.Module):
    def forward(self, x, y):
        return (x * 2.0).expand(y.shape[0], -1) * y


def test_a_row_repeated_down_the_rows():
    torch.manual_seed(0)
    x, y = torch.randn(1, 400), torch.randn(700, 400)
    compiled = lpx_tvm.from_torch(Rows().eval(), (x, y), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy(), y.numpy()])["output_0"]
    with torch.no_grad():
        np.testing.assert_array_equal(got, Rows()(x, y).numpy())
    (region,) = compiled.executable.regions.values()  # one LPX region: nothing left on the CPU
    writes = collections.Counter(i.tag.rsplit(".", 1)[-1] for i in region.program.instrs if i.op == "mem.write")
    assert writes["broadcast_rows"] == 2  # a write per lane tile: the 700 rows are one run

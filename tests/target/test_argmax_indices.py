"""An argmax's second pass reads its lane tiles several to a group, with the row maximum,
the running result and one row of a vector's lane indices, each through its own slice's
port. Lane indices placed on the running result's slice (as a batch-16 decode step's
happened to be) are read from a copy clear of them, and the indices still match numpy's
argmax, first index on ties, within a group and across groups."""

import numpy as np
import torch

import lpx_tvm
from lpx_tvm.machine.isa import DType
from lpx_tvm.target.codegen.lowerings import argmax as argmax_lowering


class FirstMax(torch.nn.Module):
    def forward(self, x):
        return (x * 1.5).argmax(-1, keepdim=True).to(torch.int32)


def test_lane_indices_on_a_slice_the_group_reads_are_copied_apart(monkeypatch):
    cols = 700  # three lane tiles on tsp

    def on_the_running_result(ctx, n):
        # The last temp lower_argmax made before asking for the indices: the running result.
        slice_ = ctx.scratch[-1].layout.tiles[0][0]
        return ctx.builder.constant(f"iota{n}", np.arange(n, dtype=np.float32)[None, :], DType.FP32,
                                    slices=[slice_])

    monkeypatch.setattr(argmax_lowering, "iota_vector", on_the_running_result)
    x = torch.randn(4, cols, generator=torch.Generator().manual_seed(3))
    x[1, 650] = x[1, 10] = 9.0  # a tie: the first index wins
    compiled = lpx_tvm.from_torch(FirstMax().eval(), (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    np.testing.assert_array_equal(got.reshape(-1), np.argmax(x.numpy() * 1.5, axis=-1))
    (region,) = compiled.executable.regions.values()
    assert any(i.tag.endswith(".iota.copy") for i in region.program.instrs)


def test_first_index_several_tiles_a_group():
    cols = 2_000  # six whole lane tiles on tsp and a partial one
    x = torch.randn(5, cols, generator=torch.Generator().manual_seed(4))
    x[0, 1_999] = 9.0  # in the partial tile
    x[1, 330] = x[1, 1_300] = 9.0  # tiles 1 and 4: a tie across groups of four
    x[2, 321] = x[2, 645] = x[2, 900] = 9.0  # tiles 1, 2 and 2: a tie within a group, within a tile
    x[3, 0] = x[3, 1_919] = 9.0  # the first lane of all and the last whole tile's last lane
    x[4] = 1.0  # every lane a maximum
    compiled = lpx_tvm.from_torch(FirstMax().eval(), (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    np.testing.assert_array_equal(got.reshape(-1), [1_999, 330, 321, 0, 0])
    np.testing.assert_array_equal(got.reshape(-1), np.argmax(x.numpy() * 1.5, axis=-1))
    (region,) = compiled.executable.regions.values()
    # A reduction across lanes a group (the whole tiles combined first) and one for the
    # partial tile: 4 + 2 whole tiles and the partial one are three groups, not seven.
    reductions = [i for i in region.program.instrs if i.tag.endswith(".first") and i.op == "vxm.reduce_max"]
    assert len(reductions) == 3

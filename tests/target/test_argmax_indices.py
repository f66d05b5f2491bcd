"""An argmax's second pass reads, for each lane tile, the tile, the row maximum, the running
result and the tile's lane indices in one group, each through its own slice's port. Lane
indices placed on the running result's slice (as a batch-16 decode step's happened to be)
are read from a copy clear of them, and the indices still match numpy's argmax."""

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
                                    slices=[slice_] * 3)

    monkeypatch.setattr(argmax_lowering, "iota_vector", on_the_running_result)
    x = torch.randn(4, cols, generator=torch.Generator().manual_seed(3))
    x[1, 650] = x[1, 10] = 9.0  # a tie: the first index wins
    compiled = lpx_tvm.from_torch(FirstMax().eval(), (x,), preset="tsp", precision="fp32")
    got = compiled.run([x.numpy()])["output_0"]
    np.testing.assert_array_equal(got.reshape(-1), np.argmax(x.numpy() * 1.5, axis=-1))
    (region,) = compiled.executable.regions.values()
    assert any(i.tag.endswith(".iota.copy") for i in region.program.instrs)

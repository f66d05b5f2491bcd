"""A gather table that no slice still has room for whole (a batch's key caches take a part
of every slice): cut into chunks on several slices, each between spare rows of zeros, one
gather a chunk with the indices made local to it, the chunks' rows summed. Checked against
numpy, with the gathers counted by hand."""

import numpy as np
import pytest
import torch

import lpx_tvm
from lpx_tvm.target.sram_alloc import SramAllocator

ROWS, COLS = 1024, 40  # fp32 on mini: 4 lines a row, a whole slice's 4,096 lines; 3 lane tiles of 16


class Lookup(torch.nn.Module):
    def __init__(self, table):
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, idx):
        return self.table.index_select(0, idx)


def _gathers(compiled) -> int:
    (region,) = compiled.executable.regions.values()
    return sum(i.op == "mem.gather" for i in region.program.instrs)


@pytest.mark.parametrize("room", [True, False])
def test_a_table_in_chunks_gathers_the_rows_numpy_does(monkeypatch, room):
    if not room:  # as if every slice were partly taken: the table cannot sit in one
        monkeypatch.setattr(SramAllocator, "constant_fits", lambda self, lines: False)
    table = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(0))
    # Rows at both ends of each half (the chunks: 1024 rows and a spare row each side do
    # not fit a slice, so two of 512) and some between.
    idx = torch.tensor([0, 511, 512, 1023, 7, 600, 511, 3], dtype=torch.int32)
    compiled = lpx_tvm.from_torch(Lookup(table).eval(), (idx,), preset="mini", precision="fp32")
    got = compiled.run([idx.numpy()])["output_0"]
    np.testing.assert_array_equal(got, table.numpy()[idx.numpy()])
    # One gather a lane tile (3), and a chunk (x2) when the table is cut.
    assert _gathers(compiled) == (3 if room else 6)

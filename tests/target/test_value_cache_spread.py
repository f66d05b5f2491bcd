"""A value cache spread over slices (docs/llm.md): ``index_put`` of rows at runtime
indices into an input laid out in chunks, one scatter a chunk with the indices made
local to it, the rows other chunks hold sent to a spare row; then ``p @ cache`` installs
the chunks through as many slices at once. Checked against numpy and torch."""

import collections

import numpy as np
import torch

import lpx_tvm


class CacheStep(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.register_buffer("cols", torch.arange(width, dtype=torch.int32)[None, :])

    def forward(self, cache, rows, v, p):
        new = torch.ops.aten.index_put(cache, [rows, self.cols], v)
        return p @ new, new


def test_rows_at_the_chunks_edges_land_and_the_product_reads_them():
    rng = np.random.default_rng(0)
    n, d = 700, 64
    cache = rng.standard_normal((n, d)).astype(np.float32)
    # The first and last rows of chunks (80 rows each at fp32: 320 / 4 install lanes) and
    # the cache's last row, written at once.
    rows = np.array([[0], [79], [80], [399], [699]], np.int32)
    v = rng.standard_normal((len(rows), d)).astype(np.float32)
    p = rng.standard_normal((3, n)).astype(np.float32)
    args = [torch.from_numpy(a) for a in (cache, rows, v, p)]
    compiled = lpx_tvm.from_torch(CacheStep(d).eval(), tuple(args), preset="tsp", precision="fp32")
    got = compiled.run([cache, rows, v, p])
    want = cache.copy()
    want[rows[:, 0]] = v
    np.testing.assert_array_equal(got["output_1"], want)
    with torch.no_grad():
        ref = CacheStep(d)(*args)[0].numpy()
    np.testing.assert_allclose(got["output_0"], ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ref, p @ want, rtol=1e-5, atol=1e-4)

    (region,) = compiled.executable.regions.values()
    prog = region.program
    (binding,) = [b for b in prog.bindings if b.role == "input" and b.layout.shape == (n, d)]
    lay = binding.layout
    assert (lay.chunk_rows, lay.nchunks, lay.margin) == (80, 9, 1)
    assert len({sl for sl, _ in lay.tiles}) == 4  # one slice per fp32 install lane
    ops = collections.Counter(i.op for i in prog.instrs)
    assert ops["mem.scatter"] == 9  # one a chunk, each of the 5 rows
    # A tile of 320 rows is 4 chunks on 4 slices, installed through 4 lanes of 80 rows
    # each; the last tile's 60 rows (one chunk) cut into 4 parts of 15.
    installs = [i for i in prog.instrs if i.op == "mxm.install"]
    assert sorted(i.count for i in installs) == [15] * 4 + [80] * 8


def test_a_row_index_outside_every_chunk_but_one_goes_to_spare_rows_only():
    """Every chunk but the row's own receives the row in a spare row: the cache's other
    rows are exactly as they were, over many single-row writes."""
    rng = np.random.default_rng(1)
    n, d = 330, 40
    cache = rng.standard_normal((n, d)).astype(np.float32)
    p = np.ones((1, n), np.float32)
    compiled = None
    for r in (0, 81, 164, 329):
        rows = np.array([[r]], np.int32)
        v = rng.standard_normal((1, d)).astype(np.float32)
        if compiled is None:
            args = tuple(torch.from_numpy(a) for a in (cache, rows, v, p))
            compiled = lpx_tvm.from_torch(CacheStep(d).eval(), args, preset="tsp", precision="fp32")
        got = compiled.run([cache, rows, v, p])
        cache = cache.copy()
        cache[r] = v[0]
        np.testing.assert_array_equal(got["output_1"], cache)
        np.testing.assert_allclose(got["output_0"], cache.sum(0, keepdims=True), rtol=1e-5, atol=1e-4)


def test_a_cache_too_long_for_the_install_lanes_slices_spreads_over_more():
    """On ``mini`` (16 lanes, 8 slices of 4,096 lines, 2 install lanes for fp16): 4,000
    rows in chunks of 8 with their spare rows take 20 lines a chunk, 500 chunks: 10,000
    lines over 2 slices would overflow them, so the chunks go over 4 (2,500 lines each)."""
    rng = np.random.default_rng(2)
    n, d = 4000, 16
    cache = rng.standard_normal((n, d)).astype(np.float16).astype(np.float32)
    rows = np.array([[7], [8], [3999]], np.int32)
    v = rng.standard_normal((len(rows), d)).astype(np.float16).astype(np.float32)
    p = (rng.standard_normal((1, n)) / 64).astype(np.float16).astype(np.float32)
    args = tuple(torch.from_numpy(a) for a in (cache, rows, v, p))
    compiled = lpx_tvm.from_torch(CacheStep(d).eval(), args, preset="mini", precision="fp16")
    got = compiled.run([cache, rows, v, p])
    want = cache.copy()
    want[rows[:, 0]] = v
    np.testing.assert_array_equal(got["output_1"], want)
    np.testing.assert_allclose(got["output_0"], p @ want, rtol=2e-2, atol=2e-2)
    (region,) = compiled.executable.regions.values()
    (binding,) = [b for b in region.program.bindings if b.role == "input" and b.layout.shape == (n, d)]
    assert (binding.layout.chunk_rows, binding.layout.nchunks) == (8, 500)
    assert len({sl for sl, _ in binding.layout.tiles}) == 4

"""A prefill's tall values (a row per token) kept where the planes read them side by side
(docs/compiler.md, "Tall values"): attention's probabilities and products cut into a row
chunk per plane, its runtime matrix laid out for the install lanes. Checked against
torch, with the layouts. (A product's input keeping its column tiles apart:
tests/target/test_sram_alloc.py.)"""

import numpy as np
import torch

import lpx_tvm


class Attention(torch.nn.Module):
    def forward(self, scores, v):
        return torch.softmax(scores, -1) @ torch.relu(v)


def _compile(model, inputs):
    compiled = lpx_tvm.from_torch(model, inputs, preset="tsp", precision="fp16")
    got = compiled.run([t.numpy() for t in inputs])
    with torch.no_grad():
        want = model(*inputs)
    np.testing.assert_allclose(next(iter(got.values())), want.numpy(), rtol=2e-2, atol=2e-2)
    (region,) = compiled.executable.regions.values()
    return region.program


def _layouts(program, shape):
    """The layouts of the values of ``shape`` the program makes (not its inputs)."""
    bound = {b.name for b in program.bindings}
    return [s for n, s in program.symbols.items()
            if n not in bound and isinstance(s, dict) and s.get("shape") == list(shape)]


def test_attention_rows_are_cut_a_chunk_per_plane_and_its_matrix_laid_out_for_installs():
    torch.manual_seed(1)
    scores, v = torch.randn(512, 256), torch.randn(256, 256)
    program = _compile(Attention().eval(), (scores, v))
    # softmax(scores) (multiplied by a runtime matrix, fp16) and the product (drained by
    # the planes), one lane tile each: a row chunk of 512 / 4 = 128 rows per plane, each
    # chunk on its own slice. (The softmax's fp32 exponents, read by its own passes only,
    # keep one chunk.)
    (p,) = [s for s in _layouts(program, (512, 256)) if s["dtype"] == "fp16"]
    (out,) = [b.layout for b in program.bindings if b.role == "output"]
    for chunk_rows, tiles in ((p.get("chunk_rows"), p["tiles"]), (out.chunk_rows, out.tiles)):
        slices = [sl for sl, _ in tiles]
        assert chunk_rows == 128 and len(slices) == 4 and len(set(slices)) == 4, tiles
    # relu(v), installed as the product's matrix: its 256 rows cut into a chunk per fp16
    # install lane (256 / 8 = 32 rows: 8 chunks), on distinct slices, which the 8 lanes
    # then read at once.
    (matrix,) = _layouts(program, (256, 256))
    slices = [sl for sl, _ in matrix["tiles"]]
    assert matrix.get("chunk_rows") == 32 and len(slices) == 8 and len(set(slices)) == 8, matrix

"""The ops of a decoder step on LPX, against torch: greedy argmax, gathers of table rows by runtime int32 indices, int32 index arithmetic, a mask and RoPE at a runtime position."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lpx_tvm  # noqa: E402


class NextToken(torch.nn.Module):
    """A last projection to the vocabulary, then its argmax (a decoder's greedy pick)."""

    def __init__(self, hidden, vocab):
        super().__init__()
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, x):
        logits = self.head(x)
        return logits.argmax(-1, keepdim=True).to(torch.int32), logits


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("rows, vocab", [(1, 700), (3, 250), (1, 4100), (2, 3000)])
def test_argmax_matches_torch(precision, rows, vocab):
    torch.manual_seed(0)
    model = NextToken(64, vocab).eval()
    x = torch.randn(rows, 64)
    compiled = lpx_tvm.from_torch(model, (x,), preset="tsp", precision=precision)
    out = compiled.run([x.numpy()])
    offload = compiled.report["offload"]
    assert offload["lpx"].get("argmax") == 1 and "argmax" not in offload["cpu"], offload
    ids, logits = out["output_0"], out["output_1"]
    assert ids.dtype == np.int32 and ids.shape == (rows, 1)
    # The pick of the logits LPX computed (first index of the maximum, as torch.argmax).
    np.testing.assert_array_equal(ids[:, 0], np.argmax(logits, axis=-1))
    if precision == "fp32":
        np.testing.assert_array_equal(ids[:, 0], model(x)[0][:, 0].numpy())


class Ties(torch.nn.Module):
    def forward(self, x):
        return (x * 1.0).argmax(-1, keepdim=True).to(torch.int32)


def test_argmax_first_index_on_ties_and_tiny_gaps():
    x = np.zeros((4, 650), np.float32)
    x[0, [5, 400, 600]] = 3.0  # ties across tiles: the first wins
    x[1, 330] = np.float32(1e-38)  # a denormal-sized gap above 0 still decides
    x[2] = -1.0
    x[2, 649] = np.nextafter(np.float32(-1.0), np.float32(0.0))  # the last lane of the last tile
    x[3] = np.linspace(-5, 5, 650, dtype=np.float32)[::-1]  # the maximum in lane 0
    compiled = lpx_tvm.from_torch(Ties(), (torch.from_numpy(x),), preset="tsp", precision="fp32")
    ids = compiled.run([x])["output_0"][:, 0]
    np.testing.assert_array_equal(ids, [5, 330, 649, 0])
    np.testing.assert_array_equal(ids, torch.from_numpy(x).argmax(-1).numpy())


def test_argmax_over_a_large_vocabulary_reduces_tiles_as_a_tree():
    """4,100 values: 12 whole lane tiles, combined lane by lane a few to a group, and a
    partial one reduced over its 260 valid lanes alone; ties across tiles still give the
    first index, and a maximum in the partial tile's last lane still wins."""
    x = np.zeros((3, 4100), np.float32)
    x[0, [10, 2000, 4000]] = 3.0  # ties across tiles (and in the partial tile): the first wins
    x[1] = -1.0
    x[1, 4099] = np.nextafter(np.float32(-1.0), np.float32(0.0))  # the last valid lane
    x[2] = np.random.default_rng(3).standard_normal(4100).astype(np.float32)
    compiled = lpx_tvm.from_torch(Ties(), (torch.from_numpy(x),), preset="tsp", precision="fp32")
    ids = compiled.run([x])["output_0"][:, 0]
    np.testing.assert_array_equal(ids, torch.from_numpy(x).argmax(-1).numpy())
    assert ids[0] == 10 and ids[1] == 4099
    # The row maximum took fewer cross-lane reductions than the 13 tiles (the tree ran).
    instrs = [i for r in compiled.executable.regions.values() for i in r.program.instrs]
    reductions = [i for i in instrs if i.op == "vxm.reduce_max" and ".max" in i.tag]
    assert 0 < len(reductions) < 13, len(reductions)


class Embed(torch.nn.Module):
    """A token embedding and a position table looked up at a runtime position."""

    def __init__(self, vocab, hidden, context):
        super().__init__()
        self.embed = torch.nn.Parameter(torch.randn(vocab, hidden))
        self.pos = torch.nn.Parameter(torch.randn(context, hidden))
        self.register_buffer("steps", torch.arange(3, dtype=torch.int32))

    def forward(self, ids, position):
        x = torch.index_select(self.embed, 0, ids.flatten())
        p = torch.index_select(self.pos, 0, position + self.steps)
        return x + p


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_take_gathers_rows_on_lpx(precision):
    torch.manual_seed(1)
    model = Embed(256, 400, 64).eval()  # two column tiles of 320 lanes
    ids = torch.tensor([[7, 255, 0]], dtype=torch.int32)
    position = torch.tensor([41], dtype=torch.int32)
    compiled = lpx_tvm.from_torch(model, (ids, position), preset="tsp", precision=precision)
    offload = compiled.report["offload"]
    assert offload["lpx"].get("take") == 2 and "take" not in offload["cpu"], offload
    for ids_, pos_ in (([[7, 255, 0]], [41]), ([[3, 3, 128]], [0])):
        ids_, pos_ = np.array(ids_, np.int32), np.array(pos_, np.int32)
        got = compiled.run([ids_, pos_])["output_0"]
        want = model(torch.from_numpy(ids_), torch.from_numpy(pos_)).detach().numpy()
        tol = 1e-6 if precision == "fp32" else 2e-2
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 4)


class Mask(torch.nn.Module):
    """A decoder's additive attention mask from a runtime position (no comparisons)."""

    def __init__(self, steps, context):
        super().__init__()
        t, j = torch.arange(steps)[:, None], torch.arange(context)[None, :]
        self.register_buffer("offsets", (t - j).float())

    def forward(self, scores, position):
        mask = torch.clamp(position.float() + self.offsets, max=0.0) * 1e4
        return torch.softmax(scores + mask, dim=-1)


@pytest.mark.parametrize("position", [0, 5, 60])
def test_mask_from_runtime_position(position):
    torch.manual_seed(2)
    model = Mask(3, 64).eval()
    scores = torch.randn(3, 64)
    compiled = lpx_tvm.from_torch(model, (scores, torch.tensor([0], dtype=torch.int32)), preset="tsp",
                                  precision="fp32")
    assert not compiled.report["offload"]["cpu"], compiled.report["offload"]
    got = compiled.run([scores.numpy(), np.array([position], np.int32)])["output_0"]
    want = model(scores, torch.tensor([position], dtype=torch.int32)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (got[:, position + 3:] == 0).all() and (got[:, :position + 1] > 0).all()


class Rope(torch.nn.Module):
    """Rotary embedding at a runtime position: table rows gathered, then repeated for every
    head (a runtime block broadcast along the leading dims)."""

    def __init__(self, heads, steps, dim, context):
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        angles = torch.outer(torch.arange(context).float(), inv)
        angles = torch.cat([angles, angles], -1)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())
        self.register_buffer("steps", torch.arange(steps, dtype=torch.int32))
        self.half = dim // 2

    def forward(self, x, position):  # x: [heads, steps, dim]
        at = position + self.steps
        cos, sin = torch.index_select(self.cos, 0, at), torch.index_select(self.sin, 0, at)
        rotated = torch.cat([-x[..., self.half:], x[..., :self.half]], -1)
        return x * cos + rotated * sin


@pytest.mark.parametrize("steps, position", [(1, 37), (5, 0)])
def test_rope_at_a_runtime_position(steps, position):
    torch.manual_seed(3)
    model = Rope(6, steps, 40, 64).eval()
    x = torch.randn(6, steps, 40)
    compiled = lpx_tvm.from_torch(model, (x, torch.tensor([0], dtype=torch.int32)), preset="tsp", precision="fp32")
    assert not compiled.report["offload"]["cpu"], compiled.report["offload"]
    for pos in (position, 64 - steps):
        got = compiled.run([x.numpy(), np.array([pos], np.int32)])["output_0"]
        want = model(x, torch.tensor([pos], dtype=torch.int32)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class Indices(torch.nn.Module):
    """Int32 index arithmetic: cache rows of every head at a runtime position."""

    def __init__(self, heads, steps, context):
        super().__init__()
        base = torch.arange(heads)[:, None] * context + torch.arange(steps)[None, :]
        self.register_buffer("base", base.flatten().to(torch.int32))
        self.register_buffer("one", torch.ones(heads * steps, dtype=torch.int32))

    def forward(self, position, other):
        rows = self.base + position
        return rows, rows - other + self.one


def test_int32_index_arithmetic_is_exact():
    model = Indices(3, 4, 1 << 20).eval()  # rows past 2^24: an fp32 detour would round them
    other = torch.arange(12, dtype=torch.int32) * 7
    compiled = lpx_tvm.from_torch(model, (torch.tensor([0], dtype=torch.int32), other), preset="tsp",
                                  precision="fp16")
    assert not compiled.report["offload"]["cpu"], compiled.report["offload"]
    position = np.array([1_000_003], np.int32)
    out = compiled.run([position, other.numpy()])
    want = model(torch.from_numpy(position), other)
    for got, ref in zip((out["output_0"], out["output_1"]), want):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, ref.numpy())


class CacheWrite(torch.nn.Module):
    """A KV cache's rows written at a runtime position (rows ordered head, position), then
    attention scores of a query against the updated cache, which is returned too."""

    def __init__(self, heads, context, dim, steps):
        super().__init__()
        self.register_buffer("offsets", (torch.arange(heads, dtype=torch.int32)[:, None] * context +
                                         torch.arange(steps, dtype=torch.int32)[None, :]).reshape(-1, 1))
        self.register_buffer("cols", torch.arange(dim, dtype=torch.int32)[None, :])

    def forward(self, cache, new_rows, q, position):
        rows = position.reshape(1, 1) + self.offsets  # (heads * steps, 1)
        cache = torch.ops.aten.index_put(cache, [rows, self.cols], new_rows)
        return cache @ q.T, cache


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("steps, position", [(1, 0), (1, 37), (3, 61)])
def test_cache_rows_written_at_a_runtime_position(precision, steps, position):
    heads, context, dim = 2, 64, 40
    torch.manual_seed(steps + position)
    model = CacheWrite(heads, context, dim, steps).eval()
    cache = torch.randn(heads * context, dim)
    new_rows, q = torch.randn(heads * steps, dim), torch.randn(3, dim)
    args = (cache, new_rows, q, torch.tensor([position], dtype=torch.int32))
    compiled = lpx_tvm.from_torch(model, args, preset="tsp", precision=precision)
    offload = compiled.report["offload"]
    assert offload["lpx"].get("index_put") == 1 and not offload["cpu"], offload
    out = compiled.run([a.numpy() for a in args])
    want_scores, want_cache = (t.numpy() for t in model(*args))
    got_scores, got_cache = out["output_0"], out["output_1"]
    written = (np.arange(heads)[:, None] * context + position + np.arange(steps)).reshape(-1)
    tol = dict(rtol=1e-6, atol=1e-6) if precision == "fp32" else dict(rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(got_cache[written], new_rows.numpy(), **tol)
    np.testing.assert_allclose(got_cache, want_cache, **tol)  # every other row kept
    loose = dict(rtol=1e-5, atol=2e-5) if precision == "fp32" else dict(rtol=2e-2, atol=5e-2)
    np.testing.assert_allclose(got_scores, want_scores, **loose)  # sums of 40 products
    # In place: the region returns the cache in its input's lines, no copy of it.
    program = next(r.program for r in compiled.executable.regions.values()
                   if any(i.op == "mem.scatter" for i in r.program.instrs))
    inputs = {b.layout.tiles for b in program.bindings if b.role == "input"}
    assert any(b.role == "output" and b.layout.tiles in inputs for b in program.bindings)


class IntMask(torch.nn.Module):
    """The decoder step's mask: the position added to int32 offsets before any float (a
    float16 position is exact only to 2,048)."""

    def __init__(self, steps, context):
        super().__init__()
        t, j = torch.arange(steps, dtype=torch.int32)[:, None], torch.arange(context, dtype=torch.int32)[None, :]
        self.register_buffer("offsets", t - j)

    def forward(self, scores, position):
        mask = torch.clamp((position + self.offsets).to(scores.dtype), -1.0, 0.0) * 1e4
        return torch.softmax(scores + mask, dim=-1)


def test_mask_past_float16_integers():
    """At positions past 2,048 a float16 position rounds (2,051 reads 2,052): the mask is
    built in int32 first, so each query row sees exactly the rows up to its position."""
    steps, context = 2, 2100
    model = IntMask(steps, context).eval()
    scores = torch.zeros(steps, context)
    compiled = lpx_tvm.from_torch(model, (scores, torch.tensor([0], dtype=torch.int32)), preset="tsp",
                                  precision="fp16")
    assert not compiled.report["offload"]["cpu"], compiled.report["offload"]
    for position in (2049, 2051, 2053, 2097):
        got = compiled.run([scores.numpy(), np.array([position], np.int32)])["output_0"]
        for t in range(steps):  # equal scores: 1 / (rows seen) on each row seen, 0 after
            seen = position + t + 1
            assert (got[t, seen:] == 0).all() and (got[t, :seen] > 0).all(), (position, t)
            np.testing.assert_allclose(got[t, :seen], 1.0 / seen, rtol=2e-3)


class KeyColumns(torch.nn.Module):
    """A key cache stored transposed (``dim`` rows of (head, position) columns) with the
    step's new keys written into their columns at a runtime position, as the decoder step
    writes it: ``cache * keep + k^T @ one_hot``; then scores against the updated cache."""

    def __init__(self, heads, context, steps):
        super().__init__()
        i32 = torch.int32
        cols = torch.arange(heads * context, dtype=i32)[None, :]
        rows = (torch.arange(heads, dtype=i32)[:, None] * context + torch.arange(steps, dtype=i32)[None, :])
        self.register_buffer("column_base", rows.reshape(-1, 1) - cols)
        self.register_buffer("after_first", steps - cols % context)
        self.register_buffer("from_last", -(cols % context))

    def forward(self, cache, keys, q, position):
        def near(base):
            return (position + base).to(cache.dtype)
        one_hot = torch.clamp(1.0 - torch.abs(near(self.column_base)), 0.0, 1.0)
        keep = 1.0 - (torch.clamp(near(self.after_first), 0.0, 1.0) - torch.clamp(near(self.from_last), 0.0, 1.0))
        cache = cache * keep + keys.T @ one_hot
        return q @ cache, cache


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("heads, context, steps, position", [(1, 64, 1, 37), (2, 400, 1, 350), (1, 2100, 1, 2051),
                                                             (2, 64, 3, 61), (1, 700, 5, 0)])
def test_key_cache_columns_written_at_a_runtime_position(precision, heads, context, steps, position):
    """One new key (the SXM broadcast path) and several (the MXM path), a cache of one and
    of several lane tiles, a column past float16's integers: the new keys land exactly in
    their columns, every other column is kept bit for bit, and the cache stays where it lies."""
    dim = 40
    torch.manual_seed(steps + position)
    model = KeyColumns(heads, context, steps).eval()
    cache = torch.randn(dim, heads * context)
    keys, q = torch.randn(heads * steps, dim), torch.randn(3, dim)
    args = (cache, keys, q, torch.tensor([0], dtype=torch.int32))
    compiled = lpx_tvm.from_torch(model, args, preset="tsp", precision=precision)
    assert not compiled.report["offload"]["cpu"], compiled.report["offload"]
    program = next(iter(compiled.executable.regions.values())).program
    # The SXM transposes only the new keys, never the cache's columns.
    assert sum(i.count for i in program.instrs if i.op == "sxm.transpose") == heads * steps
    assert any(i.tag.endswith(".blend") for i in program.instrs)
    args = (cache, keys, q, torch.tensor([position], dtype=torch.int32))
    out = compiled.run([a.numpy() for a in args])
    got_scores, got_cache = out["output_0"], out["output_1"]
    as_stored = np.float16 if precision == "fp16" else np.float32
    want = cache.numpy().astype(as_stored).astype(np.float32)
    written = (np.arange(heads)[:, None] * context + position + np.arange(steps)).reshape(-1)
    want[:, written] = keys.numpy().T.astype(as_stored)
    np.testing.assert_array_equal(got_cache, want)  # exact: products by 1 and 0 only
    loose = dict(rtol=1e-5, atol=2e-5) if precision == "fp32" else dict(rtol=2e-2, atol=5e-2)
    np.testing.assert_allclose(got_scores, q.numpy() @ want, **loose)
    inputs = {b.layout.tiles for b in program.bindings if b.role == "input"}
    assert any(b.role == "output" and b.layout.tiles in inputs for b in program.bindings)

"""How many bytes a decoder takes in SRAM, in one place: the fit check of a session
(``session.fit_problem``), the capacity planner (``capacity.py``) and the refusal of a
step that does not fit (``step_program.py``) all count here, and every matrix, table and
cache is counted as the compiler stores it (:func:`lpx_tvm.machine.layout.stored_bytes`:
each row whole vectors of lanes, the rule the compiler's own checks use too).
"""

from __future__ import annotations

from ..frontends import decoders
from ..machine.config import LPXConfig
from ..machine.layout import stored_bytes
from ..precision import Precision
from ..target.sram_plan import spread_chunks

# The 8-bit paths: W8A8 dense layers in int8, or in fp8 e4m3 on a machine whose MXM
# multiplies fp8.
EIGHT_BIT = ("int8", "fp8")
# The float precision of what an 8-bit path leaves in float (norms, RoPE, attention, the
# KV cache, the embedding table).
FLOAT_OF = {"int8": "fp16", "fp8": "fp16"}


def float_bytes(precision: str) -> int:
    """Bytes of a float value (activation, cache, table entry) at ``precision``."""
    return Precision.parse(FLOAT_OF.get(precision, precision)).value_bytes


def matrix_value_bytes(precision: str) -> int:
    """Bytes of a dense layer's weight value at ``precision`` (one for the 8-bit paths)."""
    return 1 if precision in EIGHT_BIT else Precision.parse(precision).value_bytes


def weight_bytes(spec: decoders.DecoderSpec, precision: str, matrices: int) -> int:
    """Bytes of the weights: ``matrices`` values the MXM multiplies by at the precision's
    size, the rest (tables, norms) at its float size."""
    return matrices * matrix_value_bytes(precision) + (spec.parameters - matrices) * float_bytes(precision)


def matrix_values(rows: int, cols: int, lanes: int) -> int:
    """Values (bytes at one byte a value) a (rows, cols) matrix takes as stored: an
    N-wide weight of K rows, a table of C rows (the installs' layout, docs/llm.md)."""
    return stored_bytes(rows, cols, 1, lanes)


def rope_table_values(spec: decoders.DecoderSpec, lanes: "int | None" = None) -> int:
    """Values of the tables the steps add to the model's weights: RoPE's cosine and
    (signed) sine, a row of ``head_dim`` per position; none for GPT-2. With ``lanes``, as
    stored: both in one table when a vector holds both rows (``DecoderSpec.rope_tables_shared``)."""
    if spec.family == "gpt2":
        return 0
    if lanes is None:
        return 2 * spec.max_context * spec.head_dim
    if spec.rope_tables_shared:
        return matrix_values(spec.max_context, 2 * spec.head_dim, lanes)
    return 2 * matrix_values(spec.max_context, spec.head_dim, lanes)


def half_layer_stored(model, spec: decoders.DecoderSpec, size: int, lanes: int) -> tuple:
    """(attention, MLP): the values one chip of ``size`` (``decoders.TensorShard``) stores
    of a layer's dense weights, each (K, N) matrix K rows of whole lane tiles: what the fit
    of a stage counts (q, k and v fused, of 1,024 + 128 + 128 outputs, take 1,280 lanes a
    row; o's 8,192 take 8,320)."""
    # As the step's weights are split; the hidden units of the fullest chip where they do
    # not divide.
    q, kv = spec.heads // size * spec.head_dim, spec.kv_heads // size * spec.head_dim
    shapes = {}
    for key, (n, k) in decoders.layer_matrix_shapes(model, spec).items():
        if key in ("o", "down"):  # split by their inputs
            shapes[key] = (n, q if key == "o" else -(-k // size))
        else:
            shapes[key] = (q if key == "q" else kv if key in ("k", "v") else -(-n // size), k)
    for fused, keys in decoders.FUSED.items():  # as the steps store them: the parts' outputs, one input
        if all(k in shapes for k in keys):
            parts = [shapes.pop(k) for k in keys]
            shapes[fused] = (sum(n for n, _ in parts), parts[0][1])
    out = [0, 0]
    for key, (n, k) in shapes.items():
        out[decoders.LAYER_DENSE[key] not in ("attn", "o")] += matrix_values(k, n, lanes)
    return tuple(out)


def cache_bytes_as_stored(spec: decoders.DecoderSpec, cfg: LPXConfig, precision: str) -> int:
    """Bytes of SRAM the caches take as stored, whole vectors of lanes, one line per byte
    of a value: a value cache's rows of ``head_dim`` values each take a vector (with its
    chunks' spare rows), a key cache's ``head_dim`` rows of positions (stored transposed)
    their lane tiles."""
    w = float_bytes(precision)
    total = 0
    for n in spec.cache_names:
        rows, cols = spec.cache_shape(n)
        if n.startswith("v_"):  # spread over slices (sram_plan.spread_chunks)
            rows = spread_chunks(cfg, rows, w).rows_held
        total += stored_bytes(rows, cols, w, cfg.lanes)
    return total

"""The latency floor of a decode step: the fewest cycles any schedule of the step's
dataflow takes on a machine, from its floorplan, its latencies and its weight buffers
(docs/llm.md, "The latency floor").

The install floor (the model's matrix bytes over the install bandwidth) holds only if
every matrix could stream in while the chain before it runs. Two rules of the machine
forbid that at a small batch:

- **Buffers.** A plane holds ``weight_buffers`` installed tiles, so at most
  ``planes * weight_buffers`` tiles of a product stand installed before its input exists
  (each waits for a multiply to free its buffer). The rest of its install work comes after
  its input arrives.
- **Trips.** Products run on the MXMs, every function between two of them (a norm, RoPE,
  softmax's exponent, the MLP's activation, the 8-bit conversions) on the VXM, and the
  floorplan puts the VXM ``d`` positions from the nearest plane: a vector crosses one
  position a cycle. Each hop from one product to the next costs the drain, ``2 d`` and the
  function's VXM latency.

Every output of a product needs all of its input vector, and a norm needs all of its row,
so a layer splits into two segments joined by the norms: attention (q, k and v; the
scores; p V; o) and the MLP (gate and up; down). A segment lasts at least the longest of
three paths: its chain of trips with its tiles installed ahead; its last-installed tile's
shortest way to the segment's end; and all its install work past the buffers. Each term
counts only what no schedule avoids (a norm's reduction, its reciprocal square root and
its scale; one exponent; one activation; one conversion), so the floor is a lower bound:
``tests/llm/test_latency_floor.py`` derives it by hand, and the LLM tests check that no
compiled step beats it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..machine.config import LPXConfig
from .sizing import FLOAT_OF, matrix_value_bytes


@dataclass(frozen=True)
class LayerMatrices:
    """Values of one layer's products: ``qkv`` (q, k and v), ``o``, ``up`` (gate and up,
    or GPT-2's fc) and ``down``."""

    qkv: int
    o: int
    up: int
    down: int


def layer_matrices(shapes: dict) -> LayerMatrices:
    """A layer's products from :func:`lpx_tvm.frontends.decoders.layer_matrix_shapes`."""
    size = {k: r * c for k, (r, c) in shapes.items()}
    return LayerMatrices(qkv=size["q"] + size["k"] + size["v"], o=size["o"],
                         up=size.get("gate", 0) + size.get("up", 0) + size.get("fc", 0), down=size["down"])


@dataclass(frozen=True)
class LatencyFloor:
    """The floor and its parts, in cycles: ``trip`` (a hop from a product's accumulators
    to the next product's input with no function on the way), ``buffer_credit`` (the
    install work the buffers hold ahead), ``start`` (the first layer's input to its
    first product), ``attention`` and ``mlp`` (a layer's two segments, each ending
    with the norm's trip into the next), ``head`` (the last norm's trip, the LM head and
    the argmax) and ``binds`` (which path binds each segment: ``trips``, ``last tile`` or
    ``installs``)."""

    cycles: float
    trip: int
    buffer_credit: float
    start: float
    attention: float
    mlp: float
    head: float
    layers: int
    binds: dict

    def to_json(self) -> dict:
        return asdict(self)


def _function_latencies(cfg: LPXConfig, family: str) -> dict:
    """The VXM latency each function between products cannot avoid."""
    lat = cfg.latency
    alu, tr = min(lat["vxm_alu"], lat["vxm_convert"]), lat["vxm_transcendental"]
    return dict(
        norm=lat["vxm_reduce"] + tr + lat["vxm_alu"],  # sum of squares, 1/sqrt, scale
        query=alu,  # RoPE's multiply-add (GPT-2: the conversion to the scores' dtype)
        exp=tr,  # softmax's exponent (its maximum and sum can wait past p V)
        convert=alu,  # p V's accumulators to o's activation dtype
        act=tr + (lat["vxm_alu"] if family != "gpt2" else 0),  # SiLU(gate) * up, or GELU
        argmax=lat["vxm_reduce"],
    )


def decode_latency_floor(cfg: LPXConfig, family: str, layers: int, layer: LayerMatrices, head_values: int,
                         precision: str, float_precision: "str | None" = None, batch: int = 1) -> LatencyFloor:
    """The latency floor of a ``layers``-layer decode step of ``batch`` sequences whose
    products are ``layer``'s each layer and an LM head of ``head_values``: dense products
    at ``precision`` (``int8``/``fp8``: 8-bit weights and activations), attention's at
    ``float_precision`` (by default the precision's float, :data:`FLOAT_OF`)."""
    lat = cfg.latency
    vxm = cfg.position("VXM")
    d = min(abs(cfg.position("MXM", p) - vxm) for p in range(cfg.mxm_planes))
    fn = _function_latencies(cfg, family)
    floats = float_precision or FLOAT_OF.get(precision, precision)
    cpv = cfg.mxm_cycles_per_vector

    def product(dtype: str, rows: int) -> int:
        # input at the plane -> its last accumulator row landed
        return cpv[dtype] * rows + lat["mxm_mul"] - 1

    m_dense, m_attention = product(precision, batch), product(floats, 1)
    trip = lat["mxm_drain"] + 2 * d

    def hop(function: str) -> int:
        # fp32 products need no conversion between them: the drain feeds the next plane.
        if function == "convert" and precision == "fp32" and floats == "fp32":
            return lat["mxm_drain"]
        return trip + fn[function]

    weight_bytes = matrix_value_bytes(precision)
    per_cycle = cfg.install_bytes_per_cycle
    # The buffers' tiles, installed by all planes at once: a plane's share of them.
    credit = cfg.mxm_weight_buffers * cfg.mxm_rows * weight_bytes / cfg.mxm_install_streams

    def installs(values: int) -> float:
        return values * weight_bytes / per_cycle

    tail = lat["mxm_install"] + m_dense  # the last tile installed -> its product landed

    def segment(paths: dict) -> tuple:
        kind = max(paths, key=paths.get)
        return paths[kind], kind

    i_qkv, i_o, i_up, i_down = (installs(v) for v in (layer.qkv, layer.o, layer.up, layer.down))
    attention, attention_binds = segment({
        # the first head's chain, its tiles installed ahead: qkv, scores, p V, o
        "trips": m_dense + hop("query") + m_attention + hop("exp") + m_attention + hop("convert") + m_dense,
        # the last qkv tile (a v's, whose shortest way to o is one trip)
        "last tile": max(0.0, i_qkv - credit) + tail + hop("convert") + m_dense,
        "installs": max(0.0, i_qkv + i_o - credit) + tail,
    })
    mlp, mlp_binds = segment({
        "trips": m_dense + hop("act") + m_dense,
        "last tile": max(0.0, i_up - credit) + tail + hop("act") + m_dense,
        "installs": max(0.0, i_up + i_down - credit) + tail,
    })
    norm = hop("norm")
    # The first layer's input: a row read from SRAM next to the VXM (one position away),
    # normed, crossed to a plane.
    start = lat["mem_read"] + 1 + fn["norm"] + d
    head = max(float(m_dense), installs(head_values) - credit + tail) + lat["mxm_drain"] + d + fn["argmax"]
    # Each segment ends with a norm's trip: the post-attention norm's, then the next
    # layer's input norm's (the last layer's: the final norm's, into the LM head).
    cycles = start + layers * (attention + mlp + 2 * norm) + head
    return LatencyFloor(cycles=cycles, trip=trip, buffer_credit=credit, start=start,
                        attention=attention + norm, mlp=mlp + norm, head=head, layers=layers,
                        binds=dict(attention=attention_binds, mlp=mlp_binds))

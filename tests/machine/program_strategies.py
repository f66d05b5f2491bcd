"""Hypothesis strategies for random valid LPX instructions and programs."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from lpx_tvm.machine.encoding import f32_from_bits
from lpx_tvm.machine.isa import OPS, DType, Instr, Stream, Unit
from lpx_tvm.machine.program import Binding, Program, SramImage, TensorLayout
from lpx_tvm.machine.timing import unit_count

streams = st.builds(Stream, st.sampled_from("EW"), st.integers(0, 63))
finite_or_inf_f32 = st.floats(width=32, allow_nan=False)  # -0.0, subnormals, +-inf
nan_f32 = st.builds(lambda sign, mant: f32_from_bits((sign << 31) | 0x7F800000 | mant),
                    st.integers(0, 1), st.integers(1, 0x7FFFFF))
# A few repeated tags (to exercise the tag table), arbitrary text, and awkward cases.
tags = st.one_of(st.sampled_from(["", "", "conv1", "layer.0/matmul"]), st.text(max_size=12),
                 st.sampled_from([" lead", "trail ", '"quoted"', "a ; b", "tab\there", "new\nline", "#"]))

FIELD_VALUES = {
    "dtype": st.sampled_from(list(DType)),
    "out_dtype": st.sampled_from(list(DType)),
    "src0": st.one_of(streams, st.none()),
    "src1": st.one_of(streams, st.none()),
    "dst": st.one_of(streams, st.none()),
    "buf": st.integers(0, 255),
    "slice": st.integers(0, 2**16 - 1),
    "addr": st.integers(0, 2**32 - 1),
    "stride": st.integers(-(2**31), 2**31 - 1),
    "imm": finite_or_inf_f32,
    "aux0": st.integers(-(2**63), 2**63 - 1),
    "aux1": st.integers(-(2**63), 2**63 - 1),
}


@st.composite
def instrs(draw, op=None, imm=None):
    """A valid Instr: only the fields its opcode uses, optional ones sometimes default."""
    spec = OPS[op] if op else draw(st.sampled_from(list(OPS.values())))
    kw = {}
    for _, name in spec.fields:
        if name in spec.optional and draw(st.booleans()):
            continue
        kw[name] = draw(imm if name == "imm" and imm is not None else FIELD_VALUES[name])
    return Instr(op=spec.mnemonic, cycle=draw(st.integers(0, 2**64 - 1)), unit=draw(st.integers(0, 2**16 - 1)),
                 count=draw(st.integers(1, 2**32 - 1)), tag=draw(tags), **kw)


layouts = st.builds(
    TensorLayout,
    shape=st.lists(st.integers(0, 300), max_size=4).map(tuple),
    dtype=st.sampled_from([d for d in DType if d is not DType.NONE]),
    tiles=st.lists(st.tuples(st.integers(0, 87), st.integers(0, 2**20)), max_size=4).map(tuple),
    row_stride=st.integers(0, 64),
    chunk_rows=st.integers(0, 300),
    margin=st.integers(0, 3),
)
bindings = st.builds(Binding, st.text(max_size=10), st.sampled_from(["input", "output"]), layouts)
tables = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20).map(lambda v: np.array(v, dtype=np.int32))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)


@st.composite
def sram_images(draw, lanes):
    data = draw(st.binary(min_size=0, max_size=4).map(lambda b: b * lanes))  # whole lines only
    return SramImage(draw(st.integers(0, 87)), draw(st.integers(0, 2**20)), data)


@st.composite
def programs(draw, imm=None):
    """A random valid Program (instructions need not form a sensible schedule)."""
    lanes = draw(st.sampled_from([16, 320]))
    return Program(
        config_hash=draw(st.binary(min_size=16, max_size=16)).hex(),
        instrs=draw(st.lists(instrs(imm=imm), max_size=12)),
        sram_init=draw(st.lists(sram_images(lanes), max_size=3)),
        host_init=draw(st.binary(max_size=100)),
        host_bytes=draw(st.integers(0, 2**40)),
        bindings=draw(st.lists(bindings, max_size=3)),
        tables=draw(st.lists(tables, max_size=3)),
        symbols=draw(st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
        name=draw(st.text(max_size=16)),
    )


# ---- valid programs with data -----------------------------------------------------
# Random dataflow built with the program builder, whose scheduler times it: every
# program is a valid schedule by construction (the simulator checks that when it runs
# one), and comes with inputs. Each group streams one value from SRAM through a few
# random VXM/SXM ops into SRAM; others multiply on the MXM (mul, then macs that continue
# the row block or, after a drain, add at once), move data over DMA and the C2C
# loopback, or gather rows.

_FLOATS = (DType.FP16, DType.BF16, DType.FP32)
_INTS = (DType.INT8, DType.UINT8, DType.INT32)
_TRANSCENDENTAL = ("vxm.exp", "vxm.tanh", "vxm.sigmoid", "vxm.gelu", "vxm.gelu_tanh", "vxm.erf",
                   "vxm.rsqrt", "vxm.recip")
_SXM = ("sxm.shift", "sxm.rotate", "sxm.permute", "sxm.transpose", "sxm.broadcast", "sxm.pad")


def random_data(rng: np.random.Generator, shape, dtype: DType) -> np.ndarray:
    """Values of ``dtype`` that exercise it: floats of varied magnitude and sign (zeros
    included), integers over their whole range (int32: large enough to wrap)."""
    if dtype.is_float:
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-3, 4, shape)
        x[rng.random(shape) < 0.05] = 0.0
        return x.astype(dtype.np)
    if dtype is DType.INT32:
        return rng.integers(-(2**30), 2**30, shape).astype(np.int32)
    info = np.iinfo(dtype.np)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype.np)


class _ProgramMaker:
    """Draws the groups of one random program on a ProgramBuilder."""

    def __init__(self, draw, preset: str):
        from lpx_tvm.target.builder import ProgramBuilder

        self.draw = draw
        self.b = ProgramBuilder(preset, name="random")
        self.cfg = self.b.config
        self.lanes = self.cfg.lanes
        self.rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        self.inputs = {}
        self.tensors = []  # SramTensors that hold data (inputs, constants, outputs written)
        self.next_acc = [0] * self.cfg.mxm_planes
        self.names = 0

    def name(self, kind: str) -> str:
        self.names += 1
        return f"{kind}{self.names}"

    def input(self, rows: int, dtype: DType, avoid=()):
        t = self.b.input(self.name("in"), (rows, self.lanes), dtype, avoid=avoid)
        self.inputs[t.name] = random_data(self.rng, (rows, self.lanes), dtype)
        self.tensors.append(t)
        return t

    def output(self, rows: int, dtype: DType, avoid=()):
        t = self.b.output(self.name("out"), (rows, self.lanes), dtype, avoid=avoid)
        self.tensors.append(t)
        return t

    def source(self, rows: int, dtype: DType, avoid=()):
        """A tensor of ``dtype`` with at least ``rows`` rows, outside slices ``avoid``:
        one already there (an input, or an output a group wrote) or a new input."""
        have = [t for t in self.tensors if t.layout.dtype is dtype and t.layout.rows >= rows
                and t.layout.tiles[0][0] not in avoid]
        if have and self.draw(st.booleans()):
            return self.draw(st.sampled_from(have))
        return self.input(rows, dtype, avoid)

    def read(self, g, n: int, dtype: DType, avoid=()):
        """``n`` vectors read from a tensor in one of the MEM access patterns."""
        from lpx_tvm.target.builder import SramSpan

        pattern = self.draw(st.sampled_from(["rows", "strided", "backwards", "repeat", "window"]))
        w = dtype.itemsize
        need = {"strided": 2 * n, "window": 3 * n}.get(pattern, n)
        t = self.source(need, dtype, avoid)
        tile = t.tile(0)
        if pattern == "strided":
            region = SramSpan(tile.slice, tile.addr, n, 2 * w, dtype)
        elif pattern == "backwards":
            region = SramSpan(tile.slice, tile.addr + (n - 1) * w, n, -w, dtype)
        elif pattern == "repeat":
            region = tile.rows(0, 1).repeat(n)
        elif pattern == "window" and n % 2 == 0:  # n/2 rows of 2 vectors, every other vector, 3 apart
            region = tile.window(0, n // 2, 2, 6, 2)
        else:
            region = tile.rows(0, n)
        return g.read(region), tile.slice

    def write(self, g, v, slices):
        """Write a value to a new output, or over the rows of one already written."""
        from lpx_tvm.target.builder import SramSpan

        outs = [t for t in self.tensors if t.name.startswith("out") and t.layout.dtype is v.dtype
                and t.layout.rows >= v.count and t.layout.tiles[0][0] not in slices]
        if outs and self.draw(st.booleans()):
            t = self.draw(st.sampled_from(outs))
        else:
            t = self.output(v.count * self.draw(st.sampled_from([1, 2])), v.dtype, avoid=slices)
        tile = t.tile(0)
        stride = tile.stride if t.layout.rows < 2 * v.count else self.draw(st.sampled_from([1, 2])) * tile.stride
        g.write(v, SramSpan(tile.slice, tile.addr, v.count, stride, v.dtype))

    # -- one group each ----------------------------------------------------------
    def stream_group(self):
        """read -> 1..3 VXM/SXM ops -> write."""
        draw = self.draw
        g = self.b.group(self.name("stream"))
        n = draw(st.integers(1, 24))
        dt = draw(st.sampled_from(_FLOATS + _INTS))
        v, sl = self.read(g, n, dt)
        slices = {sl}
        for _ in range(draw(st.integers(1, 3))):
            v = self.stream_op(g, v, slices)
        self.write(g, v, slices)

    def stream_op(self, g, v, slices):
        draw, dt = self.draw, v.dtype
        kinds = ["binary", "cvt", "sxm", "reduce"] + (["transcendental"] if dt.is_float else []) \
            + (["requant"] if dt is DType.INT32 else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "binary":
            op = draw(st.sampled_from(["vxm.add", "vxm.sub", "vxm.mul", "vxm.max", "vxm.min"]))
            if draw(st.booleans()):
                other, sl = self.read(g, v.count, dt, avoid=slices)
                slices.add(sl)
                return g.vxm(op, v, other)
            imm = draw(st.integers(-300, 300)) if dt.is_int else draw(st.floats(-8, 8, width=32))
            return g.vxm(op, v, imm=imm)
        if kind == "transcendental":
            return g.vxm(draw(st.sampled_from(_TRANSCENDENTAL)), v)
        if kind == "cvt":
            return g.vxm("vxm.cvt", v, to=draw(st.sampled_from(_FLOATS + _INTS)))
        if kind == "requant":
            zp = draw(st.integers(-20, 20))
            to = draw(st.sampled_from([DType.INT8, DType.UINT8]))
            if draw(st.booleans()):
                scale, sl = self.read(g, v.count, DType.FP32, avoid=slices)
                slices.add(sl)
                return g.vxm("vxm.requant", v, scale, to=to, zp=zp)
            return g.vxm("vxm.requant", v, imm=draw(st.floats(2.0**-30, 2.0**-10, width=32)), to=to, zp=zp)
        if kind == "reduce":
            op = "vxm.reduce_max" if dt in (DType.INT8, DType.UINT8) else \
                draw(st.sampled_from(["vxm.reduce_sum", "vxm.reduce_max"]))
            return g.vxm(op, v, width=draw(st.integers(1, self.lanes)))
        # One SXM unit serves one op of a group (they would overlap on its port).
        free = [u for u in range(unit_count(self.cfg, Unit.SXM)) if ("sxm", u) not in slices]
        if not free:
            return g.vxm("vxm.max", v, imm=0)
        unit = draw(st.sampled_from(free))
        slices.add(("sxm", unit))
        op = draw(st.sampled_from(_SXM))
        if op == "sxm.transpose" and v.count <= self.lanes:
            return g.sxm(op, v, unit=unit, out=draw(st.integers(1, self.lanes)))
        if op == "sxm.permute":
            table = self.rng.integers(-1, self.lanes, self.lanes)
            return g.sxm(op, v, unit=unit, map=self.b.table(table))
        if op == "sxm.broadcast":
            return g.sxm(op, v, unit=unit, lane=draw(st.integers(0, self.lanes - 1)))
        if op == "sxm.pad":
            return g.sxm(op, v, unit=unit, before=draw(st.integers(0, self.lanes)),
                         width=draw(st.integers(0, self.lanes)))
        op = draw(st.sampled_from(["sxm.shift", "sxm.rotate"]))
        return g.sxm(op, v, unit=unit, by=draw(st.integers(-self.lanes - 2, self.lanes + 2)))

    def matmul_groups(self):
        """install, mul, 0..2 x (install, mac), with a drain in between sometimes, drain, write."""
        draw, cfg = self.draw, self.cfg
        plane = draw(st.integers(0, cfg.mxm_planes - 1))
        kind = draw(st.sampled_from(["int", "float"]))
        n = draw(st.integers(1, 20))
        width = draw(st.integers(1, cfg.mxm_cols))
        acc = self.next_acc[plane]
        if acc + n > cfg.mxm_acc_rows:
            acc = 0
        self.next_acc[plane] = acc + n
        fdt = draw(st.sampled_from(_FLOATS))
        for step in range(draw(st.integers(1, 3))):
            wdt, xdt = (draw(st.sampled_from([DType.INT8, DType.UINT8])) for _ in range(2)) if kind == "int" \
                else (fdt, fdt)
            k = draw(st.integers(1, cfg.mxm_rows))
            if step and draw(st.integers(0, 5)) == 0:  # another width: the mac continues no block
                width = draw(st.integers(1, cfg.mxm_cols))
            buf = step % cfg.mxm_weight_buffers
            g = self.b.group(self.name("install"))
            wv, _ = self.read(g, k, wdt)
            g.install(plane, buf, wv, width)
            g = self.b.group(self.name("mul"))
            xv, _ = self.read(g, n, xdt)
            g.mul(plane, buf, xv, acc, accumulate=step > 0)
            if draw(st.integers(0, 3)) == 0:  # a drain settles the block: the next mac adds at once
                self.drain(plane, acc, n, kind)
        self.drain(plane, acc, n, kind)

    def drain(self, plane, acc, n, kind):
        g = self.b.group(self.name("drain"))
        v = g.drain(plane, acc, n, DType.INT32 if kind == "int" else DType.FP32)
        # As in stream_group: the write avoids the slices the group's own reads use. The
        # scheduler orders groups, not the instructions of one group, so writing over the
        # operand a vxm op reads here (backwards, say) races with that read.
        slices = set()
        if self.draw(st.booleans()):
            v = self.stream_op(g, v, slices)
        self.write(g, v, slices)

    def dma_groups(self):
        """Off-chip input -> SRAM (dma.load), and SRAM -> an off-chip output (dma.store)."""
        draw = self.draw
        n = draw(st.integers(1, 16))
        dt = draw(st.sampled_from(_FLOATS + _INTS))
        src = self.b.offchip(self.name("in"), (n, self.lanes), dt, role="input")
        self.inputs[src.name] = random_data(self.rng, (n, self.lanes), dt)
        buf = self.output(n, dt)
        self.b.group(self.name("load")).dma_load(src.at(0, 0), buf.tile(0))
        t = self.draw(st.sampled_from([t for t in self.tensors if t.layout.rows >= n]))
        dst = self.b.offchip(self.name("out"), (n, self.lanes), t.layout.dtype, role="output")
        self.b.group(self.name("store")).dma_store(t.tile(0).rows(0, n), dst.at(0, 0))

    def c2c_groups(self):
        """A value sent on a link, received by a later group and written."""
        draw = self.draw
        link = draw(st.integers(0, self.cfg.c2c_links - 1))
        n = draw(st.integers(1, 12))
        dt = draw(st.sampled_from(_FLOATS + _INTS))
        g = self.b.group(self.name("send"))
        v, _ = self.read(g, n, dt)
        g.send(link, v)
        g = self.b.group(self.name("recv"))
        self.write(g, g.recv(link, n, dt), set())

    def gather_group(self):
        """Rows of a tensor picked by an index vector's lane 0 (a constant)."""
        draw = self.draw
        rows, n = draw(st.integers(1, 12)), draw(st.integers(1, 12))
        dt = draw(st.sampled_from(_FLOATS + _INTS))
        table = self.source(rows, dt)
        index = self.b.constant(self.name("idx"), self.rng.integers(0, rows, (n, self.lanes)), DType.INT32,
                                avoid=(table.layout.tiles[0][0],))
        g = self.b.group(self.name("gather"))
        self.write(g, g.gather(g.read(index.tile(0)), table.tile(0)), {table.layout.tiles[0][0]})


@st.composite
def valid_programs(draw, preset: str = "mini", max_groups: int = 6):
    """``(program, inputs)``: a random valid schedule and inputs for it."""
    m = _ProgramMaker(draw, preset)
    makers = [m.stream_group] * 4 + [m.matmul_groups] * 2 + [m.dma_groups, m.c2c_groups, m.gather_group]
    for _ in range(draw(st.integers(1, max_groups))):
        draw(st.sampled_from(makers))()
        if draw(st.integers(0, 7)) == 0:
            m.b.sync()
    return m.b.build(), m.inputs

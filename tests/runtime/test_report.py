"""The one report: per-layer cycle attribution (each cycle counted once) and its JSON form."""

import numpy as np
import pytest

from lpx_tvm.kernels import gemm, softmax
from lpx_tvm.machine.config import load_config
from lpx_tvm.machine.isa import Instr
from lpx_tvm.machine.program import Program
from lpx_tvm.runtime.report import (IDLE, Layer, Offload, Report, ReportError, layer_cycles, owned_cycles,
                                    program_report)
from lpx_tvm.sim import Simulator

MINI = load_config("mini")


def _hand_program() -> Program:
    """No-ops (in flight over [issue, issue + count)) on five queues:

    a.x  mem  [0, 10)   the oldest from 0: owns 0..9                 -> a: 10
    b    vxm  [2, 6)    inside a.x: owns nothing                     -> b: 0
    c    sxm  [8, 15)   owns 10..14 (a.x still in flight before 10)  -> c: 5
    (nothing in flight over 15..19)                                   -> idle: 5
    a.y  dma  [20, 23)  starts with d, earlier in program order      -> a: +3
    d    mxm  [20, 25)  owns 23..24                                   -> d: 2
    """
    instrs = [Instr("mem.nop", 0, count=10, tag="a.x"), Instr("vxm.nop", 2, count=4, tag="b"),
              Instr("sxm.nop", 8, count=7, tag="c"), Instr("dma.nop", 20, count=3, tag="a.y"),
              Instr("mxm.nop", 20, count=5, tag="d")]
    return Program(MINI.hash, instrs=instrs, name="hand")


def test_hand_made_program_attribution():
    prog = _hand_program()
    got = layer_cycles(MINI, prog)
    assert got == {"a": 13, "b": 0, "c": 5, "d": 2, IDLE: 5}
    assert sum(got.values()) == Simulator(MINI).run(prog, {}, timing_only=True).cycles == 25


def _brute_force(issue, done):
    """Owner of every cycle by a loop over cycles: the earliest-issued interval in flight."""
    owned, idle = np.zeros(len(issue), dtype=np.int64), 0
    order = sorted(range(len(issue)), key=lambda i: (issue[i], i))
    for t in range(int(max(done))):
        owner = next((i for i in order if issue[i] <= t < done[i]), None)
        if owner is None:
            idle += 1
        else:
            owned[owner] += 1
    return owned, idle


@pytest.mark.parametrize("seed", range(20))
def test_interval_attribution_matches_a_per_cycle_loop(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    issue = rng.integers(0, 200, n)
    done = issue + rng.integers(0, 40, n)  # some zero-length intervals
    if done.max() == 0:
        done[0] = 1
    owned, idle = owned_cycles(issue, done)
    want_owned, want_idle = _brute_force(issue, done)
    np.testing.assert_array_equal(owned, want_owned)
    assert idle == want_idle
    assert owned.sum() + idle == done.max()


@pytest.mark.parametrize("prog", [
    gemm("mini", 40, 48, 36, "fp16", bias=np.linspace(-1, 1, 36), relu=True),
    gemm("mini", 24, 40, 20, "int8"),
    softmax("mini", 24, 16, "fp16"),
], ids=["gemm_fp16", "gemm_int8", "softmax"])
def test_layer_cycles_add_up_to_the_simulated_cycles(prog):
    cycles = Simulator(MINI).run(prog, {}, timing_only=True).cycles
    assert sum(layer_cycles(MINI, prog).values()) == cycles


def test_program_report_reads_the_simulator():
    prog = gemm("mini", 24, 40, 20, "int8")
    result = Simulator(MINI).run(prog, {}, timing_only=True)
    rep = program_report(result, prog)
    assert rep.cycles == result.cycles == sum(layer.cycles for layer in rep.layers)
    assert rep.macs == 24 * 40 * 20 == sum(layer.macs for layer in rep.layers)
    assert rep.mxm_dtypes == ["int8"] and rep.precision is None
    assert sum(layer.instructions for layer in rep.layers) == len(prog.instrs)


def test_program_utilization_is_against_the_peak_of_the_dtype_it_multiplies():
    """An fp16 program's MXM utilization divides by the fp16 peak (4 x 320 x 320 MACs per
    cycle at a quarter of the int8 rate on tsp), not by the int8 peak."""
    tsp = load_config("tsp")
    prog = gemm("tsp", 64, 640, 640, "fp16")
    result = Simulator(tsp).run(prog, {}, timing_only=True)
    rep = program_report(result, prog)
    fp16_peak = 4 * 320 * 320 / 4
    assert rep.mxm_dtypes == ["fp16"]
    assert rep.mxm_utilization == pytest.approx(64 * 640 * 640 / (fp16_peak * rep.cycles))


def test_report_json_round_trip_and_schema_checks(tmp_path):
    rep = Report(preset="mini", precision="fp32", cycles=25, latency_s=25 / 900e6, macs=7, mxm_utilization=0.5,
                 mxm_dtypes=["fp32"], offload=Offload(lpx={"nn.conv2d": 1}, cpu={"cos": 1}, reasons={"cos": ["x"]}),
                 layers=[Layer("conv", 20, 7, 3, {"installs": 2, "rows": 16, "lanes": 2, "slices": 2, "hops": [1, 3],
                                                  "rows_per_cycle": 2.0}), Layer(IDLE, 5)],
                 tuning={"log": "l", "tuned_layers": [],
                                                                          "default_layers": ["t"]})
    path = tmp_path / "r.json"
    rep.save(path)
    back = Report.load(path)
    assert back == rep
    assert back["offload"]["lpx"] == {"nn.conv2d": 1} and back["layers"][0] == {"name": "conv", "cycles": 20,
                                                                                "macs": 7, "instructions": 3,
                                                                                "weights": rep.layers[0].weights}
    # a read-only mapping of the JSON form, as the README's example uses it
    assert dict(back) == rep.to_json() and list(back.keys()) == list(rep.to_json())
    assert back.get("cycles") == 25 and back.get("no such field", "none") == "none"
    assert dict(back.items())["macs"] == 7 and len(back) == len(rep.to_json())
    assert "cycles" in back and "mxm_dtype" not in back
    back["offload"]["lpx"]["cos"] = 9  # a copy: the report is unchanged
    assert back.offload.lpx == {"nn.conv2d": 1}
    with pytest.raises(TypeError):
        back["cycles"] = 3
    # a report written before layers had weights reads back with none
    old = rep.to_json()
    for row in old["layers"]:
        del row["weights"]
    assert Report.from_json(old).layers[1].weights is None
    with pytest.raises(ReportError, match="schema version 0"):
        Report.from_json({**rep.to_json(), "schema_version": 0})
    with pytest.raises(ReportError, match="mxm_dtype'"):
        Report.from_json({**rep.to_json(), "mxm_dtype": "int8"})


def test_weight_placement_pairs_each_install_with_its_read():
    """mini: two install parts of 8 int8 rows, from slices 1 (position 3) and 2 (position
    4), read at 0 (emitted at 2), into plane 0 (position 0) through lanes 0 and 1: 3 and 4
    hops, so they issue at 5 and 6; they run over [5, 13) and [6, 14): 16 rows in 9 cycles
    of plane 0 installing."""
    from lpx_tvm.machine.isa import DType, Stream
    from lpx_tvm.runtime.report import weight_placement

    cfg = load_config("mini")
    ins = [Instr("mem.read", 0, unit=1, count=8, addr=0, stride=1, dtype=DType.INT8, dst=Stream("W", 0), tag="fc.install"),
           Instr("mxm.install", 5, unit=0, count=8, buf=0, dtype=DType.INT8, aux0=16, addr=0, aux1=0,
                 src0=Stream("W", 0), tag="fc.install"),
           Instr("mem.read", 0, unit=2, count=8, addr=0, stride=1, dtype=DType.INT8, dst=Stream("W", 1), tag="fc.install"),
           Instr("mxm.install", 6, unit=0, count=8, buf=0, dtype=DType.INT8, aux0=16, addr=8, aux1=1,
                 src0=Stream("W", 1), tag="fc.install")]
    got = weight_placement(cfg, Program(cfg.hash, ins))
    assert got == {"fc": {"installs": 2, "rows": 16, "lanes": 2, "slices": 2, "hops": [3, 4],
                          "rows_per_cycle": round(16 / 9, 2)}}

"""A machine whose MXM is narrower than its lanes (``mxm.rows`` or ``mxm.cols`` <
``lanes``) is a valid machine: the ISA and the simulator take it (a hand-built program
installing 8-row weights on 16 lanes computes the right product). The compiler and the
GEMM kernel tile by whole stream vectors: they refuse it before making any program,
naming the keys, instead of emitting code the simulator reports as a hazard."""

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpx_tvm
from lpx_tvm import cli
from lpx_tvm.errors import ConfigError
from lpx_tvm.machine.config import PRESETS, load_config
from lpx_tvm.machine.schema import compiler_problem
from lpx_tvm.sim import Simulator
from lpx_tvm.target.builder import ProgramBuilder

RNG = np.random.default_rng(7)


def _machine(tmp_path, rows, cols):
    from importlib import resources

    data = json.loads((resources.files("lpx_tvm.machine") / "presets" / "mini.json").read_text())
    data["name"] = f"mini_r{rows}_c{cols}"
    data["mxm"].update(rows=rows, cols=cols)
    path = tmp_path / f"{data['name']}.json"
    path.write_text(json.dumps(data))
    return str(path)


def _dense():
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 24])],
        [numpy_helper.from_array(RNG.standard_normal((40, 24)).astype(np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_simulator_runs_a_narrow_mxm(tmp_path):
    cfg = load_config(_machine(tmp_path, 8, 16))
    b = ProgramBuilder(cfg, "narrow")
    A, B = b.input("A", (4, 8), "fp32"), b.input("B", (8, 16), "fp32")
    C = b.output("C", (4, 16), "fp32")
    g = b.group("install")
    g.install(0, 0, g.read(B.tile(0).rows(0, 8)), width=16)
    g = b.group("mul")
    g.mul(0, 0, g.read(A.tile(0).rows(0, 4)), acc=0, accumulate=False)
    g = b.group("drain")
    g.write(g.drain(0, 0, 4, "fp32"), C.tile(0).rows(0, 4))
    a, w = RNG.standard_normal((4, 8)).astype(np.float32), RNG.standard_normal((8, 16)).astype(np.float32)
    out = Simulator(cfg).run(b.build(), {"A": a, "B": w}).outputs["C"]
    np.testing.assert_allclose(out, a @ w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows, cols, named", [(8, 16, "mxm.rows=8 with"), (16, 8, "mxm.cols=8 with"),
                                               (8, 8, "mxm.rows=8 and mxm.cols=8 with")])
def test_the_compiler_refuses_a_narrow_mxm_naming_the_keys(tmp_path, rows, cols, named):
    machine = _machine(tmp_path, rows, cols)
    with pytest.raises(ConfigError, match=f"machine mini_r{rows}_c{cols}: {named} lanes=16"):
        lpx_tvm.compile_model(_dense(), preset=machine, precision="fp32")


def test_the_gemm_kernel_command_refuses_it_in_one_line(tmp_path, capsys):
    machine = _machine(tmp_path, 16, 8)  # the kernel itself would fail with an IndexError
    argv = ["kernel", "gemm", "--shape", "16", "16", "16", "--preset", machine, "-o", str(tmp_path / "k.lpx")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("lpx-tvm: error: machine mini_r16_c8: mxm.cols=8")
    assert not (tmp_path / "k.lpx").exists()


def test_every_preset_is_a_machine_the_compiler_takes():
    assert [compiler_problem(load_config(name)) for name in PRESETS] == [None] * len(PRESETS)


def test_the_gemm_kernel_refuses_it_through_the_api_too(tmp_path):
    from lpx_tvm.kernels import gemm

    with pytest.raises(ConfigError, match="machine mini_r16_c8: mxm.cols=8 with lanes=16"):
        gemm(load_config(_machine(tmp_path, 16, 8)), 16, 16, 16, "fp32")

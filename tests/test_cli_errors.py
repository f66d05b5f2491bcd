"""The CLI turns every failure into one line: a problem with the input exits 2 with
``lpx-tvm: error:``; an unexpected exception is reported as an internal error in one line
(exit 3) that points to ``--debug``, which shows the traceback instead."""

import pathlib
import sys

import pytest

from lpx_tvm import cli


@pytest.fixture
def broken_kernel(monkeypatch):
    """``lpx-tvm kernel`` with a handler that fails the way a bug would."""
    def handler(args):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")

    name, (text, add, _) = "kernel", cli.COMMANDS["kernel"]
    monkeypatch.setitem(cli.COMMANDS, name, (text, add, handler))


ARGV = ["kernel", "gemm", "--shape", "16", "16", "16", "--preset", "mini", "-o", "k.lpx"]


def test_an_internal_error_is_one_line_with_its_own_status(broken_kernel, capsys):
    assert cli.main(ARGV) == cli.EXIT_INTERNAL == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("lpx-tvm: internal error") and "TypeError" in err[0] and "--debug" in err[0]


@pytest.mark.parametrize("argv", [["--debug"] + ARGV, ARGV + ["--debug"]])
def test_debug_shows_the_traceback(broken_kernel, argv):
    with pytest.raises(TypeError, match="unsupported operand"):
        cli.main(argv)


def test_input_problems_still_exit_2(tmp_path, capsys):
    assert cli.main(["disasm", str(tmp_path / "missing.lpx")]) == 2
    assert capsys.readouterr().err.startswith("lpx-tvm: error:")


def test_run_refuses_flags_it_would_ignore(tmp_path, capsys):
    """Each flag of ``run`` either works or is refused: an artifact runs as compiled, a
    model has no timing-only run, a program binary has no precision."""
    import onnx

    import lpx_tvm
    from lpx_tvm.kernels import transpose
    from lpx_tvm.machine.encoding import save_program

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "e2e"))
    import test_build

    onnx.save(test_build.small_cnn(), str(tmp_path / "cnn.onnx"))
    lpx_tvm.compile_model(str(tmp_path / "cnn.onnx"), preset="mini", precision="fp32").save(tmp_path / "art")
    save_program(transpose("mini", 16, 16), tmp_path / "t.lpx")
    cases = [
        ([str(tmp_path / "art"), "--precision", "fp16"], "--precision cannot be used here"),
        ([str(tmp_path / "art"), "--preset", "tsp", "--timing-only"], "--preset, --timing-only cannot"),
        ([str(tmp_path / "art"), "--tuning-log", str(tmp_path)], "--tuning-log cannot"),
        ([str(tmp_path / "cnn.onnx"), "--timing-only", "--trace", str(tmp_path / "tr.json")],
         "--timing-only cannot"),
        ([str(tmp_path / "t.lpx"), "--precision", "fp32"], "--precision cannot"),
    ]
    for argv, message in cases:
        assert cli.main(["run"] + argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("lpx-tvm: error:") and message in err, (argv, err)
    assert not (tmp_path / "tr.json").exists()


def test_a_program_given_strings_is_an_input_error(tmp_path, capsys):
    import numpy as np

    from lpx_tvm.kernels import transpose
    from lpx_tvm.machine.encoding import save_program

    save_program(transpose("mini", 16, 16), tmp_path / "t.lpx")
    np.savez(tmp_path / "in.npz", X=np.full((16, 16), "a"))
    assert cli.main(["run", str(tmp_path / "t.lpx"), "--inputs", str(tmp_path / "in.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lpx-tvm: error:") and "'X'" in err and "<U1" in err


# ---- nothing printed around the one line: warnings, TVM's prints and C++ log lines ----

def _gemm_inputs(tmp_path, dtype, a):
    import numpy as np

    from lpx_tvm.kernels import gemm
    from lpx_tvm.machine.encoding import save_program

    save_program(gemm("mini", 16, 16, 16, dtype), tmp_path / "g.lpx")
    np.savez(tmp_path / "in.npz", A=a, B=np.ones((16, 16), np.float32))
    return ["run", str(tmp_path / "g.lpx"), "--inputs", str(tmp_path / "in.npz")]


def test_a_nan_input_gives_the_error_line_alone(tmp_path, capfd):
    """numpy warns while casting NaN to int8 before the check refuses it: the warning
    is shown only with --debug, below the error line."""
    import numpy as np

    a = np.ones((16, 16), np.float32)
    a[3, 4] = np.nan
    argv = _gemm_inputs(tmp_path, "int8", a)
    capfd.readouterr()
    assert cli.main(argv) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.splitlines() == ["lpx-tvm: error: tensor 'A': values do not fit dtype int8 exactly"]
    assert cli.main(argv + ["--debug"]) == 2
    lines = capfd.readouterr().err.splitlines()
    assert lines[0].startswith("lpx-tvm: error:") and lines[1:] == [
        "lpx-tvm: warning: invalid value encountered in cast (RuntimeWarning)"]


def test_a_warning_of_a_successful_run_is_one_line_after_its_output(tmp_path, capfd):
    import numpy as np

    argv = _gemm_inputs(tmp_path, "fp16", np.full((16, 16), 1e6, np.float32))  # past fp16's range
    capfd.readouterr()
    assert cli.main(argv) == 0
    out, err = capfd.readouterr()
    assert "cycles" in out and err.splitlines() == ["lpx-tvm: warning: overflow encountered in cast (RuntimeWarning)"]


def _reshape_model(shape_at_run_time: bool):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    if shape_at_run_time:
        inputs = [("x", TensorProto.FLOAT, [4, 16]), ("shape", TensorProto.INT64, [2])]
        inits, out = [], ["a", "b"]
    else:
        inputs = [("x", TensorProto.FLOAT, ["n", 16])]
        inits, out = [numpy_helper.from_array(np.array([4, 4, 4], np.int64), "shape")], [4, 4, 4]
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape")], "g",
                              [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info("r", TensorProto.FLOAT, out)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_runtime_shape_reshape_is_one_line_naming_it(tmp_path, capfd):
    """TVM's importer prints the failed node's inputs to stdout, and its block builder
    logs on fd 2 when freed; neither reaches the terminal."""
    import onnx

    onnx.save(_reshape_model(True), tmp_path / "m.onnx")
    capfd.readouterr()
    assert cli.main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "art")]) == 2
    out, err = capfd.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("lpx-tvm: error:") and "Reshape 'reshape' takes its shape 'shape' at run time" in err


def test_input_shapes_the_model_cannot_take_are_one_error_naming_the_node(capfd):
    import pytest

    import lpx_tvm
    from lpx_tvm.relax_passes.errors import ModelError

    capfd.readouterr()
    with pytest.raises(ModelError, match="failed on Reshape 'reshape'.*product T.int64.48."):
        lpx_tvm.compile_model(_reshape_model(False), preset="mini", input_shapes={"x": (3, 16)})
    import gc

    gc.collect()  # what the failure left is freed by now, without a word
    assert capfd.readouterr() == ("", "")

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
    whole-model trace is not there yet, a program binary has no precision."""
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
        ([str(tmp_path / "cnn.onnx"), "--trace", str(tmp_path / "tr.json")], "--trace cannot"),
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

"""The CLI turns every failure into one line: a problem with the input exits 2 with
``lpx-tvm: error:``; an unexpected exception is reported as an internal error in one line
(exit 3) that points to ``--debug``, which shows the traceback instead."""

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

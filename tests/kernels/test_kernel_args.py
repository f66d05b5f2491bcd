"""Bad kernel arguments are one clear error naming the kernel and the argument, through
the API and through ``lpx-tvm kernel`` (exit status 2, one ``lpx-tvm: error:`` line)."""

import pytest

from lpx_tvm import kernels
from lpx_tvm.cli import main
from lpx_tvm.errors import LPXError


@pytest.mark.parametrize("call, message", [
    (lambda: kernels.gemm("mini", 0, 64, 64), "gemm: M must be a positive integer, got 0"),
    (lambda: kernels.gemm("mini", 16, 16, 16, "int4"), "gemm: unknown dtype 'int4'"),
    (lambda: kernels.gemm("mini", 16, 16, 16, "int32"), "gemm: dtype int32 is not supported"),
    (lambda: kernels.softmax("mini", 16, 0), "softmax: cols must be a positive integer, got 0"),
    (lambda: kernels.softmax("mini", 16, 8, "int8"), "softmax: dtype int8 is not supported"),
    (lambda: kernels.layernorm("mini", -1, 8, [1.0] * 8, [0.0] * 8), "layernorm: rows must be a positive"),
    (lambda: kernels.transpose("mini", 16, 2.5), "transpose: cols must be a positive integer, got 2.5"),
])
def test_bad_arguments_name_the_kernel_and_argument(call, message):
    with pytest.raises(LPXError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


@pytest.mark.parametrize("argv, message", [
    (["kernel", "gemm", "--shape", "0", "64", "64"], "gemm: M must be a positive integer"),
    (["kernel", "gemm", "--shape", "16", "16", "16", "--dtype", "int4"], "gemm: unknown dtype 'int4'"),
    (["kernel", "softmax", "--shape", "16", "0"], "softmax: cols must be a positive integer"),
])
def test_cli_kernel_errors_are_one_line(argv, message, tmp_path, capsys):
    assert main(argv + ["--preset", "mini", "-o", str(tmp_path / "k.lpx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lpx-tvm: error:") and message in err[0], err
    assert not (tmp_path / "k.lpx").exists()


def test_valid_arguments_still_build():
    prog = kernels.softmax("mini", 16, 8, "fp16")
    assert prog.instrs

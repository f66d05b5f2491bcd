"""``lpx-tvm kernel``: a hand-written kernel into a program binary."""

from __future__ import annotations

import argparse


def _kernel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=["gemm", "softmax", "layernorm", "transpose"])
    p.add_argument("--shape", type=int, nargs="+", required=True,
                   help="gemm: M K N; softmax, layernorm, transpose: ROWS COLS")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--preset", default="tsp")
    p.add_argument("-o", "--output", required=True, help="program binary to write (.lpx)")


def _kernel(args) -> int:
    import numpy as np

    from .. import kernels
    from ..errors import ProgramError
    from ..machine.encoding import save_program

    from ..files import Output, check_outputs

    check_outputs([Output("-o", args.output)], inputs=[args.preset])
    need = 3 if args.name == "gemm" else 2
    if len(args.shape) != need:
        raise ProgramError(f"{args.name} takes {need} sizes, got {len(args.shape)}")
    if args.name == "layernorm":
        cols = args.shape[1]
        prog = kernels.layernorm(args.preset, *args.shape, np.ones(cols), np.zeros(cols), args.dtype)
    else:
        prog = getattr(kernels, args.name)(args.preset, *args.shape, args.dtype)
    save_program(prog, args.output)
    print(f"{args.output}: {len(prog.instrs)} instructions")
    return 0

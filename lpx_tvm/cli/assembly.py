"""``lpx-tvm disasm`` and ``lpx-tvm asm``: a program binary to its listing and back."""

from __future__ import annotations

import argparse

from .arguments import _write_text

# ---- disasm -----------------------------------------------------------------------


def _disasm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="LPX program binary (.lpx)")
    p.add_argument("-o", "--output", help="write the listing here instead of stdout")


def _disasm(args) -> int:
    from ..files import Output, check_outputs
    from ..machine.asm import format_program
    from ..machine.encoding import load_program

    check_outputs([Output("-o", args.output)], inputs=[args.file])
    _write_text(format_program(load_program(args.file)), args.output)
    return 0


# ---- asm --------------------------------------------------------------------------


def _asm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="LPX assembly text (.s)")
    p.add_argument("-o", "--output", required=True, help="program binary to write (.lpx)")


def _asm(args) -> int:
    from ..errors import EncodingError
    from ..files import Output, check_outputs
    from ..machine.asm import parse_program
    from ..machine.encoding import save_program

    check_outputs([Output("-o", args.output)], inputs=[args.file])
    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise EncodingError(f"{args.file}: no such file") from None
    except UnicodeDecodeError as e:
        raise EncodingError(f"{args.file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        prog = parse_program(text)
    except EncodingError as e:
        raise EncodingError(f"{args.file}: {e}") from None
    save_program(prog, args.output)
    return 0

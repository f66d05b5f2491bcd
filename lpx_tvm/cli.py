"""The ``lpx-tvm`` command line.

Each subcommand is an entry of :data:`COMMANDS`: its name maps to a function adding its
arguments to an argparse parser and a handler taking the parsed arguments and
returning an exit code. Library errors are turned into one ``lpx-tvm: error:`` line
here and nowhere else.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .errors import LPXError

PROG = "lpx-tvm"


def _write_text(text: str, out) -> None:
    if out is None:
        sys.stdout.write(text)
    else:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)


# ---- disasm -----------------------------------------------------------------------

def _disasm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="LPX program binary (.lpx)")
    p.add_argument("-o", "--output", help="write the listing here instead of stdout")


def _disasm(args) -> int:
    from .target.asm import format_program
    from .target.encoding import load_program

    _write_text(format_program(load_program(args.file)), args.output)
    return 0


# ---- asm --------------------------------------------------------------------------

def _asm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="LPX assembly text (.s)")
    p.add_argument("-o", "--output", required=True, help="program binary to write (.lpx)")


def _asm(args) -> int:
    from .errors import EncodingError
    from .target.asm import parse_program
    from .target.encoding import save_program

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


# name -> (help, add_arguments(parser), handler(args) -> exit code)
COMMANDS = {
    "disasm": ("print the assembly listing of a program binary", _disasm_args, _disasm),
    "asm": ("assemble a text listing into a program binary", _asm_args, _asm),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subparser per entry of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog=PROG, description="LPX compiler, simulator and tools.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, handler) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(handler=handler)
    return parser


def main(argv=None) -> int:
    """Run the ``lpx-tvm`` command line; return the exit code (2 on any error)."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (LPXError, OSError) as e:
        msg = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
        msg = msg or type(e).__name__
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``lpx-tvm`` entry: the commands collected into one parser, and library errors turned into
one ``lpx-tvm: error:`` line here and nowhere else (docs/errors.md)."""

from __future__ import annotations

import argparse
import sys
import warnings

from .. import __version__
from ..errors import LPXError
from .arguments import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, PROG, _Parser
from .assembly import _asm, _asm_args, _disasm, _disasm_args
from .compile import _compile, _compile_args
from .demo import _demo, _demo_args
from .generate import _generate, _generate_args
from .kernel import _kernel, _kernel_args
from .planning import _plan, _plan_args
from .profiling import _profile, _profile_args
from .run import _run, _run_args
from .tuning import _tune, _tune_args

# name -> (help, add_arguments(parser), handler(args) -> exit code)
COMMANDS = {
    "demo": ("compile a bundled ONNX model for LPX, run it, check it against onnxruntime", _demo_args, _demo),
    "compile": ("compile an ONNX model for LPX into an artifact folder", _compile_args, _compile),
    "run": ("run a model, an artifact or a program binary on the simulated LPX", _run_args, _run),
    "profile": ("run a model once and write its whole-model trace, per-layer floors and roofline figure",
                _profile_args, _profile),
    "tune": ("search the MXM schedules of a model on the simulator into a tuning log", _tune_args, _tune),
    "generate": ("compile a decoder LLM (a transformers config) for one chip or a system and generate tokens "
                 "greedily",
                 _generate_args, _generate),
    "plan": ("predict the mappings of a decoder LLM onto a system of chips from simulated layers",
             _plan_args, _plan),
    "kernel": ("build a hand-written kernel into a program binary", _kernel_args, _kernel),
    "disasm": ("print the assembly listing of a program binary", _disasm_args, _disasm),
    "asm": ("assemble a text listing into a program binary", _asm_args, _asm),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subparser per entry of :data:`COMMANDS`."""
    parser = _Parser(prog=PROG, description="LPX compiler, simulator and tools.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, handler) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
        p.set_defaults(handler=handler)
    return parser


DEBUG_HELP = "on an internal error, show Python's traceback instead of one line"


def _one_line(e: BaseException) -> str:
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


def main(argv=None) -> int:
    """Run the ``lpx-tvm`` command line; return the exit code (0; 2 for a problem with the
    input; 3 for an internal error; 130 when interrupted).

    Warnings raised while a command runs are held back: after a success each is one
    ``lpx-tvm: warning:`` line at the end; after a failure only the error line is
    printed, and ``--debug`` shows the warnings (and TVM's log lines) below it.
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # a flag's value refused: one line (_Parser.error); --help and --version: 0
        if e.code == EXIT_INPUT:
            return EXIT_INPUT
        raise
    failure = []  # the exception, held until _release_failure
    with warnings.catch_warnings(record=True) as caught:
        try:
            status = args.handler(args)
        except (LPXError, OSError) as e:
            status, error = EXIT_INPUT, f"{PROG}: error: {_one_line(e)}"
            failure.append(e)
        except KeyboardInterrupt as e:
            status, error = EXIT_INTERRUPTED, f"{PROG}: interrupted"
            failure.append(e)
        except Exception as e:  # anything else is a bug of ours: say so in one line
            if args.debug:
                _print_warnings(caught)
                raise
            failure.append(e)
            status = EXIT_INTERNAL
            error = (f"{PROG}: internal error (a bug in lpx_tvm): {type(e).__name__}: {_one_line(e)}; "
                     f"run again with --debug for the traceback")
    if not failure:
        _print_warnings(caught)
        return status
    # What the failure's traceback holds (TVM's builders among it) is freed here, where
    # TVM's C++ log lines about it cannot come before or after the error line.
    late = _release_failure(failure)
    print(error, file=sys.stderr)
    if args.debug:
        _print_warnings(caught)
        sys.stderr.write(late)
    return status


def _release_failure(held: list) -> str:
    """Drop the exception in ``held`` and collect what its traceback's frames kept alive;
    returns what TVM wrote to fd 2 meanwhile ("" when TVM was never imported)."""
    import gc

    if "tvm" not in sys.modules:
        held.clear()
        return ""
    from ..relax_passes.tvm_output import captured_fd2

    with captured_fd2() as captured:
        held.clear()
        gc.collect()
    return captured[0]


def _print_warnings(caught) -> None:
    seen = set()
    for w in caught:
        line = f"{PROG}: warning: {_one_line(w.message)}"
        if w.category is not UserWarning:
            line += f" ({w.category.__name__})"
        if line not in seen:
            seen.add(line)
            print(line, file=sys.stderr)

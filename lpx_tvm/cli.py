"""The ``lpx-tvm`` command line.

Each subcommand is an entry of :data:`COMMANDS`: its name maps to a function adding its
arguments to an argparse parser and a handler taking the parsed arguments and
returning an exit code. Library errors are turned into one ``lpx-tvm: error:`` line
here and nowhere else.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings

from . import __version__
from .errors import LPXError
from .precision import Precision

PROG = "lpx-tvm"
# The precisions of the decoder LLM commands (lpx_tvm.llm.session.PRECISIONS, restated:
# ``--help`` imports neither torch nor TVM).
LLM_PRECISIONS = ["fp32", "fp16", "bf16", "int8", "fp8"]


# ---- flag values: each numeric flag's range is checked as it is parsed ---------------

INT64_MAX = 2**63 - 1


def _whole(text: str, low: int, high: int = INT64_MAX) -> int:
    t = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", t):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    v = int(t)
    if v > high == INT64_MAX:
        raise argparse.ArgumentTypeError(f"{v} is beyond int64")
    if not low <= v <= high:
        want = f"of at least {low}" if high == INT64_MAX else f"from {low} to {high}"
        raise argparse.ArgumentTypeError(f"{v} is out of range: expected an integer {want}")
    return v


def whole_number(low: int):
    """An argparse ``type``: an integer of at least ``low`` (and within int64)."""
    def parse(text: str) -> int:
        return _whole(text, low)

    parse.__name__ = f"integer >= {low}"
    return parse


positive_int, natural_int = whole_number(1), whole_number(0)


def int_list(low: int, unique: bool = True):
    """An argparse ``type``: comma-separated integers of at least ``low``; an empty list, an
    empty item or (``unique``) a repeated value is refused."""
    def parse(text: str) -> list:
        if not text.strip():
            raise argparse.ArgumentTypeError("an empty list: expected comma-separated integers, e.g. 1,2,4")
        values = []
        for item in text.split(","):
            if not item.strip():
                raise argparse.ArgumentTypeError(f"{text!r} has an empty item: expected comma-separated integers")
            v = _whole(item, low)
            if unique and v in values:
                raise argparse.ArgumentTypeError(f"{v} is given twice")
            values.append(v)
        return values

    parse.__name__ = "list of integers"
    return parse


def _number(text: str, within, expected: str) -> float:
    """``text`` as a float for which ``within`` holds (nan never does), or argparse's error
    saying what was ``expected``."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not within(v):
        raise argparse.ArgumentTypeError(f"{text} is out of range: expected {expected}")
    return v


def fraction(text: str) -> float:
    """An argparse ``type``: a number in (0, 1]."""
    return _number(text, lambda v: 0 < v <= 1, "a share in (0, 1], e.g. 0.9")


def non_negative(text: str) -> float:
    """An argparse ``type``: a finite number of at least 0."""
    return _number(text, lambda v: 0 <= v < float("inf"), "a finite number of at least 0")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (argparse prints its usage above them)."""

    def error(self, message):
        self.exit(EXIT_INPUT, f"{PROG}: error: {message} (see {self.prog} --help)\n")


def _check_ray(address) -> None:
    """Refuse a Ray address where nothing answers, within seconds (Ray itself retries for
    minutes): ``auto`` and ``local`` are Ray's to resolve."""
    if not address or address in ("auto", "local"):
        return
    import socket

    host, sep, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LPXError(f"--ray {address}: expected HOST:PORT of a Ray cluster's head (or ray://HOST:PORT, or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_S).close()
    except OSError as e:
        raise LPXError(f"--ray {address}: nothing answers at {host}:{port} ({e.strerror or e or 'timed out'}); "
                       "start the cluster (ray start --head) or give its address") from None


RAY_CONNECT_S = 3.0


def _save_npz(path: str, arrays: dict) -> None:
    """An npz archive at exactly ``path`` (numpy would add ``.npz`` to a name without it)."""
    import numpy as np

    with open(path, "wb") as f:
        np.savez(f, **arrays)


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
    from .files import Output, check_outputs
    from .machine.asm import format_program
    from .machine.encoding import load_program

    check_outputs([Output("-o", args.output)], inputs=[args.file])
    _write_text(format_program(load_program(args.file)), args.output)
    return 0


# ---- asm --------------------------------------------------------------------------

def _asm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="LPX assembly text (.s)")
    p.add_argument("-o", "--output", required=True, help="program binary to write (.lpx)")


def _asm(args) -> int:
    from .errors import EncodingError
    from .files import Output, check_outputs
    from .machine.asm import parse_program
    from .machine.encoding import save_program

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


# ---- run --------------------------------------------------------------------------

def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx model, a model bundled with onnx (light_resnet50, ...), an artifact "
                                 "folder (lpx-tvm compile) or a program binary (.lpx)")
    p.add_argument("--inputs", help="npz file whose keys are the model's input names")
    p.add_argument("--fill-mode", choices=FILL_MODES,
                   help="fill the inputs --inputs does not give (all of them without --inputs): random (seeded "
                        "standard normal values; integers 0 to 9), zeros or ones")
    _input_shapes_arg(p)
    p.add_argument("--outputs", help="npz file to write the outputs to, keyed by output name")
    p.add_argument("--report", help="JSON report to write (cycles, latency, utilization, offload, layers)")
    p.add_argument("--trace", help="Chrome/Perfetto trace JSON to write (a model's: every unit, layer and CPU "
                                   "kernel of the whole run, docs/profile.md)")
    p.add_argument("--preset", default=None, help="machine: tsp, mini, lp30 or a JSON file (default: tsp; a "
                                                   "program or artifact runs on the machine it was built for)")
    p.add_argument("--precision", default=None, choices=Precision.names(), help="ONNX models (default: fp16)")
    p.add_argument("--timing-only", action="store_true", help="program binaries: skip the arithmetic")
    p.add_argument("--tuning-log", help="ONNX models: tuning log folder (lpx-tvm tune) whose schedules to use")


# The flags of `run` that each kind of model takes (the others are refused, never ignored).
_RUN_FLAGS = {
    "onnx": ("preset", "precision", "tuning_log", "input_shapes", "trace"),
    "artifact": ("trace",),  # built for one machine, precision and input shapes, its schedules fixed
    "program": ("preset", "timing_only", "trace"),
}
_FLAG_NAMES = {"preset": "--preset", "precision": "--precision", "tuning_log": "--tuning-log",
               "timing_only": "--timing-only", "trace": "--trace", "input_shapes": "--input-shapes"}


def _refuse_flags(args, kind: str, what: str):
    from .errors import LPXError

    given = [f for f in _FLAG_NAMES if getattr(args, f, None) not in (None, False) and f not in _RUN_FLAGS[kind]]
    if given:
        why = {"artifact": "an artifact runs as it was compiled (compile it again to change them)",
               "onnx": "timing-only runs are for program binaries (.lpx); lpx-tvm profile MODEL shows a "
                       "model's timing",
               "program": "a program binary is already compiled, for its input shapes"}[kind]
        raise LPXError(f"{what}: {', '.join(_FLAG_NAMES[f] for f in given)} cannot be used here: {why}")


def _program_preset(prog, preset):
    from .errors import ProgramError
    from .machine.config import PRESETS, load_config

    if preset is not None:
        return load_config(preset)
    for name in PRESETS:
        cfg = load_config(name)
        if cfg.hash == prog.config_hash:
            return cfg
    raise ProgramError(f"program was built for machine config {prog.config_hash}, which is no bundled "
                       "preset; pass --preset FILE.json")


def _load_npz(path):
    import numpy as np

    from .errors import ProgramError

    try:
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    except FileNotFoundError:
        raise ProgramError(f"{path}: no such file") from None
    except Exception as e:  # numpy raises several types for a corrupt archive
        raise ProgramError(f"{path}: not a readable npz file ({e})") from None


def _run(args) -> int:
    import os

    from .files import Output, check_outputs

    check_outputs([Output("--outputs", args.outputs), Output("--report", args.report), Output("--trace", args.trace)],
                  inputs=[args.model, args.inputs, args.preset, args.tuning_log])
    if args.model.endswith(".lpx"):
        _refuse_flags(args, "program", args.model)
        return _run_program(args)
    path = _bundled_model(args.model)
    _refuse_flags(args, "artifact" if os.path.isdir(path) else "onnx", args.model)
    model = _load_model(args)
    inputs = _run_inputs(args, model.inputs)
    if args.trace:
        from .runtime.profile import profile_model
        from .runtime.profile_trace import model_trace, save_trace

        profile, outputs = profile_model(model, inputs)
        save_trace(model_trace(profile), args.trace)
    else:
        outputs = model.run(inputs)
    if args.outputs:
        _save_npz(args.outputs, outputs)
    report = model.report
    if args.report:
        report.save(args.report)
    _print_model_report(report)
    return 0


def _load_model(args):
    """The model ``run`` runs: an artifact folder loaded, or an ONNX file (or a bundled
    model's name) compiled."""
    import os

    from . import compile_model, load

    path = _bundled_model(args.model)
    if os.path.isdir(path):
        return load(path)
    return compile_model(path, preset=args.preset or "tsp", precision=args.precision or Precision.FP16,
                         input_shapes=_parse_input_shapes(args.input_shapes), tuning_log=args.tuning_log)


def _run_inputs(args, specs, fill_mode=None) -> dict:
    """The inputs of a run: the ``--inputs`` npz, and ``--fill-mode`` values (or
    ``fill_mode``'s) for the inputs ``specs`` ``[(name, shape, dtype)]`` it does not give."""
    inputs = _load_npz(args.inputs) if args.inputs else {}
    fill_mode = args.fill_mode or fill_mode
    if fill_mode:
        inputs.update(fill_inputs([spec for spec in specs if spec[0] not in inputs], fill_mode))
    return inputs


FILL_MODES = ("random", "zeros", "ones")


def fill_inputs(specs, mode: str, seed: int = 0) -> dict:
    """Input arrays for ``specs`` ``[(name, shape, dtype)]``: ``random`` gives seeded
    standard normal values (integers 0 to 9, small enough for any index input; booleans
    at random), ``zeros`` and ``ones`` constant arrays."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape, dtype in specs:
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        if mode == "zeros":
            arrays[name] = np.zeros(shape, dtype)
        elif mode == "ones":
            arrays[name] = np.ones(shape, dtype)
        elif dtype.kind == "b":
            arrays[name] = rng.integers(0, 2, shape).astype(dtype)
        elif dtype.kind in "iu":
            arrays[name] = rng.integers(0, 10, shape).astype(dtype)
        else:
            arrays[name] = rng.standard_normal(shape).astype(dtype)
    return arrays


def _input_shapes_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-shapes", metavar="NAME:DIMS[,NAME:DIMS...]",
                   help="ONNX models: static shapes for inputs with dynamic dimensions, e.g. "
                        "input:1x3x224x224,mask:1x128 (an input name may hold ':'; the last one separates)")


def _parse_input_shapes(text):
    """``name:1x3x224x224[,name2:...]`` -> {name: (1, 3, 224, 224), ...}; None for None."""
    if text is None:
        return None
    import re

    from .errors import LPXError

    def bad(why):
        return LPXError(f"--input-shapes {text!r}: {why}; expected NAME:DIMS[,NAME:DIMS...], "
                        "e.g. input:1x3x224x224")

    shapes = {}
    for item in text.split(","):
        name, sep, dims = item.strip().rpartition(":")
        if not sep or not name:
            raise bad(f"{item.strip()!r} has no input name before ':'" if sep else
                      f"{item.strip()!r} is not NAME:DIMS")
        sizes = dims.strip().lower().split("x")
        if not all(re.fullmatch(r"\s*[0-9]+\s*", d) and int(d) > 0 for d in sizes):
            raise bad(f"the shape {dims.strip()!r} of {name!r} is not positive integers joined by 'x'")
        if name in shapes:
            raise bad(f"{name!r} is given twice")
        shapes[name] = tuple(int(d) for d in sizes)
    return shapes


def _run_program(args) -> int:
    import time

    from .machine.encoding import load_program
    from .runtime.report import program_report
    from .sim import Simulator

    prog = load_program(args.model)
    cfg = _program_preset(prog, args.preset)
    inputs = _run_inputs(args, [(b.name, b.layout.shape, b.layout.dtype.np) for b in prog.inputs])
    t = time.perf_counter()
    result = Simulator(cfg).run(prog, inputs, timing_only=args.timing_only, trace=bool(args.trace))
    report = program_report(result, prog, time.perf_counter() - t)
    if args.outputs and not args.timing_only:
        _save_npz(args.outputs, result.outputs)
    if args.report:
        report.save(args.report)
    if args.trace:
        result.trace.save(args.trace)
    _print_program_report(report)
    return 0


# ---- compile ----------------------------------------------------------------------

def _compile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx model or a model bundled with onnx (light_resnet50, ...)")
    p.add_argument("-o", "--output", required=True, help="artifact folder to write")
    p.add_argument("--preset", default="tsp", help="tsp, mini, lp30 or a JSON machine file")
    p.add_argument("--precision", default="fp16", choices=Precision.names())
    p.add_argument("--tuning-log", help="tuning log folder (lpx-tvm tune) whose schedules to use")
    _input_shapes_arg(p)


def _compile(args) -> int:
    from . import compile_model
    from .files import Output, check_outputs, manifest_says
    from .runtime.artifact import FORMAT

    # The rule of save_artifact (runtime/artifact.py), checked before the compile.
    check_outputs([Output("-o", args.output, folder=True, ours=manifest_says(FORMAT),
                          what="an LPX artifact")], inputs=[args.model, args.preset, args.tuning_log])
    shapes = _parse_input_shapes(args.input_shapes)
    model = compile_model(_bundled_model(args.model), preset=args.preset, precision=args.precision,
                          input_shapes=shapes, tuning_log=args.tuning_log)
    model.save(args.output)
    n = len(model.executable.regions)
    print(f"{args.output}: {n} LPX region{'s' if n != 1 else ''} for {model.preset} ({args.precision})")
    return 0


def _print_model_report(rep) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    top = Table(title=f"model on {rep.preset} ({rep.precision})", show_header=False)
    top.add_row("cycles", f"{rep.cycles:,}")
    top.add_row("latency", f"{rep.latency_s * 1e3:,.3f} ms")
    top.add_row("MACs on LPX", f"{rep.macs:,}")
    top.add_row("MXM utilization", f"{rep.mxm_utilization:.1%}")
    top.add_row("simulator wall time", f"{rep.sim_wall_s:.2f} s")
    top.add_row("CPU ops wall time", f"{rep.cpu_wall_s:.2f} s")
    console.print(top)
    off = Table(title="offload")
    for col in ("op", "on LPX", "on CPU"):
        off.add_column(col, justify="left" if col == "op" else "right")
    lpx, cpu = rep.offload.lpx, rep.offload.cpu
    for op in sorted(set(lpx) | set(cpu)):
        off.add_row(op, str(lpx.get(op, 0)), str(cpu.get(op, 0)))
    console.print(off)


# ---- profile ----------------------------------------------------------------------

PROFILE_FILES = {"trace": "trace.json", "table": "layers.json", "roofline": "roofline.png"}


def _profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx model, a model bundled with onnx (light_resnet50, ...), an artifact "
                                 "folder (lpx-tvm compile), or a decoder LLM's transformers config.json (its "
                                 "decode step: docs/llm.md)")
    p.add_argument("-o", "--output", required=True,
                   help=f"folder to write {', '.join(PROFILE_FILES.values())} into (made if missing)")
    p.add_argument("--inputs", help="npz file whose keys are the model's input names")
    p.add_argument("--fill-mode", choices=FILL_MODES, default=None,
                   help="ONNX models: fill the inputs --inputs does not give: random (the default), zeros or ones")
    _input_shapes_arg(p)
    p.add_argument("--preset", default=None, help="tsp, mini, lp30 or a JSON file (default: tsp)")
    p.add_argument("--precision", default=None, choices=LLM_PRECISIONS,
                   help="default: fp16; fp8 for decoder configs on an MXM that multiplies it (lp30)")
    p.add_argument("--tuning-log", help="ONNX models: tuning log folder (lpx-tvm tune) whose schedules to use")
    p.add_argument("--max-context", type=whole_number(2), default=None,
                   help="decoder configs: positions of the KV cache (default 256)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="decoder configs: sequences decoded together (default 1)")


def _profile(args) -> int:
    """Run a model once and write its whole-model trace, its per-layer table (floors,
    bottleneck) and its roofline figure into one folder (docs/profile.md)."""
    import json
    import os

    from .errors import LPXError
    from .files import Output, check_outputs, holds_only
    from .runtime.profile import profile_model
    from .runtime.profile_trace import model_trace, save_trace
    from .runtime.roofline import pyplot, save_roofline

    if args.model.endswith(".lpx"):
        raise LPXError(f"{args.model}: lpx-tvm profile takes a model; a program binary's trace is "
                       "lpx-tvm run PROGRAM --trace FILE")
    path = _bundled_model(args.model)
    decoder = path.endswith(".json")  # a decoder's config: its decode step
    _profile_flags(args, decoder)
    if os.path.isdir(path):
        _refuse_flags(args, "artifact", args.model)
    out = args.output
    check_outputs([Output("-o", out, folder=True, ours=holds_only(PROFILE_HEADS),
                          what="a folder of lpx-tvm profile's files")],
                  inputs=[path, args.inputs, args.tuning_log, args.preset])
    pyplot()  # before the run: a missing matplotlib says so now
    if decoder:
        from .llm.session import compile_llm, llm_machine, quiet_transformers

        llm_machine(args.precision or Precision.FP16, args.preset or "tsp", name="--precision")
        with quiet_transformers():
            session = compile_llm(path, preset=args.preset or "tsp", precision=args.precision or Precision.FP16,
                                  max_context=args.max_context or 256, batch=args.batch or 1)
        profile = session.profile()
    else:
        model = _load_model(args)
        profile, _ = profile_model(model, _run_inputs(args, model.inputs, args.fill_mode or "random"))
    os.makedirs(out, exist_ok=True)
    paths = {k: os.path.join(out, name) for k, name in PROFILE_FILES.items()}
    save_trace(model_trace(profile), paths["trace"])
    with open(paths["table"], "w", encoding="utf-8") as f:
        json.dump(profile.to_json(), f, indent=1)
    save_roofline(profile, paths["roofline"])
    _print_profile(profile)
    print(f"wrote {paths['trace']} (open in https://ui.perfetto.dev), {paths['table']}, {paths['roofline']}")
    return 0


# What each file of a profile folder begins with: a folder holding only these is one
# profile wrote (written again), any other non-empty folder is the user's (refused).
PROFILE_HEADS = {"trace.json": b'{"traceEvents"', "layers.json": b'{\n "preset"', "roofline.png": b"\x89PNG"}


def _profile_flags(args, decoder: bool) -> None:
    """Refuse the flags of ``profile`` the kind of model does not take (never ignore them)."""
    if decoder:
        given = [flag for flag, v in (("--inputs", args.inputs), ("--input-shapes", args.input_shapes),
                                      ("--tuning-log", args.tuning_log), ("--fill-mode", args.fill_mode)) if v]
        why = "a decoder config's profile is of its decode step, built from the config (they apply to ONNX models)"
    else:
        given = [flag for flag, v in (("--max-context", args.max_context), ("--batch", args.batch)) if v]
        if args.precision == "fp8":
            given.append("--precision fp8")
        why = "they apply to decoder configs (config.json); an ONNX model compiles at fp32, fp16, bf16 or int8"
    if given:
        raise LPXError(f"{args.model}: {', '.join(given)} cannot be used here: {why}")


def _print_profile(profile) -> None:
    from rich.console import Console
    from rich.table import Table

    # Off a terminal rich would wrap at 80 columns; layer names and numbers need more.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    kind, floor = profile.floors.largest()
    top = Table(title=f"profile on {profile.preset} ({profile.precision})", show_header=False)
    top.add_row("cycles", f"{profile.cycles:,}")
    top.add_row("largest floor", f"{kind} {floor:,.0f} cycles")
    top.add_row("cycles / largest floor", f"{profile.cycles / floor:.2f}x" if floor else "-")
    kernels = sum(1 for c in profile.calls if c.cpu)
    top.add_row("CPU kernels (measured wall time)",
                f"{kernels} call(s), {profile.cpu_wall_s * 1e3:,.3f} ms" if kernels else "none")
    console.print(top)
    table = Table(title="per layer: each cycle owned by one layer (docs/profile.md)")
    # "floor": the layer's largest floor; "of floor": that floor over the layer's cycles
    for col in ("layer", "cycles", "share", "waited", "MACs", "floor", "floor cycles", "of floor", "bottleneck"):
        table.add_column(col, justify="left" if col in ("layer", "floor", "bottleneck") else "right")
    for x in profile.layers:
        share = x.cycles / profile.cycles if profile.cycles else 0.0
        frac = "-" if x.floor_fraction is None else f"{x.floor_fraction:.1%}"
        table.add_row(x.name, f"{x.cycles:,}", f"{share:.1%}", f"{x.waited:,}", f"{x.macs:,}", x.floor_kind,
                      f"{x.floor_cycles:,.1f}", frac, x.bottleneck)
    console.print(table)


# ---- tune -------------------------------------------------------------------------

def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx model or a model bundled with onnx (light_resnet50, ...)")
    p.add_argument("--preset", default="tsp", help="tsp, mini, lp30 or a JSON machine file")
    p.add_argument("--precision", default="fp16", choices=Precision.names())
    p.add_argument("--trials", type=int, default=64, help="measured candidates per task (default 64)")
    p.add_argument("--log", required=True, help="tuning log folder to write (a rerun resumes it)")
    p.add_argument("--workers", type=int, default=0,
                   help="worker processes building and simulating candidates (0: this process)")
    p.add_argument("--ray", metavar="ADDRESS", help="send candidates to this Ray cluster instead")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategy", default="evolutionary", choices=["evolutionary", "random"],
                   help="evolutionary search guided by the XGBoost cost model, or random search")
    p.add_argument("--no-context", dest="context", action="store_false",
                   help="keep each task's best schedule measured alone; by default the search is followed "
                        "by a refinement that chooses each task's schedule by the whole model's cycles")
    p.add_argument("--context-top-k", type=int, default=4, metavar="K",
                   help="best distinct isolated schedules per task tried in the whole model (default 4)")
    p.add_argument("--context-sweeps", type=int, default=2, metavar="N",
                   help="passes over the tasks in the refinement (default 2; stops when one changes nothing)")
    p.add_argument("--no-placement", dest="placement", action="store_false",
                   help="skip the refinement's last pass, which tries each task's first plane and installs "
                        "ahead in the whole model (planes + 2 whole-model runs per task)")


def _tune(args) -> int:
    import time

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.table import Table

    from .machine.config import load_config
    from .relax_passes import import_onnx
    from .tune.tuner import extract_tasks, tune

    _check_ray(args.ray)
    cfg = load_config(args.preset)
    path = _bundled_model(args.model)
    mod = import_onnx(path).mod
    tasks = extract_tasks(mod, cfg, args.precision)
    console = Console()
    console.print(f"{args.model} on {cfg.name} ({args.precision}): {len(tasks)} tuning task(s), "
                  f"{args.trials} trials each, log {args.log}")
    start = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[unit]}"),
                  TimeRemainingColumn(), console=console, transient=False) as progress:
        bar = progress.add_task("tuning", total=None, unit="trials")

        def report(state, name):
            best, default = state["best"].get(name), state["default"].get(name)
            gain = f" ({default / best:.2f}x default)" if best and default else ""
            served = f"; {state['served']} measured before, from the log" if state["served"] else ""
            progress.update(bar, total=state["total"], completed=state["done"],
                            description=(f"{name}: best {best:,} cycles{gain}" if best else name) + served)

        results = tune(tasks, cfg, args.log, args.trials, workers=args.workers, ray_address=args.ray,
                       seed=args.seed, strategy=args.strategy, model=args.model, report=report)
        refined = None
        if args.context and tasks:
            from .tune.refine import refine_in_context

            ctx_bar = progress.add_task("in context", total=None, unit="whole-model runs")

            def ctx_report(st):
                where = f"{st['phase']}, {st['task']}" if st["task"] else st["phase"]
                progress.update(ctx_bar, total=st["total"], completed=st["done"],
                                description=f"in context ({where}): best {st['best']:,} cycles "
                                            f"({st['default'] / st['best']:.3f}x default)")

            refined = refine_in_context(mod, tasks, cfg, args.log, top_k=args.context_top_k,
                                        sweeps=args.context_sweeps, model=args.model, report=ctx_report,
                                        place=args.placement)
    table = Table(title=f"tuning {args.model} on {cfg.name}: {time.perf_counter() - start:.0f} s "
                        "(each task measured alone)")
    # "rejected": fast records whose outputs differed from the default schedule's (shown when any did).
    rejected = any(r.rejected for r in results)
    for col in ("task", "count", "trials") + (("rejected",) if rejected else ()) + ("default cycles", "tuned cycles", "speedup"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for r in results:
        if r.default_cycles is None:
            table.add_row(r.task.name, str(r.task.weight), *["-"] * (3 + rejected), f"not tuned: {r.error}")
            continue
        tuned = r.tuned_cycles if r.tuned_cycles is not None else r.default_cycles
        table.add_row(r.task.name, str(r.task.weight), str(r.trials), *([str(r.rejected)] if rejected else []),
                      f"{r.default_cycles:,}", f"{tuned:,}",
                      f"{r.default_cycles / tuned:.2f}x")
    console.print(table)
    if refined is not None:
        chosen = Table(title="chosen in the whole model")
        for col in ("task", "schedule"):
            chosen.add_column(col)
        for r in results:
            chosen.add_row(r.task.name, refined.choices.get(r.task.name, "default"))
        console.print(chosen)
        iso = refined.isolated_cycles
        iso = f"{iso:,} ({refined.default_cycles / iso:.3f}x)" if iso else "rejected by the compiler"
        console.print(f"whole model: default {refined.default_cycles:,} cycles, isolated best schedules {iso}, "
                      f"chosen in context {refined.cycles:,} ({refined.default_cycles / refined.cycles:.3f}x); "
                      f"{refined.evaluations} whole-model runs in {refined.wall_s:.0f} s")
    return 0


# ---- kernel -----------------------------------------------------------------------

def _kernel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=["gemm", "softmax", "layernorm", "transpose"])
    p.add_argument("--shape", type=int, nargs="+", required=True,
                   help="gemm: M K N; softmax, layernorm, transpose: ROWS COLS")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--preset", default="tsp")
    p.add_argument("-o", "--output", required=True, help="program binary to write (.lpx)")


def _kernel(args) -> int:
    import numpy as np

    from . import kernels
    from .errors import ProgramError
    from .machine.encoding import save_program

    from .files import Output, check_outputs

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


# ---- demo -------------------------------------------------------------------------

def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="light_resnet50",
                   help="a model bundled with the onnx package (light_resnet50, light_squeezenet, ...; its constant "
                        "weights replaced by seeded random values) or an .onnx file (run with its own weights)")
    p.add_argument("--preset", default="tsp")
    p.add_argument("--precision", default="bf16", choices=[p for p in Precision.names() if p != Precision.INT8],
                   help="bf16 by default: the precision of light_resnet50's shipped tuning log")
    p.add_argument("--no-tuning-log", dest="tuning_log", action="store_false",
                   help="compile with the default schedules even where a tuning log for the model, machine and "
                        "precision ships with lpx_tvm (lpx_tvm/tuning_logs/)")


def _bundled_model(name: str) -> str:
    import os

    import onnx

    if os.path.exists(name):
        return name
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"{name}.onnx")
    if not os.path.exists(path):
        from .errors import LPXError

        raise LPXError(f"{name}: no such file, and no model of that name is bundled with onnx")
    return path


def _demo(args) -> int:
    """Compile a bundled ONNX model for LPX, run it on the simulator, check its outputs and
    logits against onnxruntime and print the report."""
    import time

    import numpy as np
    import onnxruntime as ort

    from . import compile_model
    from .errors import LPXError
    from .light_models import compare_outputs
    from .machine.config import load_config

    path = _bundled_model(args.model)
    cfg = load_config(args.preset)
    log = None
    if args.tuning_log:
        from .tune.database import shipped_log

        log = shipped_log(args.model, cfg, args.precision)
    bundled = path != args.model
    onnx_model, logits = _demo_model(path, bundled)
    t = time.perf_counter()
    model = compile_model(onnx_model, preset=args.preset, precision=args.precision, tuning_log=log)
    compile_s = time.perf_counter() - t
    name, shape, dtype = model.inputs[0]
    rng = np.random.default_rng(0)
    # Token ids for an integer input (BERT's input_ids), else standard normal values.
    x = (rng.integers(0, 1000, shape) if np.dtype(dtype).kind in "iu" else rng.standard_normal(shape)).astype(dtype)
    got = model.run({name: x})
    options = ort.SessionOptions()
    options.log_severity_level = 3  # its notes on unused initializers of the bundled models
    sess = ort.InferenceSession(onnx_model if isinstance(onnx_model, str) else onnx_model.SerializeToString(),
                                options, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {name: x})))
    errs = compare_outputs(got, want, args.precision, logits)
    print(f"{args.model} on {args.preset} ({args.precision}): compiled in {compile_s:.1f} s, "
          f"{len(model.executable.regions)} LPX region(s)")
    if bundled:
        print("  weights: the bundled graph's constants replaced by seeded random values (seed 0)")
    for k, (e, tol) in errs.items():
        what = f"logits {k} (the softmax input)" if k == logits else f"output {k}"
        print(f"  {what}: relative L2 error vs onnxruntime {e:.2e} (tolerance {tol:.1e})")
    if log is not None:
        _print_tuned(model, onnx_model, log, cfg, args.precision)
    elif args.tuning_log:
        print("  default schedules (no tuning log for this model, machine and precision ships with lpx_tvm)")
    else:
        print("  default schedules (--no-tuning-log)")
    _print_model_report(model.report)
    print(_profile_command(args, log))
    beyond = {k: f"{e:.2e} > {tol:.1e}" for k, (e, tol) in errs.items() if not e <= tol}
    if beyond:
        raise LPXError(f"simulated outputs differ from onnxruntime beyond tolerance: {beyond}")
    worst, (e, tol) = max(errs.items(), key=lambda kv: kv[1][0] / kv[1][1])
    print(f"PASS: {len(errs)} output(s) match onnxruntime within tolerance (relative L2; closest to its bound: "
          f"{worst} {e:.2e} <= {tol:.1e})")
    return 0


def _demo_model(path: str, bundled: bool) -> tuple:
    """(the model the demo runs, the name of its logits or None). A bundled model's
    weights are all 0.02 (every logit equal, whatever the answer): they become seeded
    random values. The model is a ModelProto, or ``path`` itself when it is unchanged
    (a file without a softmax output, or one that is not a model: compile_model says
    why, in one line)."""
    import onnx

    from .light_models import expose_logits, with_random_weights

    try:
        onnx_model = onnx.load(path)
    except Exception:  # noqa: BLE001 (protobuf raises several unrelated types on garbage)
        return path, None
    if bundled:
        onnx_model = with_random_weights(onnx_model, seed=0)
    logits = expose_logits(onnx_model)
    return (onnx_model if bundled or logits else path), logits


def _print_tuned(model, onnx_model, log: str, cfg, precision: str) -> None:
    """The demo's tuned line: the shipped log, how many MXM layers took a tuned schedule,
    and the default schedules' cycles (the model's LPX regions compiled again with the
    defaults and simulated timing only: a few seconds)."""
    import os

    from .relax_passes import import_onnx
    from .tune.refine import ModelContext

    report = model.report
    tuning = report.tuning or {}
    tuned, default = len(tuning.get("tuned_layers", [])), len(tuning.get("default_layers", []))
    cycles = report.cycles
    base = ModelContext(import_onnx(onnx_model).mod, cfg, precision).cycles({})
    print(f"  tuned: shipped log lpx_tvm/tuning_logs/{os.path.basename(log)}, {tuned} of {tuned + default} "
          f"distinct MXM layers (tuning tasks) on a tuned schedule; {cycles:,} cycles vs {base:,} with the "
          f"default schedules ({base / cycles:.3f}x; --no-tuning-log runs the defaults)")


def _profile_command(args, log) -> str:
    """The demo's last line: the ``lpx-tvm profile`` command for the model it ran."""
    import os
    import shlex

    words = ["lpx-tvm", "profile", args.model, "--preset", args.preset, "--precision", args.precision]
    if log is not None:
        words += ["--tuning-log", log]
    words += ["-o", os.path.splitext(os.path.basename(args.model))[0] + "_profile"]
    return f"where the cycles go, layer by layer: {shlex.join(words)}"


def _print_program_report(rep) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    top = Table(title=f"LPX run on {rep.preset}", show_header=False)
    top.add_row("cycles", f"{rep.cycles:,}")
    top.add_row("latency", f"{rep.latency_s * 1e6:,.1f} us")
    top.add_row("MACs", f"{rep.macs:,}")
    dtypes = "/".join(rep.mxm_dtypes) or "no MXM"
    top.add_row(f"MXM utilization ({dtypes})", f"{rep.mxm_utilization:.1%}")
    top.add_row("SRAM bytes (read + written)", f"{rep.sram_bytes:,}")
    if rep.offchip_bytes:
        top.add_row("off-chip bytes", f"{rep.offchip_bytes:,}")
    console.print(top)
    layers = Table(title="per layer (each cycle counted once: docs/report.md)")
    for col in ("layer", "instructions", "cycles", "share", "MACs"):
        layers.add_column(col, justify="left" if col == "layer" else "right")
    for row in rep.layers:
        share = row.cycles / rep.cycles if rep.cycles else 0.0
        layers.add_row(row.name, f"{row.instructions:,}", f"{row.cycles:,}", f"{share:.1%}", f"{row.macs:,}")
    console.print(layers)


def _generate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True,
                   help="a transformers config.json of a Llama, Qwen2, Mistral or GPT-2 decoder (random weights, "
                        "seeded by --seed: nothing is downloaded)")
    p.add_argument("--prompt-len", type=positive_int, default=None,
                   help="prompt tokens (seeded random ids; default 8)")
    p.add_argument("--prompt-ids", type=int_list(0, unique=False),
                   help="the prompt's token ids, comma-separated (instead of --prompt-len)")
    p.add_argument("--new-tokens", type=positive_int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--max-context", type=positive_int, default=None,
                   help="positions the KV cache holds (default: prompt + new tokens)")
    p.add_argument("--batch", type=positive_int, default=1, help="sequences decoded together (the prompt repeated)")
    p.add_argument("--preset", default="tsp")
    p.add_argument("--precision", default="fp16", choices=LLM_PRECISIONS,
                   help="fp16 by default; int8 / fp8: W8A8 dense layers in int8 or fp8 e4m3 (activation scales "
                        "calibrated on a seeded random prompt), the rest fp16; fp8 needs an MXM with an fp8 "
                        "rate (--preset lp30)")
    p.add_argument("--seed", type=natural_int, default=0, help="seed of the random weights and prompt")
    p.add_argument("--report", help="JSON file to write the report to")
    p.add_argument("--system", help="map the decoder over chips of this system by tensor and pipeline parallelism: "
                                     "a preset (groqnode, tsp-rack, tsp-576, lp30-rack) or a system JSON file; "
                                     "replaces --preset (docs/multichip.md)")
    p.add_argument("--chips", type=int_list(0), help="the system's chips to use, comma-separated, in pipeline "
                                                      "stages of --tensor-parallel chips (default: all)")
    p.add_argument("--tensor-parallel", type=positive_int, default=None,
                   help="chips per pipeline stage, pairwise linked (default: all the chips, one stage)")


def _generate(args) -> int:
    import json

    import numpy as np

    from .files import Output, check_outputs

    # Every refusal that needs no model comes first, then those that need its vocabulary,
    # all before the compile.
    if args.prompt_ids is not None and args.prompt_len is not None:
        raise LPXError("give --prompt-ids or --prompt-len, not both")
    for flag, value in (("--chips", args.chips), ("--tensor-parallel", args.tensor_parallel)):
        if value is not None and not args.system:
            raise LPXError(f"{flag} needs --system")
    check_outputs([Output("--report", args.report)], inputs=[args.config, args.system])
    from .llm.session import check_cache_rows, compile_llm, llm_machine, load_decoder, quiet_transformers

    cfg, _ = llm_machine(args.precision, args.preset, args.system, name="--precision")
    prompt_len = len(args.prompt_ids) if args.prompt_ids else args.prompt_len or 8
    need = max(prompt_len + 1, prompt_len + args.new_tokens - 1)  # the prefill's, the last decode step's
    context = args.max_context or prompt_len + args.new_tokens
    if context < need:
        raise LPXError(f"--max-context {context}: a prompt of {prompt_len} tokens and {args.new_tokens} new ones "
                       f"need a context of at least {need}")
    check_cache_rows(cfg, args.precision, args.batch, context)
    with quiet_transformers():
        model = load_decoder(args.config, args.seed)
    vocab = model.get_input_embeddings().num_embeddings
    if args.prompt_ids:
        beyond = [i for i in args.prompt_ids if i >= vocab]
        if beyond:
            raise LPXError(f"--prompt-ids: {beyond[0]} is not a token id of this model (its vocabulary: "
                           f"0..{vocab - 1})")
        prompt = np.array(args.prompt_ids, np.int64)
    else:
        prompt = np.random.default_rng(args.seed).integers(0, vocab, prompt_len)
    chips = args.chips
    t = time.perf_counter()
    session = compile_llm(model, preset=args.preset, precision=args.precision, max_context=context,
                          batch=args.batch, prompt_len=len(prompt), system=args.system, chips=chips,
                          tensor_parallel=args.tensor_parallel)
    compile_s = time.perf_counter() - t
    tokens = session.generate(np.tile(prompt, (args.batch, 1)), args.new_tokens)
    rep = session.report
    where = rep["preset"] if "system" not in rep else \
        f"{len(rep['chips'])} chips of {rep['system']} ({rep['preset']}; {rep['pipeline_stages']} stage(s) of " \
        f"{rep['tensor_parallel']}; chips {rep['chips']})"
    print(f"{rep['family']} ({rep['parameters']:,} parameters, {rep['layers']} layers) on {where} "
          f"({rep['precision']}), batch {rep['batch']}, context {rep['max_context']}: compiled in {compile_s:.1f} s")
    print(f"prompt: {','.join(str(int(x)) for x in prompt)}")
    for b, row in enumerate(tokens):
        print(f"tokens{f' [{b}]' if args.batch > 1 else ''}: {','.join(str(int(x)) for x in row)}")
    _print_llm_report(rep) if "system" not in rep else _print_system_report(rep)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(rep, f, indent=1)
        print(f"report: {args.report}")
    return 0


def _print_llm_report(rep: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="LLM decode on one chip (docs/llm.md)", show_header=False)
    table.add_row("time to first token", f"{rep['ttft_cycles']:,} cycles ({rep['ttft_s'] * 1e6:,.1f} us)")
    table.add_row("decode, per token", f"{rep['decode_cycles_per_token']:,} cycles "
                                       f"({rep['decode_s_per_token'] * 1e6:,.2f} us)")
    table.add_row("decode floor", f"{rep['decode_floor_cycles']:,.0f} cycles ({rep['decode_floor_kind']}): "
                                  f"{rep['decode_over_floor']:.2f}x")
    table.add_row("tokens/s per user", f"{rep['tokens_per_s_per_user']:,.0f}")
    table.add_row("tokens/s per chip", f"{rep['tokens_per_s_per_chip']:,.0f}")
    sram = rep["sram"]
    table.add_row("SRAM: weights / KV cache / working",
                  f"{sram['weights_bytes'] / 2**20:,.2f} / {sram['kv_cache_bytes'] / 2**20:,.2f} / "
                  f"{sram['working_bytes'] / 2**20:,.2f} MiB of {sram['capacity_bytes'] / 2**20:,.0f}")
    table.add_row("MXM / install utilization", f"{rep['mxm_utilization']:.1%} / {rep['install_utilization']:.1%}")
    Console().print(table)


def _print_system_report(rep: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="LLM decode over chips of a system (docs/multichip.md)", show_header=False)
    table.add_row("mapping", f"{rep['pipeline_stages']} pipeline stage(s) of {rep['tensor_parallel']} chip(s); "
                             f"layers per stage {rep['stage_layers']}")
    table.add_row("time to first token", f"{rep['ttft_cycles']:,} cycles")
    table.add_row("decode, per token", f"{rep['decode_cycles_per_token']:,} cycles")
    table.add_row("tokens/s per user", f"{rep['tokens_per_s_per_user']:,.0f}")
    table.add_row("tokens/s per chip", f"{rep['tokens_per_s_per_chip']:,.0f}")
    table.add_row("link bytes per token", f"{rep['link_bytes_per_token']:,}")
    Console().print(table)


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a transformers config.json of a Llama, Qwen2, Mistral or GPT-2 "
                                                   "decoder (random weights: nothing is downloaded)")
    p.add_argument("--system", required=True, help="a system preset (groqnode, tsp-rack, tsp-576, lp30-rack) or a "
                                                   "system JSON file")
    p.add_argument("--precision", default="fp16", choices=LLM_PRECISIONS)
    p.add_argument("--context", type=whole_number(2), default=256, help="positions the KV cache holds (default 256)")
    p.add_argument("--prompt-len", type=positive_int, default=None,
                   help="prompt tokens for TTFT (default: context / 2)")
    p.add_argument("--batches", type=int_list(1), default=[1], help="batch sizes, comma-separated (default 1)")
    p.add_argument("--slo-tokens-per-s-per-user", type=non_negative, default=0.0,
                   help="the best mapping is the one with the most tokens/s per chip at or above this")
    p.add_argument("--max-chips", type=positive_int, default=None, help="the most chips a mapping may use")
    p.add_argument("--tensor-parallel", type=int_list(1), default=None,
                   help="tensor-parallel degrees, comma-separated (default: the kv heads' divisors that fit a group)")
    p.add_argument("--pipeline", type=int_list(1), default=None,
                   help="pipeline depths, comma-separated (default: 1, 2, 4, ... up to the layers, and the layers)")
    p.add_argument("--workers", type=natural_int, default=0,
                   help="compile and simulate the sampled models in this many worker processes (default 0: inline)")
    p.add_argument("--ray", default=None, metavar="ADDRESS", help="run them on the Ray cluster at ADDRESS")
    p.add_argument("--samples", default="system", choices=["system", "chip"],
                   help="system: simulate sampled mappings whole (default); chip: one chip's share of a layer alone, "
                        "the collectives added (a model too large to compile whole, docs/multichip.md)")
    p.add_argument("--split-layers", action="store_true",
                   help="let pipeline stages cut a layer between its attention and its MLP (with --samples chip)")
    p.add_argument("--sram-budget", type=fraction, default=0.9,
                   help="the share of a chip's SRAM weights and caches may fill; the rest is working space (0.9)")
    p.add_argument("--png", default=None, help="write the Pareto figure (tokens/s per user against per chip) here")
    p.add_argument("--report", default=None, help="write the plan as JSON here")


def _plan(args) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from .files import Output, check_outputs

    check_outputs([Output("--png", args.png, suffix=".png"), Output("--report", args.report)],
                  inputs=[args.config, args.system])
    if args.prompt_len is not None and args.prompt_len >= args.context:
        raise LPXError(f"--prompt-len {args.prompt_len}: a prompt takes 1 to {args.context - 1} tokens in a "
                       f"--context of {args.context}")
    if args.split_layers and args.samples != "chip":
        raise LPXError("--split-layers plans from one chip's samples: give --samples chip")
    _check_ray(args.ray)
    from .llm.capacity import PLAN_COLUMNS, plan, plan_table, save_pareto
    from .llm.session import llm_machine, quiet_transformers

    llm_machine(args.precision, system=args.system, name="--precision")
    with quiet_transformers():
        p = plan(args.config, args.system, precision=args.precision, context=args.context,
                 prompt_len=args.prompt_len or args.context // 2, batches=args.batches,
                 tensor_parallel=args.tensor_parallel, pipeline=args.pipeline, max_chips=args.max_chips,
                 workers=args.workers, ray_address=args.ray, samples=args.samples, split_layers=args.split_layers,
                 sram_budget=args.sram_budget)
    table = Table(title=f"{p.model} on {p.system} ({p.precision}, context {p.context}, {p.layers} layers): "
                        "predicted from simulated layers (docs/multichip.md)")
    for c in PLAN_COLUMNS:
        table.add_column(c, justify="right")
    for row in plan_table(p):
        table.add_row(*row)
    console = Console(width=150)
    console.print(table)
    best = p.best(args.slo_tokens_per_s_per_user)
    if best is None:
        console.print(f"no mapping meets {args.slo_tokens_per_s_per_user:,.0f} tokens/s per user")
    else:
        console.print(f"best at >= {args.slo_tokens_per_s_per_user:,.0f} tokens/s per user: tensor parallel "
                      f"{best.tensor_parallel}, {best.pipeline_stages} stage(s), batch {best.batch}: {best.tokens_per_s_per_user:,.0f} tokens/s per "
                      f"user, {best.tokens_per_s_per_chip:,.0f} per chip on {best.chips} chip(s)")
    if args.png:
        save_pareto(p, args.png)
        console.print(f"Pareto figure: {args.png}")
    if args.report:
        with open(args.report, "w") as f:
            json.dump(dict(p.to_json(), best=best.to_json() if best else None), f, indent=1)
        console.print(f"plan: {args.report}")
    return 0


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
# Exit statuses (docs/errors.md): 2 a problem with the input, the model, a file or a flag;
# 3 an internal error, a bug of lpx_tvm; 130 interrupted.
EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 2, 3, 130


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
    from .relax_passes.tvm_output import captured_fd2

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


if __name__ == "__main__":
    sys.exit(main())

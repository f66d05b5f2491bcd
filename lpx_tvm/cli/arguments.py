"""What the commands' flags take and name: numbers checked as they are parsed, models and
their inputs, bundled models, the parser that turns a refused flag into one line."""

from __future__ import annotations

import argparse
import re
import sys

from ..errors import LPXError
from ..precision import Precision


PROG = "lpx-tvm"


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


# The flags of `run` that each kind of model takes (the others are refused, never ignored).
_RUN_FLAGS = {
    "onnx": ("preset", "precision", "tuning_log", "input_shapes", "trace"),
    "artifact": ("trace",),  # built for one machine, precision and input shapes, its schedules fixed
    "program": ("preset", "timing_only", "trace"),
}


_FLAG_NAMES = {"preset": "--preset", "precision": "--precision", "tuning_log": "--tuning-log",
               "timing_only": "--timing-only", "trace": "--trace", "input_shapes": "--input-shapes"}


def _refuse_flags(args, kind: str, what: str):
    from ..errors import LPXError

    given = [f for f in _FLAG_NAMES if getattr(args, f, None) not in (None, False) and f not in _RUN_FLAGS[kind]]
    if given:
        why = {"artifact": "an artifact runs as it was compiled (compile it again to change them)",
               "onnx": "timing-only runs are for program binaries (.lpx); lpx-tvm profile MODEL shows a "
                       "model's timing",
               "program": "a program binary is already compiled, for its input shapes"}[kind]
        raise LPXError(f"{what}: {', '.join(_FLAG_NAMES[f] for f in given)} cannot be used here: {why}")


def _program_preset(prog, preset):
    from ..errors import ProgramError
    from ..machine.config import PRESETS, load_config

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

    from ..errors import ProgramError

    try:
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    except FileNotFoundError:
        raise ProgramError(f"{path}: no such file") from None
    except Exception as e:  # numpy raises several types for a corrupt archive
        raise ProgramError(f"{path}: not a readable npz file ({e})") from None


def _load_model(args):
    """The model ``run`` runs: an artifact folder loaded, or an ONNX file (or a bundled
    model's name) compiled."""
    import os

    from .. import compile_model, load

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

    from ..errors import LPXError

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


def _bundled_model(name: str) -> str:
    import os

    import onnx

    if os.path.exists(name):
        return name
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"{name}.onnx")
    if not os.path.exists(path):
        from ..errors import LPXError

        raise LPXError(f"{name}: no such file, and no model of that name is bundled with onnx")
    return path


# 3 an internal error, a bug of lpx_tvm; 130 interrupted.
EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 2, 3, 130

"""``lpx-tvm demo``: a bundled ONNX model compiled, run and checked against onnxruntime."""

from __future__ import annotations

import argparse

from ..precision import Precision
from .arguments import _bundled_model
from .reports import _print_model_report, _print_tuned


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


def _demo(args) -> int:
    """Compile a bundled ONNX model for LPX, run it on the simulator, check its outputs and
    logits against onnxruntime and print the report."""
    import time

    import numpy as np
    import onnxruntime as ort

    from .. import compile_model
    from ..errors import LPXError
    from ..light_models import compare_outputs
    from ..machine.config import load_config

    path = _bundled_model(args.model)
    cfg = load_config(args.preset)
    log = None
    if args.tuning_log:
        from ..tune.database import shipped_log

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

    from ..light_models import expose_logits, with_random_weights

    try:
        onnx_model = onnx.load(path)
    except Exception:  # noqa: BLE001 (protobuf raises several unrelated types on garbage)
        return path, None
    if bundled:
        onnx_model = with_random_weights(onnx_model, seed=0)
    logits = expose_logits(onnx_model)
    return (onnx_model if bundled or logits else path), logits


def _profile_command(args, log) -> str:
    """The demo's last line: the ``lpx-tvm profile`` command for the model it ran."""
    import os
    import shlex

    words = ["lpx-tvm", "profile", args.model, "--preset", args.preset, "--precision", args.precision]
    if log is not None:
        words += ["--tuning-log", log]
    words += ["-o", os.path.splitext(os.path.basename(args.model))[0] + "_profile"]
    return f"where the cycles go, layer by layer: {shlex.join(words)}"

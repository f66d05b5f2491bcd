"""``lpx-tvm run``: a model, an artifact or a program binary on the simulated LPX."""

from __future__ import annotations

import argparse

from ..precision import Precision
from .arguments import (FILL_MODES, _bundled_model, _input_shapes_arg, _load_model, _program_preset, _refuse_flags,
                        _run_inputs, _save_npz)
from .reports import _print_model_report, _print_program_report


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


def _run(args) -> int:
    import os

    from ..files import Output, check_outputs

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
        from ..runtime.profile import profile_model
        from ..runtime.profile_trace import model_trace, save_trace

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


def _run_program(args) -> int:
    import time

    from ..machine.encoding import load_program
    from ..runtime.report import program_report
    from ..sim import Simulator

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

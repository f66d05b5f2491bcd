"""``lpx-tvm compile``: an ONNX model into an artifact folder."""

from __future__ import annotations

import argparse

from ..precision import Precision
from .arguments import _bundled_model, _input_shapes_arg, _parse_input_shapes


def _compile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx model or a model bundled with onnx (light_resnet50, ...)")
    p.add_argument("-o", "--output", required=True, help="artifact folder to write")
    p.add_argument("--preset", default="tsp", help="tsp, mini, lp30 or a JSON machine file")
    p.add_argument("--precision", default="fp16", choices=Precision.names())
    p.add_argument("--tuning-log", help="tuning log folder (lpx-tvm tune) whose schedules to use")
    _input_shapes_arg(p)


def _compile(args) -> int:
    from .. import compile_model
    from ..files import Output, check_outputs, manifest_says
    from ..runtime.artifact import FORMAT

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

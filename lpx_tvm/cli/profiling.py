"""``lpx-tvm profile``: a model's (or a decoder step's) trace, per-layer floors and roofline."""

from __future__ import annotations

import argparse

from ..errors import LPXError
from ..precision import Precision
from .arguments import (FILL_MODES, LLM_PRECISIONS, _bundled_model, _input_shapes_arg, _load_model, _refuse_flags,
                        _run_inputs, positive_int, whole_number)
from .reports import _print_profile


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

    from ..errors import LPXError
    from ..files import Output, check_outputs, holds_only
    from ..runtime.profile import profile_model
    from ..runtime.profile_trace import model_trace, save_trace
    from ..runtime.roofline import pyplot, save_roofline

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
        from ..llm.session import compile_llm, llm_machine, quiet_transformers

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

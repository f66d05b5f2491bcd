"""Measure a shipped tuning log's in-context choice again, and append it with its new cycles.

For a change of the machine model that keeps the config (and so the log's key) but moves
cycles, e.g. the byte-plane stream rule: the choice is kept, only measured again on the
bundled graph the refinement measured, and the figures it replaces are kept in the line
(``remeasured``). A change of the config makes the log refused instead: re-tune then.

    python bench/remeasure_log.py light_resnet50 --preset tsp --precision bf16
"""

from __future__ import annotations

import argparse
import json

import onnx

from lpx_tvm.cli import _bundled_model
from lpx_tvm.machine.config import load_config
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.tune.refine import remeasure_applied
from lpx_tvm.tune.database import TuningLog, shipped_log


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a bundled light model with a shipped log")
    ap.add_argument("--preset", default="tsp")
    ap.add_argument("--precision", default="bf16")
    args = ap.parse_args()
    cfg = load_config(args.preset)
    log = shipped_log(args.model, cfg, args.precision)
    before = TuningLog(log).applied_line(cfg)
    mod = import_onnx(onnx.load(_bundled_model(args.model))).mod
    default, cycles = remeasure_applied(mod, cfg, log, args.precision)
    print(f"{args.model} on {cfg.name} ({args.precision}): default {before['default_cycles']:,} -> {default:,} "
          f"cycles, the log's choice {before['cycles']:,} -> {cycles:,} ({default / cycles:.3f}x)")
    print(json.dumps({"model": args.model, "default_cycles": default, "cycles": cycles,
                      "previous_default_cycles": before["default_cycles"], "previous_cycles": before["cycles"]}))


if __name__ == "__main__":
    main()

"""Random-model fuzzer: compile and run N random valid ONNX graphs through ``lpx-tvm run``
at fp32, compare each with onnxruntime and count the outcomes (docs/fuzz.md).

    python bench/fuzz.py --count 300 --preset mini [--seed 0] [--start 0]
                         [--family cnn,transformer,elementwise] [--timeout 120]
                         [--save failing/] [--jsonl outcomes.jsonl]
    python bench/fuzz.py --summary outcomes.jsonl

Graph k of the run (k = 0 .. N-1) is graph ``start + k // F`` of family ``k % F`` (the F
families taken in turn), so every family gets N/F graphs and any graph can be run again
from its (family, index, seed). Each graph runs in a worker process with a timeout, so a
crash or a hang is an outcome of its own.

Prints one line per graph, then a table of outcomes per family, the failing graphs
(family, index, seed, first error line), and the distinct kinds of failure (first lines
with numbers and tensor names masked), each with a graph that reproduces it.
``--save DIR`` writes each failing graph to ``DIR/<family>-<index>-s<seed>-<preset>/``
(model.onnx, inputs.npz, expected.npz, outcome.json) for regression tests.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fuzz"))

import onnx_graphs  # noqa: E402
from fuzz_runner import FAILURES, OUTCOMES, Outcome  # noqa: E402
from fuzz_sandbox import Sandbox  # noqa: E402


def schedule(count: int, families, start: int):
    """(family, index) of each of the ``count`` graphs: the families in turn."""
    return [(families[k % len(families)], start + k // len(families)) for k in range(count)]


def failure_kind(first_line: str) -> str:
    """A first error line with what differs between graphs with the same bug masked:
    Relax variable names (lv3, gv_1 in "lv_1.qadd", "gv.operand"), numbers and shapes."""
    kind = re.sub(r"\b[lg]v\w*", "v*", first_line)
    kind = re.sub(r"\((?:\d+, )*\d+,?\)", "(shape)", kind)
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "#", kind)


def save_case(folder: str, family: str, index: int, seed: int, preset: str, outcome) -> str:
    case = onnx_graphs.case(family, index, seed)
    path = os.path.join(folder, f"{case.name}-{preset}")
    os.makedirs(path, exist_ok=True)
    onnx.save(case.model, os.path.join(path, "model.onnx"))
    np.savez(os.path.join(path, "inputs.npz"), **case.inputs)
    np.savez(os.path.join(path, "expected.npz"), **case.expected)
    with open(os.path.join(path, "outcome.json"), "w", encoding="utf-8") as f:
        json.dump({"family": family, "index": index, "seed": seed, "preset": preset,
                   "graph": case.model.doc_string, **outcome.to_json()}, f, indent=1)
    return path


def print_table(results, families) -> None:
    counts = collections.defaultdict(collections.Counter)
    for (family, _), outcome in results:
        counts[family][outcome.kind] += 1
        counts["all"][outcome.kind] += 1
    header = f"{'family':<12}" + "".join(f"{k:>11}" for k in OUTCOMES) + f"{'total':>8}"
    print(header)
    for family in list(families) + ["all"]:
        row = counts[family]
        print(f"{family:<12}" + "".join(f"{row[k]:>11}" for k in OUTCOMES) + f"{sum(row.values()):>8}")


# Exit-2 errors that are scheduling or allocation failures: on a valid model these are
# compiler bugs (issue 13: the compiler places differently, retries, bands or partitions).
COMPILER_FAILURES = ("SchedulingError", "SramFull", "ScheduleHazard", "UnsupportedOnLPX")


def verdict(outcome) -> str:
    if outcome.kind == "user-error" and outcome.error_type in COMPILER_FAILURES:
        return "a compiler failure shown as a user error"
    return {"user-error": "check: is the model outside what the machine can do?"}.get(outcome.kind, "a bug")


def print_failures(results, seed: int) -> None:
    failing = [(job, o) for job, o in results if o.kind in FAILURES]
    if not failing:
        print("\nno failing graphs")
        return
    print(f"\nfailing graphs ({len(failing)}):")
    for (family, index), o in failing:
        where = f"  [{o.error_type} at {o.where}]" if o.where else ""
        print(f"  {family:<12} {index:>5} seed {seed}  {o.first_line}{where}")
    kinds = collections.OrderedDict()
    for (family, index), o in failing:
        kinds.setdefault(failure_kind(o.first_line), []).append((family, index, o))
    print(f"\ndistinct kinds of failure ({len(kinds)}):")
    for kind, hits in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        family, index, o = hits[0]
        per_family = collections.Counter(f for f, _, _ in hits)
        print(f"  {len(hits):>4} x  {o.first_line}")
        print(f"         e.g. ({family}, {index}, {seed}); {dict(per_family)}; {verdict(o)}"
              + (f"; {o.error_type} at {o.where}" if o.where else ""))


def summarize(results, families, seed, preset, wall=None) -> None:
    """The table of outcomes per family and the failures of ``results``, [((family, index), Outcome)]."""
    took = f" in {wall:.0f} s ({wall / max(1, len(results)):.1f} s per graph)" if wall is not None else ""
    print(f"\n{len(results)} graphs on {preset} (fp32, seed {seed}){took}\n")
    print_table(results, families)
    ran = [o for _, o in results if o.offload]
    if ran:
        whole = sum(1 for o in ran if not o.offload["cpu"] and o.offload["regions"] == 1)
        print(f"\nof {len(ran)} graphs that ran: {whole} in one LPX region with no CPU op")
    print_failures(results, seed)


def read_jsonl(path: str):
    """The outcomes a run wrote with ``--jsonl``, grouped by (preset, seed)."""
    runs = collections.defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            key = (row.pop("preset"), row.pop("seed"))
            job = (row.pop("family"), row.pop("index"))
            runs[key].append((job, Outcome.from_json(row)))
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, help="graphs to run, the families in turn")
    ap.add_argument("--summary", metavar="FILE", help="print the tables of the outcomes in FILE (written by "
                    "--jsonl, perhaps over several runs) instead of running graphs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="index of each family's first graph")
    ap.add_argument("--preset", default="mini", help="mini, tsp, lp30 or a JSON machine file")
    ap.add_argument("--family", default=",".join(onnx_graphs.FAMILIES),
                    help=f"comma-separated families (default: {','.join(onnx_graphs.FAMILIES)})")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per graph before it is a timeout")
    ap.add_argument("--save", metavar="DIR", help="write each failing graph (model, inputs, expected) here")
    ap.add_argument("--jsonl", metavar="FILE", help="append every outcome as one JSON line here")
    ap.add_argument("--log", metavar="FILE", help="what the compiler prints (default: discarded)")
    args = ap.parse_args(argv)
    if args.summary:
        for (preset, seed), results in sorted(read_jsonl(args.summary).items()):
            summarize(results, sorted({f for (f, _), _ in results}, key=onnx_graphs.FAMILIES.index), seed, preset)
        return 0
    if args.count is None:
        ap.error("--count (or --summary) is required")
    families = [f.strip() for f in args.family.split(",") if f.strip()]
    unknown = sorted(set(families) - set(onnx_graphs.FAMILIES))
    if unknown:
        ap.error(f"unknown family {', '.join(unknown)}; one of {', '.join(onnx_graphs.FAMILIES)}")

    results = []
    start = time.perf_counter()
    jsonl = open(args.jsonl, "a", encoding="utf-8") if args.jsonl else None
    with Sandbox(timeout=args.timeout, log=args.log or os.devnull) as sandbox:
        for n, (family, index) in enumerate(schedule(args.count, families, args.start), 1):
            outcome = sandbox.run(family, index, args.seed, args.preset)
            results.append(((family, index), outcome))
            off = outcome.offload
            placed = f"{off['regions']} regions, {sum(off['cpu'].values())} CPU ops" if off else ""
            print(f"[{n}/{args.count}] {family}-{index}-s{args.seed} {args.preset}: {outcome.seconds:6.1f} s  "
                  f"{outcome.first_line}  {placed}", flush=True)
            if jsonl:
                jsonl.write(json.dumps({"family": family, "index": index, "seed": args.seed,
                                        "preset": args.preset, **outcome.to_json()}) + "\n")
                jsonl.flush()
            if args.save and outcome.kind in FAILURES:
                save_case(args.save, family, index, args.seed, args.preset, outcome)
    if jsonl:
        jsonl.close()
    summarize(results, families, args.seed, args.preset, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())

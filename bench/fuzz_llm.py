"""Decoder fuzzer: compile N random valid decoder configs (llama, qwen2, mistral, gpt2) on
one chip or over chips of a system, generate greedily in fp32 and compare with
transformers' ``generate(do_sample=False)`` on the same random-weight model (docs/fuzz.md).

    python bench/fuzz_llm.py --count N [--start S] [--seed K] [--family llama,gpt2]
                             [--jsonl out.jsonl] [--save failing/] [--workers 1] [--timeout 300]
    python bench/fuzz_llm.py --summary out.jsonl [more.jsonl ...]

Case k of the run (k = 0 .. N-1) is case ``start + k // F`` of family ``k % F`` (the F
families in turn); a case is named by (family, index, seed) and draws its config,
prompt and mapping from it (tests/fuzz/decoder_configs.py). Each case runs in a worker
process with a timeout. Prints one line per case, then a table of outcomes per family
and per kind of mapping, the refusals grouped by reason, and the failing cases.
``--save DIR`` writes each failing case's reproducer, ``DIR/<family>-<index>-s<seed>.json``
(config, weights' seed and scale, prompt, mapping, outcome).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fuzz"))

import decoder_configs  # noqa: E402
from llm_runner import FAILURES, OUTCOMES, LLMSandbox, Outcome  # noqa: E402


def schedule(count: int, families, start: int):
    """(family, index) of each of the ``count`` cases: the families in turn."""
    return [(families[k % len(families)], start + k // len(families)) for k in range(count)]


def reason(first_line: str) -> str:
    """A refusal's line with numbers masked: the reason, to group by."""
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "#", first_line)


def _row(label, outcomes) -> str:
    counts = collections.Counter(o.kind for o in outcomes)
    return f"| {label} | {len(outcomes)} | " + " | ".join(str(counts[k]) for k in OUTCOMES) + " |"


def print_tables(results) -> None:
    """``results``: [(family, index, seed, mapping kind, Outcome)]."""
    head = "| {} | cases | " + " | ".join(OUTCOMES) + " |"
    rule = "|---|---|" + "---|" * len(OUTCOMES)
    for title, key, keys in (("family", 0, decoder_configs.FAMILIES), ("mapping", 3, decoder_configs.MAPPINGS)):
        print("\n" + head.format(title) + "\n" + rule)
        for k in keys:
            mine = [r[4] for r in results if r[key] == k]
            if mine:
                print(_row(k, mine))
        print(_row("all", [r[4] for r in results]))
    refusals = collections.Counter(reason(r[4].message) for r in results if r[4].kind == "refused")
    if refusals:
        print("\nrefusals by reason:")
        for why, n in refusals.most_common():
            print(f"  {n:4d}  {why}")
    ties = [r for r in results if r[4].kind == "tie"]
    for f, i, s, m, o in ties:
        print(f"tie: ({f}, {i}, {s}) {m}: {o.message}")
    fails = [r for r in results if r[4].kind in FAILURES]
    print(f"\nfailing cases: {len(fails)}")
    for f, i, s, m, o in fails:
        print(f"  ({f}, {i}, {s}) {m}: {o.first_line}" + (f"  [{o.where}]" if o.where else ""))
    done = [r[4] for r in results if r[4].rel_err is not None]
    if done:
        print(f"\nworst logits error (relative L2) of the cases that generated: {max(o.rel_err for o in done):.2e}")


def save_case(folder: str, family: str, index: int, seed: int, outcome: Outcome) -> str:
    case = decoder_configs.case(family, index, seed)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{case.name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(dict(case.to_json(), description=case.describe(), outcome=outcome.to_json()), f, indent=1)
    return path


def read_jsonl(paths):
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    out.append((d["family"], d["index"], d["seed"], d["mapping"], Outcome.from_json(d["outcome"])))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, help="cases to run, the families in turn")
    ap.add_argument("--summary", nargs="+", metavar="FILE", help="print the tables of the outcomes in FILE(s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="index of each family's first case")
    ap.add_argument("--family", default=",".join(decoder_configs.FAMILIES))
    ap.add_argument("--workers", type=int, default=1, help="worker processes (one case each at a time)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it is a timeout")
    ap.add_argument("--save", metavar="DIR", help="write each failing case's reproducer here")
    ap.add_argument("--jsonl", metavar="FILE", help="append every outcome as one JSON line here")
    ap.add_argument("--log", metavar="FILE", help="what the compiler prints (default: discarded)")
    args = ap.parse_args(argv)
    if args.summary:
        print_tables(read_jsonl(args.summary))
        return 0
    if args.count is None or args.count < 1 or args.start < 0 or args.seed < 0 or args.workers < 1:
        ap.error("give --count N >= 1 (and a non-negative --start and --seed, --workers >= 1), or --summary FILE")
    families = [f.strip() for f in args.family.split(",") if f.strip()]
    bad = [f for f in families if f not in decoder_configs.FAMILIES]
    if bad or not families:
        ap.error(f"--family: unknown {bad}; choose from {', '.join(decoder_configs.FAMILIES)}")
    todo = schedule(args.count, families, args.start)
    log = args.log or os.devnull
    results = []
    start = time.perf_counter()
    boxes = [LLMSandbox(args.timeout, log=log) for _ in range(args.workers)]
    try:
        if args.workers == 1:
            outcomes = (boxes[0].run(f, i, args.seed) for f, i in todo)
        else:
            from concurrent.futures import ThreadPoolExecutor

            free = collections.deque(boxes)  # each thread borrows a sandbox for one case
            import threading

            lock = threading.Lock()

            def one(job):
                with lock:
                    box = free.popleft()
                try:
                    return box.run(job[0], job[1], args.seed)
                finally:
                    with lock:
                        free.append(box)

            outcomes = ThreadPoolExecutor(args.workers).map(one, todo)
        for (family, index), outcome in zip(todo, outcomes):
            mapping = decoder_configs.case(family, index, args.seed).mapping.kind
            results.append((family, index, args.seed, mapping, outcome))
            line = f"({family}, {index}, {args.seed}) {mapping:5s} {outcome.seconds:6.1f}s  {outcome.first_line}"
            print(line, flush=True)
            if args.jsonl:
                with open(args.jsonl, "a", encoding="utf-8") as f:
                    f.write(json.dumps(dict(family=family, index=index, seed=args.seed, mapping=mapping,
                                            outcome=outcome.to_json())) + "\n")
            if args.save and outcome.kind in FAILURES + ("tie",):
                save_case(args.save, family, index, args.seed, outcome)
    finally:
        for box in boxes:
            box.close()
    print_tables(results)
    print(f"\n{len(results)} cases in {time.perf_counter() - start:.0f} s wall")
    return 1 if any(r[4].kind in FAILURES for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

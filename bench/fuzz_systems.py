"""Systems-and-collectives fuzzer: N random valid system files and collective calls, each
built, run on the system simulator and checked bit for bit against numpy
(tests/multichip/collectives_cases.py says what is drawn and checked).

    python bench/fuzz_systems.py --count 300 [--seed 0] [--start 0] [--kind all_reduce,point_to_point]
                                 [--timeout 120]

Case k of the run (k = 0 .. N-1) is case ``start + k // K`` of kind ``k % K`` (the K kinds
in turn), named by (kind, index, seed) as docs/fuzz.md's graphs are. Prints each case
that is not right, then a table of outcomes per kind:

- ok: every output right bit for bit, every message and cycle count as documented;
- wrong: an output differs from numpy, or a message goes where the system file does not
  link, or the bytes moved or a path are not the algorithm's;
- timing: cycles or arrivals differ from the hand arithmetic or between runs;
- refused: an lpx_tvm error on a valid call;
- internal: any other exception, or no answer within ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "multichip"))

import collectives_cases as cc  # noqa: E402
from lpx_tvm.errors import LPXError  # noqa: E402

OUTCOMES = ("ok", "wrong", "timing", "refused", "internal")


class _Timeout(Exception):
    pass


def outcome(c: cc.Case, timeout: float) -> tuple:
    """(outcome, first problem or "")."""
    def expire(*_):
        raise _Timeout()

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        problems = cc.run(c)
    except _Timeout:
        return "internal", f"no answer in {timeout:g} s"
    except LPXError as e:
        return "refused", f"{type(e).__name__}: {str(e).splitlines()[0]}"
    except Exception as e:  # noqa: BLE001 - every exception is an outcome here
        return "internal", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if not problems:
        return "ok", ""
    kind = "wrong" if any(p.startswith("wrong") for p in problems) else "timing"
    return kind, "; ".join(problems[:2])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--kind", default=",".join(cc.KINDS), help=f"comma-separated, of {', '.join(cc.KINDS)}")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    kinds = [k for k in args.kind.split(",") if k]
    unknown = sorted(set(kinds) - set(cc.KINDS))
    if unknown or args.count < 1:
        ap.error(f"unknown kind(s) {unknown}" if unknown else "--count must be at least 1")
    counts = collections.defaultdict(collections.Counter)
    seconds = collections.Counter()
    failing = []
    t0 = time.perf_counter()
    for k in range(args.count):
        kind, index = kinds[k % len(kinds)], args.start + k // len(kinds)
        t = time.perf_counter()
        c = cc.case(kind, index, args.seed)
        result, problem = outcome(c, args.timeout)
        seconds[kind] += time.perf_counter() - t
        counts[kind][result] += 1
        if result != "ok":
            failing.append((c, result, problem))
            print(f"{result}: {c.describe()}: {problem}", flush=True)
    wall = time.perf_counter() - t0
    print(f"\n{args.count} cases, seed {args.seed}, from index {args.start}, in {wall:.1f} s")
    print(f"| kind | cases | {' | '.join(OUTCOMES)} | s a case |")
    print(f"|---|---|{'---|' * len(OUTCOMES)}---|")
    total = collections.Counter()
    for kind in kinds:
        n = sum(counts[kind].values())
        total.update(counts[kind])
        print(f"| {kind} | {n} | {' | '.join(str(counts[kind][o]) for o in OUTCOMES)} | "
              f"{seconds[kind] / max(n, 1):.2f} |")
    print(f"| all | {args.count} | {' | '.join(str(total[o]) for o in OUTCOMES)} | {wall / args.count:.2f} |")
    for c, result, problem in failing:
        print(f"  {result}: ({c.kind}, {c.index}, {c.seed}): {problem}")
    return 0 if not failing else 1


if __name__ == "__main__":
    sys.exit(main())

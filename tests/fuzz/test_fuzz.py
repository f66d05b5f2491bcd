"""A fixed sample of random valid ONNX graphs (tests/fuzz/onnx_graphs.py), each run through
``lpx-tvm run ... --precision fp32`` on mini and tsp (in a worker process: fuzz_sandbox)
and compared with onnxruntime (docs/fuzz.md). ``bench/fuzz.py --count N`` runs more.

Every graph must give ``ok``. The graphs that fail today are listed in KNOWN_FAILURES with
their exact first line: they are strict xfails, so the test turns red when a fix lands
(remove the entry) and also when the failure changes (update the entry, or it is a new
bug). A valid model that fails with exit status 2 is a compiler bug as well when the
error is a scheduling or allocation failure (issue 13: the compiler places differently,
retries, bands or partitions smaller).
"""

import pytest

import onnx_graphs
from fuzz_sandbox import Sandbox

SEED = 0

# The first graphs of each family, and on mini one graph of each kind of failure the
# bench found beyond them (bench/fuzz.py --count 930 --preset mini; docs/fuzz.md).
SAMPLE = (
    [("mini", family, i) for family in onnx_graphs.FAMILIES for i in range(8)]
    + [("mini", "elementwise", i) for i in (12, 20, 46, 124)] + [("mini", "cnn", 38)]
    + [("tsp", family, i) for family in onnx_graphs.FAMILIES for i in range(5)]
)

# (preset, family, index, seed): failures of later bench runs, fixed since (bench/fuzz.py
# --count 1000 --seed 2 --preset mini: a full-tensor constant of a batch of two when the
# op runs by bands of one image; a global-pool column the SRAM held in two pieces).
REGRESSIONS = [("mini", "elementwise", 203, 2), ("mini", "elementwise", 244, 2), ("mini", "cnn", 297, 2)]

# (preset, family, index) -> the outcome's first line today, for graphs that fail because
# of a compiler bug not fixed yet. Empty: the five kinds the bench found on mini (SRAM
# full with most of it free, a Where needing more streams than the machine has, a
# broadcast offloaded then refused) are fixed, and their reproducers above (elementwise
# 12, 20, 46, 124; cnn 38; transformer 0 and 1) are regression tests now.
KNOWN_FAILURES = {}


class KnownFailure(Exception):
    """The graph failed exactly as KNOWN_FAILURES says."""


def _params():
    for preset, family, index in SAMPLE:
        known = KNOWN_FAILURES.get((preset, family, index))
        marks = [pytest.mark.xfail(strict=True, raises=KnownFailure, reason=known)] if known else []
        yield pytest.param(preset, family, index, SEED, id=f"{preset}-{family}-{index}", marks=marks)
    for preset, family, index, seed in REGRESSIONS:
        yield pytest.param(preset, family, index, seed, id=f"{preset}-{family}-{index}-s{seed}")


def test_known_failures_are_in_the_sample():
    assert set(KNOWN_FAILURES) <= set(SAMPLE)


@pytest.fixture(scope="module")
def sandbox():
    # A worker process replaced as it grows (compiled models are not all freed), so the
    # sample stays within a few GiB; a crash or a hang fails one test, not the session.
    with Sandbox(timeout=300, max_rss_mib=1200) as box:
        yield box


@pytest.mark.parametrize(("preset", "family", "index", "seed"), list(_params()))
def test_random_graph_matches_onnxruntime(sandbox, preset, family, index, seed):
    case = onnx_graphs.case(family, index, seed)
    outcome = sandbox.run(family, index, seed, preset)
    known = KNOWN_FAILURES.get((preset, family, index))
    if known is not None and outcome.first_line == known:
        raise KnownFailure(known)
    assert outcome.kind == "ok", (
        f"{case.name} on {preset}: {outcome.first_line}"
        + (f" [{outcome.error_type} at {outcome.where}]" if outcome.where else "")
        + (f"\n  known failure was: {known}" if known else "")
        + f"\n  graph: {case.model.doc_string}")

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

_SRAM_PIECE = "SRAM full: any slice has no 4 free lines in one piece"
_SRAM_TOP = "SRAM full: no slice has 4 free lines at its top for constants"

# (preset, family, index) -> the outcome's first line today. All are compiler failures on
# small valid models shown as user errors (exit 2).
KNOWN_FAILURES = {
    # attention blocks 48 or 64 wide (4 heads), FFN 128 to 256: under 30% of the SRAM in use
    ("mini", "transformer", 0): f"user-error: tensor lv1 (19, 256) fp32: {_SRAM_PIECE} (9472 of 32768 lines in use)",
    ("mini", "transformer", 1): f"user-error: tensor lv1 (23, 128) fp32: {_SRAM_PIECE} (4864 of 32768 lines in use)",
    # Where with a runtime condition over a 4-D value
    ("mini", "elementwise", 12): "user-error: group 'gv.where' needs more simultaneous streams than the machine has",
    # a per-channel (or last-axis) constant operand of Add / Sub / Mul, e.g. a standalone BatchNorm
    ("mini", "elementwise", 20): f"user-error: tensor gv.operand (1, 3) fp32: {_SRAM_TOP} (1560 of 32768 lines in use)",
    ("mini", "cnn", 38): f"user-error: tensor lv_1.operand (1, 4) fp32: {_SRAM_TOP} (2792 of 32768 lines in use)",
    # Where with a runtime condition over a 2-D value
    ("mini", "elementwise", 46): f"user-error: tensor lv.apart (23, 62) fp32: {_SRAM_PIECE} (1104 of 32768 lines in use)",
    # a full-tensor constant of a batch-2 value in a region that runs image by image
    ("mini", "elementwise", 124): "user-error: constant of shape (2, 9, 9, 11) broadcast against (1, 9, 9, 11): "
                                  "only scalars, one value per channel or a full tensor are supported",
}


class KnownFailure(Exception):
    """The graph failed exactly as KNOWN_FAILURES says."""


def _params():
    for preset, family, index in SAMPLE:
        known = KNOWN_FAILURES.get((preset, family, index))
        marks = [pytest.mark.xfail(strict=True, raises=KnownFailure, reason=known)] if known else []
        yield pytest.param(preset, family, index, id=f"{preset}-{family}-{index}", marks=marks)


def test_known_failures_are_in_the_sample():
    assert set(KNOWN_FAILURES) <= set(SAMPLE)


@pytest.fixture(scope="module")
def sandbox():
    # A worker process replaced as it grows (compiled models are not all freed), so the
    # sample stays within a few GiB; a crash or a hang fails one test, not the session.
    with Sandbox(timeout=300, max_rss_mib=1200) as box:
        yield box


@pytest.mark.parametrize(("preset", "family", "index"), list(_params()))
def test_random_graph_matches_onnxruntime(sandbox, preset, family, index):
    case = onnx_graphs.case(family, index, SEED)
    outcome = sandbox.run(family, index, SEED, preset)
    known = KNOWN_FAILURES.get((preset, family, index))
    if known is not None and outcome.first_line == known:
        raise KnownFailure(known)
    assert outcome.kind == "ok", (
        f"{case.name} on {preset}: {outcome.first_line}"
        + (f" [{outcome.error_type} at {outcome.where}]" if outcome.where else "")
        + (f"\n  known failure was: {known}" if known else "")
        + f"\n  graph: {case.model.doc_string}")

"""Every functional run in tests/sim is checked against the reference interpreter.

The hand-written programs of these tests (lpx_hand.Hand and the programs the tests
build directly) each run on a Simulator; after every functional run that passes its
checks, the same program and inputs run on :mod:`lpx_tvm.sim.reference`, which must
give the same outputs bit for bit and the same cycle count.
"""

import pytest

from lpx_hand import compare_runs_with_reference


@pytest.fixture(autouse=True)
def reference_agrees(request, monkeypatch):
    if not getattr(request.module, "COMPARES_ITSELF", False):  # test_reference.py does it itself
        compare_runs_with_reference(monkeypatch)

"""Candidates measured on a Ray cluster (a local one here): the same results as in-process."""

import pytest

from lpx_tvm.tune.database import TuningLog
from lpx_tvm.tune.tuner import tune

from test_tune import MINI, mm_tasks  # noqa: F401 — the fixture

ray = pytest.importorskip("ray")


def test_tune_on_a_local_ray_cluster(tmp_path, mm_tasks):  # noqa: F811
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        on_ray = tune(mm_tasks, MINI, str(tmp_path / "ray"), 4, seed=5, ray_address="auto")
    finally:
        ray.shutdown()
    tune(mm_tasks, MINI, str(tmp_path / "local"), 4, seed=5)
    assert on_ray[0].trials == 4 and on_ray[0].error is None
    # Measurement is deterministic: each record's cycles match its in-process measurement.
    got = {str(r.trace): float(r.run_secs[0]) for r in TuningLog(str(tmp_path / "ray")).get_all_tuning_records()}
    want = {str(r.trace): float(r.run_secs[0]) for r in TuningLog(str(tmp_path / "local")).get_all_tuning_records()}
    assert all(v < 1e9 for v in got.values())
    common = set(got) & set(want)
    assert all(got[k] == want[k] for k in common)
    # (Whether 4 trials beat the default depends on the search, not on where candidates run.)
    assert on_ray[0].tuned_cycles is not None and on_ray[0].default_cycles is not None

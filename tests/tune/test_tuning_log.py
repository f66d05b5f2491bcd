"""Tuning logs are exact: a killed job resumes to the records of one uninterrupted run,
a rerun measures nothing again, concurrent jobs share one folder, records are keyed by
workload hash (tune/database.py, tune/tuner.py)."""

import json
import os
import random
import shutil
import subprocess
import sys
import time
import warnings

import pytest

import lpx_tvm
from lpx_tvm.relax_passes import import_onnx
from lpx_tvm.tune.database import (APPLIED, RECORDS, WORKLOADS, TuningLog, TuningLogError, TuningLogWarning,
                                   best_records, load_tuned, tiling_of_record)
from lpx_tvm.tune.tuner import extract_tasks, tune

from test_tune import MINI, conv_model, matmul_model

MODELS = {"matmul": matmul_model, "conv": conv_model}
TRIALS, SEED, PER_ITER = 16, 2, 2

JOB = """
import sys
sys.path.insert(0, {tests!r})
from test_tuning_log import job
job({model!r}, {log!r})
"""


def job(model: str, log: str, trials: int = TRIALS):
    """The tuning job the tests kill, resume and run side by side."""
    tasks = extract_tasks(import_onnx(MODELS[model]()).mod, MINI, "fp16")
    return tune(tasks, MINI, log, trials, seed=SEED, trials_per_iter=PER_ITER, model=model)


def _start(model: str, log: str) -> subprocess.Popen:
    script = JOB.format(tests=os.path.dirname(__file__), model=model, log=log)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def records(log: str) -> set:
    """{(workload hash, trace, seconds)} of a log's distinct records."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TuningLogWarning)  # a record may have been cut mid-write
        db = TuningLog(log)
    out = set()
    for key, wl in db.workloads.items():
        for rec in db.get_top_k(wl, 1 << 30):
            out.add((key, json.dumps(rec.as_json()[0]), tuple(float(s) for s in rec.run_secs)))
    return out


def _lines(path: str) -> int:
    return open(path, "rb").read().count(b"\n") if os.path.exists(path) else 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each model tuned once, never interrupted, into its own log."""
    out = {}
    for model in MODELS:
        log = str(tmp_path_factory.mktemp("logs") / model)
        job(model, log)
        out[model] = log
    return out


def test_a_job_killed_ten_times_resumes_to_the_uninterrupted_records(tmp_path, uninterrupted):
    log = str(tmp_path / "killed")
    path = os.path.join(log, RECORDS)
    rng = random.Random(0)
    kills, seen = 0, 0
    while kills < 10:
        proc = _start("conv", log)
        # Kill at a random moment once the job has added a record (or is replaying the ones
        # before), so every kill interrupts a job that is measuring.
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and _lines(path) <= seen:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.2))
        if proc.poll() is not None:
            assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
            break  # finished before the kill: nothing left to interrupt
        proc.kill()  # SIGKILL: no cleanup
        proc.wait()
        kills += 1
        seen = _lines(path)
    assert kills >= 10, f"the job finished after {kills} kills"
    partial = records(log)
    results = job("conv", log)
    want = records(uninterrupted["conv"])
    assert partial <= want  # every record a killed job left is one the uninterrupted job made
    assert records(log) == want
    assert [r.trials for r in results] == [TRIALS] * len(results)
    # Each record once in the file: the resumed job appended only what the killed ones lacked.
    assert _lines(path) == len(want)


def test_rerun_of_a_finished_job_measures_and_adds_nothing(tmp_path, uninterrupted):
    log = str(tmp_path / "again")
    shutil.copytree(uninterrupted["matmul"], log)
    before = open(os.path.join(log, RECORDS), "rb").read()
    results = job("matmul", log)
    assert results[0].trials == TRIALS
    assert open(os.path.join(log, RECORDS), "rb").read() == before
    # More trials than the log holds: the job replays the first ones from the log (not
    # measured again, not appended again) and adds only new candidates.
    results = job("matmul", log, trials=TRIALS + 4)
    assert TRIALS <= results[0].trials <= TRIALS + 4  # fewer: a small space ran out
    after = records(log)
    assert records(uninterrupted["matmul"]) <= after and len(after) == _lines(os.path.join(log, RECORDS))


def test_two_jobs_into_one_folder_keep_both_models_records(tmp_path, uninterrupted):
    log = str(tmp_path / "shared")
    procs = [_start(model, log) for model in MODELS]
    for p in procs:
        assert p.wait(300) == 0, p.stderr.read().decode()[-2000:]
    got = records(log)
    assert got == records(uninterrupted["matmul"]) | records(uninterrupted["conv"])
    # Each model's build applies its own tasks' best records.
    for model, make in MODELS.items():
        mod = import_onnx(make()).mod
        alone = load_tuned(uninterrupted[model], MINI)
        assert {k: v for k, v in load_tuned(log, MINI).items() if k in alone} == alone
        exe = lpx_tvm.build(mod, preset="mini", precision="fp16", tuning_log=log)
        assert exe.tuning["default_layers"] == [] and len(exe.tuning["tuned_layers"]) == len(
            extract_tasks(mod, MINI, "fp16"))


def test_records_are_keyed_by_workload_hash(tmp_path, uninterrupted):
    log = str(tmp_path / "keys")
    shutil.copytree(uninterrupted["conv"], log)
    path = os.path.join(log, RECORDS)
    lines = open(path).read().splitlines(keepends=True)
    keys = [json.loads(line)[0] for line in open(os.path.join(log, WORKLOADS))]
    assert {json.loads(line)[0] for line in lines} <= set(keys)
    # A duplicate line (two jobs that measured one candidate) is dropped on load.
    with open(path, "a") as f:
        f.write(lines[0])
    assert len(TuningLog(log)) == len(lines)
    # A record naming a workload the log does not hold is corruption, never another's record.
    bad = json.loads(lines[1])
    bad[0] = "12345"
    with open(path, "w") as f:
        f.writelines([lines[0], json.dumps(bad) + "\n"] + lines[2:])
    with pytest.raises(TuningLogError, match=f"{path}:2: corrupt tuning record .*workload 12345 is not in"):
        TuningLog(log)


def test_a_log_in_metaschedules_line_index_format_still_loads(tmp_path, uninterrupted):
    log = str(tmp_path / "legacy")
    shutil.copytree(uninterrupted["conv"], log)
    keys = [json.loads(line)[0] for line in open(os.path.join(log, WORKLOADS))]
    path = os.path.join(log, RECORDS)
    legacy = [json.dumps([keys.index(k), rec]) + "\n" for k, rec in map(json.loads, open(path))]
    with open(path, "w") as f:
        f.writelines(legacy)
    assert load_tuned(log, MINI) == load_tuned(uninterrupted["conv"], MINI)
    best = best_records(TuningLog(log), MINI)
    assert {k: tiling_of_record(r) for k, (r, _) in best.items()} == load_tuned(log, MINI)
    assert not os.path.exists(os.path.join(log, APPLIED))

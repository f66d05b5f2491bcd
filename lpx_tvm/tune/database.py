"""Tuning logs: a MetaSchedule JSON database under ``tuning_logs/NAME/``.

The folder holds two JSON-lines files in the spirit of ``ms.database.JSONDatabase``:
``database_workload.json`` (one ``[structural hash, module]`` line per workload) and
``database_tuning_record.json`` (one ``[workload hash, record]`` line per measured
candidate), and ``lpx_tuning.json`` naming the machine (preset and config hash) and
precision it was made for. Every workload module also carries the config hash, so a record
is keyed by workload *and* machine: a log made for one machine is never applied to another.

A record names its workload by hash, not by line: a record whose hash the log does not
hold is corruption, never another workload's record. (Logs written before kept the line
index of the workload, MetaSchedule's own format; they still load.) Loading keeps one
record per workload and trace: a duplicate line (two jobs that measured the same
candidate) is dropped.

Writers take the folder's lock (``.lock``: an advisory ``flock``) around every append,
read what other jobs appended since (so every job sees one set of workloads and records),
and append records whole: one ``write`` of a complete line to a file opened with
``O_APPEND``, then ``fsync``. A job killed at any point (``kill -9``) leaves at most a
truncated last line, which the next load drops with a warning (and the next writer cuts
off, under the lock, so no other job can be mid-write) — every completed record survives.
A line that is not the truncated tail of a file is corruption: loading stops with an error
naming the file and the line.

``lpx_applied.json`` (JSON lines, appended the same way) holds the schedules chosen *in
context* (:mod:`.refine`): each line is one whole choice for a model's tasks, written
once the refinement has measured it: ``{"kind": "context", "config_hash", "model",
"cycles", "default_cycles", "isolated_cycles", "choices": [[workload hash, record | null],
...]}`` (null: the task keeps its default schedule). A line measured again after a change
of the machine model that kept the config (:func:`.context.remeasure_applied`) repeats
the choice with the new cycles and ``"remeasured": {"cycles", "default_cycles"}``, the
figures it replaces. For each model the last line for the
machine is in force; a ``{"kind": "isolated", "config_hash", "workloads": [hash, ...]}``
line (new records for those workloads) withdraws every earlier choice that names one of
them. Tasks no choice in force names take their best isolated record, as does every task
of a log without the file.

``lpx_checked.json`` (JSON lines) holds the functional checks of records (:mod:`.check`):
``{"workload": hash, "trace": sha256 of the trace, "error": null | what differs}``. Only
records whose check passed are applied.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import warnings

from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..errors import LPXError
from ..files import user_mode
from ..machine.config import LPXConfig
from ..tir_schedules.schedules import tiling_of
from .space import task_key_of

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
META = "lpx_tuning.json"
APPLIED = "lpx_applied.json"
CHECKS = "lpx_checked.json"
LOCK = ".lock"

FAILED_SECS = 1e9  # MetaSchedule marks a candidate that failed to build or run with 1e10 s


class TuningLogError(LPXError):
    """A tuning log that cannot be read (a corrupt line) or is for another machine."""


class TuningLogWarning(UserWarning):
    """A tuning log (or part of one) that is not applied."""


@contextlib.contextmanager
def folder_lock(path: str):
    """Hold the log folder's advisory lock (``flock``; released when the holder dies)."""
    os.makedirs(path, exist_ok=True)
    fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_lines(path: str, start: tuple, repair: bool) -> tuple:
    """([(line number, parsed JSON)], end) of the complete lines of a JSON-lines file from
    ``start`` on (``start``, ``end``: a byte offset and the lines before it). A truncated
    last line (no newline: a write cut short) is dropped with a warning, and cut off the
    file when ``repair`` (the caller holds the lock, so no job is writing it)."""
    offset, before = start
    if not os.path.exists(path):
        return [], (0, 0)
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    lines = data.split(b"\n")
    out = []
    for i, raw in enumerate(lines):
        lineno, last = before + i + 1, i == len(lines) - 1  # last: no newline after it
        if last:
            if raw:  # even a whole JSON value: its newline never came
                warnings.warn(f"{path}:{lineno}: dropping a truncated last record (a tuning job stopped "
                              "mid-write)", TuningLogWarning, stacklevel=4)
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(offset)
            break
        offset += len(raw) + 1
        if not raw.strip():
            continue
        try:
            out.append((lineno, json.loads(raw.decode("utf-8"))))
        except (ValueError, UnicodeDecodeError) as e:
            raise TuningLogError(f"{path}:{lineno}: corrupt tuning log line ({e})") from None
    return out, (offset, before + len(lines) - 1)


def _append_line(path: str, obj) -> int:
    """Append ``obj`` as one line; the number of bytes written."""
    line = (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(line)


def workload_key(workload) -> str:
    """The hash a log keys a workload by (MetaSchedule's structural hash of its module)."""
    return workload.as_json()[0]


def _trace_key(record_json) -> str:
    return json.dumps(record_json[0], separators=(",", ":"))


def _check_key(record) -> tuple:
    trace = _trace_key(record.as_json())
    return workload_key(record.workload), hashlib.sha256(trace.encode()).hexdigest()[:32]


class _Queries(ms.database.PyDatabase):
    """The Database queries, answered by the ``MemoryDatabase`` ``self.mem``."""

    def has_workload(self, mod) -> bool:
        return self.mem.has_workload(mod)

    def get_top_k(self, workload, top_k: int):
        return self.mem.get_top_k(workload, top_k)

    def get_all_tuning_records(self):
        return self.mem.get_all_tuning_records()

    def query_tuning_record(self, mod, target, workload_name):
        return self.mem.query_tuning_record(mod, target, workload_name)

    def query_schedule(self, mod, target, workload_name):
        return self.mem.query_schedule(mod, target, workload_name)

    def query_ir_module(self, mod, target, workload_name):
        return self.mem.query_ir_module(mod, target, workload_name)

    def __len__(self) -> int:
        return len(self.mem)


@derived_object
class TuningLog(_Queries):
    """A MetaSchedule database kept in memory and appended, record by record, to the
    JSON-lines files of ``path`` (see the module docstring). ``writer``: this object
    appends (it takes the folder lock to load, and cuts off a truncated last line)."""

    def __init__(self, path: str, writer: bool = False):
        super().__init__()
        self.path, self.writer = path, writer
        self.mem = ms.database.MemoryDatabase(module_equality="structural")
        self.workloads = {}  # workload key -> Workload
        self.by_line = []  # workloads in line order (records of older logs name a line)
        self.seen = set()  # (workload key, trace) of every record
        self.trials = {}  # workload key -> distinct records (failed candidates included)
        self.applied = []  # the lines of APPLIED
        self.checks = {}  # (workload key, trace hash) -> None (passed) or what differs
        self.read_to = {name: (0, 0) for name in (WORKLOADS, RECORDS, APPLIED, CHECKS)}  # (byte offset, lines) read
        self.appended = 0  # records this object appended
        if writer:
            with folder_lock(path):
                self._sync()
        else:
            self._sync()

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _sync(self) -> None:
        """Read what was appended to the files since the last read (by any job)."""
        path = self._file(WORKLOADS)
        lines, self.read_to[WORKLOADS] = _read_lines(path, self.read_to[WORKLOADS], self.writer)
        for lineno, obj in lines:
            try:
                key = str(obj[0])
                wl = self.mem.commit_workload(ms.database.Workload.from_json(obj).mod)
            except Exception as e:  # noqa: BLE001 — any undecodable entry is a corrupt line
                raise TuningLogError(f"{path}:{lineno}: corrupt workload entry ({type(e).__name__}: {e})") from None
            self.workloads.setdefault(key, wl)
            self.by_line.append(self.workloads[key])
        path = self._file(RECORDS)
        lines, self.read_to[RECORDS] = _read_lines(path, self.read_to[RECORDS], self.writer)
        for lineno, obj in lines:
            try:
                ref, rec = obj
                key, wl = self._workload(ref)
                seen = (key, _trace_key(rec))
                if seen in self.seen:
                    continue
                self.mem.commit_tuning_record(ms.database.TuningRecord.from_json(rec, wl))
            except Exception as e:  # noqa: BLE001
                raise TuningLogError(f"{path}:{lineno}: corrupt tuning record ({type(e).__name__}: {e})") from None
            self.seen.add(seen)
            self.trials[key] = self.trials.get(key, 0) + 1
        path = self._file(APPLIED)
        lines, self.read_to[APPLIED] = _read_lines(path, self.read_to[APPLIED], self.writer)
        for lineno, obj in lines:
            if not isinstance(obj, dict) or obj.get("kind") not in ("context", "isolated"):
                raise TuningLogError(f"{path}:{lineno}: corrupt applied-schedules line")
            self.applied.append((lineno, obj))
        path = self._file(CHECKS)
        lines, self.read_to[CHECKS] = _read_lines(path, self.read_to[CHECKS], self.writer)
        for lineno, obj in lines:
            if not isinstance(obj, dict) or not {"workload", "trace", "error"} <= set(obj):
                raise TuningLogError(f"{path}:{lineno}: corrupt check line")
            self.checks[(obj["workload"], obj["trace"])] = obj["error"]

    def _workload(self, ref) -> tuple:
        """(key, Workload) a record names: a workload hash, or (older logs) a line index."""
        if isinstance(ref, str):
            if ref not in self.workloads:
                raise ValueError(f"workload {ref} is not in {WORKLOADS}")
            return ref, self.workloads[ref]
        if isinstance(ref, bool) or not isinstance(ref, int) or not 0 <= ref < len(self.by_line):
            raise ValueError(f"workload {ref!r} of {len(self.by_line)}")
        wl = self.by_line[ref]
        return workload_key(wl), wl

    def _append(self, name: str, obj) -> None:
        offset, lines = self.read_to[name]
        self.read_to[name] = (offset + _append_line(self._file(name), obj), lines + 1)

    # ---- the Database interface (writes; the queries: _Queries) --------------------
    def commit_workload(self, mod):
        if not self.mem.has_workload(mod):
            with folder_lock(self.path):
                self._sync()
                if not self.mem.has_workload(mod):
                    wl = self.mem.commit_workload(mod)
                    self._append(WORKLOADS, wl.as_json())
                    self.workloads[workload_key(wl)] = wl
                    self.by_line.append(wl)
        return self.mem.commit_workload(mod)

    def holds(self, record) -> bool:
        """Whether the log has a record of ``record``'s workload and trace."""
        if not self.mem.has_workload(record.workload.mod):
            return False
        wl = self.mem.commit_workload(record.workload.mod)
        return (workload_key(wl), _trace_key(record.as_json())) in self.seen

    def commit_tuning_record(self, record) -> bool:
        """Append ``record`` unless the log has one of its workload and trace; True if appended."""
        wl = self.commit_workload(record.workload.mod)
        key, rec = workload_key(wl), record.as_json()
        seen = (key, _trace_key(rec))
        with folder_lock(self.path):
            self._sync()
            if seen in self.seen:
                return False
            self._append(RECORDS, [key, rec])
        self.mem.commit_tuning_record(ms.database.TuningRecord.from_json(rec, wl))
        self.seen.add(seen)
        self.trials[key] = self.trials.get(key, 0) + 1
        self.appended += 1
        return True

    def trial_count(self, mod) -> int:
        """Distinct candidates the log holds for workload ``mod`` (failed ones included)."""
        if not self.mem.has_workload(mod):
            return 0
        return self.trials.get(workload_key(self.mem.commit_workload(mod)), 0)

    # ---- functional checks (check.py) ---------------------------------------------------
    def check_of(self, record):
        """``True`` (passed), what differs (a string: failed), or None (never checked)."""
        key = _check_key(record)
        if key not in self.checks:
            return None
        return True if self.checks[key] is None else self.checks[key]

    def commit_check(self, record, error: "str | None") -> None:
        """Keep the verdict of ``record``'s check (``error``: None, or what differs)."""
        wkey, trace = key = _check_key(record)
        with folder_lock(self.path):
            self._sync()
            if key not in self.checks:
                self._append(CHECKS, {"workload": wkey, "trace": trace, "error": error})
        self.checks[key] = error

    def passed(self, record) -> bool:
        return self.check_of(record) is True

    # ---- the schedules applied (in-context refinement) ---------------------------------
    def commit_applied(self, cfg: LPXConfig, choices: dict, **info) -> None:
        """Append one whole in-context choice: ``choices`` {workload module: TuningRecord or
        None (the default schedule)}; ``info``: model, cycles, ... (kept in the line)."""
        rows = [[workload_key(self.commit_workload(mod)), None if rec is None else rec.as_json()]
                for mod, rec in choices.items()]
        line = {"kind": "context", "config_hash": cfg.hash, **info, "choices": rows}
        with folder_lock(self.path):
            self._sync()
            self._append(APPLIED, line)
        self.applied.append((None, line))

    def withdraw_applied(self, cfg: LPXConfig, mods: list) -> None:
        """Stop applying every in-context choice that names one of workloads ``mods`` (new
        records for them make it stale): their best records apply again."""
        keys = sorted(workload_key(self.commit_workload(m)) for m in mods)
        with folder_lock(self.path):
            self._sync()
            if any(set(keys) & self._choice_keys(obj) for obj in self._in_force(cfg)):
                line = {"kind": "isolated", "config_hash": cfg.hash, "workloads": keys}
                self._append(APPLIED, line)
                self.applied.append((None, line))

    def _choice_keys(self, line) -> set:
        try:
            return {self._workload(ref)[0] for ref, _ in line["choices"]}
        except Exception as e:  # noqa: BLE001
            raise TuningLogError(f"{self._file(APPLIED)}: corrupt applied choice ({type(e).__name__}: {e})") from None

    def _in_force(self, cfg: LPXConfig) -> list:
        """The in-context choices in force for machine ``cfg``, oldest first: each model's
        last choice, unless a later withdrawal names one of its workloads."""
        out = []
        for _, obj in self.applied:
            if obj.get("config_hash") != cfg.hash:
                continue
            if obj["kind"] == "context":
                out = [o for o in out if o.get("model") != obj.get("model")] + [obj]
            elif "workloads" in obj:
                out = [o for o in out if not set(obj["workloads"]) & self._choice_keys(o)]
            else:  # a withdrawal of an older log: every choice
                out = []
        return out

    def applied_line(self, cfg: LPXConfig):
        """The newest in-context choice in force for machine ``cfg`` (a dict), or None."""
        lines = self._in_force(cfg)
        return lines[-1] if lines else None

    def applied_choices(self, cfg: LPXConfig) -> dict:
        """{(workload, composite, batches): TuningRecord or None} of the choices in force (a
        newer choice decides a workload two models share)."""
        out = {}
        for line in self._in_force(cfg):
            for mod, rec in self.line_choices(line).items():
                out[task_key_of(mod)[:3]] = rec
        return out

    def line_choices(self, line: dict) -> dict:
        """{workload module: TuningRecord or None (the default schedule)} of one applied line."""
        out = {}
        for ref, rec in line["choices"]:
            try:
                _, wl = self._workload(ref)
                out[wl.mod] = None if rec is None else ms.database.TuningRecord.from_json(rec, wl)
            except Exception as e:  # noqa: BLE001
                raise TuningLogError(f"{self._file(APPLIED)}: corrupt applied choice "
                                     f"({type(e).__name__}: {e})") from None
        return out


@derived_object
class SearchDatabase(_Queries):
    """The database one tuning job's search sees: only what this job measured, so a job
    resumed after a kill makes the same decisions as one never interrupted (the search's
    start and its cost model depend on what the database holds). Every workload and
    record goes through to the log, which keeps one record per workload and trace;
    ``on_new_record()`` is called before the first record the log did not hold."""

    def __init__(self, log: TuningLog, on_new_record=None):
        super().__init__()
        self.log, self.on_new_record = log, on_new_record
        self.mem = ms.database.MemoryDatabase(module_equality="structural")

    def commit_workload(self, mod):
        self.log.commit_workload(mod)
        return self.mem.commit_workload(mod)

    def commit_tuning_record(self, record) -> None:
        self.mem.commit_tuning_record(record)
        if self.on_new_record is not None and not self.log.appended and not self.log.holds(record):
            self.on_new_record()
        self.log.commit_tuning_record(record)


def write_meta(path: str, cfg: LPXConfig, precision: str, model: "str | None" = None) -> None:
    """Name the machine a log is for; a log for another machine is refused."""
    meta_path = os.path.join(path, META)
    meta = {"preset": cfg.name, "config_hash": cfg.hash, "precision": precision, "model": model}
    with folder_lock(path):
        if os.path.exists(meta_path):
            old = read_meta(path)
            if old.get("config_hash") != cfg.hash:
                raise TuningLogError(f"{path} is a tuning log for machine {old.get('preset')} "
                                     f"(config {old.get('config_hash')}), not {cfg.name} ({cfg.hash}): "
                                     "tune into another folder")
            meta = {**old, **{k: v for k, v in meta.items() if v is not None}}
        fd, tmp = tempfile.mkstemp(prefix=META, dir=path)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        os.chmod(tmp, user_mode(0o644))
        os.replace(tmp, meta_path)


def read_meta(path: str) -> dict:
    meta_path = os.path.join(path, META)
    if not os.path.exists(meta_path):
        return {}
    try:
        with open(meta_path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise TuningLogError(f"{meta_path}: not valid JSON ({e})") from None


def latency(record) -> "float | None":
    """A record's mean measured seconds, or None for a candidate that failed to build or run."""
    secs = [float(s) for s in record.run_secs] if record.run_secs else []
    if not secs or min(secs) >= FAILED_SECS:
        return None
    return sum(secs) / len(secs)


def best_records(db, cfg: LPXConfig, accept=None) -> dict:
    """{(workload, composite, batches): (best TuningRecord, latency_s)} of the records made
    for machine ``cfg`` (and, with ``accept``, those ``accept(record)`` takes); those made
    for other machines are left out."""
    best = {}
    for rec in db.get_all_tuning_records():
        lat = latency(rec)
        if lat is None or (accept is not None and not accept(rec)):
            continue
        w, composite, batches, config_hash = task_key_of(rec.workload.mod)
        if config_hash != cfg.hash:
            continue
        key = (w, composite, batches)
        if key not in best or lat < best[key][1]:
            best[key] = (rec, lat)
    return best


def measured_records(db, mod) -> list:
    """The records of workload ``mod`` that ran, fastest first (ties in the log's order)."""
    records = [r for r in db.get_top_k(db.commit_workload(mod), 1 << 30) if latency(r) is not None]
    return sorted(records, key=latency)


def tiling_of_record(rec):
    """The tiling a record's trace stands for."""
    w = task_key_of(rec.workload.mod)[0]
    sch = s_tir.Schedule(rec.workload.mod)
    rec.trace.apply_to_schedule(sch, remove_postproc=False)
    return tiling_of(w, sch.mod["main"])


def load_tuned(path: str, cfg: LPXConfig) -> dict:
    """{(workload, composite, batches): tiling} of the log at ``path`` for machine ``cfg``:
    the in-context choice where the log has one (a task it leaves at the default is
    absent), else the best records. Only records whose functional check passed apply
    (:mod:`.check`); a task whose better records are unchecked takes its best checked one
    (a warning says so: ``lpx-tvm tune`` with the log checks them). A log made for another
    machine is not applied (a warning says so)."""
    if not os.path.isdir(path):
        raise TuningLogError(f"{path}: no such tuning log folder")
    meta = read_meta(path)
    if meta.get("config_hash") not in (None, cfg.hash):
        warnings.warn(f"tuning log {path} was made for machine {meta.get('preset')} (config "
                      f"{meta.get('config_hash')}), not for {cfg.name} ({cfg.hash}): not applied; "
                      "every layer uses its default schedule", TuningLogWarning, stacklevel=2)
        return {}
    db = TuningLog(path)
    every = best_records(db, cfg)
    if len(db) and not every:
        warnings.warn(f"tuning log {path} has no records for machine {cfg.name} ({cfg.hash}): not applied",
                      TuningLogWarning, stacklevel=2)
    best = best_records(db, cfg, accept=db.passed)
    tuned = {key: tiling_of_record(rec) for key, (rec, _) in best.items()}
    unchecked = [key for key, (rec, _) in every.items()
                 if db.check_of(rec) is None and (key not in best or every[key][1] < best[key][1])]
    for key, rec in db.applied_choices(cfg).items():
        if rec is None:
            tuned.pop(key, None)
        elif db.passed(rec):
            tuned[key] = tiling_of_record(rec)
        elif db.check_of(rec) is None:
            unchecked.append(key)
    if unchecked:
        warnings.warn(f"tuning log {path}: the best schedules of {len(set(unchecked))} task(s) were never checked "
                      "against the default schedule and are not applied (run lpx-tvm tune with this log: it "
                      "checks them without measuring again)", TuningLogWarning, stacklevel=2)
    return tuned


SHIPPED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tuning_logs")


def shipped_logs() -> list:
    """[(folder, meta)] of the tuning logs shipped inside the package (``lpx_tvm/tuning_logs/``)."""
    if not os.path.isdir(SHIPPED_DIR):
        return []
    out = []
    for name in sorted(os.listdir(SHIPPED_DIR)):
        path = os.path.join(SHIPPED_DIR, name)
        if os.path.isfile(os.path.join(path, META)):
            out.append((path, read_meta(path)))
    return out


def shipped_log(model: str, cfg: LPXConfig, precision: str) -> "str | None":
    """The shipped tuning log made for ``model`` (its name, or an .onnx path whose file name
    is that name) on machine ``cfg`` (same config hash) at ``precision``, or None."""
    def name(m):
        return os.path.splitext(os.path.basename(str(m)))[0]

    for path, meta in shipped_logs():
        if meta.get("model") and name(meta["model"]) == name(model) and meta.get("config_hash") == cfg.hash and meta.get("precision") == precision:
            return path
    return None

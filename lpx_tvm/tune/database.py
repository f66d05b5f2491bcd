"""Tuning logs: a MetaSchedule JSON database under ``tuning_logs/NAME/``.

The folder holds MetaSchedule's two JSON-lines files (``database_workload.json``,
``database_tuning_record.json``: the format of ``ms.database.JSONDatabase``) and
``lpx_tuning.json`` naming the machine (preset and config hash) and precision it was
made for. Every workload module also carries the config hash, so a record is keyed by
workload *and* machine: a log made for one machine is never applied to another.

Records are appended whole: one ``write`` of a complete line to a file opened with
``O_APPEND``, then ``fsync``. A tuning job killed at any point (``kill -9``) leaves at
most a truncated last line, which the next load drops with a warning (and a tuning rerun
cuts off) — every completed record survives and the rerun resumes from them. A line
that is not the truncated tail of a file is corruption: loading stops with an error
naming the file and the line.

``lpx_applied.json`` (JSON lines, appended the same way) holds the schedules chosen *in
context* (:mod:`.context`): each line is one whole choice for a model's tasks, written
once the refinement has measured it: ``{"kind": "context", "config_hash", "model",
"cycles", "default_cycles", "isolated_cycles", "choices": [[workload index, record | null],
...]}`` (null: the task keeps its default schedule). The last line for the machine is
the one applied; a ``{"kind": "isolated", "config_hash"}`` line withdraws it (a tuning run
without the refinement). Tasks the line does not name take their best isolated record,
as does every task of a log without the file (logs made before it existed).
"""

from __future__ import annotations

import json
import os
import warnings

from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..errors import LPXError
from ..machine.config import LPXConfig
from ..tir_schedules.schedules import tiling_of
from .space import task_key_of

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
META = "lpx_tuning.json"
APPLIED = "lpx_applied.json"


class TuningLogError(LPXError):
    """A tuning log that cannot be read (a corrupt line) or is for another machine."""


class TuningLogWarning(UserWarning):
    """A tuning log (or part of one) that is not applied."""


def _read_lines(path: str, repair: bool) -> list:
    """[(line number, parsed JSON)] of a JSON-lines file. A truncated last line (no
    newline: a write cut short) is dropped, and cut off the file when ``repair``."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    out = []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        last = i == len(lines)  # no newline after it
        try:
            out.append((i, json.loads(raw.decode("utf-8"))))
        except (ValueError, UnicodeDecodeError) as e:
            if last:
                warnings.warn(f"{path}:{i}: dropping a truncated last record (a tuning job stopped mid-write)",
                              TuningLogWarning, stacklevel=3)
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(len(data) - len(raw))
                break
            raise TuningLogError(f"{path}:{i}: corrupt tuning log line ({e})") from None
    return out


def _append_line(path: str, obj) -> None:
    line = (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


@derived_object
class TuningLog(ms.database.PyDatabase):
    """A MetaSchedule database kept in memory and appended, record by record, to the
    JSON-lines files of ``path`` (see the module docstring)."""

    def __init__(self, path: str, repair: bool = False):
        super().__init__()
        self.path = path
        self.mem = ms.database.MemoryDatabase(module_equality="structural")
        self.index = {}  # workload structural hash -> line index in WORKLOADS
        self.workloads = []  # by line index in WORKLOADS
        self.applied = []  # the lines of APPLIED
        self.count = 0
        self._load(repair)

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _load(self, repair: bool):
        if repair:
            os.makedirs(self.path, exist_ok=True)
        workloads = []
        path = self._file(WORKLOADS)
        for lineno, obj in _read_lines(path, repair):
            try:
                wl = ms.database.Workload.from_json(obj)
                wl = self.mem.commit_workload(wl.mod)
            except Exception as e:  # noqa: BLE001 — any undecodable entry is a corrupt line
                raise TuningLogError(f"{path}:{lineno}: corrupt workload entry ({type(e).__name__}: {e})") from None
            self.index[wl.as_json()[0]] = len(workloads)
            workloads.append(wl)
        self.count = len(workloads)
        self.workloads = workloads
        path = self._file(RECORDS)
        for lineno, obj in _read_lines(path, repair):
            try:
                wi, rec = obj
                if not 0 <= int(wi) < len(workloads):
                    raise ValueError(f"workload {wi} of {len(workloads)}")
                self.mem.commit_tuning_record(ms.database.TuningRecord.from_json(rec, workloads[int(wi)]))
            except Exception as e:  # noqa: BLE001
                raise TuningLogError(f"{path}:{lineno}: corrupt tuning record ({type(e).__name__}: {e})") from None
        path = self._file(APPLIED)
        for lineno, obj in _read_lines(path, repair):
            if not isinstance(obj, dict) or obj.get("kind") not in ("context", "isolated"):
                raise TuningLogError(f"{path}:{lineno}: corrupt applied-schedules line")
            self.applied.append((lineno, obj))

    # ---- the Database interface ---------------------------------------------------
    def has_workload(self, mod) -> bool:
        return self.mem.has_workload(mod)

    def commit_workload(self, mod):
        known = self.mem.has_workload(mod)
        wl = self.mem.commit_workload(mod)
        if not known:
            _append_line(self._file(WORKLOADS), wl.as_json())
            self.index[wl.as_json()[0]] = self.count
            self.workloads.append(wl)
            self.count += 1
        return wl

    def commit_tuning_record(self, record) -> None:
        self.mem.commit_tuning_record(record)
        _append_line(self._file(RECORDS), [self.index[record.workload.as_json()[0]], record.as_json()])

    # ---- the schedules applied (in-context refinement) ---------------------------------
    def commit_applied(self, cfg: LPXConfig, choices: dict, **info) -> None:
        """Append one whole in-context choice: ``choices`` {workload module: TuningRecord or
        None (the default schedule)}; ``info``: model, cycles, ... (kept in the line)."""
        rows = []
        for mod, rec in choices.items():
            wl = self.commit_workload(mod)
            rows.append([self.index[wl.as_json()[0]], None if rec is None else rec.as_json()])
        line = {"kind": "context", "config_hash": cfg.hash, **info, "choices": rows}
        _append_line(self._file(APPLIED), line)
        self.applied.append((None, line))

    def withdraw_applied(self, cfg: LPXConfig) -> None:
        """Stop applying the in-context choice (when there is one): best records again."""
        if self.applied_line(cfg) is not None:
            line = {"kind": "isolated", "config_hash": cfg.hash}
            _append_line(self._file(APPLIED), line)
            self.applied.append((None, line))

    def applied_line(self, cfg: LPXConfig):
        """The in-context choice in force for machine ``cfg`` (a dict), or None."""
        for _, obj in reversed(self.applied):
            if obj.get("config_hash") == cfg.hash:
                return obj if obj["kind"] == "context" else None
        return None

    def applied_choices(self, cfg: LPXConfig) -> dict:
        """{(workload, composite, batches): TuningRecord or None} of the choice in force."""
        line = self.applied_line(cfg)
        if line is None:
            return {}
        path, out = self._file(APPLIED), {}
        for wi, rec in line["choices"]:
            try:
                wl = self.workloads[int(wi)]
                key = task_key_of(wl.mod)[:3]
                out[key] = None if rec is None else ms.database.TuningRecord.from_json(rec, wl)
            except Exception as e:  # noqa: BLE001
                raise TuningLogError(f"{path}: corrupt applied choice ({type(e).__name__}: {e})") from None
        return out

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


def write_meta(path: str, cfg: LPXConfig, precision: str, model: "str | None" = None) -> None:
    """Name the machine a log is for; a log for another machine is refused."""
    os.makedirs(path, exist_ok=True)
    meta_path = os.path.join(path, META)
    meta = {"preset": cfg.name, "config_hash": cfg.hash, "precision": precision, "model": model}
    if os.path.exists(meta_path):
        old = read_meta(path)
        if old.get("config_hash") != cfg.hash:
            raise TuningLogError(f"{path} is a tuning log for machine {old.get('preset')} "
                                 f"(config {old.get('config_hash')}), not {cfg.name} ({cfg.hash}): "
                                 "tune into another folder")
        meta = {**old, **{k: v for k, v in meta.items() if v is not None}}
    with open(meta_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)


def read_meta(path: str) -> dict:
    meta_path = os.path.join(path, META)
    if not os.path.exists(meta_path):
        return {}
    try:
        with open(meta_path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise TuningLogError(f"{meta_path}: not valid JSON ({e})") from None


def best_records(db, cfg: LPXConfig) -> dict:
    """{(workload, composite, batches): (best TuningRecord, latency_s)} of the records made
    for machine ``cfg``; those made for other machines are left out."""
    best = {}
    for rec in db.get_all_tuning_records():
        if not rec.run_secs:
            continue
        secs = [float(s) for s in rec.run_secs]
        if min(secs) >= 1e9:  # MetaSchedule's mark of a failed run
            continue
        w, composite, batches, config_hash = task_key_of(rec.workload.mod)
        if config_hash != cfg.hash:
            continue
        key = (w, composite, batches)
        lat = sum(secs) / len(secs)
        if key not in best or lat < best[key][1]:
            best[key] = (rec, lat)
    return best


def tiling_of_record(rec):
    """The tiling a record's trace stands for."""
    w = task_key_of(rec.workload.mod)[0]
    sch = s_tir.Schedule(rec.workload.mod)
    rec.trace.apply_to_schedule(sch, remove_postproc=False)
    return tiling_of(w, sch.mod["main"])


def load_tuned(path: str, cfg: LPXConfig) -> dict:
    """{(workload, composite, batches): tiling} of the log at ``path`` for machine ``cfg``:
    the in-context choice where the log has one (a task it leaves at the default is
    absent), else the best records. A log made for another machine is not applied (a
    warning says so)."""
    if not os.path.isdir(path):
        raise TuningLogError(f"{path}: no such tuning log folder")
    meta = read_meta(path)
    if meta.get("config_hash") not in (None, cfg.hash):
        warnings.warn(f"tuning log {path} was made for machine {meta.get('preset')} (config "
                      f"{meta.get('config_hash')}), not for {cfg.name} ({cfg.hash}): not applied; "
                      "every layer uses its default schedule", TuningLogWarning, stacklevel=2)
        return {}
    db = TuningLog(path)
    best = best_records(db, cfg)
    if len(db) and not best:
        warnings.warn(f"tuning log {path} has no records for machine {cfg.name} ({cfg.hash}): not applied",
                      TuningLogWarning, stacklevel=2)
    tuned = {key: tiling_of_record(rec) for key, (rec, _) in best.items()}
    for key, rec in db.applied_choices(cfg).items():
        if rec is None:
            tuned.pop(key, None)
        else:
            tuned[key] = tiling_of_record(rec)
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

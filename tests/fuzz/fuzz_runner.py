"""Compile and run one fuzz graph as a user does, and classify what happened.

:func:`run_case` writes the graph and its inputs to a folder and runs
``lpx-tvm run model.onnx --inputs inputs.npz --outputs outputs.npz --report report.json
--preset P --precision fp32`` through :func:`lpx_tvm.cli.main`, then compares the outputs
with onnxruntime's. The outcome is one of :data:`OUTCOMES`:

- ``ok``: exit 0 and every output within ``rtol * ||want|| + atol * sqrt(n)`` in L2;
- ``mismatch``: exit 0 but an output is missing, of another shape or too far off;
- ``user-error``: exit 2, one ``lpx-tvm: error:`` line. For a valid model this is right
  only when the model is outside what the machine can do; otherwise it is a bug too
  (``error_type`` names the exception behind it);
- ``internal``: exit 3 (an exception lpx_tvm did not expect: a compiler bug);
- ``crash`` and ``timeout``: set by :mod:`fuzz_sandbox`, which runs cases in a worker process.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field

import numpy as np

OUTCOMES = ("ok", "mismatch", "user-error", "internal", "crash", "timeout")
FAILURES = OUTCOMES[1:]
RTOL = ATOL = 1e-4
PRECISION = "fp32"


@dataclass
class Outcome:
    """What one compile-and-run of a graph gave."""

    kind: str
    message: str = ""  # the first error line (empty when ok)
    error_type: str = ""  # the exception behind exit 2 or 3
    where: str = ""  # its two innermost lpx_tvm frames, "target/a.py:12 f < target/b.py:34 g"
    rel_err: "float | None" = None  # the worst output's relative L2 error
    offload: dict = field(default_factory=dict)  # regions and op counts on LPX / CPU
    seconds: float = 0.0

    @property
    def first_line(self) -> str:
        """The outcome as one line: what the CI table and the bench's failure list show."""
        return self.kind if self.kind == "ok" else f"{self.kind}: {self.message}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Outcome":
        return cls(**data)


def run_case(case, preset: str, workdir: "str | None" = None) -> Outcome:
    """Run ``case`` (an :class:`onnx_graphs.Case`) through ``lpx-tvm run`` on ``preset``
    at fp32, in ``workdir`` (a new temporary folder if None), and classify the result."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="lpx-fuzz-") as tmp:
            return run_case(case, preset, tmp)
    import onnx

    model, inputs = os.path.join(workdir, "model.onnx"), os.path.join(workdir, "inputs.npz")
    outputs, report = os.path.join(workdir, "outputs.npz"), os.path.join(workdir, "report.json")
    onnx.save(case.model, model)
    np.savez(inputs, **case.inputs)
    argv = ["run", model, "--inputs", inputs, "--outputs", outputs, "--report", report,
            "--preset", preset, "--precision", PRECISION]
    start = time.perf_counter()
    status, stderr, error = _cli(argv)
    seconds = time.perf_counter() - start
    line = _error_line(stderr).replace(workdir + os.sep, "")
    kind_of_error = dict(error_type=type(error).__name__ if error else "", where=_innermost_frame(error))
    if status == 2:
        return Outcome("user-error", _strip(line, "lpx-tvm: error: "), seconds=seconds, **kind_of_error)
    if status != 0:
        return Outcome("internal", _strip(line, "lpx-tvm: internal error (a bug in lpx_tvm): ")
                       .removesuffix("; run again with --debug for the traceback") or f"exit status {status}",
                       seconds=seconds, **kind_of_error)
    with np.load(outputs) as f:
        got = {k: f[k] for k in f.files}
    off = _offload(report)
    problem, worst = compare(got, case.expected)
    if problem:
        return Outcome("mismatch", problem, rel_err=worst, offload=off, seconds=seconds)
    return Outcome("ok", rel_err=worst, offload=off, seconds=seconds)


def compare(got: dict, want: dict, rtol: float = RTOL, atol: float = ATOL):
    """(the first problem or None, the worst relative L2 error) of ``got`` against ``want``:
    an output passes when ``||got - want|| <= rtol * ||want|| + atol * sqrt(size)``."""
    worst = 0.0
    for name, w in want.items():
        if name not in got:
            return f"output {name} missing (got {sorted(got)})", None
        g = got[name]
        if g.shape != w.shape:
            return f"output {name} has shape {g.shape}, onnxruntime {w.shape}", None
        d = g.astype(np.float64) - w.astype(np.float64)
        err = float(np.linalg.norm(d))
        rel = err / max(float(np.linalg.norm(w)), 1e-30)
        worst = max(worst, rel) if math.isfinite(rel) else math.inf
        if not err <= rtol * float(np.linalg.norm(w)) + atol * math.sqrt(w.size):
            at = np.unravel_index(int(np.nanargmax(np.where(np.isnan(d), np.inf, np.abs(d)))), d.shape)
            return (f"output {name} {w.shape}: relative L2 error {rel:.2e} (max abs error "
                    f"{float(np.abs(d[at])):.3g} at {tuple(int(i) for i in at)})"), worst
    return None, worst


def _cli(argv):
    """``lpx_tvm.cli.main(argv)``: (exit status, what it printed on stderr, the exception
    the ``run`` command raised, if any). The exception is only observed: main() handles it
    exactly as for a user."""
    from lpx_tvm import cli

    seen = []
    help_text, add_arguments, handler = cli.COMMANDS["run"]

    def observed(args):
        try:
            return handler(args)
        except BaseException as e:
            seen.append(e)
            raise

    err = io.StringIO()
    cli.COMMANDS["run"] = (help_text, add_arguments, observed)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = cli.main(argv)
    finally:
        cli.COMMANDS["run"] = (help_text, add_arguments, handler)
    return status, err.getvalue(), (seen[0] if seen else None)


def _error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("lpx-tvm: ")]
    return lines[-1] if lines else (stderr.strip().splitlines() or [""])[-1]


def _strip(line: str, prefix: str) -> str:
    return line[len(prefix):] if line.startswith(prefix) else line


def _innermost_frame(error) -> str:
    if error is None:
        return ""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f"{os.sep}lpx_tvm{os.sep}" in f.filename]
    return " < ".join(f"{f.filename.rsplit(os.sep + 'lpx_tvm' + os.sep, 1)[1]}:{f.lineno} {f.name}"
                      for f in reversed(frames[-2:]))


def _offload(report_path: str) -> dict:
    with open(report_path, encoding="utf-8") as f:
        off = json.load(f).get("offload", {})
    return {"regions": off.get("regions", 0), "lpx": sum(off.get("lpx", {}).values()),
            "cpu": off.get("cpu", {})}

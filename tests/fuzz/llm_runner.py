"""Compile one decoder fuzz case, generate, compare with transformers, classify.

:func:`run_case` builds the case's model (:func:`decoder_configs.build_model`), takes
``model.generate(do_sample=False)``'s tokens in fp32 as the reference, compiles it with
``lpx_tvm.compile_llm(model, precision="fp32", ...)`` on the case's mapping and generates
with the logits. The outcome is one of :data:`OUTCOMES`:

- ``ok``: the same tokens, and every step's logits within :data:`LOGITS_RTOL` (relative
  L2) of transformers' own logits for the tokens LPX chose (teacher-forced);
- ``tie``: the tokens part where transformers' logits of the two tokens are within
  :data:`TIE_RTOL` of its largest |logit| (either way round: its cached and uncached
  passes sum in other orders too), and LPX's logits up to there are within
  :data:`LOGITS_RTOL`: fp32 summation order decides, not a bug;
- ``wrong``: any other token difference, or the same tokens with logits beyond
  :data:`LOGITS_RTOL` (a wrong RoPE or kv-group mapping moves the logits far more);
- ``refused``: an ``LPXError`` (``ModelError``, ``DoesNotFit``, ...): its first line;
  right only if it names something the steps really do not support;
- ``internal``: any other exception;
- ``crash`` and ``timeout``: set by :class:`LLMSandbox`.

:class:`LLMSandbox` runs cases in a worker process with a timeout, as
:mod:`fuzz_sandbox` does for the ONNX graphs.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

import numpy as np

from fuzz_sandbox import Sandbox

OUTCOMES = ("ok", "tie", "wrong", "refused", "internal", "crash", "timeout")
FAILURES = ("wrong", "internal", "crash", "timeout")
LOGITS_RTOL = 1e-4  # fp32 steps against fp32 transformers: only the sums' order differs (~1e-6)
TIE_RTOL = 1e-4

_HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Outcome:
    kind: str
    message: str = ""  # the first line of the error, or what differs
    error_type: str = ""
    where: str = ""  # the two innermost lpx_tvm frames
    rel_err: "float | None" = None  # the worst step's logits, relative L2
    margin: "float | None" = None  # at the first differing step: transformers' top-2 gap / max |logit|
    tokens: list = field(default_factory=list)
    want: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def first_line(self) -> str:
        return self.kind if self.kind in ("ok", "tie") else f"{self.kind}: {self.message}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Outcome":
        return cls(**data)


def compile_args(case) -> dict:
    """``compile_llm``'s keyword arguments for the case (its model aside)."""
    m = case.mapping
    args = dict(precision="fp32", max_context=case.max_context)
    if m.system is None:
        args["preset"] = m.preset
    else:
        args.update(system=m.system, **m.args)
    return args


def reference(model, case):
    """transformers' greedy tokens [1, N] after the prompt (fp32)."""
    import torch

    ids = torch.as_tensor(case.prompt)
    with torch.no_grad():  # the mask given: generate would take a pad id in the prompt for padding
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=case.new_tokens,
                             do_sample=False)
    want = out[:, case.prompt.shape[1]:].numpy()
    if want.shape[1] != case.new_tokens:
        raise RuntimeError(f"transformers generated {want.shape[1]} tokens, not {case.new_tokens}")
    return want


def forced_logits(model, case, tokens):
    """transformers' logits [N, V] of each step, fed the prompt and ``tokens`` (LPX's)."""
    import torch

    seq = np.concatenate([case.prompt, tokens[:, :-1]], axis=1)
    with torch.no_grad():
        out = model(torch.as_tensor(seq)).logits[0].float().numpy()
    p = case.prompt.shape[1]
    return out[p - 1:p - 1 + case.new_tokens]


def classify(tokens, logits, want, ref) -> Outcome:
    """The outcome of LPX's ``tokens`` [1, N] and ``logits`` [N, 1, V] against transformers'
    greedy ``want`` [1, N] and its teacher-forced logits ``ref`` [N, V]."""
    errs = [float(np.linalg.norm(logits[k, 0] - ref[k]) / max(np.linalg.norm(ref[k]), 1e-30))
            for k in range(len(ref))]
    diff = np.nonzero(tokens[0] != want[0])[0]
    base = dict(tokens=tokens[0].tolist(), want=want[0].tolist())
    if not len(diff):
        worst = max(errs)
        if worst <= LOGITS_RTOL:
            return Outcome("ok", rel_err=worst, **base)
        k = int(np.argmax(errs))
        return Outcome("wrong", f"tokens equal but step {k}'s logits off by {errs[k]:.2e} (relative L2)",
                       rel_err=worst, **base)
    k = int(diff[0])
    worst = max(errs[:k + 1])  # up to the split, LPX's steps saw transformers' tokens
    r, got, exp = ref[k], int(tokens[0, k]), int(want[0, k])
    margin = float((r[exp] - r[got]) / max(np.abs(r).max(), 1e-30))
    msg = (f"step {k}: token {got}, transformers {exp} (its logits {r[got]:.6g} and {r[exp]:.6g}, margin "
           f"{margin:.1e}; logits off by {worst:.1e})")
    if abs(margin) <= TIE_RTOL and worst <= LOGITS_RTOL:
        return Outcome("tie", msg, rel_err=worst, margin=margin, **base)
    return Outcome("wrong", msg, rel_err=worst, margin=margin, **base)


def run_case(case) -> Outcome:
    """Compile and generate ``case`` (a :class:`decoder_configs.Case`) and classify."""
    import lpx_tvm
    from lpx_tvm.errors import LPXError
    import decoder_configs

    model = decoder_configs.build_model(case)
    want = reference(model, case)
    _check_reference(model, case, want)
    start = time.perf_counter()
    try:
        session = lpx_tvm.compile_llm(model, **compile_args(case))
        tokens, logits = session.generate(case.prompt, case.new_tokens, return_logits=True)
    except LPXError as e:
        return Outcome("refused", _first_line(e), type(e).__name__, _innermost(e),
                       seconds=time.perf_counter() - start)
    except Exception as e:
        return Outcome("internal", _first_line(e), type(e).__name__, _innermost(e),
                       seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    out = classify(np.asarray(tokens), np.asarray(logits), want, forced_logits(model, case, np.asarray(tokens)))
    out.seconds = seconds
    return out


def _check_reference(model, case, want) -> None:
    """transformers' greedy tokens are its own teacher-forced argmax (up to ties): else
    the reference itself is wrong (a bug of the fuzzer, e.g. a token taken for padding)."""
    ref = forced_logits(model, case, want)
    top, mine = ref.max(-1), ref[np.arange(len(ref)), want[0]]
    gap = (top - mine) / np.maximum(np.abs(ref).max(-1), 1e-30)
    if gap.max() > TIE_RTOL:
        raise RuntimeError(f"transformers' generate and its forward disagree at step {int(gap.argmax())} "
                           f"(gap {gap.max():.1e})")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:500]


def _innermost(e: BaseException) -> str:
    sep = os.sep + "lpx_tvm" + os.sep
    frames = [f for f in traceback.extract_tb(e.__traceback__) if sep in f.filename]
    return " < ".join(f"{f.filename.rsplit(sep, 1)[1]}:{f.lineno} {f.name}" for f in reversed(frames[-2:]))


# ---- the sandbox ----------------------------------------------------------------------

def run_generated_case(family: str, index: int, seed: int) -> Outcome:
    """The decoder fuzzer's case (family, index, seed), run."""
    sys.path.insert(0, _HERE)
    import decoder_configs

    return run_case(decoder_configs.case(family, index, seed))


class LLMSandbox(Sandbox):
    """Runs cases (family, index, seed) in one worker process with a per-case
    ``timeout``; a case past it is a ``timeout``, a worker that dies a ``crash``, and the
    next case gets a fresh worker (so does every ``recycle``-th case, or a worker grown
    past ``max_rss_mib``: compiled sessions are not all freed)."""

    run_case = run_generated_case
    outcome = Outcome

    def __init__(self, timeout: float = 300.0, recycle: int = 25, max_rss_mib: float = 2000.0,
                 log: "str | None" = None):
        super().__init__(timeout, recycle, max_rss_mib, log)

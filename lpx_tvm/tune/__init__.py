"""Auto-tuning of LPX's MXM schedules with MetaSchedule, measured on the simulator.

:mod:`.space` (tasks and design spaces), :mod:`.measure` (builder and runner on the
simulator), :mod:`.database` (tuning logs keyed by workload and machine), :mod:`.tuner`
(task extraction and the search), :mod:`.refine` (choosing schedules by the whole
model's cycles), :mod:`.log_policy` (a log as the compiler's tiling policy).
"""

_API = {"extract_tasks": "tuner", "tune": "tuner", "refine_in_context": "refine", "ModelContext": "refine",
        "policy_from_log": "log_policy", "LogPolicy": "log_policy"}


def __getattr__(name):  # the API, imported when first used (MetaSchedule is slow to import)
    if name in _API:
        import importlib

        return getattr(importlib.import_module(f".{_API[name]}", __name__), name)
    raise AttributeError(name)

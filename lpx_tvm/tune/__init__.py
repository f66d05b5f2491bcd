"""Auto-tuning of LPX's MXM schedules with MetaSchedule, measured on the simulator.

:mod:`.space` (tasks and design spaces), :mod:`.measure` (builder and runner on the
simulator), :mod:`.database` (tuning logs keyed by workload and machine), :mod:`.tuner`
(task extraction and the search).
"""

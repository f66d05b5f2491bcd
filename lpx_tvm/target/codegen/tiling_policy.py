"""Which tiling each MXM layer of a region gets: the tuning policy a compile is given.

The compiler never reads a tuning log. Whoever compiles (the pipeline, a tuning job, a
whole-model refinement) hands it a :class:`TilingPolicy` holding the tuned tilings by
task key ``(workload, composite, batches)``; the compiler asks it for each layer and the
policy records what was asked (the model's tuning tasks) and what it applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TilingPolicy:
    """Tuned tilings by task key; layers without one take their default tiling.

    After a compile, ``tasks`` maps every on-chip MXM layer's key to the composites that
    asked for it (the tuning tasks), and ``used`` holds the keys a tuned tiling was
    applied to.
    """

    tuned: dict = field(default_factory=dict)
    tasks: dict = field(default_factory=dict)  # key -> [RegionOp]
    used: set = field(default_factory=set)

    def tiling(self, key, op, default, *, record: bool = True):
        """The tiling of layer ``key`` (``op``: the composite, recorded as a task when
        ``record``); ``default()`` when none is tuned."""
        if record:
            self.tasks.setdefault(key, []).append(op)
        t = self.tuned.get(key)
        if t is None:
            return default()
        self.used.add(key)
        return t

    def peek(self, key):
        """The tuned tiling of ``key`` or None, without recording anything."""
        return self.tuned.get(key)

"""The cost model of LPX tuning: MetaSchedule's XGBModel on LPX features, which ranks
candidates by an analytic estimate until it has measurements to learn from.

XGBModel predicts at random during its warm-up (its first ``num_warmup_samples``
measurements); here the warm-up picks are the candidates with the fewest estimated
cycles (:func:`~lpx_tvm.tune.features.estimated_cycles`) instead, and the estimate stays
one of the features the trained model sees (:class:`~lpx_tvm.tune.features.LPXFeatures`).
"""

from __future__ import annotations

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..machine.config import LPXConfig
from ..tir_schedules.schedules import tiling_of
from .features import LPXFeatures, estimated_cycles
from .space import task_key_of


@derived_object
class LPXCostModel(ms.cost_model.PyCostModel):
    """XGBModel (one thread, ``warmup`` samples) with LPX features and an analytic warm-up."""

    def __init__(self, cfg: LPXConfig, warmup: int = 4):
        super().__init__()
        self.cfg, self.warmup = cfg, warmup
        self.xgb = ms.cost_model.XGBModel(extractor=LPXFeatures(cfg), num_warmup_samples=warmup,
                                          num_tuning_cores=1)

    def load(self, path: str) -> None:
        self.xgb.load(path)

    def save(self, path: str) -> None:
        self.xgb.save(path)

    def update(self, context, candidates, results) -> None:
        self.xgb.update(context, candidates, results)

    def predict(self, context, candidates) -> np.ndarray:
        if self.xgb.data_size >= self.warmup and self.xgb.booster is not None:
            return self.xgb.predict(context, candidates)
        return self.estimate(context, candidates)

    def estimate(self, context, candidates) -> np.ndarray:
        """Normalized scores (higher is better) from the analytic estimate."""
        w, _, batches, _ = task_key_of(context.mod)
        cycles = []
        for cand in candidates:
            try:
                cycles.append(estimated_cycles(w, tiling_of(w, cand.sch.mod["main"]), self.cfg, batches))
            except (ValueError, KeyError):
                cycles.append(np.inf)
        cycles = np.asarray(cycles, np.float64)
        return np.where(np.isfinite(cycles), cycles.min(initial=np.inf) / cycles, 0.0)

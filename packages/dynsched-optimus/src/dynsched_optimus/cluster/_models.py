"""Re-export of the online all-reduce speed form (it lives in ``dynsched_optimus``)."""

from __future__ import annotations

from dynsched_optimus._online_speed import fit_allreduce_speed, predict_allreduce_time

__all__ = ["fit_allreduce_speed", "predict_allreduce_time"]

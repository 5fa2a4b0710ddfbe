"""Drills: seeded chaos under load against a running `RayRunner` (module `chaos`)."""

from __future__ import annotations

from dynsched_ray.drills.chaos import FAULT_KINDS, ChaosReport, ChaosSchedule, run_chaos_soak

__all__ = ["FAULT_KINDS", "ChaosReport", "ChaosSchedule", "run_chaos_soak"]

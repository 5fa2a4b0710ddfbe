"""dynsched-policies: the built-in dynamic scheduling policies of dynsched.

Four policies, registered by name through the ``dynsched.policies`` entry points of
this distribution (``dynsched_core.build_policy(name)`` finds them without importing
this package first):

* ``default`` -- `DefaultDynamicSchedulePolicy`: adaptive deactivate ratio plus a
  cost/benefit activation gate;
* ``static_fully_async`` -- `StaticFullyAsyncPolicy`: never activates (baseline); the
  colocated schedule when there are no standalone replicas;
* ``fixed_ratio`` -- `FixedRatioDynamicSchedulePolicy`: fixed ratio, pure gap test;
* ``predictive`` -- `PredictiveDynamicSchedulePolicy`: online rate, step-time and
  switch-cost models; lends k of m hybrid replicas, after a weight sync or mid-cycle,
  for the time that minimises the predicted cycle.
"""

from __future__ import annotations

from dynsched_policies._default import DefaultDynamicSchedulePolicy, FixedRatioDynamicSchedulePolicy
from dynsched_policies._predictive import PredictiveDynamicSchedulePolicy, PredictiveOptions
from dynsched_policies._static import StaticFullyAsyncPolicy

__version__ = "0.1.1"

#: Registered name -> class, as declared in this distribution's entry points.
BUILTIN_POLICIES = {
    "default": DefaultDynamicSchedulePolicy,
    "static_fully_async": StaticFullyAsyncPolicy,
    "fixed_ratio": FixedRatioDynamicSchedulePolicy,
    "predictive": PredictiveDynamicSchedulePolicy,
}

__all__ = [
    "BUILTIN_POLICIES",
    "DefaultDynamicSchedulePolicy",
    "FixedRatioDynamicSchedulePolicy",
    "PredictiveDynamicSchedulePolicy",
    "PredictiveOptions",
    "StaticFullyAsyncPolicy",
]

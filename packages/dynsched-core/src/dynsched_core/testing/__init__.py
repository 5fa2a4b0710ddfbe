"""Test helpers for dynsched and for third-party policy authors.

In-memory implementations of the core protocols, hypothesis strategies for valid
contexts, and the policy conformance kit. Importing this module needs hypothesis
(``pip install dynsched-core[testing]``).
"""

from __future__ import annotations

__all__: list[str] = []

# --- core-A: in-memory fakes (section owned by core-A) ---
from dynsched_core.testing._fakes import (
    Call,
    CallRecorder,
    InMemoryReplica,
    RecordingRouter,
    ReplicaDeadError,
    ReplicaNotReadyError,
)

__all__ = [  # a dunder assignment (not `+=`) keeps the next sections' imports E402-clean
    *__all__,
    "Call",
    "CallRecorder",
    "InMemoryReplica",
    "RecordingRouter",
    "ReplicaDeadError",
    "ReplicaNotReadyError",
]
# --- end core-A ---

# --- policies: hypothesis strategies and the policy conformance kit (section owned by policies) ---
from dynsched_core.testing._conformance import (
    POLICY_PROPERTIES,
    PolicyConformanceError,
    check_policy,
)
from dynsched_core.testing._strategies import (
    StepInput,
    StepRecord,
    colocated_contexts,
    contexts,
    drive_step,
    drive_steps,
    global_steps,
    step_sequences,
)

__all__ += [
    "POLICY_PROPERTIES",
    "PolicyConformanceError",
    "StepInput",
    "StepRecord",
    "check_policy",
    "colocated_contexts",
    "contexts",
    "drive_step",
    "drive_steps",
    "global_steps",
    "step_sequences",
]
# --- end policies ---

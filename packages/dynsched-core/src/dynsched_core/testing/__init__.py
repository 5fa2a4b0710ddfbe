"""Test helpers for dynsched and for third-party policy authors.

Recording fakes of the core protocols (`CallRecorder`, `RecordingRouter`), the
in-memory replica (re-exported from the runtime, `dynsched_core.InMemoryReplica`),
hypothesis strategies for valid contexts and the policy conformance kit
`check_policy` (which returns a `ConformanceReport` naming the policy API version the
policy was checked against). The fakes import without hypothesis; the strategies and the kit need it
(``pip install dynsched-core[testing]``) and import it only when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from dynsched_core._inmemory import InMemoryReplica, ReplicaDeadError, ReplicaNotReadyError
from dynsched_core.testing._fakes import Call, CallRecorder, RecordingRouter

#: Names that need hypothesis, by the module that defines them (imported on first use).
_NEEDS_HYPOTHESIS = {
    "POLICY_PROPERTIES": "_conformance",
    "ConformanceReport": "_conformance",
    "PolicyConformanceError": "_conformance",
    "check_policy": "_conformance",
    "PolicyStep": "_strategies",
    "StepInput": "_strategies",
    "colocated_contexts": "_strategies",
    "contexts": "_strategies",
    "drive_step": "_strategies",
    "drive_steps": "_strategies",
    "global_steps": "_strategies",
    "step_sequences": "_strategies",
}

__all__ = [
    "Call",
    "CallRecorder",
    "InMemoryReplica",
    "RecordingRouter",
    "ReplicaDeadError",
    "ReplicaNotReadyError",
    *_NEEDS_HYPOTHESIS,
]


def __getattr__(name: str) -> Any:
    module = _NEEDS_HYPOTHESIS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "hypothesis":
            raise
        raise ModuleNotFoundError(
            f"dynsched_core.testing.{name} needs hypothesis: pip install 'dynsched-core[testing]'",
            name=exc.name,
        ) from exc
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""`ReplicaLifecycle`: the serving state machine every replica shares (it lives in core).

The one definition is `dynsched_core._lifecycle` (used by core's `InMemoryReplica` too);
this module keeps the names the engines and their users import: `ReplicaLifecycle`,
`Phase` (core's `ReplicaPhase`) and `TRANSITIONS`; and `mark_aborted`, the abort of the
requests a replica (or the actor hosting it) tracks by id.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

from dynsched_core._lifecycle import TRANSITIONS, ReplicaLifecycle, ReplicaPhase

__all__ = ["TRANSITIONS", "Phase", "ReplicaLifecycle", "mark_aborted"]

Phase = ReplicaPhase
"""Where a replica's serving stands (core's `ReplicaPhase`)."""


def mark_aborted(flags: MutableMapping[str, bool], request_ids: Sequence[str] | None) -> int:
    """Set the abort flag of the tracked requests ``request_ids`` (every tracked one when
    None; ids not tracked are ignored) and return how many were flagged."""
    targets = list(flags) if request_ids is None else [r for r in request_ids if r in flags]
    for rid in targets:
        flags[rid] = True
    return len(targets)

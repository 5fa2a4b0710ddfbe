"""`ReplicaLifecycle`: the serving state machine every replica shares (it lives in core).

The one definition is `dynsched_core._lifecycle` (used by core's `InMemoryReplica` too);
this module keeps the names the engines and their users import: `ReplicaLifecycle`,
`Phase` (core's `ReplicaPhase`) and `TRANSITIONS`.
"""

from __future__ import annotations

from dynsched_core._lifecycle import TRANSITIONS, ReplicaLifecycle, ReplicaPhase

__all__ = ["TRANSITIONS", "Phase", "ReplicaLifecycle"]

Phase = ReplicaPhase
"""Where a replica's serving stands (core's `ReplicaPhase`)."""

"""Ground-truth accounting: what every GPU group really did, second by second.

A group is a set of GPUs that always share a fate: one standalone replica, or the
trainer GPUs under one hybrid replica (or the whole trainer pool when there is none).
Each group has a *trainer activity* (``train``, ``weight_sync`` or nothing) and an
*engine activity* (``rollout``, ``weight_sync``, ``switching``, ``idle``, ``asleep``);
its mode is, by priority: ``train`` > ``switching`` > ``weight_sync`` > ``rollout`` >
``idle``. The accountant integrates GPU-seconds per mode and emits a
`ReplicaModeEvent` on every mode change (the resource-time layout plot).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from dynsched_core import EventBus
from dynsched_core.events import ReplicaModeEvent

__all__ = ["MODES", "GroupAccountant", "GroupUsage"]

MODES = ("train", "rollout", "weight_sync", "switching", "idle")


@attrs.define
class _Group:
    name: str
    gpus: int
    pool: str
    trainer: str = ""
    engine: str = "idle"
    mode: str = "idle"
    since: float = 0.0
    seconds: dict[str, float] = attrs.field(factory=lambda: dict.fromkeys(MODES, 0.0))


@attrs.frozen
class GroupUsage:
    """Seconds a group spent in each mode."""

    name: str
    pool: str
    gpus: int
    seconds: dict[str, float]

    @property
    def total_s(self) -> float:
        """Sum over modes."""
        return sum(self.seconds.values())


def _mode(trainer: str, engine: str) -> str:
    if trainer == "train":
        return "train"
    if engine == "switching":
        return "switching"
    if trainer == "weight_sync" or engine == "weight_sync":
        return "weight_sync"
    if engine == "rollout":
        return "rollout"
    return "idle"


class GroupAccountant:
    """Integrates per-group mode time on the loop clock.

    Args:
        clock: Returns the current (virtual) time.
        events: Bus that receives a `ReplicaModeEvent` on each mode change.
    """

    def __init__(self, clock: Callable[[], float], events: EventBus | None = None) -> None:
        self._clock = clock
        self._events = events
        self._groups: dict[str, _Group] = {}

    def add_group(self, name: str, gpus: int, pool: str) -> None:
        """Declare a group (``pool`` is ``"trainer"`` or ``"standalone"``); starts idle."""
        if name in self._groups:
            raise ValueError(f"group {name!r} declared twice")
        now = self._clock()
        self._groups[name] = _Group(name=name, gpus=gpus, pool=pool, since=now)
        if self._events is not None:
            self._events.emit(ReplicaModeEvent(now, name, "idle", gpus))

    def set_trainer(self, name: str, activity: str) -> None:
        """Set the trainer activity of a group (``train``, ``weight_sync`` or ``""``)."""
        g = self._groups[name]
        g.trainer = activity
        self._update(g)

    def set_engine(self, name: str, activity: str) -> None:
        """Set the engine activity of a group (``rollout``, ``weight_sync``, ``switching``, ``idle``)."""
        g = self._groups[name]
        if g.engine == activity:
            return
        g.engine = activity
        self._update(g)

    def _update(self, g: _Group) -> None:
        mode = _mode(g.trainer, g.engine)
        if mode == g.mode:
            return
        now = self._clock()
        g.seconds[g.mode] += now - g.since
        g.mode = mode
        g.since = now
        if self._events is not None:
            self._events.emit(ReplicaModeEvent(now, g.name, mode, g.gpus))  # type: ignore[arg-type]

    def mode_of(self, name: str) -> str:
        """The current mode of group ``name``."""
        return self._groups[name].mode

    def usage(self) -> list[GroupUsage]:
        """Seconds per mode of every group, up to now."""
        now = self._clock()
        out = []
        for g in self._groups.values():
            secs = dict(g.seconds)
            secs[g.mode] += now - g.since
            out.append(GroupUsage(g.name, g.pool, g.gpus, secs))
        return out

    def pool_fractions(self) -> dict[str, dict[str, float]]:
        """Per pool (``trainer``, ``standalone``, ``cluster``): GPU-time fraction per mode."""
        acc: dict[str, dict[str, float]] = {}
        for u in self.usage():
            for pool in (u.pool, "cluster"):
                d = acc.setdefault(pool, dict.fromkeys(MODES, 0.0))
                for m, s in u.seconds.items():
                    d[m] += s * u.gpus
        out: dict[str, dict[str, float]] = {}
        for pool, d in acc.items():
            tot = sum(d.values())
            out[pool] = {m: (s / tot if tot > 0 else 0.0) for m, s in d.items()}
        return out

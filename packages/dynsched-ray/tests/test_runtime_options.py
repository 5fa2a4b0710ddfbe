"""The runner and the supervisor take their options records through core's
`options_or_default` (no Ray started): None gives the defaults, anything but the record
is refused at construction, naming the argument and the record."""

from __future__ import annotations

from typing import Any

import pytest
from dynsched_core import DynamicScheduleConfig, ReplicaSet
from dynsched_ray.runtime.runner import RayRunner, RayRunOptions
from dynsched_ray.runtime.supervisor import ReplicaSupervisor, RestartOptions


class _Fleet:
    """What a supervisor's constructor asks of its fleet: to show the set's records."""

    def attach(self, replicas: ReplicaSet) -> None:
        self.replicas = replicas


def _supervisor(options: Any) -> ReplicaSupervisor:
    return ReplicaSupervisor(
        _Fleet(),  # type: ignore[arg-type]  # no restart happens here
        ReplicaSet(),
        weights=lambda: (0, None),
        options=options,
    )


def test_none_gives_the_default_records() -> None:
    assert RayRunner(DynamicScheduleConfig()).options == RayRunOptions()
    assert _supervisor(None).options == RestartOptions()


def test_a_given_record_is_kept() -> None:
    opt = RayRunOptions(name="kept")
    assert RayRunner(DynamicScheduleConfig(), opt).options is opt
    restart = RestartOptions(attempts=2)
    assert _supervisor(restart).options is restart


@pytest.mark.parametrize("bad", [{"name": "x"}, "RayRunOptions", 3])
def test_anything_else_is_refused_naming_the_record(bad: Any) -> None:
    with pytest.raises(TypeError, match=r"options must be a RayRunOptions"):
        RayRunner(DynamicScheduleConfig(), bad)
    with pytest.raises(TypeError, match=r"options must be a RestartOptions"):
        _supervisor(bad)

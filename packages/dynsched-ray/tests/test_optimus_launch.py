"""A starting job never holds the service: `WorkerGroup.poll` advances the start by what is
ready (bundles, actors, rank 0's address, the scripts) and never waits on a reference that
is not. No Ray: Ray's calls are replaced by a ledger of references the test makes ready
one at a time; `ray.get` of one not ready fails the test."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import ray
from dynsched_optimus import JobPlacement
from dynsched_optimus.jobs import ContextOptions, JobSpec
from dynsched_ray.optimus import executor


class _Ledger:
    def __init__(self) -> None:
        self.ready: set[int] = set()
        self.made: list[tuple[int, str]] = []
        self._ids = itertools.count()
        self.calls: list[str] = []
        self.open: set[str] = set()  # kinds of reference ready as soon as made

    def ref(self, what: str) -> int:
        r = next(self._ids)
        self.made.append((r, what))
        if what in self.open:
            self.ready.add(r)
        return r

    def wait(self, refs: list[int], num_returns: int = 1, timeout: float = 0) -> Any:
        assert timeout == 0, "the group waited"
        done = [r for r in refs if r in self.ready]
        return done, [r for r in refs if r not in self.ready]

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        many = isinstance(refs, list)
        kinds = dict(self.made)
        for r in refs if many else [refs]:
            assert r in self.ready, f"ray.get on a reference not ready: {kinds[r]}"
        value = {"start": 4321, "poll": [], "address": ("10.0.0.1", 5000), "alive": True}
        return [value[kinds[r]] for r in refs] if many else value[kinds[refs]]

    def release(self, what: str) -> None:
        self.open.add(what)
        self.ready |= {r for r, w in self.made if w == what}


class _Method:
    def __init__(self, ledger: _Ledger, name: str) -> None:
        self.ledger, self.name = ledger, name

    def remote(self, *args: Any) -> int:
        self.ledger.calls.append(self.name)
        ref = self.ledger.ref(self.name)
        if self.name in ("poll", "request_batch", "request_stop"):
            self.ledger.ready.add(ref)
        return ref


class _Actor:
    def __init__(self, ledger: _Ledger) -> None:
        for name in ("address", "start", "poll", "request_batch", "request_stop", "alive"):
            setattr(self, name, _Method(ledger, name))


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch) -> _Ledger:
    led = _Ledger()

    class _Cls:
        def options(self, **_: Any) -> Any:
            return self

        def remote(self) -> _Actor:
            return _Actor(led)

    class _PG:
        def ready(self) -> int:
            return led.ref("bundles")

    monkeypatch.setattr(executor, "placement_group", lambda *a, **k: _PG())
    monkeypatch.setattr(executor, "PlacementGroupSchedulingStrategy", lambda *a, **k: None)
    monkeypatch.setattr(executor, "_remote_worker", lambda: _Cls())
    monkeypatch.setattr(ray, "wait", led.wait)
    monkeypatch.setattr(ray, "get", led.get)
    return led


def _group(workers: int) -> executor.WorkerGroup:
    spec = JobSpec("j", "x.py", 16, workers, workers)
    opts = ContextOptions(
        job_name="j", rank=0, world_size=workers, batch_size=16, completion=spec.completion
    )
    return executor.WorkerGroup(spec, JobPlacement("j", (0,), (0,), (workers,)), [None], opts)


@pytest.mark.parametrize("workers", [1, 3])
def test_each_poll_advances_the_start_by_what_is_ready(ledger: _Ledger, workers: int) -> None:
    g = _group(workers)
    stages = ["bundles", "address", "start"] if workers > 1 else ["bundles", "start"]
    for stage in stages:
        for _ in range(3):  # polls while the stage is pending return at once, with nothing
            assert g.poll() == [] and not g.started and g.dead is None
        ledger.release(stage)
    g.poll()
    assert g.started and g.pids == [4321] * workers
    assert ledger.calls.count("start") == workers and ledger.calls.count("poll") == workers


def test_requests_made_while_starting_reach_the_ranks_once_they_run(ledger: _Ledger) -> None:
    g = _group(2)
    g.request_batch(32)  # not launched yet: the ranks start with it
    assert g.options.batch_size == 32 and g.pending_batch is None
    ledger.release("bundles")
    ledger.release("address")
    g.poll()  # the scripts are handed out now
    assert g.launched and not g.started
    g.request_batch(64)
    g.request_stop()
    assert "request_batch" not in ledger.calls and "request_stop" not in ledger.calls
    ledger.release("start")
    g.poll()
    assert g.started
    assert ledger.calls.count("request_batch") == 2 and ledger.calls.count("request_stop") == 2


def test_a_start_past_its_bound_makes_the_group_dead(
    ledger: _Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = _group(2)
    ledger.release("bundles")
    g.poll()
    assert g.dead is None
    monkeypatch.setattr(executor, "CALL_TIMEOUT_S", -1.0)
    g._deadline = -1.0  # the bound has passed
    g.poll()
    assert g.dead is not None and "start-up" in g.dead

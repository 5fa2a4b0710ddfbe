"""The simulator's Optimus family allocates and places every job kind with the package's
``allocate`` and ``place`` (through the composed scheduler)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from dynsched_optimus import Allocation, PSSpeedModel
from dynsched_optimus import _scheduler as sched_mod
from dynsched_optimus._allocation import allocate_reference
from dynsched_optimus.cluster import (
    ClusterSpec,
    ClusterState,
    GpuJob,
    GpuJobSpec,
    NodeSpec,
    OptimusScheduler,
    PSJob,
    PSJobOptions,
    PSLossCurve,
)
from dynsched_optimus.cluster._run import PS_JOB_TYPES


def _state(spec: ClusterSpec) -> ClusterState:
    return ClusterState(spec=spec, capacity=spec.capacity(), interval_s=60.0, restart_delay_s=30.0)


def _job(name: str, submit: float, jtype: str, steps: float) -> PSJob:
    j = PSJob(
        name,
        submit,
        PS_JOB_TYPES[jtype],
        np.random.default_rng(0),
        curve=PSLossCurve(1e-3, 1.0, 0.05, 100),
        options=PSJobOptions(requested_workers=4, requested_ps=2),
    )
    j.total_steps = steps
    return j


class _Spy:
    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.real(*args, **kwargs)
        self.calls.append((args, kwargs, out))
        return out


def _jobs() -> list[PSJob]:
    types = ["cnn-rand", "resnet-50", "vgg-16", "seq2seq", "inception-bn"]
    return [_job(f"j{i}", float(i), types[i % 5], 1e4 * (i + 1)) for i in range(5)]


@pytest.mark.parametrize("oracle", [True, False])
def test_ps_jobs_use_package_allocate_and_place(
    monkeypatch: pytest.MonkeyPatch, oracle: bool
) -> None:
    spec = ClusterSpec.homogeneous(3, NodeSpec(cpu=32, mem_gb=128, gpu=0))
    jobs = _jobs()
    sched = OptimusScheduler(oracle=oracle)
    for j in jobs:
        for pl in sched.prerun_configs(j, spec.capacity()):
            j.record_speed(pl, j.true_speed(pl))
    alloc_spy = _Spy(sched_mod.allocate)
    place_spy = _Spy(sched_mod.place)
    monkeypatch.setattr(sched_mod, "allocate", alloc_spy)
    monkeypatch.setattr(sched_mod, "place", place_spy)
    out = sched.schedule(0.0, jobs, _state(spec))

    assert len(alloc_spy.calls) == 1
    args, kwargs, res = alloc_spy.calls[0]
    ajobs, capacity = args
    assert [a.job_id for a in ajobs] == [j.name for j in jobs]
    assert capacity == tuple(spec.capacity().sum(axis=0))
    for a, j in zip(ajobs, jobs, strict=True):
        assert a.ps_demand == tuple(j.ps_demand) and a.worker_demand == tuple(j.worker_demand)
        assert (a.max_ps, a.max_workers) == (j.max_ps, j.max_workers)
        # the fitted speed model is handed over as is (the allocator's vectorised path)
        assert isinstance(a.speed, PSSpeedModel) != oracle
    # same answer as the package's executable specification on the same inputs
    ref = allocate_reference(ajobs, capacity, damping=kwargs.get("damping", 0.95))
    assert isinstance(res, Allocation) and dict(res.tasks) == dict(ref.tasks)
    assert res.total_tasks > 2 * len(jobs)  # grew beyond the 1 + 1 starters

    # placement: every placed job is where the package's ``place`` put it
    assert place_spy.calls
    placed = place_spy.calls[-1][2]
    assert set(out) == set(placed.placements)
    for name, pl in out.items():
        jp = placed.placements[name]
        ps_alloc, w_alloc = res.tasks[name]
        assert (pl.num_ps, pl.num_workers) == placed.shrunk.get(name, (ps_alloc, w_alloc))
        assert pl.nodes_used == jp.num_servers
        for nd, pp, ww in zip(jp.nodes, jp.ps_per_node, jp.workers_per_node, strict=True):
            assert (pl.ps[nd], pl.workers[nd]) == (pp, ww)
    used = sum(pl.usage(jobs[0].worker_demand, jobs[0].ps_demand) for pl in out.values())
    assert np.all(used <= spec.capacity() + 1e-9)


def test_unchanged_counts_keep_their_placement() -> None:
    spec = ClusterSpec.homogeneous(3, NodeSpec(cpu=32, mem_gb=128, gpu=0))
    jobs = _jobs()
    sched = OptimusScheduler(oracle=True)
    first = sched.schedule(0.0, jobs, _state(spec))
    for j in jobs:
        j.placement = first.get(j.name)
    second = sched.schedule(60.0, jobs, _state(spec))
    assert second == first


@pytest.mark.parametrize("variant", ["optimus", "optimus-oracle", "optimus+"])
def test_gpu_jobs_use_the_package_allocate_and_place(
    monkeypatch: pytest.MonkeyPatch,
    profiles: dict,  # type: ignore[type-arg]
    variant: str,
) -> None:
    spec = ClusterSpec.pollux(num_nodes=2)
    jobs = [
        GpuJob(
            GpuJobSpec(f"c{i}", float(i), "cifar10", 2, 512),
            profiles["cifar10"],
            np.random.default_rng(i),
        )
        for i in range(3)
    ]
    alloc_spy = _Spy(sched_mod.allocate)
    place_spy = _Spy(sched_mod.place)
    monkeypatch.setattr(sched_mod, "allocate", alloc_spy)
    monkeypatch.setattr(sched_mod, "place", place_spy)
    sched = OptimusScheduler(oracle=variant == "optimus-oracle", plus=variant == "optimus+")
    out = sched.schedule(0.0, jobs, _state(spec))
    assert len(alloc_spy.calls) == 1  # all-reduce jobs go through the public allocator
    ajobs = alloc_spy.calls[0][0][0]
    assert {a.kind for a in ajobs} == {"allreduce"}
    assert place_spy.calls
    assert set(out) == {j.name for j in jobs}
    assert all(pl.num_ps == 0 and pl.num_workers >= 1 for pl in out.values())
    assert sum(pl.num_workers for pl in out.values()) <= 8


@pytest.mark.parametrize(
    ("name", "strategy"),
    [
        ("fifo", "fewest"),
        ("drf", "spread"),
        ("drf-fixed", "spread"),
        ("tetris", "align"),
        ("srtf", "fewest"),
        ("tiresias", "fewest"),
    ],
)
def test_every_baseline_places_through_the_package_place(
    monkeypatch: pytest.MonkeyPatch,
    profiles: dict,  # type: ignore[type-arg]
    name: str,
    strategy: str,
) -> None:
    from dynsched_optimus.cluster import _schedulers as cluster_sched
    from dynsched_optimus.cluster import make_scheduler

    spec = ClusterSpec.pollux(num_nodes=2)
    jobs = [
        GpuJob(
            GpuJobSpec(f"c{i}", float(i), "cifar10", 2 + i, 512),
            profiles["cifar10"],
            np.random.default_rng(i),
        )
        for i in range(3)
    ] + [_job("p0", 0.5, "cnn-rand", 1e4)]
    spy = _Spy(cluster_sched.place)
    monkeypatch.setattr(cluster_sched, "place", spy)
    out = make_scheduler(name).schedule(0.0, jobs, _state(spec))
    assert out and spy.calls
    assert {c[1].get("strategy", "fewest") for c in spy.calls} == {strategy}
    # every placement handed back is one the package's place() made
    made = {
        (jid, tuple(sorted(zip(jp.nodes, jp.workers_per_node, jp.ps_per_node, strict=True))))
        for _a, _k, res in spy.calls
        for jid, jp in res.placements.items()
    }
    for jid, pl in out.items():
        used = tuple(
            (i, w, p) for i, (w, p) in enumerate(zip(pl.workers, pl.ps, strict=True)) if w or p
        )
        assert (jid, used) in made

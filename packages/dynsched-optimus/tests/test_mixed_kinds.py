"""One allocate()/place() for parameter-server and all-reduce jobs, fill fallback, and
placement-aware allocation: never over capacity, everything allocated is placed, and
the result does not depend on the order of the input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dynsched_optimus import (
    AllocationJob,
    OptimusError,
    PlacementRequest,
    StepTimeModel,
    allocate,
    place,
)
from dynsched_optimus._allocation import allocate_reference
from dynsched_optimus.testing import place_reference
from hypothesis import given
from hypothesis import strategies as st

GPU_NODE = (32.0, 256.0, 4.0, 10.0)
REPLICA = (4.0, 16.0, 1.0, 0.0)
PS_TASK = (4.0, 8.0, 0.0, 2.0)
WORKER = (4.0, 8.0, 0.0, 1.0)


def _ar_speed(scale: float, alpha: float):
    """Sub-linear all-reduce scaling: ``scale * w**alpha`` steps/s."""

    def f(p: int, w: int) -> float:
        assert p == 0  # an all-reduce job is never asked about parameter servers
        return scale * w**alpha

    return f


def _ps_speed(seed: int):
    model = StepTimeModel.random(np.random.default_rng(seed), "sync").as_speed_model()
    return lambda p, w: float(model.predict(p, w))


def test_allreduce_job_has_no_ps_and_grows_by_gpus() -> None:
    jobs = [
        AllocationJob("gpu", 1e4, _ar_speed(1.0, 0.9), (), REPLICA, kind="allreduce"),
        AllocationJob("ps", 1e4, _ps_speed(0), PS_TASK, WORKER),
    ]
    res = allocate(jobs, np.array([GPU_NODE] * 2).sum(axis=0))
    p, w = res.tasks["gpu"]
    assert p == 0 and w == 8  # all 8 GPUs: the gain of one more GPU is always positive
    assert res.tasks["ps"][0] >= 1 and res.tasks["ps"][1] >= 1
    assert jobs[0].ps_demand == (0.0, 0.0, 0.0, 0.0)


def test_bad_kind_and_ps_demand_of_allreduce_name_the_field() -> None:
    with pytest.raises(OptimusError, match="'kind'.*allreduce"):
        AllocationJob("x", 1.0, _ar_speed(1, 1), (), REPLICA, kind="mpi")
    with pytest.raises(OptimusError, match="no PS"):
        AllocationJob("x", 1.0, _ar_speed(1, 1), PS_TASK, REPLICA, kind="allreduce")
    model = StepTimeModel.random(np.random.default_rng(0), "sync").as_speed_model()
    with pytest.raises(OptimusError, match="callable"):
        AllocationJob("x", 1.0, model, (), REPLICA, kind="allreduce")


def test_ties_go_to_the_earlier_arrival_not_the_job_id() -> None:
    # two identical single-GPU-capped jobs, one GPU free: the earlier arrival gets it
    jobs = [
        AllocationJob("a", 1e3, _ar_speed(1, 1), (), REPLICA, kind="allreduce", arrival=5.0),
        AllocationJob("b", 1e3, _ar_speed(1, 1), (), REPLICA, kind="allreduce", arrival=1.0),
    ]
    res = allocate(jobs, (32.0, 256.0, 1.0, 10.0))
    assert res.tasks == {"a": (0, 0), "b": (0, 1)}


def test_fill_fallback_places_a_job_on_fragmented_gpus() -> None:
    # free GPUs 3, 1, 1, 1: no even spread of 6 GPUs fits (2, 2, 1, 1), a fill does
    free = np.array([[32.0, 256.0, float(g), 10.0] for g in (1, 3, 1, 1)])
    job = [PlacementRequest("j", 0, 6, (0.0,) * 4, REPLICA)]
    assert place(job, free).unplaced == ("j",)
    for fn in (place, place_reference):
        res = fn(job, free, fill=True)
        pl = res.placements["j"]
        assert not res.unplaced
        assert pl.nodes[0] == 1 and pl.workers_per_node == (3, 1, 1, 1)
        assert np.all(res.free >= -1e-9)
    # 7 GPUs do not fit: unplaced, or with shrink the 6 that fit
    big = [PlacementRequest("j", 0, 7, (0.0,) * 4, REPLICA)]
    assert place(big, free, fill=True).unplaced == ("j",)
    assert dict(place(big, free, fill=True, shrink=True).shrunk) == {"j": (0, 6)}


@st.composite
def _mixed(draw):  # type: ignore[no-untyped-def]
    n_nodes = draw(st.integers(1, 6))
    node_gpus = draw(st.lists(st.integers(0, 8), min_size=n_nodes, max_size=n_nodes))
    nodes = np.array([[32.0, 256.0, float(g), 10.0] for g in node_gpus])
    jobs = []
    for i in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["ps", "allreduce"]))
        rem = draw(st.floats(10.0, 1e5))
        arrival = float(draw(st.integers(0, 3)))
        cap = draw(st.none() | st.integers(1, 12))
        if kind == "allreduce":
            speed = _ar_speed(draw(st.floats(0.1, 10.0)), draw(st.floats(0.3, 1.0)))
            jobs.append(
                AllocationJob(
                    f"g{i}", rem, speed, (), REPLICA, kind=kind, arrival=arrival, max_workers=cap
                )
            )
        else:
            jobs.append(
                AllocationJob(
                    f"p{i}",
                    rem,
                    _ps_speed(draw(st.integers(0, 50))),
                    (draw(st.sampled_from([2.0, 4.0, 6.0])), 8.0, 0.0, 2.0),
                    (draw(st.sampled_from([3.0, 4.0, 5.0])), 12.0, 0.0, 1.0),
                    arrival=arrival,
                    max_workers=cap,
                    max_ps=cap,
                )
            )
    return jobs, nodes


@given(_mixed(), st.randoms(use_true_random=False))
def test_mixed_allocation_is_placed_within_capacity_and_order_independent(case, rnd) -> None:  # type: ignore[no-untyped-def]
    jobs, nodes = case
    res = allocate(jobs, node_capacity=nodes)
    assert res.placement is not None
    # never over capacity, per node and in aggregate
    assert np.all(res.placement.free >= -1e-6)
    assert all(u <= c * (1 + 1e-9) + 1e-9 for u, c in zip(res.used, res.capacity, strict=True))
    by_id = {j.job_id: j for j in jobs}
    for jid, (p, w) in res.tasks.items():
        if p + w == 0:
            assert jid not in res.placement.placements
            continue
        pl = res.placement.placements[jid]  # every allocated job is placed, with its counts
        assert (pl.ps, pl.workers) == (p, w)
        if by_id[jid].kind == "allreduce":
            assert p == 0
        else:
            assert p >= 1 and w >= 1
        mw = by_id[jid].max_workers
        assert mw is None or w <= mw
    # the same allocation (and placement) whatever the input order
    shuffled = list(jobs)
    rnd.shuffle(shuffled)
    again = allocate(shuffled, node_capacity=nodes)
    assert dict(again.tasks) == dict(res.tasks)
    assert again.placement is not None
    assert dict(again.placement.placements) == dict(res.placement.placements)
    # aggregate-only allocation: fast == reference on mixes too
    cap = tuple(nodes.sum(axis=0))
    assert dict(allocate(jobs, cap).tasks) == dict(allocate_reference(jobs, cap).tasks)


@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=8),
    st.lists(st.tuples(st.floats(1.0, 1e4), st.floats(0.3, 1.0)), min_size=1, max_size=12),
)
def test_gpu_jobs_lose_nothing_when_free_shapes_allow(node_gpus, specs) -> None:  # type: ignore[no-untyped-def]
    # one GPU per replica and nothing else scarce: any GPU is a slot, so every task the
    # aggregate allocation hands out fits somewhere and the fill places all of it
    nodes = np.array([[1e3, 1e4, float(g), 1e3] for g in node_gpus])
    jobs = [
        AllocationJob(f"j{i}", q, _ar_speed(1.0, a), (), REPLICA, kind="allreduce")
        for i, (q, a) in enumerate(specs)
    ]
    res = allocate(jobs, node_capacity=nodes)
    assert not res.trimmed
    assert sum(w for _p, w in res.tasks.values()) == min(sum(node_gpus), math.inf)


@given(_mixed(), st.booleans())
def test_fill_placement_fast_equals_reference(case, shrink) -> None:  # type: ignore[no-untyped-def]
    jobs, nodes = case
    agg = allocate(jobs, tuple(nodes.sum(axis=0)) + np.array([0, 0, 4.0, 0]))  # over-allocate
    reqs = [
        PlacementRequest(j.job_id, *agg.tasks[j.job_id], j.ps_demand, j.worker_demand)
        for j in jobs
        if sum(agg.tasks[j.job_id])
    ]
    a = place(reqs, nodes, fill=True, shrink=shrink)
    b = place_reference(reqs, nodes, fill=True, shrink=shrink)
    assert a.placements == b.placements
    assert a.unplaced == b.unplaced and dict(a.shrunk) == dict(b.shrunk)
    assert np.allclose(a.free, b.free) and np.all(a.free >= -1e-6)


def _benchmark_like(n_nodes: int, n_jobs: int, seed: int) -> tuple[list[AllocationJob], np.ndarray]:
    """The scale benchmark's instance generator (benchmarks/optimus_allocation_placement.py)."""
    workers = ((4.0, 8.0, 1.0), (5.0, 12.0, 1.0), (6.0, 16.0, 2.0))
    pss = ((4.0, 8.0, 2.0), (5.0, 8.0, 2.0), (6.0, 12.0, 2.0))
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(n_jobs):
        model = StepTimeModel.random(rng, "sync" if i % 2 == 0 else "async").as_speed_model()
        c = int(rng.integers(0, 3))
        jobs.append(
            AllocationJob(
                f"job{i:06d}",
                float(rng.uniform(1e3, 1e5)),
                model,
                pss[c],
                workers[c],
                damped=bool(rng.random() < 0.3),
            )
        )
    return jobs, np.tile(np.array((32.0, 128.0, 10.0)), (n_nodes, 1))


@pytest.mark.parametrize(("n_nodes", "n_jobs", "seed"), [(12, 4, 28), (16, 6, 2), (24, 8, 1)])
def test_no_job_is_cut_to_nothing_a_donor_makes_room(n_nodes: int, n_jobs: int, seed: int) -> None:
    # these instances leave the last job placed without a server for even 1 PS + 1 worker
    # (every server's network is down to < 2 Gbit/s): the job with the most workers gives
    # up the fewest workers on one server so that the starter bundle fits there
    jobs, nodes = _benchmark_like(n_nodes, n_jobs, seed)
    agg = allocate(jobs, tuple(nodes.sum(axis=0)))
    bare = place(
        [
            PlacementRequest(j.job_id, *agg.tasks[j.job_id], j.ps_demand, j.worker_demand)
            for j in jobs
            if sum(agg.tasks[j.job_id])
        ],
        nodes,
        shrink=True,
        fill=True,
    )
    assert bare.unplaced  # the instance really drops a job without the repair
    res = allocate(jobs, node_capacity=nodes)
    assert res.placement is not None
    assert not res.placement.unplaced
    by_id = {j.job_id: j for j in jobs}
    used = np.zeros_like(nodes)
    for jid, (p, w) in res.tasks.items():
        if sum(agg.tasks[jid]):
            assert p >= 1 and w >= 1  # nobody the aggregate allocation served is left out
        pl = res.placement.placements[jid]
        assert (pl.ps, pl.workers) == (p, w)
        for nd, pp, ww in zip(pl.nodes, pl.ps_per_node, pl.workers_per_node, strict=True):
            used[nd] += pp * np.asarray(by_id[jid].ps_demand) + ww * np.asarray(
                by_id[jid].worker_demand
            )
    assert np.all(used <= nodes + 1e-6)
    assert np.allclose(res.placement.free, nodes - used)
    for jid in bare.unplaced:
        assert res.tasks[jid] == (1, 1) and res.trimmed[jid] == agg.tasks[jid]
    donors = [k for k in res.trimmed if k not in bare.unplaced and k not in bare.shrunk]
    assert donors  # someone gave up workers, and it is recorded
    for k in donors:
        assert res.tasks[k][1] < res.trimmed[k][1] and res.tasks[k][0] == res.trimmed[k][0]

"""Placement (Theorem 1): hand-checked cases, no over-commit, fast path equal to reference."""

from __future__ import annotations

import numpy as np
import pytest
from dynsched_optimus import JobPlacement, OptimusError, PlacementRequest, even_split, place
from dynsched_optimus.testing import place_reference
from hypothesis import given, settings
from hypothesis import strategies as st

ONE = (1.0, 1.0)


def _both(jobs, cap, previous=None, shrink=False):
    a = place(jobs, cap, previous=previous, shrink=shrink)
    b = place_reference(jobs, cap, previous=previous, shrink=shrink)
    assert a.placements == b.placements
    assert a.unplaced == b.unplaced and a.kept == b.kept
    assert dict(a.shrunk) == dict(b.shrunk)
    assert np.allclose(a.free, b.free)
    return a


def test_single_server_when_it_fits() -> None:
    cap = np.array([[8.0, 8.0]] * 3)
    res = _both([PlacementRequest("j", 2, 4, ONE, ONE)], cap)
    pl = res.placements["j"]
    assert pl.nodes == (0,) and pl.ps_per_node == (2,) and pl.workers_per_node == (4,)


def test_fewest_servers_even_spread() -> None:
    cap = np.array([[8.0, 100.0]] * 4)
    res = _both([PlacementRequest("j", 4, 8, ONE, ONE)], cap)
    pl = res.placements["j"]
    assert pl.num_servers == 2
    assert pl.ps_per_node == (2, 2) and pl.workers_per_node == (4, 4)
    # uneven counts: differ by at most one, extra tasks on the first servers
    cap3 = np.array([[3.0, 100.0]] * 3)
    res3 = _both([PlacementRequest("k", 3, 5, ONE, ONE)], cap3)
    pl3 = res3.placements["k"]
    assert pl3.num_servers == 3
    assert pl3.ps_per_node == (1, 1, 1) and pl3.workers_per_node == (2, 2, 1)
    assert even_split(5, 3) == [2, 2, 1]


def test_servers_by_descending_free_capacity_and_jobs_by_ascending_demand() -> None:
    cap = np.array([[4.0, 4.0], [16.0, 16.0], [8.0, 8.0]])
    jobs = [
        PlacementRequest("large", 2, 6, ONE, ONE),  # 8 tasks
        PlacementRequest("small", 1, 1, ONE, ONE),  # 2 tasks, placed first
    ]
    res = _both(jobs, cap)
    assert res.placements["small"].nodes == (1,)  # the freest server
    # after "small", server 1 has 14 free and still comes first: "large" fits there alone
    assert res.placements["large"].nodes == (1,)
    assert res.free[1].tolist() == [6.0, 6.0]


def test_spread_when_no_single_server_fits_and_unplaceable_jobs() -> None:
    cap = np.array([[5.0, 5.0], [5.0, 5.0], [2.0, 2.0]])
    jobs = [
        PlacementRequest("a", 2, 6, ONE, ONE),  # 8 tasks: two servers of 5 with 4+4
        PlacementRequest("b", 1, 20, ONE, ONE),  # 21 tasks: never fits
    ]
    res = _both(jobs, cap)
    assert res.placements["a"].nodes == (0, 1)
    assert res.placements["a"].ps_per_node == (1, 1)
    assert res.placements["a"].workers_per_node == (3, 3)
    assert res.unplaced == ("b",)
    assert (res.free >= 0).all()


def test_jobs_that_keep_their_allocation_keep_their_placement() -> None:
    cap = np.array([[8.0, 8.0]] * 3)
    prev = {
        "keep": JobPlacement("keep", nodes=(2,), ps_per_node=(1,), workers_per_node=(3,)),
        "grow": JobPlacement("grow", nodes=(0,), ps_per_node=(1,), workers_per_node=(1,)),
    }
    jobs = [
        PlacementRequest("keep", 1, 3, ONE, ONE),
        PlacementRequest("grow", 1, 4, ONE, ONE),  # changed counts: placed anew
    ]
    res = _both(jobs, cap, prev)
    assert res.placements["keep"] == prev["keep"]
    assert res.kept == ("keep",)
    assert res.placements["grow"].nodes == (0,)
    assert res.free[2].tolist() == [4.0, 4.0]


placement_jobs = st.lists(
    st.builds(
        lambda i, p, w, pd, wd: PlacementRequest(f"j{i}", p, w, pd, wd),
        st.integers(0, 10_000),
        st.integers(0, 6),
        st.integers(0, 12),
        st.tuples(st.integers(1, 4).map(float), st.integers(0, 6).map(float)),
        st.tuples(st.integers(1, 4).map(float), st.integers(0, 6).map(float)),
    ),
    max_size=14,
    unique_by=lambda j: j.job_id,
)


@settings(deadline=None)
@given(
    jobs=placement_jobs,
    caps=st.lists(
        st.tuples(st.sampled_from([4.0, 8.0, 16.0]), st.sampled_from([8.0, 16.0, 32.0])),
        min_size=1,
        max_size=12,
    ),
    keep_every=st.integers(1, 3),
    shrink=st.booleans(),
)
def test_never_over_commits_and_equals_reference(jobs, caps, keep_every, shrink) -> None:
    cap = np.array(caps)
    res = _both(jobs, cap, shrink=shrink)
    load = np.zeros_like(cap)
    for j in jobs:
        pl = res.placements.get(j.job_id)
        if pl is None:
            assert j.job_id in res.unplaced or j.ps + j.workers == 0
            continue
        if j.job_id in res.shrunk:
            assert (pl.ps, pl.workers) == res.shrunk[j.job_id]
            assert pl.ps <= j.ps and pl.workers <= j.workers
            assert pl.ps + pl.workers < j.ps + j.workers
        else:
            assert pl.ps == j.ps and pl.workers == j.workers
        assert len(set(pl.nodes)) == len(pl.nodes)
        assert max(pl.ps_per_node) - min(pl.ps_per_node) <= 1
        assert max(pl.workers_per_node) - min(pl.workers_per_node) <= 1
        for n, a, b in zip(pl.nodes, pl.ps_per_node, pl.workers_per_node, strict=True):
            load[n] += a * np.array(j.ps_demand) + b * np.array(j.worker_demand)
    assert (load <= cap + 1e-9).all()
    assert np.allclose(cap - load, res.free)
    # a second round keeping some placements is consistent too
    prev = {k: v for i, (k, v) in enumerate(sorted(res.placements.items())) if i % keep_every == 0}
    res2 = _both(jobs, cap, prev, shrink=shrink)
    for k in res2.kept:
        assert res2.placements[k] == prev[k]


def test_shrink_fits_a_fragmented_job() -> None:
    # the aggregate has room for "b" (allocation only checks totals) but no prefix of the
    # servers can hold its even spread; with shrink it is placed with fewer workers
    cap = np.array([[4.0, 100.0], [4.0, 100.0], [1.0, 100.0]])
    jobs = [PlacementRequest("b", 1, 8, ONE, ONE)]  # 9 tasks, 9 cpu in total
    assert _both(jobs, cap).unplaced == ("b",)
    res = _both(jobs, cap, shrink=True)
    assert res.shrunk == {"b": (1, 7)}
    pl = res.placements["b"]
    assert pl.num_servers == 2 and pl.ps + pl.workers == 8


def test_bad_input() -> None:
    with pytest.raises(OptimusError, match="node_capacity"):
        place([], np.zeros((0, 2)))
    with pytest.raises(OptimusError, match="duplicate"):
        place([PlacementRequest("a", 1, 1, ONE, ONE)] * 2, np.ones((2, 2)))
    with pytest.raises(OptimusError, match="resources"):
        place([PlacementRequest("a", 1, 1, ONE, ONE)], np.ones((2, 3)))
    with pytest.raises(OptimusError, match="ps and workers"):
        PlacementRequest("a", -1, 1, ONE, ONE)


def test_wide_jobs_use_the_vectorised_block_check() -> None:
    cap = np.array([[4.0, 4.0]] * 40)
    jobs = [PlacementRequest("wide", 30, 90, ONE, ONE)]  # 120 tasks, 30 servers of 4
    res = _both(jobs, cap)
    pl = res.placements["wide"]
    assert pl.num_servers == 30
    assert set(pl.ps_per_node) == {1} and set(pl.workers_per_node) == {3}


@settings(deadline=None, max_examples=150)
@given(
    jobs=placement_jobs,
    kinds=st.lists(
        st.tuples(st.sampled_from([4.0, 8.0, 16.0]), st.sampled_from([8.0, 16.0, 32.0])),
        min_size=1,
        max_size=2,
    ),
    n_nodes=st.integers(4, 40),
    keep_every=st.integers(1, 3),
    shrink=st.booleans(),
    fill=st.booleans(),
)
def test_bucketed_servers_equal_the_reference(
    jobs, kinds, n_nodes, keep_every, shrink, fill
) -> None:
    """Few distinct server shapes (large buckets of equal servers): same result as the
    test oracle, with and without fill, shrink and kept jobs."""
    cap = np.array([kinds[i % len(kinds)] for i in range(n_nodes)])
    prev = None
    for _round in range(2):
        a = _same_as_oracle(jobs, cap, previous=prev, shrink=shrink, fill=fill)
        prev = {k: v for i, (k, v) in enumerate(sorted(a.placements.items())) if i % keep_every}


def _same_as_oracle(jobs, cap, **kw):
    """``place`` equals the test oracle exactly (free resources bit for bit)."""
    a = place(jobs, cap, **kw)
    r = place_reference(jobs, cap, **kw)
    assert a.placements == r.placements
    assert a.unplaced == r.unplaced and a.kept == r.kept
    assert dict(a.shrunk) == dict(r.shrunk)
    assert np.array_equal(a.free, r.free)
    assert (a.free >= -1e-9 * np.asarray(cap)).all()
    return a


@settings(deadline=None, max_examples=150)
@given(
    jobs=placement_jobs,
    caps=st.lists(
        st.tuples(st.integers(2, 24), st.integers(2, 24)).map(lambda t: (float(t[0]), float(t[1]))),
        min_size=1,
        max_size=30,
    ),
    keep_every=st.integers(1, 3),
    shrink=st.booleans(),
    fill=st.booleans(),
)
def test_heterogeneous_servers_equal_the_reference(jobs, caps, keep_every, shrink, fill) -> None:
    """Mostly distinct servers (buckets of one server, several buckets under one key):
    the one implementation equals the oracle over two rounds with kept placements."""
    cap = np.array(caps)
    prev = None
    for _round in range(2):
        a = _same_as_oracle(jobs, cap, previous=prev, shrink=shrink, fill=fill)
        prev = {k: v for i, (k, v) in enumerate(sorted(a.placements.items())) if i % keep_every}


def test_benchmark_like_cluster_matches_the_reference() -> None:
    """Homogeneous servers, three demand classes, capacity-bound: fragmentation, fill."""
    rng = np.random.default_rng(3)
    classes = [((4.0, 8.0, 2.0), (4.0, 8.0, 1.0)), ((5.0, 8.0, 2.0), (5.0, 12.0, 1.0))]
    jobs = []
    for i in range(300):
        pd, wd = classes[i % 2]
        jobs.append(
            PlacementRequest(f"j{i:03d}", int(rng.integers(1, 5)), int(rng.integers(1, 12)), pd, wd)
        )
    cap = np.tile([32.0, 128.0, 10.0], (200, 1))
    for kw in ({}, {"shrink": True}, {"fill": True, "shrink": True}):
        a = _same_as_oracle(jobs, cap, **kw)
    assert a.shrunk or a.unplaced  # the instance is fragmented

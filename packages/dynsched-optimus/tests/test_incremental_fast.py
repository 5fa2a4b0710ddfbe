"""The incremental allocator's engines (victim heaps, vectorised growth) against the plain
one-task-at-a-time greedy they replace (``_incremental_oracle``): the same allocation,
task for task, on random instances with and without running jobs, restarts, caps, the
``optimus+rw`` gains and contention in one or several resources."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from dynsched_optimus import AllocationJob, StepTimeModel
from dynsched_optimus._allocation import allocate_incremental
from dynsched_optimus._incremental import (
    _fits_floats,
    _fitting_run,
    _short_bits,
    _utilities,
    _utility,
)
from hypothesis import given
from hypothesis import strategies as st

_spec = importlib.util.spec_from_file_location(
    "_incremental_oracle", Path(__file__).with_name("_incremental_oracle.py")
)
assert _spec is not None and _spec.loader is not None
oracle = importlib.util.module_from_spec(_spec)
sys.modules["_incremental_oracle"] = oracle
_spec.loader.exec_module(oracle)

WORKER = ((4.0, 8.0, 1.0), (5.0, 12.0, 1.0), (6.0, 16.0, 2.0), (2.0, 4.0, 0.0))
PS = ((4.0, 8.0, 2.0), (5.0, 8.0, 2.0), (6.0, 12.0, 2.0), (1.5, 6.5, 0.0))


def _generic_speed(scale: float):  # type: ignore[no-untyped-def]
    """A speed callable that is not a PSSpeedModel (forces the scalar engine)."""

    def speed(p: int, w: int) -> float:
        return scale * w / (1.0 + 0.05 * w * w)

    return speed


def instance(
    seed: int, *, generic: bool = False
) -> tuple[list[AllocationJob], tuple[float, ...], dict[str, tuple[int, int]], dict]:  # type: ignore[type-arg]
    """Jobs, capacity, current tasks and allocator settings drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    jobs = []
    for i in range(n):
        c = int(rng.integers(0, len(WORKER)))
        kind = "ps"
        speed = StepTimeModel.random(rng, "sync" if rng.random() < 0.5 else "async")
        model = speed.as_speed_model()
        if generic and rng.random() < 0.4:
            kind, model = "allreduce", _generic_speed(float(rng.uniform(1, 10)))
        jobs.append(
            AllocationJob(
                job_id=f"j{i:03d}",
                remaining_steps=float(rng.choice([0.0, *rng.uniform(1e2, 1e5, 8)])),
                speed=model,
                ps_demand=PS[c] if kind == "ps" else (0.0, 0.0, 0.0),
                worker_demand=WORKER[c],
                arrival=float(rng.integers(0, 5)),
                kind=kind,
                max_workers=None if rng.random() < 0.7 else int(rng.integers(1, 12)),
                max_ps=None if kind != "ps" or rng.random() < 0.7 else int(rng.integers(1, 6)),
            )
        )
    scale = float(rng.choice([0.3, 1.0, 3.0, 30.0]))
    cap = (
        round(scale * n * float(rng.uniform(4, 40))),
        round(scale * n * float(rng.uniform(8, 120))),
        round(scale * n * float(rng.uniform(1, 10))),
    )
    current: dict[str, tuple[int, int]] = {}
    for j in jobs:
        if rng.random() < 0.4:
            w = int(rng.integers(1, 6))
            p = int(rng.integers(0, 4)) if j.kind == "ps" else 0  # 0: a PS job short of PS
            current[j.job_id] = (p, w)
    penalty: float | dict[str, float] = float(rng.choice([0.0, 30.0, 600.0]))
    if rng.random() < 0.3:  # per job (a restart history): victims in several penalty groups
        penalty = {jid: float(rng.choice([0.0, 30.0, 64.0, 600.0])) for jid in current}
    settings = {
        "restart_penalty": penalty,
        "min_gain": float(rng.choice([0.0, 0.01, 0.05])),
        "utility_exponent": float(rng.choice([1.0, 1.5, 0.5, 2.0])),
        "jct_gains": bool(rng.random() < 0.5),
    }
    return jobs, cap, current, settings


def _both(seed: int, generic: bool = False):  # type: ignore[no-untyped-def]
    jobs, cap, current, kw = instance(seed, generic=generic)
    got = allocate_incremental(jobs, cap, current=current, **kw)
    want = oracle.oracle_allocate_incremental(jobs, cap, current=current, **kw)
    return got, want


@pytest.mark.parametrize("seed", range(120))
def test_same_allocation_as_the_one_at_a_time_greedy(seed: int) -> None:
    got, want = _both(seed)
    assert got.tasks == want.tasks
    assert np.allclose(got.used, want.used)


@pytest.mark.parametrize("seed", range(60))
def test_scalar_engine_same_as_the_greedy_with_generic_speed_models(seed: int) -> None:
    got, want = _both(1000 + seed, generic=True)
    assert got.tasks == want.tasks


@given(seed=st.integers(0, 2**31 - 1), generic=st.booleans())
def test_same_allocation_property(seed: int, generic: bool) -> None:
    got, want = _both(seed, generic)
    assert got.tasks == want.tasks


def test_instances_exercise_contention_and_takes() -> None:
    """The random instances above reach what the fast engines must get right: full
    resources, tasks taken from running jobs, and the vectorised path bailing out."""
    full = taken = 0
    for seed in range(120):
        jobs, cap, current, kw = instance(seed)
        got = allocate_incremental(jobs, cap, current=current, **kw)
        if any(u > c - 6.0 for u, c in zip(got.used, cap, strict=True)):
            full += 1
        if any(sum(got.tasks[k]) < sum(v) for k, v in current.items()):
            taken += 1
    assert full >= 30
    assert taken >= 10


def test_utilities_match_the_scalar_utility_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    t = np.concatenate([rng.lognormal(5, 4, 500), [np.inf, 0.0, 1e-12, 1e-9, 1.0]])
    for a in (1.0, 0.5, 1.5, 2.0, 0.0):
        want = [_utility(float(x), a) for x in t]
        assert _utilities(t, a).tolist() == want


def test_fitting_run_matches_one_subtraction_at_a_time() -> None:
    rng = np.random.default_rng(4)
    free = np.array([10.3, 7.7, 5.0])
    needs = rng.uniform(0, 1.3, (40, 3))
    k, after = _fitting_run(free, needs)
    room = free.copy()
    n = 0
    for row in needs:
        if not np.all(row <= room + 1e-9):
            break
        room -= row
        n += 1
    assert k == n
    assert after.tolist() == room.tolist()
    assert 0 < k < len(needs)


def test_large_instance_same_as_greedy() -> None:
    """A 200-job instance (the scale where the fast path runs many rounds and windows)."""
    rng = np.random.default_rng(11)
    jobs = [
        AllocationJob(
            job_id=f"job{i:05d}",
            remaining_steps=float(rng.uniform(1e3, 1e5)),
            speed=StepTimeModel.random(rng, "sync" if i % 2 else "async").as_speed_model(),
            ps_demand=PS[i % 3],
            worker_demand=WORKER[i % 3],
        )
        for i in range(200)
    ]
    cap = (32.0 * 800, 128.0 * 800, 10.0 * 800)
    for kw in ({"min_gain": 0.01}, {"utility_exponent": 1.5, "min_gain": 0.01, "jct_gains": True}):
        got = allocate_incremental(jobs, cap, current={}, **kw)  # type: ignore[arg-type]
        want = oracle.oracle_allocate_incremental(jobs, cap, current={}, **kw)  # type: ignore[arg-type]
        assert got.tasks == want.tasks
        assert math.isclose(sum(got.used), sum(want.used))
        # the next decision in a running cluster: 5 % new jobs, restarts cost 30 s
        current = {k: v for i, (k, v) in enumerate(got.tasks.items()) if i % 20 and v[1] > 0}
        steady = dict(kw, restart_penalty=30.0)
        got2 = allocate_incremental(jobs, cap, current=current, **steady)  # type: ignore[arg-type]
        want2 = oracle.oracle_allocate_incremental(jobs, cap, current=current, **steady)  # type: ignore[arg-type]
        assert got2.tasks == want2.tasks
        assert got2.tasks != got.tasks


@pytest.mark.parametrize("seed", range(80))
def test_same_allocation_with_identical_jobs(seed: int) -> None:
    """Copies of a few job types (equal gains everywhere): ties go by arrival, then id,
    in both engines."""
    rng = np.random.default_rng(500 + seed)
    types = [
        (StepTimeModel.random(rng, "sync").as_speed_model(), float(rng.uniform(1e3, 1e5)), c)
        for c in range(int(rng.integers(1, 4)))
    ]
    jobs = []
    for i in range(int(rng.integers(2, 30))):
        model, q, c = types[int(rng.integers(0, len(types)))]
        jobs.append(
            AllocationJob(
                job_id=f"c{int(rng.integers(0, 10**6)):07d}-{i}",
                remaining_steps=q,
                speed=model,
                ps_demand=PS[c],
                worker_demand=WORKER[c],
                arrival=float(rng.integers(0, 3)),
            )
        )
    n = len(jobs)
    cap = (float(n * rng.integers(6, 60)), float(n * rng.integers(16, 200)), float(n * 4))
    # running copies at different sizes: one copy's later tasks equal another's first
    current = {j.job_id: (1, int(rng.integers(1, 6))) for j in jobs if rng.random() < 0.5}
    kw = {
        "restart_penalty": float(rng.choice([0.0, 60.0])),
        "min_gain": 0.0,
        "utility_exponent": float(rng.choice([1.0, 1.5])),
        "jct_gains": bool(rng.random() < 0.5),
    }
    got = allocate_incremental(jobs, cap, current=current, **kw)  # type: ignore[arg-type]
    want = oracle.oracle_allocate_incremental(jobs, cap, current=current, **kw)  # type: ignore[arg-type]
    assert got.tasks == want.tasks


@given(
    seed=st.integers(0, 2**31 - 1),
    n_sorted=st.integers(0, 60),
    n_new=st.integers(0, 60),
    distinct=st.integers(1, 8),
)
def test_merge_order_is_the_full_sort(seed: int, n_sorted: int, n_new: int, distinct: int) -> None:
    """The fast path's merge of newly generated tasks into the sorted ones gives the
    order of a full sort by (key, rank, position), ties between jobs included."""
    from dynsched_optimus._incremental import _FastGrow

    rng = np.random.default_rng(seed)
    n_jobs = 6
    fg = _FastGrow.__new__(_FastGrow)
    fg.rank = rng.permutation(n_jobs).astype(np.int64)
    keys = -rng.integers(1, distinct + 1, n_sorted + n_new).astype(np.float64)
    own = rng.integers(0, n_jobs, n_sorted + n_new).astype(np.int64)
    # positions grow along each job's chain: older (sorted) tasks first
    pos = np.zeros(len(own), dtype=np.int64)
    seen: dict[int, int] = {}
    for i, o in enumerate(own.tolist()):
        pos[i] = seen.get(o, 0)
        seen[o] = pos[i] + 1
    # a job's key never rises along its chain (a running minimum)
    for o in range(n_jobs):
        idx = np.flatnonzero(own == o)
        keys[idx] = np.maximum.accumulate(keys[idx])
    old = np.lexsort((pos[:n_sorted], fg.rank[own[:n_sorted]], keys[:n_sorted]))
    fg.p_key = np.concatenate([keys[:n_sorted][old], keys[n_sorted:]])
    fg.p_own = np.concatenate([own[:n_sorted][old], own[n_sorted:]])
    fg.p_pos = np.concatenate([pos[:n_sorted][old], pos[n_sorted:]])
    fg.n_sorted = n_sorted
    order = fg._order()
    want = np.lexsort((fg.p_pos, fg.rank[fg.p_own], fg.p_key))
    assert order.tolist() == want.tolist()


_RESOURCE = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([0.0, -0.0, 1e-9, -1e-9, 5e-10, math.inf, -math.inf, math.nan]),
)


@given(st.lists(st.tuples(_RESOURCE, _RESOURCE), min_size=1, max_size=5))
def test_float_fit_and_shortage_match_the_numpy_forms(pairs: list[tuple[float, float]]) -> None:
    """The scalar take works on Python floats: its fit test and its shortage bits must
    decide exactly as the numpy forms they replace (tolerance, signed zeros, inf, NaN)."""
    need = [a for a, _b in pairs]
    room = [b for _a, b in pairs]
    na, ra = np.array(need), np.array(room)
    assert _fits_floats(need, room) == oracle._fits_room(na, ra)
    with np.errstate(invalid="ignore"):
        short = np.maximum(na - ra, 0.0)
    assert _short_bits(need, room) == sum(1 << d for d in range(len(need)) if short[d] > 0)

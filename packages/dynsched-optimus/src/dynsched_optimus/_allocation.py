"""Optimus' greedy resource allocation: marginal gain per unit of dominant resource.

Algorithm (one scheduling interval), for jobs with remaining steps ``Q_j > 0`` and
speed models ``f_j(p, w)``; the estimated remaining time is ``T_j(p, w) = Q_j / f_j(p, w)``:

Two job kinds share the loop: a **parameter-server** job (``kind="ps"``, speed
``f(p, w)``) and an **all-reduce** GPU job (``kind="allreduce"``: no PS, ``ps_demand``
all zero, speed ``f(0, w)`` of its ``w`` workers/GPUs).

1. **Starter tasks.** Jobs are visited in ascending order of the dominant share of their
   starter bundle (``1 PS + 1 worker``, or ``1 worker`` for an all-reduce job; ties:
   ascending ``arrival``, then ``job_id``); each job whose bundle fits in the free
   capacity gets it.  A job whose bundle does not fit is skipped (it gets nothing this
   interval), the loop goes on.
2. **Greedy growth.** Each allocated job offers two candidates: one more worker, with gain
   ``(T(p, w) - T(p, w+1)) / s_w`` and one more PS, with gain ``(T(p, w) - T(p+1, w)) /
   s_p``, where ``s`` is the task's *dominant share* (its largest fraction of the
   cluster's capacity over the resources).  Gains of jobs flagged ``damped`` (models
   fitted on few points) are multiplied by ``damping`` (default 0.95).  A max-heap pops
   the candidate with the largest gain; so for each job the larger of its two terms comes
   first (an all-reduce job offers only the worker).  If the task fits in the free capacity it is added and both candidates of that
   job are recomputed (older candidates of the job become stale); if it does not fit it
   is skipped (the job's other candidate stays in the heap).  The loop stops when the
   heap is empty or the largest gain is ``<= 0``.

**Tie-break key.** Heap entries are ordered by ``(-gain, arrival, job_id, kind)`` with
``kind`` 0 for a worker and 1 for a PS, so equal gains go to the earlier arrival (first
come, first served; ``job_id`` only separates equal arrivals) and a worker wins over a PS
of the same job: the result does not depend on the order jobs are listed.

**Placement-aware.** With ``node_capacity`` the allocation is placed right away by
:func:`~dynsched_optimus.place` with its fill fallback and ``shrink=True``, and the
counts returned are the ones placed: what is allocated can be placed
(``Allocation.placement`` holds the placements, ``Allocation.trimmed`` the jobs that
lost tasks to fragmentation).

Cost: each added task pops one entry and pushes two: ``O(T log J)`` for ``T`` added tasks
and ``J`` jobs.  :func:`allocate` (``method="fast"``) computes the same result with numpy:
while no candidate is refused, each job's sequence of increments depends only on its own
state, so the heap order equals the jobs' increment sequences merged by their running
minimum gain (ties by ``job_id`` then sequence index); a cumulative sum of the demands in
that order finds the first refused candidate, everything before it is accepted at once,
and the sequences are regenerated from there (with refused task kinds blocked).  The
pure-Python :func:`allocate_reference` is the executable specification; a property test
asserts both give identical allocations.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, NamedTuple

import attrs
import numpy as np
import numpy.typing as npt

from dynsched_optimus._errors import OptimusError
from dynsched_optimus._placement import JobPlacement, PlacementRequest, PlacementResult, place
from dynsched_optimus._speed import PSSpeedModel
from dynsched_optimus._types import FloatArray

__all__ = [
    "JOB_KINDS",
    "RESOURCES",
    "RESTART_LOOKAHEAD",
    "Allocation",
    "AllocationJob",
    "allocate",
    "allocate_incremental",
    "allocate_reference",
    "dominant_share",
]

logger = logging.getLogger(__name__)

#: default resource names, in the order of demand and capacity vectors
RESOURCES: tuple[str, ...] = ("cpu", "memory", "gpu", "bandwidth")

SpeedFn = Callable[[int, int], float]
_TOL = 1e-9
_Entry = tuple[float, int, int, int, int]


def _vec(value: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(x) for x in value)


def dominant_share(demand: Sequence[float], capacity: Sequence[float]) -> float:
    """Largest fraction of the cluster capacity a demand takes over the resources.

    Resources with zero capacity are ignored.
    """
    best = 0.0
    for d, c in zip(demand, capacity, strict=True):
        if c > 0:
            best = max(best, float(d) / float(c))
    return best


#: job kinds the allocator and the placement know
JOB_KINDS: tuple[str, ...] = ("ps", "allreduce")


@attrs.frozen
class AllocationJob:
    """A job as seen by the allocator.

    Attributes:
        job_id: unique identifier (the last tie-break key).
        remaining_steps: estimated steps to convergence ``Q`` (<= 0: finished, skipped).
        speed: a :class:`PSSpeedModel` (vectorised fast path, ``kind="ps"`` only) or any
            callable ``f(p, w) -> steps/s`` (heap path); an all-reduce job is called with
            ``p = 0`` and ``w`` = its GPU (worker) count.
        ps_demand: resources of one parameter server (same order as the capacity); for
            an all-reduce job empty or all zero.
        worker_demand: resources of one worker (one GPU replica of an all-reduce job).
        damped: the job's models were fitted on few points (e.g. ``speed.n_points < 10``
            or a convergence fit on fewer than ~20 points): its gains are multiplied by
            ``damping``, so better-known jobs win close calls.
        max_ps: optional cap on the number of parameter servers (>= 1).
        max_workers: optional cap on the number of workers (>= 1).
        kind: ``"ps"`` (parameter server + workers) or ``"allreduce"`` (workers only).
        arrival: submission time; ties in gain and starter order go to the earlier
            arrival, then to the smaller ``job_id``.
    """

    job_id: str = attrs.field(converter=str)
    remaining_steps: float = attrs.field(converter=float)
    speed: PSSpeedModel | SpeedFn
    ps_demand: tuple[float, ...] = attrs.field(converter=_vec)
    worker_demand: tuple[float, ...] = attrs.field(converter=_vec)
    damped: bool = False
    max_ps: int | None = None
    max_workers: int | None = None
    kind: str = "ps"
    arrival: float = attrs.field(default=0.0, converter=float)

    def __attrs_post_init__(self) -> None:
        if self.kind not in JOB_KINDS:
            raise OptimusError(
                f"job {self.job_id!r}: field 'kind' must be one of {list(JOB_KINDS)}, "
                f"got {self.kind!r}"
            )
        if self.kind == "allreduce":
            if isinstance(self.speed, PSSpeedModel):
                raise OptimusError(
                    f"job {self.job_id!r}: an all-reduce job needs a speed callable f(0, w), "
                    "not a PSSpeedModel"
                )
            if not self.ps_demand:
                object.__setattr__(self, "ps_demand", (0.0,) * len(self.worker_demand))
            if any(x != 0 for x in self.ps_demand):
                raise OptimusError(
                    f"job {self.job_id!r}: an all-reduce job has no PS: ps_demand must be "
                    "empty or all zero"
                )
        names = ("ps_demand", "worker_demand") if self.kind == "ps" else ("worker_demand",)
        for name in names:
            vec = getattr(self, name)
            if any(not (x >= 0 and math.isfinite(x)) for x in vec):
                raise OptimusError(f"job {self.job_id!r}: {name} must be finite and >= 0")
            if not any(x > 0 for x in vec):
                raise OptimusError(f"job {self.job_id!r}: {name} must have a positive entry")
        if not math.isfinite(self.arrival):
            raise OptimusError(f"job {self.job_id!r}: arrival must be finite")
        if len(self.ps_demand) != len(self.worker_demand):
            raise OptimusError(
                f"job {self.job_id!r}: ps_demand and worker_demand must have the same length"
            )
        for name in ("max_ps", "max_workers"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise OptimusError(f"job {self.job_id!r}: {name} must be None or >= 1, got {v}")
        if not math.isfinite(self.remaining_steps):
            raise OptimusError(f"job {self.job_id!r}: remaining_steps must be finite")


@attrs.frozen
class Allocation:
    """Result of one allocation round.

    Attributes:
        tasks: ``job_id -> (ps, workers)``; ``(0, 0)`` for jobs that got nothing.
        used: resources used by all allocated tasks.
        capacity: the cluster capacity allocated against.
        method: ``"fast"`` or ``"reference"``.
        placement: with ``node_capacity``: where the allocated tasks run (every job
            with tasks is placed).
        trimmed: with ``node_capacity``: ``job_id -> (ps, workers)`` the aggregate
            allocation had for the jobs that fragmentation cut down (``tasks`` holds
            the placed counts).
    """

    tasks: Mapping[str, tuple[int, int]]
    used: tuple[float, ...]
    capacity: tuple[float, ...]
    method: str = "reference"
    placement: PlacementResult | None = None
    trimmed: Mapping[str, tuple[int, int]] = attrs.field(factory=dict)

    @property
    def total_tasks(self) -> int:
        """Number of PS plus workers allocated."""
        return sum(p + w for p, w in self.tasks.values())


# ---------------------------------------------------------------------------------------
# Shared scalar helpers (the fast path mirrors these expressions operation by operation)
# ---------------------------------------------------------------------------------------


def _coef(job: AllocationJob) -> tuple[tuple[float, float, float, float, float], bool] | None:
    if isinstance(job.speed, PSSpeedModel):
        return job.speed.coefficient_vector()
    return None


def _time_fn(job: AllocationJob) -> Callable[[int, int], float]:
    q = job.remaining_steps
    cv = _coef(job)
    if cv is not None:
        (c0, c1, c2, c3, c4), asyn = cv
        if asyn:

            def t_async(p: int, w: int) -> float:
                r = c0 / w + c1 + c2 * w / p + c3 * w + c4 * p
                return q * r / w

            return t_async

        def t_sync(p: int, w: int) -> float:
            r = c0 / w + c1 + c2 * w / p + c3 * w + c4 * p
            return q * r

        return t_sync
    fn = job.speed

    if job.kind == "allreduce":

        def t_allreduce(p: int, w: int) -> float:
            f = float(fn(0, w))
            return q / f if f > 0 else math.inf

        return t_allreduce

    def t_generic(p: int, w: int) -> float:
        f = float(fn(p, w))
        return q / f if f > 0 else math.inf

    return t_generic


def _fits(used: list[float], demand: tuple[float, ...], cap: tuple[float, ...]) -> bool:
    return all(u + d <= c + _TOL * c for u, d, c in zip(used, demand, cap, strict=True))


def _check(jobs: Sequence[AllocationJob], capacity: Sequence[float]) -> tuple[float, ...]:
    cap = _vec(capacity)
    if any(not (c >= 0 and math.isfinite(c)) for c in cap):
        raise OptimusError("capacity must be finite and >= 0 in every resource")
    seen: set[str] = set()
    for j in jobs:
        if j.job_id in seen:
            raise OptimusError(f"duplicate job_id {j.job_id!r}")
        seen.add(j.job_id)
        if len(j.ps_demand) != len(cap):
            raise OptimusError(
                f"job {j.job_id!r}: demand vectors have {len(j.ps_demand)} resources, "
                f"capacity has {len(cap)}"
            )
    return cap


def _bundle(j: AllocationJob) -> tuple[float, ...]:
    """Demand of the starter tasks: 1 PS + 1 worker, or 1 worker for an all-reduce job."""
    if j.kind == "allreduce":
        return j.worker_demand
    return tuple(a + b for a, b in zip(j.ps_demand, j.worker_demand, strict=True))


def _ranks(jobs: Sequence[AllocationJob]) -> list[int]:
    """Tie-break rank of each job: by ``(arrival, job_id)``."""
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival, jobs[i].job_id))
    rank = [0] * len(jobs)
    for r, i in enumerate(order):
        rank[i] = r
    return rank


def _starter_order(jobs: Sequence[AllocationJob], cap: tuple[float, ...]) -> list[int]:
    rank = _ranks(jobs)
    keyed = []
    for i, j in enumerate(jobs):
        if j.remaining_steps <= 0:
            continue
        keyed.append((dominant_share(_bundle(j), cap), rank[i], i))
    keyed.sort()
    return [i for _s, _r, i in keyed]


def _gains(
    tfn: Callable[[int, int], float],
    p: int,
    w: int,
    sw: float,
    sp: float,
    damp: float,
    can_w: bool,
    can_p: bool,
) -> tuple[float, float]:
    t0 = tfn(p, w)
    gw = (t0 - tfn(p, w + 1)) / sw * damp if can_w else -math.inf
    gp = (t0 - tfn(p + 1, w)) / sp * damp if can_p else -math.inf
    return gw, gp


def _heap_greedy(
    jobs: Sequence[AllocationJob],
    cap: tuple[float, ...],
    used: list[float],
    ps: list[int],
    wk: list[int],
    damping: float,
    blocked_w: list[bool] | None = None,
    blocked_p: list[bool] | None = None,
) -> None:
    """Greedy growth phase on a heap; mutates ``used``, ``ps`` and ``wk`` in place."""
    n = len(jobs)
    tfns = [_time_fn(j) for j in jobs]
    sw = [dominant_share(j.worker_demand, cap) for j in jobs]
    sp = [dominant_share(j.ps_demand, cap) for j in jobs]
    damp = [damping if j.damped else 1.0 for j in jobs]
    rank = _ranks(jobs)
    version = [0] * n
    heap: list[_Entry] = []

    def push(i: int, add: Callable[[list[_Entry], _Entry], None]) -> None:
        j = jobs[i]
        can_w = (j.max_workers is None or wk[i] < j.max_workers) and not (
            blocked_w is not None and blocked_w[i]
        )
        can_p = (
            j.kind == "ps"
            and (j.max_ps is None or ps[i] < j.max_ps)
            and not (blocked_p is not None and blocked_p[i])
        )
        gw, gp = _gains(tfns[i], ps[i], wk[i], sw[i], sp[i], damp[i], can_w, can_p)
        if gw > 0:
            add(heap, (-gw, rank[i], 0, i, version[i]))
        if gp > 0:
            add(heap, (-gp, rank[i], 1, i, version[i]))

    for i in range(n):
        if wk[i] > 0 and jobs[i].remaining_steps > 0:
            push(i, list.append)
    heapq.heapify(heap)
    while heap:
        neg, _jid, kind, i, ver = heapq.heappop(heap)
        if ver != version[i]:
            continue
        if neg >= 0:  # pragma: no cover - non-positive gains are never pushed
            break
        demand = jobs[i].worker_demand if kind == 0 else jobs[i].ps_demand
        if not _fits(used, demand, cap):
            continue
        for r, d in enumerate(demand):
            used[r] = used[r] + d
        if kind == 0:
            wk[i] += 1
        else:
            ps[i] += 1
        version[i] += 1
        push(i, heapq.heappush)


def allocate_reference(
    jobs: Sequence[AllocationJob],
    capacity: Sequence[float],
    *,
    damping: float = 0.95,
) -> Allocation:
    """Straightforward pure-Python implementation of the allocation (the specification).

    Args:
        jobs: the jobs (unique ``job_id``).
        capacity: the cluster's total capacity per resource.
        damping: gain factor for ``damped`` jobs, in ``(0, 1]``.

    Returns:
        The allocation.
    """
    if not 0 < damping <= 1:
        raise OptimusError(f"damping must be in (0, 1], got {damping}")
    cap = _check(jobs, capacity)
    used = [0.0] * len(cap)
    ps = [0] * len(jobs)
    wk = [0] * len(jobs)
    for i in _starter_order(jobs, cap):
        j = jobs[i]
        bundle = _bundle(j)
        if _fits(used, bundle, cap):
            for r, d in enumerate(bundle):
                used[r] = used[r] + d
            ps[i], wk[i] = (1 if j.kind == "ps" else 0), 1
    _heap_greedy(jobs, cap, used, ps, wk, damping)
    return Allocation(
        tasks={j.job_id: (ps[i], wk[i]) for i, j in enumerate(jobs)},
        used=tuple(used),
        capacity=cap,
        method="reference",
    )


# ---------------------------------------------------------------------------------------
# Vectorised fast path
# ---------------------------------------------------------------------------------------


def _order(
    key: FloatArray, rank: npt.NDArray[np.int64], t: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Indices sorting by ``(-key, rank, t)``: one float sort, equal keys re-sorted apart."""
    o = np.argsort(-key)
    ks = key[o]
    tie = ks[1:] == ks[:-1]
    if not tie.any():
        return o
    in_tie = np.zeros(o.size, dtype=bool)
    in_tie[1:] |= tie
    in_tie[:-1] |= tie
    gid = np.concatenate([[0], np.cumsum(~tie)])
    sub = np.flatnonzero(in_tie)
    os_ = o[sub]
    o[sub] = os_[np.lexsort((t[os_], rank[os_], gid[sub]))]
    return o


IntArray = npt.NDArray[np.int64]


class _Merged(NamedTuple):
    j: IntArray  # position in the round's active jobs
    t: IntArray  # index in the job's sequence
    kind: npt.NDArray[np.int8]  # 0 worker, 1 PS
    jidx: IntArray  # job index
    cums: FloatArray  # cumulative use after each element
    fail: int  # first refused element (== len when none)
    tau: float  # key of the first refused element: nothing below it is reachable


def _merge(
    tau: float,
    gen: _Generator,
    rank_a: IntArray,
    act: IntArray,
    wd: FloatArray,
    pd: FloatArray,
    used: FloatArray,
    limit: FloatArray,
) -> _Merged:
    """Merge the known elements with key >= tau in heap order and find the first refusal."""
    el_j, el_t, el_k, el_kind = gen.elements(tau)
    srt = _order(el_k, rank_a[el_j], el_t)
    el_j, el_t, el_k, el_kind = el_j[srt], el_t[srt], el_k[srt], el_kind[srt]
    jidx = act[el_j]
    dem = np.where((el_kind == 0)[:, None], wd[jidx], pd[jidx])
    cums = np.cumsum(np.vstack([used[None, :], dem]), axis=0)[1:]
    bad = np.any(cums > limit, axis=1)
    fail = int(np.argmax(bad)) if bad.any() else el_j.size
    # the first refusal among the known elements bounds the round: unknown elements only
    # add demand before it, so no element with a smaller key can be reached this round
    new_tau = float(el_k[fail]) if fail < el_j.size else tau
    return _Merged(el_j, el_t, el_kind, jidx, cums, fail, new_tau)


def _np_share(demand: FloatArray, capa: FloatArray) -> FloatArray:
    """Row-wise :func:`dominant_share` (same float operations)."""
    safe = np.where(capa > 0, capa, 1.0)
    frac = np.where(capa > 0, demand / safe, 0.0)
    return np.asarray(np.maximum(frac.max(axis=1), 0.0), dtype=np.float64)


def _np_time(
    q: FloatArray, c: FloatArray, asyn: npt.NDArray[np.bool_], p: FloatArray, w: FloatArray
) -> FloatArray:
    r = c[:, 0] / w + c[:, 1] + c[:, 2] * w / p + c[:, 3] * w + c[:, 4] * p
    return np.asarray(np.where(asyn, q * r / w, q * r), dtype=np.float64)


_BIG = np.iinfo(np.int64).max


@attrs.frozen(eq=False)
class _Growth:
    coef: FloatArray
    asyn: npt.NDArray[np.bool_]
    q: FloatArray
    sw: FloatArray
    sp: FloatArray
    damp: FloatArray
    maxw: npt.NDArray[np.int64]
    maxp: npt.NDArray[np.int64]


class _Generator:
    """Per-job increment sequences (independent of other jobs), generated step by step."""

    def __init__(
        self,
        g: _Growth,
        act: npt.NDArray[np.int64],
        ps: npt.NDArray[np.int64],
        wk: npt.NDArray[np.int64],
        bw: npt.NDArray[np.bool_],
        bp: npt.NDArray[np.bool_],
    ) -> None:
        self.q, self.c, self.a = g.q[act], g.coef[act], g.asyn[act]
        self.sw, self.sp, self.d = g.sw[act], g.sp[act], g.damp[act]
        self.mw, self.mp = g.maxw[act], g.maxp[act]
        self.bw, self.bp = bw, bp
        self.p = ps.astype(np.float64)
        self.w = wk.astype(np.float64)
        m = act.size
        self.runmin = np.full(m, np.inf)
        self.count = np.zeros(m, dtype=np.int64)
        self.stopped_cap = np.zeros(m, dtype=bool)
        self._j: list[npt.NDArray[np.int64]] = []
        self._t: list[npt.NDArray[np.int64]] = []
        self._k: list[FloatArray] = []
        self._kind: list[npt.NDArray[np.int8]] = []

    def run(self, sel: npt.NDArray[np.int64], steps: int, tau: float) -> None:
        """Advance the jobs ``sel`` by up to ``steps`` increments while key >= tau and > 0."""
        self.stopped_cap[sel] = False
        for _ in range(steps):
            if sel.size == 0:
                return
            q, c, a = self.q[sel], self.c[sel], self.a[sel]
            cp, cw = self.p[sel], self.w[sel]
            t0 = _np_time(q, c, a, cp, cw)
            tw = _np_time(q, c, a, cp, cw + 1.0)
            tp = _np_time(q, c, a, cp + 1.0, cw)
            gw = np.where(
                self.bw[sel] | (cw >= self.mw[sel]), -np.inf, (t0 - tw) / self.sw[sel] * self.d[sel]
            )
            gp = np.where(
                self.bp[sel] | (cp >= self.mp[sel]), -np.inf, (t0 - tp) / self.sp[sel] * self.d[sel]
            )
            take_w = gw >= gp
            key = np.minimum(self.runmin[sel], np.where(take_w, gw, gp))
            keep = (key > 0) & (key >= tau)
            sk = sel[keep]
            self._j.append(sk)
            self._t.append(self.count[sk])
            self._k.append(key[keep])
            self._kind.append(np.where(take_w[keep], 0, 1).astype(np.int8))
            tw_k = take_w[keep]
            self.w[sk] = cw[keep] + tw_k
            self.p[sk] = cp[keep] + ~tw_k
            self.runmin[sk] = key[keep]
            self.count[sk] += 1
            self.runmin[sel[~keep]] = -np.inf
            sel = sk
        self.stopped_cap[sel] = True

    @property
    def size(self) -> int:
        """Number of elements generated so far."""
        return int(self.count.sum())

    def elements(
        self, tau: float
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray, npt.NDArray[np.int8]]:
        if not self._j:
            z = np.zeros(0, dtype=np.int64)
            return z, z, np.zeros(0), np.zeros(0, dtype=np.int8)
        j = np.concatenate(self._j)
        t = np.concatenate(self._t)
        k = np.concatenate(self._k)
        kind = np.concatenate(self._kind)
        sel = k >= tau
        return j[sel], t[sel], k[sel], kind[sel]

    def truncated(self, tau: float) -> npt.NDArray[np.int64]:
        """Jobs whose sequence was cut by the step cap while still above ``tau``."""
        return np.flatnonzero(self.stopped_cap & (self.runmin > 0) & (self.runmin >= tau))


def allocate(
    jobs: Sequence[AllocationJob],
    capacity: Sequence[float] | None = None,
    *,
    damping: float = 0.95,
    method: Literal["fast", "reference", "incremental"] = "fast",
    max_rounds: int = 256,
    node_capacity: npt.ArrayLike | None = None,
    previous: Mapping[str, JobPlacement] | None = None,
    current: Mapping[str, tuple[int, int]] | None = None,
    restart_penalty: float | Mapping[str, float] = 0.0,
    min_gain: float = 0.0,
    utility_exponent: float = 1.0,
    jct_gains: bool = False,
) -> Allocation:
    """Allocate PS and workers to jobs (see the module docstring for the algorithm).

    Args:
        jobs: the jobs (unique ``job_id``), parameter-server and all-reduce in any mix.
        capacity: the cluster's total capacity per resource (same order as demands);
            default: the sum of ``node_capacity``.
        damping: gain factor for ``damped`` jobs, in ``(0, 1]``.
        method: ``"fast"`` (numpy; falls back to the heap for generic speed callables or
            after ``max_rounds`` regenerations) or ``"reference"``.
        max_rounds: bound on the vectorised rounds before finishing on the heap.
        node_capacity: ``(nodes, resources)`` capacities: placement-aware allocation.
            The aggregate allocation is placed by :func:`~dynsched_optimus.place`
            (fewest servers, fill fallback, ``shrink=True``) and cut to what was placed,
            so every job with tasks has a placement (``Allocation.placement``).
        previous: last round's placements, kept for jobs whose counts did not change
            (with ``node_capacity`` only).
        current, restart_penalty, min_gain, utility_exponent, jct_gains:
            ``method="incremental"``
            only, see :func:`allocate_incremental` (``current`` defaults to the counts
            of ``previous``).

    Returns:
        The allocation; the aggregate counts are identical for both methods.
    """
    if capacity is None:
        if node_capacity is None:
            raise OptimusError("allocate: give capacity or node_capacity")
        capacity = tuple(float(x) for x in np.asarray(node_capacity, dtype=float).sum(axis=0))
    if method == "incremental":
        if current is None:
            current = {k: (v.ps, v.workers) for k, v in (previous or {}).items()}
        agg = allocate_incremental(
            jobs,
            capacity,
            current=current,
            restart_penalty=restart_penalty,
            min_gain=min_gain,
            utility_exponent=utility_exponent,
            jct_gains=jct_gains,
        )
    else:
        agg = _allocate_aggregate(
            jobs, capacity, damping=damping, method=method, max_rounds=max_rounds
        )
    if node_capacity is None:
        return agg
    return _place_allocation(agg, jobs, node_capacity, previous)


def _place_allocation(
    agg: Allocation,
    jobs: Sequence[AllocationJob],
    node_capacity: npt.ArrayLike,
    previous: Mapping[str, JobPlacement] | None,
) -> Allocation:
    """Place the aggregate allocation (fill fallback, shrink) and cut it to what was
    placed; jobs left with nothing get their first tasks from donors (:class:`_RoomMaker`)."""
    # the demands were validated by AllocationJob: the requests skip re-validation
    reqs = [
        PlacementRequest._trusted(j.job_id, *agg.tasks[j.job_id], j.ps_demand, j.worker_demand)
        for j in jobs
        if sum(agg.tasks[j.job_id]) > 0
    ]
    res = place(reqs, node_capacity, previous=previous, shrink=True, fill=True)
    tasks = dict(agg.tasks)
    trimmed: dict[str, tuple[int, int]] = {}
    for jid, counts in res.shrunk.items():
        trimmed[jid] = tasks[jid]
        tasks[jid] = counts
    if res.unplaced:
        room = _RoomMaker(res, jobs, tasks, trimmed, np.asarray(node_capacity, dtype=np.float64))
        res = room.result(res)
    for jid in res.unplaced:
        trimmed.setdefault(jid, tasks[jid])
        tasks[jid] = (0, 0)
    nr = len(agg.capacity)
    used = np.zeros(nr)
    if jobs:
        cnt = np.array([tasks[j.job_id] for j in jobs], dtype=np.float64)
        pd = np.array([j.ps_demand for j in jobs], dtype=np.float64).reshape(len(jobs), nr)
        wd = np.array([j.worker_demand for j in jobs], dtype=np.float64).reshape(len(jobs), nr)
        used = cnt[:, 0] @ pd + cnt[:, 1] @ wd
    return attrs.evolve(
        agg, tasks=tasks, used=tuple(float(x) for x in used), placement=res, trimmed=trimmed
    )


class _RoomMaker:
    """Give each job that fragmentation left with nothing its first tasks.

    The aggregate allocation only checks the cluster's total capacity, so the servers'
    leftovers can be too small for the first tasks of the last jobs placed (on the
    4,000-job benchmark: no server keeps 2 Gbit/s for one more PS).  For each such job
    (in placement order) the placed job with the most workers gives up as few workers as
    possible on one of its servers, so that the starter bundle (1 PS + 1 worker, or 1
    worker) fits there; a donor keeps at least one worker.  Among jobs, the one with the
    most workers loses the least from one worker fewer (diminishing returns of the speed
    function), so the aggregate allocation's greedy is disturbed least.  A job for which
    no donor server works stays unplaced.  Donors: placed jobs with more than one worker,
    most workers first (among equals the later arrival, then ``job_id``, gives).
    """

    def __init__(
        self,
        res: PlacementResult,
        jobs: Sequence[AllocationJob],
        tasks: dict[str, tuple[int, int]],
        trimmed: dict[str, tuple[int, int]],
        node_cap: FloatArray,
    ) -> None:
        self.by_id = {j.job_id: j for j in jobs}
        self.tasks = tasks
        self.trimmed = trimmed
        self.placements = dict(res.placements)
        self.free = res.free.copy()
        self.tol = _TOL * node_cap
        self.rank = dict(zip((j.job_id for j in jobs), _ranks(jobs), strict=True))
        self.n_workers = {jid: jp.workers for jid, jp in self.placements.items()}
        self.heap = [(-w, -self.rank[jid], jid) for jid, w in self.n_workers.items() if w > 1]
        heapq.heapify(self.heap)
        # per donor: its nodes, workers per node and worker demand as arrays (rebuilt
        # after it gives workers)
        self.arrays: dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray]] = {}
        # a donor that could not make room for a demand stays unable to until the free
        # capacity of one of its servers changes: (donor, demand) -> position in ``changed``
        self.failed: dict[tuple[str, tuple[float, ...]], int] = {}
        self.changed: list[int] = []
        self.shrunk = dict(res.shrunk)
        self.donors: set[str] = set()

    def admit(self, job: AllocationJob) -> bool:
        """Give ``job`` its starter bundle on a donor's server; whether one was found."""
        p0 = 0 if job.kind == "allreduce" else 1
        need = np.asarray(job.worker_demand) + p0 * np.asarray(job.ps_demand)
        need_key = tuple(need.tolist())
        done = False
        skipped: list[tuple[int, int, str]] = []
        while self.heap and not done:
            neg_w, neg_r, did = heapq.heappop(self.heap)
            if -neg_w != self.n_workers[did]:  # stale: re-queued with its current count
                continue
            seen = self.failed.get((did, need_key))
            if seen is not None and not set(self.changed[seen:]).intersection(
                self.placements[did].nodes
            ):
                skipped.append((neg_w, neg_r, did))
                continue
            cut = self._cut(did, need)
            if cut is not None:
                self._give(did, job.job_id, p0, need, *cut)
                done = True
            else:
                self.failed[(did, need_key)] = len(self.changed)
            if self.n_workers[did] > 1:
                entry = (-self.n_workers[did], neg_r, did)
                if done:
                    heapq.heappush(self.heap, entry)
                else:
                    skipped.append(entry)
        for item in skipped:
            heapq.heappush(self.heap, item)
        return done

    def _cut(self, did: str, need: FloatArray) -> tuple[int, int] | None:
        """``(position in the donor's nodes, workers)``: the fewest of the donor's workers
        to remove on one of its servers so that ``need`` fits there."""
        got = self.arrays.get(did)
        if got is None:
            jp = self.placements[did]
            got = self.arrays[did] = (
                np.asarray(jp.nodes, dtype=np.int64),
                np.asarray(jp.workers_per_node, dtype=np.int64),
                np.asarray(self.by_id[did].worker_demand, dtype=np.float64),
            )
        nodes, wpn_a, wd = got
        gap = need[None, :] - self.free[nodes] - self.tol[nodes]
        with np.errstate(divide="ignore", invalid="ignore"):
            per_r = np.where(wd > 0, np.ceil(gap / np.where(wd > 0, wd, 1.0)), 0.0)
        per_r = np.where((wd <= 0) & (gap > 0), np.inf, per_r)
        k_need = np.maximum(per_r.max(axis=1), 1.0)
        k_max = np.minimum(wpn_a, self.n_workers[did] - 1)
        ok = np.flatnonzero(k_need <= k_max)
        if not ok.size:
            return None
        pos = int(ok[np.argmin(k_need[ok])])
        return pos, int(k_need[pos])

    def _give(self, did: str, jid: str, p0: int, need: FloatArray, pos: int, k: int) -> None:
        """Remove ``k`` workers of donor ``did`` at ``pos``; start ``jid`` there."""
        jp = self.placements[did]
        wd = self.arrays.pop(did)[2]
        nd = int(jp.nodes[pos])
        self.free[nd] += k * wd - need
        self.changed.append(nd)
        wpn = list(jp.workers_per_node)
        wpn[pos] -= k
        keep = [q for q in range(len(wpn)) if wpn[q] or jp.ps_per_node[q]]
        self.placements[did] = JobPlacement(
            did,
            tuple(jp.nodes[q] for q in keep),
            tuple(jp.ps_per_node[q] for q in keep),
            tuple(wpn[q] for q in keep),
        )
        self.n_workers[did] -= k
        self.trimmed.setdefault(did, self.tasks[did])
        self.donors.add(did)
        self.tasks[did] = (jp.ps, self.n_workers[did])
        self.shrunk[did] = self.tasks[did]
        self.placements[jid] = JobPlacement(jid, (nd,), (p0,), (1,))
        self.trimmed[jid] = self.tasks[jid]
        self.tasks[jid] = (p0, 1)
        self.shrunk[jid] = (p0, 1)

    def result(self, res: PlacementResult) -> PlacementResult:
        """``res`` with the jobs it left unplaced admitted where a donor makes room."""
        unplaced = [jid for jid in res.unplaced if not self.admit(self.by_id[jid])]
        return attrs.evolve(
            res,
            placements=self.placements,
            unplaced=tuple(unplaced),
            kept=tuple(k for k in res.kept if k not in self.donors),
            free=self.free,
            shrunk=self.shrunk,
        )


def _starters(
    pd: FloatArray,
    wd: FloatArray,
    capa: FloatArray,
    cap: tuple[float, ...],
    rank: npt.NDArray[np.int64],
    qv: FloatArray,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray]:
    """Starter tasks (1 PS + 1 worker) by ascending bundle share: a prefix by cumulative
    sum, then a short loop past the first refusal; ``(ps, workers, used)``."""
    n, nr = pd.shape
    limit = capa + _TOL * capa
    bshare = _np_share(pd + wd, capa)
    cand = np.flatnonzero(qv > 0)
    order = cand[np.lexsort((rank[cand], bshare[cand]))].tolist()
    ps = np.zeros(n, dtype=np.int64)
    wk = np.zeros(n, dtype=np.int64)
    used = np.zeros(nr, dtype=np.float64)
    if not order:
        return ps, wk, used
    oi = np.array(order, dtype=np.int64)
    bundle = pd[oi] + wd[oi]
    cums = np.cumsum(np.vstack([used[None, :], bundle]), axis=0)[1:]
    bad = np.any(cums > limit, axis=1)
    first = int(np.argmax(bad)) if bad.any() else len(order)
    ps[oi[:first]] = 1
    wk[oi[:first]] = 1
    if first > 0:
        used = cums[first - 1].copy()
    used_l = used.tolist()
    for i in order[first:]:
        bt = tuple((pd[i] + wd[i]).tolist())
        if _fits(used_l, bt, cap):
            for r in range(nr):
                used_l[r] = used_l[r] + bt[r]
            ps[i] = 1
            wk[i] = 1
    return ps, wk, np.array(used_l, dtype=np.float64)


def _vector_round(
    g: _Growth,
    act: npt.NDArray[np.int64],
    counts: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray],
    blocked: tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]],
    demands: tuple[FloatArray, FloatArray],
    limit: FloatArray,
    rank: npt.NDArray[np.int64],
    cap_len: int,
) -> tuple[FloatArray, int, bool]:
    """One vectorised round of the greedy (``ps`` and ``wk`` updated in place):
    ``(used, cap_len, whether another round may add tasks)``."""
    ps, wk, used = counts
    blocked_w, blocked_p = blocked
    pd, wd = demands
    # upper bound on the tasks that can still be added (pigeonhole on a resource that
    # every open candidate uses): the sort needs only the budget+1 best elements
    free = limit - used
    dem_open = np.vstack([wd[act][~blocked_w[act]], pd[act][~blocked_p[act]]])
    dmin = dem_open.min(axis=0)
    pos_r = dmin > 0
    budget = int(np.min(np.floor(free[pos_r] / dmin[pos_r]))) + 1 if pos_r.any() else -1
    m = act.size
    first = max(2, min(16, budget // m + 2)) if budget >= 0 else 16
    gen = _Generator(g, act, ps[act], wk[act], blocked_w[act], blocked_p[act])
    gen.run(np.arange(m), first, 0.0)
    rank_a = rank[act]

    ctx = (gen, rank_a, act, wd, pd, used, limit)
    tau = _merge(0.0, *ctx).tau
    steps_done = first
    chunk = first
    known = gen.size
    while steps_done < cap_len:
        open_ = np.flatnonzero(gen.stopped_cap & (gen.runmin > 0) & (gen.runmin >= tau))
        if open_.size == 0:
            break
        step = min(chunk, cap_len - steps_done)
        gen.run(open_, step, tau)
        steps_done += step
        chunk *= 2
        if gen.size >= 2 * known:
            known = gen.size
            tau = _merge(tau, *ctx).tau
    res = _merge(tau, *ctx)
    el_j, el_t, el_kind, jidx, cums = res.j, res.t, res.kind, res.jidx, res.cums
    n_el = el_j.size
    if n_el == 0:
        return used, cap_len, False
    fail = res.fail
    trunc = n_el
    truncated = gen.truncated(tau)
    if truncated.size:
        last_t = gen.count[truncated] - 1
        is_last = np.zeros(n_el, dtype=bool)
        lookup = np.full(m, -2, dtype=np.int64)
        lookup[truncated] = last_t
        is_last = lookup[el_j] == el_t
        trunc = int(np.flatnonzero(is_last).min()) + 1 if is_last.any() else n_el
    accept = min(fail, trunc)
    if accept > 0:
        acc_j = jidx[:accept]
        acc_k = el_kind[:accept]
        np.add.at(wk, acc_j[acc_k == 0], 1)
        np.add.at(ps, acc_j[acc_k == 1], 1)
        used = cums[accept - 1].copy()
    if accept == n_el and truncated.size == 0:
        return used, cap_len, False
    if trunc <= fail and truncated.size:
        cap_len = min(cap_len * 4, 1 << 20)
    return used, cap_len, True


def _grow_vectorised(
    jobs: Sequence[AllocationJob],
    g: _Growth,
    counts: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray],
    demands: tuple[FloatArray, FloatArray],
    cap: tuple[float, ...],
    limit: FloatArray,
    rank: npt.NDArray[np.int64],
    damping: float,
    max_rounds: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray]:
    """Greedy growth in vectorised rounds (the heap finishes after ``max_rounds``)."""
    ps, wk, used = counts
    pd, wd = demands
    n = len(jobs)
    alive = (ps > 0) & (g.q > 0)
    blocked_w = np.zeros(n, dtype=bool)
    blocked_p = np.zeros(n, dtype=bool)
    cap_len = 1024
    rounds = 0
    while True:
        blocked_w |= np.any(used[None, :] + wd > limit, axis=1)
        blocked_p |= np.any(used[None, :] + pd > limit, axis=1)
        act = np.flatnonzero(alive & ~(blocked_w & blocked_p))
        if act.size == 0:
            break
        if rounds >= max_rounds:
            logger.debug("allocation: %d vectorised rounds, finishing on the heap", rounds)
            ps_l, wk_l, used_l = ps.tolist(), wk.tolist(), used.tolist()
            _heap_greedy(
                jobs, cap, used_l, ps_l, wk_l, damping, blocked_w.tolist(), blocked_p.tolist()
            )
            ps, wk = np.array(ps_l, dtype=np.int64), np.array(wk_l, dtype=np.int64)
            used = np.array(used_l, dtype=np.float64)
            break
        rounds += 1
        used, cap_len, more = _vector_round(
            g, act, (ps, wk, used), (blocked_w, blocked_p), demands, limit, rank, cap_len
        )
        if not more:
            break
    return ps, wk, used


def _allocate_aggregate(
    jobs: Sequence[AllocationJob],
    capacity: Sequence[float],
    *,
    damping: float,
    method: str,
    max_rounds: int,
) -> Allocation:
    if method == "reference":
        return allocate_reference(jobs, capacity, damping=damping)
    if method != "fast":
        raise OptimusError(f"method must be 'fast', 'reference' or 'incremental', got {method!r}")
    if not 0 < damping <= 1:
        raise OptimusError(f"damping must be in (0, 1], got {damping}")
    cap = _check(jobs, capacity)
    if any(not isinstance(j.speed, PSSpeedModel) for j in jobs):
        return attrs.evolve(allocate_reference(jobs, cap, damping=damping), method="fast")
    n = len(jobs)
    nr = len(cap)
    if n == 0:
        return Allocation(tasks={}, used=(0.0,) * nr, capacity=cap, method="fast")
    capa = np.array(cap, dtype=np.float64)
    limit = capa + _TOL * capa
    pd = np.array([j.ps_demand for j in jobs], dtype=np.float64).reshape(n, nr)
    wd = np.array([j.worker_demand for j in jobs], dtype=np.float64).reshape(n, nr)

    rank = np.array(_ranks(jobs), dtype=np.int64)
    qv = np.array([j.remaining_steps for j in jobs], dtype=np.float64)
    ps, wk, used = _starters(pd, wd, capa, cap, rank, qv)

    # ---- greedy growth, vectorised rounds
    cvs = [j.speed.coefficient_vector() for j in jobs]  # type: ignore[union-attr]
    g = _Growth(
        coef=np.array([c for c, _a in cvs], dtype=np.float64),
        asyn=np.array([a for _c, a in cvs], dtype=bool),
        q=qv,
        sw=_np_share(wd, capa),
        sp=_np_share(pd, capa),
        damp=np.array([damping if j.damped else 1.0 for j in jobs], dtype=np.float64),
        maxw=np.array([_BIG if j.max_workers is None else j.max_workers for j in jobs]),
        maxp=np.array([_BIG if j.max_ps is None else j.max_ps for j in jobs]),
    )
    ps, wk, used = _grow_vectorised(
        jobs, g, (ps, wk, used), (pd, wd), cap, limit, rank, damping, max_rounds
    )
    return Allocation(
        tasks={j.job_id: (int(ps[i]), int(wk[i])) for i, j in enumerate(jobs)},
        used=tuple(float(x) for x in used),
        capacity=cap,
        method="fast",
    )


# The incremental, restart-aware allocator (``optimus+``) lives in its own module; it
# needs the helpers above, so it is imported last (the package imports this module first).
from dynsched_optimus._incremental import (  # noqa: E402
    RESTART_LOOKAHEAD,
    allocate_incremental,
)

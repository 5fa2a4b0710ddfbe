"""Task placement of Optimus (Theorem 1): fewest servers, even spread of PS and workers.

Theorem 1 of the paper: a synchronous job on homogeneous servers trains fastest on the
fewest servers that can host it, with the same number of PS and the same number of
workers on each.  The runtime algorithm:

1. Jobs that keep their allocation (same PS and worker counts as in ``previous``) keep
   their placement, if it still fits; they are reserved first, in ``job_id`` order.
2. The other jobs are placed in ascending order of demand (the dominant share of the
   job's total demand over the cluster's total capacity; ties by ``job_id``).
3. Servers are ordered by descending free capacity, measured as
   ``sum_r free_r / max_node_capacity_r`` quantised to 2^-40 (ties by node index).
   For ``k = 1, 2, ...`` the job's PS and workers are spread evenly over the first ``k``
   servers (counts differ by at most one; extra workers go to the first servers of the
   ``k``, extra PS to the last ones, so the task totals are as even as possible); the
   first ``k`` for which every server can hold its share is used (``k`` starts at the
   lower bound ``max_r ceil(demand_r / largest node capacity_r)``).  A job
   that fits on no prefix of the order is left unplaced (reported, never over-committed).
4. **Fill fallback** (``fill=True``, beyond the paper): when no even spread fits (free
   capacity fragmented over many servers), the servers are filled in the same order:
   each takes as many of the job's remaining workers as fit, then as many of its
   remaining PS.  With ``shrink=True`` a fill that runs out of servers keeps what it
   placed (at least one worker, and one PS for a job with PS).

Parameter-server and all-reduce jobs (``ps=0``, zero PS demand) are placed alike.

:func:`place` computes the initial server keys and their order with numpy and then keeps
the servers in a sorted list of integer keys: a job inspects only the first ``k`` servers
and re-inserts the ones it used with ``bisect`` (``O(k log N)`` per job plus a memory
move, no per-job pass over all servers); wide spreads are checked in blocks of candidate
``k`` with one numpy comparison.  When the servers have few distinct (capacity, free)
shapes (at most one per four servers at the start, e.g. a homogeneous cluster) they are
bucketed by shape instead: spreads and fills are checked and committed per run of equal
servers (:func:`_place_buckets`), with the same result.  :func:`place_reference` is the straightforward version
that re-sorts every server for every job.  Both return the same placement (property test).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Iterable, Mapping, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from dynsched_optimus._errors import OptimusError

__all__ = [
    "STRATEGIES",
    "JobPlacement",
    "PlacementRequest",
    "PlacementResult",
    "even_split",
    "place",
    "place_reference",
]

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
_TOL = 1e-9
_IDX_BITS = 22  # up to ~4 million nodes
_SMALL_K = 8

#: Placement strategies of :func:`place`: ``"fewest"`` (Theorem 1 of the Optimus paper),
#: ``"spread"`` (load balancing, each task on the server with the largest smallest free
#: share) and ``"align"`` (Tetris' packing: each task on the server whose free resources
#: align best with its demand).
STRATEGIES = ("fewest", "spread", "align")


def _key_scale(nr: int) -> float:
    # keys stay below 2**38 so that (key << _IDX_BITS) | index fits in an int64
    return float(1 << (38 - max(0, (nr - 1).bit_length())))


def _vec(value: Sequence[float]) -> tuple[float, ...]:
    return tuple(map(float, value))


@attrs.frozen
class PlacementRequest:
    """A job to place: its task counts and per-task demands.

    Attributes:
        job_id: unique identifier.
        ps: number of parameter servers.
        workers: number of workers.
        ps_demand: resources of one PS (same order as node capacities).
        worker_demand: resources of one worker.
    """

    job_id: str = attrs.field(converter=str)
    ps: int
    workers: int
    ps_demand: tuple[float, ...] = attrs.field(converter=_vec)
    worker_demand: tuple[float, ...] = attrs.field(converter=_vec)

    def __attrs_post_init__(self) -> None:
        if self.ps < 0 or self.workers < 0:
            raise OptimusError(f"job {self.job_id!r}: ps and workers must be >= 0")
        if len(self.ps_demand) != len(self.worker_demand):
            raise OptimusError(f"job {self.job_id!r}: demand vectors differ in length")
        both = self.ps_demand + self.worker_demand
        if both and not (min(both) >= 0 and all(map(math.isfinite, both))):
            raise OptimusError(f"job {self.job_id!r}: demands must be finite and >= 0")

    @classmethod
    def _trusted(
        cls,
        job_id: str,
        ps: int,
        workers: int,
        ps_demand: tuple[float, ...],
        worker_demand: tuple[float, ...],
    ) -> PlacementRequest:
        """A request from values already validated (tuples of floats, counts >= 0), built
        without converters or checks (the allocator's hot path)."""
        obj = object.__new__(cls)
        for name, value in (
            ("job_id", job_id),
            ("ps", ps),
            ("workers", workers),
            ("ps_demand", ps_demand),
            ("worker_demand", worker_demand),
        ):
            object.__setattr__(obj, name, value)
        return obj


@attrs.frozen
class JobPlacement:
    """Where a job's tasks run.

    Attributes:
        job_id: the job.
        nodes: node indices used, in the order the spread was made.
        ps_per_node: PS on each of ``nodes``.
        workers_per_node: workers on each of ``nodes``.
    """

    job_id: str
    nodes: tuple[int, ...]
    ps_per_node: tuple[int, ...]
    workers_per_node: tuple[int, ...]

    @property
    def num_servers(self) -> int:
        """Number of servers the job uses."""
        return len(self.nodes)

    @property
    def ps(self) -> int:
        """Total parameter servers."""
        return sum(self.ps_per_node)

    @property
    def workers(self) -> int:
        """Total workers."""
        return sum(self.workers_per_node)


@attrs.frozen(eq=False)
class PlacementResult:
    """Placements of one round.

    Attributes:
        placements: ``job_id -> JobPlacement`` for every placed job.
        unplaced: ids of jobs with tasks that could not be placed.
        kept: ids of jobs that kept their previous placement.
        free: free resources per node after placement, shape ``(nodes, resources)``.
        shrunk: with ``shrink=True``, ``job_id -> (ps, workers)`` of the jobs placed with
            fewer tasks than allocated.
    """

    placements: Mapping[str, JobPlacement]
    unplaced: tuple[str, ...]
    kept: tuple[str, ...]
    free: FloatArray
    shrunk: Mapping[str, tuple[int, int]] = attrs.field(factory=dict)


def even_split(total: int, k: int, *, extra_last: bool = False) -> list[int]:
    """``total`` items over ``k`` bins, counts differing by at most one.

    The bins that get one more are the first ones, or the last ones with ``extra_last``.
    """
    base, extra = divmod(total, k)
    if extra_last:
        return [base + 1 if i >= k - extra else base for i in range(k)]
    return [base + 1 if i < extra else base for i in range(k)]


def ps_split(ps: int, k: int) -> list[int]:
    """PS per server of an even spread over ``k`` servers (extra PS on the last ones)."""
    return even_split(ps, k, extra_last=True)


def _check_nodes(node_capacity: npt.ArrayLike) -> FloatArray:
    cap = np.asarray(node_capacity, dtype=np.float64)
    if cap.ndim != 2 or cap.shape[0] == 0:
        raise OptimusError("node_capacity must be a non-empty (nodes, resources) array")
    if cap.shape[0] >= 1 << _IDX_BITS:
        raise OptimusError(f"at most {(1 << _IDX_BITS) - 1} nodes are supported")
    if np.any(~np.isfinite(cap)) or np.any(cap < 0):
        raise OptimusError("node_capacity must be finite and >= 0")
    return cap


def _job_order(jobs: Sequence[PlacementRequest], total: FloatArray) -> list[int]:
    if len(jobs) >= 64:
        # the same float operations as the loop below, vectorised
        nr = total.size
        pd = np.array([j.ps_demand for j in jobs], dtype=np.float64).reshape(len(jobs), nr)
        wd = np.array([j.worker_demand for j in jobs], dtype=np.float64).reshape(len(jobs), nr)
        cnt = np.array([(j.ps, j.workers) for j in jobs], dtype=np.int64)
        d = cnt[:, :1] * pd + cnt[:, 1:] * wd
        pos = total > 0
        sh = (d[:, pos] / total[pos]).max(axis=1, initial=0.0)
        ids = [j.job_id for j in jobs]
        shl = sh.tolist()
        return sorted(range(len(jobs)), key=lambda i: (shl[i], ids[i]))
    keyed = []
    for i, j in enumerate(jobs):
        share = 0.0
        for r in range(total.size):
            if total[r] > 0:
                d = j.ps * j.ps_demand[r] + j.workers * j.worker_demand[r]
                share = max(share, d / float(total[r]))
        keyed.append((share, j.job_id, i))
    keyed.sort()
    return [i for _s, _id, i in keyed]


def _node_key(free_row: Sequence[float], norm: Sequence[float], scale: float) -> int:
    s = 0.0
    for f, c in zip(free_row, norm, strict=True):
        s = s + f / c
    return math.floor(s * scale)


def _np_node_key(free: FloatArray, norm: FloatArray, scale: float) -> npt.NDArray[np.int64]:
    s = np.zeros(free.shape[0])
    for r in range(free.shape[1]):
        s = s + free[:, r] / norm[r]
    return np.floor(s * scale).astype(np.int64)


def _prepare(
    jobs: Sequence[PlacementRequest],
    node_capacity: npt.ArrayLike,
    previous: Mapping[str, JobPlacement] | None,
    priority: Sequence[str] | None = None,
    strategy: str = "fewest",
) -> tuple[FloatArray, FloatArray, FloatArray, list[int], list[int], dict[str, int]]:
    if strategy not in STRATEGIES:
        raise OptimusError(f"strategy={strategy!r}: allowed values are {list(STRATEGIES)}")
    cap = _check_nodes(node_capacity)
    nr = cap.shape[1]
    seen: dict[str, int] = {}
    for i, j in enumerate(jobs):
        if j.job_id in seen:
            raise OptimusError(f"duplicate job_id {j.job_id!r}")
        seen[j.job_id] = i
        if len(j.ps_demand) != nr:
            raise OptimusError(
                f"job {j.job_id!r}: demands have {len(j.ps_demand)} resources, nodes have {nr}"
            )
    norm = cap.max(axis=0)
    norm = np.where(norm > 0, norm, 1.0)
    kept_ids: list[int] = []
    if previous:
        for jid in sorted(previous):
            found = seen.get(jid)
            if found is None:
                continue
            i = found
            pl = previous[jid]
            if (
                pl.ps == jobs[i].ps
                and pl.workers == jobs[i].workers
                and all(0 <= n < cap.shape[0] for n in pl.nodes)
            ):
                kept_ids.append(i)
    order = _job_order(jobs, cap.sum(axis=0))
    if priority is not None:
        rank: dict[str, int] = {}
        for jid in priority:
            if jid not in seen:
                raise OptimusError(f"order: job_id {jid!r} is not among the jobs to place")
            rank.setdefault(jid, len(rank))
        # listed jobs first, in the given order; the others after, in the default order
        pos = {i: p for p, i in enumerate(order)}
        order = sorted(order, key=lambda i: (rank.get(jobs[i].job_id, len(rank)), pos[i]))
    return cap, norm, cap.sum(axis=0), kept_ids, order, seen


def _reserve_kept(
    jobs: Sequence[PlacementRequest],
    previous: Mapping[str, JobPlacement],
    kept_ids: list[int],
    free: FloatArray,
    cap: FloatArray,
) -> tuple[dict[str, JobPlacement], set[int]]:
    placements: dict[str, JobPlacement] = {}
    kept: set[int] = set()
    for i in kept_ids:
        j = jobs[i]
        pl = previous[j.job_id]
        nodes = list(pl.nodes)
        loads = [
            [pp * a + ww * b for a, b in zip(j.ps_demand, j.worker_demand, strict=True)]
            for pp, ww in zip(pl.ps_per_node, pl.workers_per_node, strict=True)
        ]
        trial = free.copy()
        ok = True
        for n, ld in zip(nodes, loads, strict=True):
            for r, x in enumerate(ld):
                trial[n, r] = trial[n, r] - x
                if trial[n, r] < -_TOL * cap[n, r]:
                    ok = False
        if ok:
            free[:, :] = trial
            placements[j.job_id] = pl
            kept.add(i)
    return placements, kept


def place_reference(
    jobs: Sequence[PlacementRequest],
    node_capacity: npt.ArrayLike,
    *,
    previous: Mapping[str, JobPlacement] | None = None,
    shrink: bool = False,
    fill: bool = False,
    strategy: str = "fewest",
    order: Sequence[str] | None = None,
) -> PlacementResult:
    """Straightforward pure-Python placement (the specification of :func:`place`).

    Re-sorts all servers for every job (``O(J N log N)``); use :func:`place` for real
    sizes.

    Args:
        jobs: jobs with their task counts (unique ``job_id``).
        node_capacity: ``(nodes, resources)`` capacities.
        previous: last round's placements; a job with unchanged counts keeps its own.
        shrink: see :func:`place`.
        fill: see :func:`place`.
        strategy: see :func:`place`.
        order: see :func:`place`.

    Returns:
        The placement result.
    """
    cap, norm_a, _total, kept_ids, job_order, _seen = _prepare(
        jobs, node_capacity, previous, order, strategy
    )
    n_nodes, nr = cap.shape
    free_a = cap.copy()
    placements, kept = _reserve_kept(jobs, previous or {}, kept_ids, free_a, cap)
    if strategy != "fewest":
        return _place_greedy(jobs, cap, job_order, free_a, placements, kept, shrink, strategy)
    order = job_order
    free = free_a.tolist()
    capl = cap.tolist()
    norm = norm_a.tolist()
    scale = _key_scale(nr)
    unplaced: list[str] = []
    shrunk: dict[str, tuple[int, int]] = {}
    for i in order:
        if i in kept:
            continue
        j = jobs[i]
        if j.ps + j.workers == 0:
            continue
        # servers by descending free capacity (ties: lower index first), re-sorted per job
        by_free = sorted(range(n_nodes), key=lambda n: (-_node_key(free[n], norm, scale), n))
        cur: PlacementRequest | None = j
        chosen = 0
        if fill and not _spread_fits(j, by_free, free, capl, norm):
            tolc = [[_TOL * c for c in row] for row in capl]
            nodes_f, pss_f, wss_f, complete = _fill_nodes(j, by_free, free, tolc)
            if complete or (shrink and _fill_ok(j, pss_f, wss_f, complete)):
                for n, pp, ww in zip(nodes_f, pss_f, wss_f, strict=True):
                    for r in range(nr):
                        free[n][r] = free[n][r] - (pp * j.ps_demand[r] + ww * j.worker_demand[r])
                placements[j.job_id] = JobPlacement(
                    job_id=j.job_id,
                    nodes=tuple(nodes_f),
                    ps_per_node=tuple(pss_f),
                    workers_per_node=tuple(wss_f),
                )
                if not complete:
                    shrunk[j.job_id] = (sum(pss_f), sum(wss_f))
            else:
                unplaced.append(j.job_id)
            continue
        while cur is not None:
            for k in range(_k_lower(cur, norm), min(n_nodes, cur.ps + cur.workers) + 1):
                ps_s = ps_split(cur.ps, k)
                w_s = even_split(cur.workers, k)
                ok = True
                for pos in range(k):
                    n = by_free[pos]
                    for r in range(nr):
                        load = ps_s[pos] * cur.ps_demand[r] + w_s[pos] * cur.worker_demand[r]
                        if load > free[n][r] + _TOL * capl[n][r]:
                            ok = False
                            break
                    if not ok:
                        break
                if ok:
                    chosen = k
                    break
            if chosen or not shrink:
                break
            cur = _shrink(cur)
        if chosen == 0 or cur is None:
            unplaced.append(j.job_id)
            continue
        if (cur.ps, cur.workers) != (j.ps, j.workers):
            shrunk[j.job_id] = (cur.ps, cur.workers)
        ps_s = ps_split(cur.ps, chosen)
        w_s = even_split(cur.workers, chosen)
        nodes = by_free[:chosen]
        for pos, n in enumerate(nodes):
            for r in range(nr):
                load = ps_s[pos] * cur.ps_demand[r] + w_s[pos] * cur.worker_demand[r]
                free[n][r] = free[n][r] - load
        placements[j.job_id] = JobPlacement(
            job_id=j.job_id,
            nodes=tuple(nodes),
            ps_per_node=tuple(ps_s),
            workers_per_node=tuple(w_s),
        )
    return _result(
        jobs,
        placements,
        unplaced,
        kept,
        np.array(free, dtype=np.float64).reshape(n_nodes, nr),
        shrunk,
    )


def _result(
    jobs: Sequence[PlacementRequest],
    placements: dict[str, JobPlacement],
    unplaced: list[str],
    kept: set[int],
    free: FloatArray,
    shrunk: dict[str, tuple[int, int]],
) -> PlacementResult:
    """The result of one placement run (kept jobs listed by ``job_id``)."""
    return PlacementResult(
        placements=placements,
        unplaced=tuple(unplaced),
        kept=tuple(jobs[i].job_id for i in sorted(kept, key=lambda x: jobs[x].job_id)),
        free=free,
        shrunk=shrunk,
    )


def _fit_count(
    free: Sequence[float], tolcap: Sequence[float], d: Sequence[float], left: int
) -> int:
    """How many tasks of demand ``d`` (at most ``left``) fit in ``free`` (+ tolerance)."""
    m = left
    for r, x in enumerate(d):
        if x > 0:
            m = min(m, max(int((free[r] + tolcap[r]) // x), 0))
    while m > 0 and any(m * x > f + t for x, f, t in zip(d, free, tolcap, strict=True)):
        m -= 1
    return m


def _fill_nodes(
    j: PlacementRequest,
    nodes: Iterable[int],
    free: Sequence[Sequence[float]],
    tolcap: Sequence[Sequence[float]],
) -> tuple[list[int], list[int], list[int], bool]:
    """Fill ``nodes`` in order; returns (used nodes, PS per node, workers per node, complete)."""
    lw, lp = j.workers, j.ps
    used: list[int] = []
    pss: list[int] = []
    wss: list[int] = []
    nr = len(j.worker_demand)
    for n in nodes:
        if lw == 0 and lp == 0:
            break
        fr = list(free[n])
        tc = tolcap[n]
        ww = _fit_count(fr, tc, j.worker_demand, lw) if lw else 0
        if ww:
            fr = [fr[r] - ww * j.worker_demand[r] for r in range(nr)]
        pp = _fit_count(fr, tc, j.ps_demand, lp) if lp else 0
        if pp:
            # recheck the combined load with the arithmetic used to commit it
            while pp > 0 and any(
                pp * j.ps_demand[r] + ww * j.worker_demand[r] > free[n][r] + tc[r]
                for r in range(nr)
            ):
                pp -= 1
        if ww or pp:
            used.append(n)
            pss.append(pp)
            wss.append(ww)
            lw -= ww
            lp -= pp
    return used, pss, wss, lw == 0 and lp == 0


def _fill_ok(j: PlacementRequest, pss: list[int], wss: list[int], complete: bool) -> bool:
    """A (partial) fill is kept when it is complete or holds the job's minimum tasks."""
    if complete:
        return True
    return sum(wss) >= 1 and (j.ps == 0 or sum(pss) >= 1)


def _shrink(j: PlacementRequest) -> PlacementRequest | None:
    """One task fewer: a worker while workers >= PS (or a single PS is left), else a PS."""
    if j.workers > 1 and (j.workers >= j.ps or j.ps <= 1):
        return attrs.evolve(j, workers=j.workers - 1)
    if j.ps > 1:
        return attrs.evolve(j, ps=j.ps - 1)
    return None


def _spread_fits(
    j: PlacementRequest,
    by_free: Sequence[int],
    free: Sequence[Sequence[float]],
    capl: Sequence[Sequence[float]],
    norm: Sequence[float],
) -> bool:
    """Whether an even spread over some prefix of ``by_free`` holds the whole job."""
    nr = len(j.worker_demand)
    for k in range(_k_lower(j, norm), min(len(by_free), j.ps + j.workers) + 1):
        ps_s = ps_split(j.ps, k)
        w_s = even_split(j.workers, k)
        if all(
            ps_s[pos] * j.ps_demand[r] + w_s[pos] * j.worker_demand[r]
            <= free[by_free[pos]][r] + _TOL * capl[by_free[pos]][r]
            for pos in range(k)
            for r in range(nr)
        ):
            return True
    return False


def _k_lower(j: PlacementRequest, norm: Sequence[float]) -> int:
    """No spread over fewer servers fits: each holds at most the largest node capacity."""
    k = 1
    for r, c in enumerate(norm):
        d = j.ps * j.ps_demand[r] + j.workers * j.worker_demand[r]
        if d > 0:
            k = max(k, math.ceil(d / (c * (1 + 4 * _TOL))))
    return k


def _split_matrix(
    total: int, ks: npt.NDArray[np.int64], width: int, extra_last: bool = False
) -> npt.NDArray[np.int64]:
    pos = np.arange(width)[None, :]
    base = total // ks[:, None]
    extra = total % ks[:, None]
    out = base + ((pos >= ks[:, None] - extra) if extra_last else (pos < extra))
    return np.where(pos < ks[:, None], out, 0)


def _rows(j: PlacementRequest, k: int, nr: int) -> list[list[float]]:
    pss = ps_split(j.ps, k)
    wss = even_split(j.workers, k)
    return [
        [pss[q] * j.ps_demand[r] + wss[q] * j.worker_demand[r] for r in range(nr)] for q in range(k)
    ]


def place(
    jobs: Sequence[PlacementRequest],
    node_capacity: npt.ArrayLike,
    *,
    previous: Mapping[str, JobPlacement] | None = None,
    shrink: bool = False,
    fill: bool = False,
    strategy: str = "fewest",
    order: Sequence[str] | None = None,
) -> PlacementResult:
    """Place jobs on the fewest servers with an even PS/worker spread (fast path).

    Servers stay in a sorted list of integer keys (initial keys computed and sorted with
    numpy; used servers re-inserted with ``bisect``), so a job costs ``O(k log N)`` for
    the ``k`` servers it inspects instead of a sort of all ``N`` servers.  Spreads over up
    to 8 servers are checked with scalar code, wider ones in blocks of candidate ``k`` with
    one numpy comparison each.  Per-shape load tables are cached across jobs.

    Args:
        jobs: jobs with their task counts (unique ``job_id``).
        node_capacity: ``(nodes, resources)`` capacities.
        previous: last round's placements; a job with unchanged counts keeps its own
            (when it still fits).
        shrink: beyond the paper: a job that fits on no prefix of the servers (the
            allocation only checks the cluster's total capacity, so fragmentation can
            leave a job without room) is retried with one task fewer at a time (a worker
            while workers >= PS, else a PS) down to its last task; the counts it got are
            in ``PlacementResult.shrunk``.  Default ``False``: such a job is unplaced.
        fill: beyond the paper: a job whose even spread fits on no prefix of the
            servers fills the servers in order instead (as many workers, then PS, as
            fit on each); with ``shrink`` a fill that runs out of servers keeps what
            it placed (at least one worker, and one PS for a job with PS).  With both,
            every job is placed unless not even its first tasks fit on any server.
        strategy: one of :data:`STRATEGIES`.  ``"fewest"`` (default) is the algorithm
            above.  ``"spread"`` and ``"align"`` place one task at a time, the job's
            workers first, then its PS: ``"spread"`` on the server with the largest
            smallest free share ``min_r free_r / capacity_r`` (load balancing, the
            baselines' placement), ``"align"`` on the server with the largest
            ``sum_r (free_r / m_r) * (demand_r / m_r)``, ``m_r`` the largest free amount
            of resource ``r`` when the job starts (Tetris' alignment); ties go to the
            lower node index.  A job whose next task fits nowhere is unplaced, or with
            ``shrink`` keeps the tasks placed so far when they hold at least one worker
            (and one PS for a job with PS).  ``fill`` changes nothing for them.
        order: job ids in the order their new placements are made (a scheduler's
            priority, e.g. FIFO or Tiresias' queues); jobs not listed follow in the
            default order, ascending demand (dominant share of the cluster's total,
            ties by ``job_id``).  Kept placements are always reserved first.

    Returns:
        The placement result; equal to :func:`place_reference`.

    Raises:
        OptimusError: an unknown ``strategy``, an ``order`` id that is not a job, a
            duplicate ``job_id`` or inconsistent demands.
    """
    cap, norm, _total, kept_ids, job_order, _seen = _prepare(
        jobs, node_capacity, previous, order, strategy
    )
    free = cap.copy()
    placements, kept = _reserve_kept(jobs, previous or {}, kept_ids, free, cap)
    if strategy != "fewest":
        return _place_greedy(jobs, cap, job_order, free, placements, kept, shrink, strategy)
    order = job_order
    groups = _group_rows(np.hstack([cap, free]), cap.shape[0] // 4)
    if groups is not None:
        return _place_buckets(jobs, cap, norm, order, free, placements, kept, groups, shrink, fill)
    return _place_sorted(jobs, cap, norm, order, free, placements, kept, shrink, fill)


def _place_greedy(
    jobs: Sequence[PlacementRequest],
    cap: FloatArray,
    order: list[int],
    free: FloatArray,
    placements: dict[str, JobPlacement],
    kept: set[int],
    shrink: bool,
    strategy: str,
) -> PlacementResult:
    """``"spread"`` / ``"align"``: one task at a time on the best-scoring server."""
    n_nodes = cap.shape[0]
    tolcap = _TOL * cap
    inv_cap = 1.0 / np.where(cap > 0, cap, 1.0)
    unplaced: list[str] = []
    shrunk: dict[str, tuple[int, int]] = {}
    for i in order:
        if i in kept:
            continue
        j = jobs[i]
        if j.ps + j.workers == 0:
            continue
        trial = free.copy()
        ws = np.zeros(n_nodes, dtype=np.int64)
        pss = np.zeros(n_nodes, dtype=np.int64)
        m = trial.max(axis=0)
        inv_m = 1.0 / np.where(m > 0, m, 1.0)
        done = True
        for count, dem, out in ((j.workers, j.worker_demand, ws), (j.ps, j.ps_demand, pss)):
            d = np.asarray(dem, dtype=np.float64)
            for _ in range(count):
                fit = np.all(trial + tolcap >= d[None, :], axis=1)
                if not fit.any():
                    done = False
                    break
                if strategy == "spread":
                    score = (trial * inv_cap).min(axis=1)
                else:
                    score = (trial * inv_m) @ (d * inv_m)
                n = int(np.argmax(np.where(fit, score, -np.inf)))
                out[n] += 1
                trial[n] -= d
            if not done:
                break
        if not done and not (shrink and _fill_ok(j, [int(pss.sum())], [int(ws.sum())], False)):
            unplaced.append(j.job_id)
            continue
        free[:, :] = trial
        nodes = tuple(int(n) for n in np.flatnonzero(ws + pss))
        placements[j.job_id] = JobPlacement(
            job_id=j.job_id,
            nodes=nodes,
            ps_per_node=tuple(int(pss[n]) for n in nodes),
            workers_per_node=tuple(int(ws[n]) for n in nodes),
        )
        if not done:
            shrunk[j.job_id] = (int(pss.sum()), int(ws.sum()))
    return _result(jobs, placements, unplaced, kept, free, shrunk)


def _place_sorted(
    jobs: Sequence[PlacementRequest],
    cap: FloatArray,
    norm: FloatArray,
    order: list[int],
    free: FloatArray,
    placements: dict[str, JobPlacement],
    kept: set[int],
    shrink: bool,
    fill: bool,
) -> PlacementResult:
    """:func:`place` on one sorted list of server keys (any cluster)."""
    n_nodes, nr = cap.shape
    tolcap_l = (_TOL * cap).tolist()
    free_l: list[list[float]] = free.tolist()
    ftol_l = (free + _TOL * cap).tolist()
    norm_l = norm.tolist()
    scale = _key_scale(nr)
    top = math.floor(float(nr) * scale) + 1
    idx = np.arange(n_nodes, dtype=np.int64)
    comp: list[int] = np.sort(((top - _np_node_key(free, norm, scale)) << _IDX_BITS) | idx).tolist()
    mask = (1 << _IDX_BITS) - 1
    comp_of: dict[int, int] = {c & mask: c for c in comp} if fill else {}
    dirty: set[int] = set()
    ftol_np = (free + _TOL * cap) if fill else np.zeros((0, nr))
    comp_np = np.zeros(n_nodes, dtype=np.int64)
    if fill:
        for c in comp:
            comp_np[c & mask] = c
    shapes: dict[tuple[object, ...], tuple[int, dict[int, list[list[float]]]]] = {}
    blocks: dict[tuple[object, ...], npt.NDArray[np.float64]] = {}
    splits: dict[tuple[int, int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
    unplaced: list[str] = []
    shrunk: dict[str, tuple[int, int]] = {}
    insort = bisect.insort

    def search(j: PlacementRequest) -> tuple[int, list[list[float]]]:
        """Smallest k whose even spread over the first k servers fits, and its loads."""
        shape = (j.ps, j.workers, j.ps_demand, j.worker_demand)
        info = shapes.get(shape)
        if info is None:
            info = (_k_lower(j, norm_l), {})
            shapes[shape] = info
        k_lb, by_k = info
        kmax = min(n_nodes, j.ps + j.workers)
        for k in range(k_lb, min(kmax, _SMALL_K) + 1):
            got = by_k.get(k)
            if got is None:
                got = _rows(j, k, nr)
                by_k[k] = got
            ok = True
            for q in range(k):
                fr = ftol_l[comp[q] & mask]
                rq = got[q]
                for r in range(nr):
                    if rq[r] > fr[r]:
                        ok = False
                        break
                if not ok:
                    break
            if ok:
                return k, got
        k_lo = max(_SMALL_K + 1, k_lb)
        block = 32
        while k_lo <= kmax:
            k_hi = min(kmax, k_lo + block - 1)
            ck = (shape, k_lo, k_hi)
            load = blocks.get(ck)
            if load is None:
                ks = np.arange(k_lo, k_hi + 1, dtype=np.int64)
                ps_m = _split_matrix(j.ps, ks, k_hi, extra_last=True)
                w_m = _split_matrix(j.workers, ks, k_hi)
                load = ps_m[:, :, None] * np.array(j.ps_demand) + w_m[:, :, None] * np.array(
                    j.worker_demand
                )
                blocks[ck] = load
            fr_a = np.array([ftol_l[c & mask] for c in comp[:k_hi]], dtype=np.float64)
            okv = np.flatnonzero((load <= fr_a[None, :, :]).all(axis=(1, 2)))
            if okv.size:
                k = k_lo + int(okv[0])
                got = by_k.get(k) or _rows(j, k, nr)
                by_k[k] = got
                return k, got
            k_lo = k_hi + 1
            block *= 4
        return 0, []

    def do_fill(j: PlacementRequest) -> bool:
        """Fill fallback (see :func:`_fill_nodes`) on the servers in key order."""
        # bring the numpy mirrors up to date, then visit (in key order) only the servers
        # that can hold at least one of the job's tasks: the others take nothing
        if dirty:
            rows = list(dirty)
            dirty.clear()
            ftol_np[rows] = [ftol_l[nd] for nd in rows]
            comp_np[rows] = [comp_of[nd] for nd in rows]
        ok = np.zeros(n_nodes, dtype=bool)
        for d, cnt in ((j.worker_demand, j.workers), (j.ps_demand, j.ps)):
            if cnt > 0:
                holds = np.all(ftol_np >= np.asarray(d)[None, :], axis=1)
                if not holds.any():
                    return False  # not even one task of this kind fits anywhere
                ok |= holds
        cand = np.flatnonzero(ok)
        cand = cand[np.argsort(comp_np[cand])]
        nodes_f, pss_f, wss_f, complete = _fill_nodes(j, cand.tolist(), free_l, tolcap_l)
        if not (complete or (shrink and _fill_ok(j, pss_f, wss_f, complete))):
            return False
        for nd, pp, ww in zip(nodes_f, pss_f, wss_f, strict=True):
            fr = free_l[nd]
            old = comp_of[nd]
            del comp[bisect.bisect_left(comp, old)]
            ssum = 0.0
            for r in range(nr):
                v = fr[r] - (pp * j.ps_demand[r] + ww * j.worker_demand[r])
                fr[r] = v
                ftol_l[nd][r] = v + tolcap_l[nd][r]
                ssum = ssum + v / norm_l[r]
            new = ((top - math.floor(ssum * scale)) << _IDX_BITS) | nd
            comp_of[nd] = new
            dirty.add(nd)
            insort(comp, new)
        placements[j.job_id] = JobPlacement(
            job_id=j.job_id,
            nodes=tuple(nodes_f),
            ps_per_node=tuple(pss_f),
            workers_per_node=tuple(wss_f),
        )
        if not complete:
            shrunk[j.job_id] = (sum(pss_f), sum(wss_f))
        return True

    for i in order:
        if i in kept:
            continue
        j = jobs[i]
        total = j.ps + j.workers
        if total == 0:
            continue
        cur: PlacementRequest | None = j
        chosen = 0
        rows: list[list[float]] = []
        if fill:
            chosen, rows = search(j)
            if chosen == 0:
                if do_fill(j):
                    continue
                unplaced.append(j.job_id)
                continue
        while cur is not None and not chosen:
            chosen, rows = search(cur)
            if chosen or not shrink:
                break
            cur = _shrink(cur)
        if chosen == 0 or cur is None:
            unplaced.append(j.job_id)
            continue
        if cur is not j:
            shrunk[j.job_id] = (cur.ps, cur.workers)
        nl = [c & mask for c in comp[:chosen]]
        del comp[:chosen]
        for q, nd in enumerate(nl):
            fr = free_l[nd]
            ft = ftol_l[nd]
            tc = tolcap_l[nd]
            lq = rows[q]
            ssum = 0.0
            for r in range(nr):
                v = fr[r] - lq[r]
                fr[r] = v
                ft[r] = v + tc[r]
                ssum = ssum + v / norm_l[r]
            new = ((top - math.floor(ssum * scale)) << _IDX_BITS) | nd
            if fill:
                comp_of[nd] = new
                dirty.add(nd)
            insort(comp, new)
        sk = (cur.ps, cur.workers, chosen)
        spl = splits.get(sk)
        if spl is None:
            spl = (tuple(ps_split(cur.ps, chosen)), tuple(even_split(cur.workers, chosen)))
            splits[sk] = spl
        placements[j.job_id] = JobPlacement(
            job_id=j.job_id, nodes=tuple(nl), ps_per_node=spl[0], workers_per_node=spl[1]
        )
    return _result(
        jobs,
        placements,
        unplaced,
        kept,
        np.array(free_l, dtype=np.float64).reshape(n_nodes, nr),
        shrunk,
    )


_BIG_COUNT = 1 << 62


def _group_rows(rows: FloatArray, most: int) -> list[list[int]] | None:
    """Indices of equal rows (each group ascending, groups by first index), or ``None``
    when there are more than ``most`` groups."""
    if bool((rows == rows[0]).all()):
        return [list(range(rows.shape[0]))]
    groups: dict[tuple[float, ...], list[int]] = {}
    for n, row in enumerate(rows.tolist()):
        g = groups.get(tuple(row))
        if g is None:
            if len(groups) >= most:
                return None
            groups[tuple(row)] = [n]
        else:
            g.append(n)
    return list(groups.values())


def _place_buckets(
    jobs: Sequence[PlacementRequest],
    cap: FloatArray,
    norm: FloatArray,
    order: list[int],
    free: FloatArray,
    placements: dict[str, JobPlacement],
    kept: set[int],
    groups: list[list[int]],
    shrink: bool,
    fill: bool,
) -> PlacementResult:
    """:func:`place` on servers bucketed by free shape (few distinct free vectors).

    Servers with the same capacity and free vector are interchangeable except for their
    index, so they form one bucket (its node indices kept sorted); buckets with the same
    key form a key class, key classes are kept in a sorted list.  The server order of
    :func:`_place_sorted` (key, then index) is the key classes in order, the nodes of a
    class merged by index; a job takes a prefix of each bucket it uses.  A spread or a fill
    is checked and committed per run of equal servers instead of per server.
    """
    n_nodes, nr = cap.shape
    tolcap = _TOL * cap
    norm_l = norm.tolist()
    scale = _key_scale(nr)
    top = math.floor(float(nr) * scale) + 1
    keys0 = top - _np_node_key(free, norm, scale)
    # bucket records, indexed by bucket id
    b_free: list[tuple[float, ...]] = []
    b_ftol: list[tuple[float, ...]] = []
    b_tc: list[tuple[float, ...]] = []
    b_key: list[int] = []
    b_nodes: list[list[int]] = []
    b_cap: list[int] = []
    bid_of: dict[tuple[int, tuple[float, ...]], int] = {}
    cap_id: dict[tuple[float, ...], int] = {}
    for s, nds in enumerate(groups):
        n0 = nds[0]
        fr = tuple(free[n0].tolist())
        tc = tuple(tolcap[n0].tolist())
        ci = cap_id.setdefault(tuple(cap[n0].tolist()), len(cap_id))
        bid_of[(ci, fr)] = s
        b_free.append(fr)
        b_tc.append(tc)
        b_ftol.append(tuple((free[n0] + tolcap[n0]).tolist()))
        b_key.append(int(keys0[n0]))
        b_nodes.append(nds)
        b_cap.append(ci)
    classes: dict[int, list[int]] = {}
    for b, k in enumerate(b_key):
        classes.setdefault(k, []).append(b)
    keys = sorted(classes)
    insort = bisect.insort
    fits_memo: dict[
        tuple[tuple[float, ...], tuple[float, ...]], dict[tuple[int, int, int], bool]
    ] = {}
    dest_memo: dict[
        tuple[tuple[float, ...], tuple[float, ...]], dict[tuple[int, int, int], int]
    ] = {}
    splits: dict[tuple[int, int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
    klb_memo: dict[tuple[object, ...], int] = {}
    unplaced: list[str] = []
    shrunk: dict[str, tuple[int, int]] = {}

    def fitter(
        pd: tuple[float, ...], wd: tuple[float, ...]
    ) -> tuple[dict[tuple[int, int, int], bool], dict[tuple[int, int, int], int]]:
        dk = (pd, wd)
        fm = fits_memo.get(dk)
        if fm is None:
            fm = fits_memo[dk] = {}
            dest_memo[dk] = {}
        return fm, dest_memo[dk]

    def fits(
        fm: dict[tuple[int, int, int], bool],
        pd: tuple[float, ...],
        wd: tuple[float, ...],
        b: int,
        p: int,
        w: int,
    ) -> bool:
        ok = fm.get((b, p, w))
        if ok is None:
            ft = b_ftol[b]
            ok = all(p * pd[r] + w * wd[r] <= ft[r] for r in range(nr))
            fm[(b, p, w)] = ok
        return ok

    def walk(limit: int) -> list[tuple[int, int]]:
        """Runs ``(bucket, count)`` of the first ``limit`` servers in order (or all)."""
        runs: list[tuple[int, int]] = []
        need = limit
        for k in keys:
            bs = classes[k]
            if len(bs) == 1:
                b = bs[0]
                c = min(len(b_nodes[b]), need)
                runs.append((b, c))
                need -= c
            else:
                merged = sorted((nd, b) for b in bs for nd in b_nodes[b][:need])[:need]
                last = -1
                for _nd, b in merged:
                    if b == last:
                        runs[-1] = (b, runs[-1][1] + 1)
                    else:
                        runs.append((b, 1))
                        last = b
                need -= len(merged)
            if need <= 0:
                break
        return runs

    def spread_pieces(
        fm: dict[tuple[int, int, int], bool],
        j: PlacementRequest,
        runs: list[tuple[int, int]],
        k: int,
    ) -> list[tuple[int, int, int, int]] | None:
        """Pieces ``(bucket, count, ps, workers)`` of the even spread over k servers."""
        bw, ew = divmod(j.workers, k)
        bp, ep = divmod(j.ps, k)
        cut_p = k - ep
        pd, wd = j.ps_demand, j.worker_demand
        out: list[tuple[int, int, int, int]] = []
        pos = 0
        for b, c in runs:
            end = min(pos + c, k)
            s = pos
            while s < end:
                e = end
                if s < ew:
                    e = min(e, ew)
                    w = bw + 1
                else:
                    w = bw
                if s < cut_p:
                    e = min(e, cut_p)
                    p = bp
                else:
                    p = bp + 1
                if not fits(fm, pd, wd, b, p, w):
                    return None
                out.append((b, e - s, p, w))
                s = e
            pos = end
            if pos >= k:
                break
        return out

    def search(
        fm: dict[tuple[int, int, int], bool], j: PlacementRequest
    ) -> list[tuple[int, int, int, int]] | None:
        shape = (j.ps, j.workers, j.ps_demand, j.worker_demand)
        k_lb = klb_memo.get(shape)
        if k_lb is None:
            k_lb = klb_memo[shape] = _k_lower(j, norm_l)
        kmax = min(n_nodes, j.ps + j.workers)
        if k_lb > kmax:
            return None
        runs = walk(kmax)
        for k in range(k_lb, kmax + 1):
            got = spread_pieces(fm, j, runs, k)
            if got is not None:
                return got
        return None

    def fill_pieces(
        fm: dict[tuple[int, int, int], bool], j: PlacementRequest
    ) -> tuple[list[tuple[int, int, int, int]], bool] | None:
        """The fill fallback (:func:`_fill_nodes`) per run of equal servers."""
        pd, wd = j.ps_demand, j.worker_demand
        live = [b for k in keys for b in classes[k]]
        for d_w, cnt in ((1, j.workers), (0, j.ps)):
            if cnt > 0 and not any(fits(fm, pd, wd, b, 1 - d_w, d_w) for b in live):
                return None  # not even one task of this kind fits anywhere
        fw_memo: dict[int, int] = {}
        h_memo: dict[tuple[int, int], int] = {}

        def f_w(b: int) -> int:
            """Workers one server of bucket ``b`` holds (uncapped :func:`_fit_count`)."""
            got = fw_memo.get(b)
            if got is None:
                got = fw_memo[b] = _fit_count(b_free[b], b_tc[b], wd, _BIG_COUNT)
            return got

        def h_p(b: int, ww: int) -> int:
            """PS it holds next to ``ww`` workers (with the commit-arithmetic recheck)."""
            got = h_memo.get((b, ww))
            if got is None:
                fr, tc = b_free[b], b_tc[b]
                fr2 = [fr[r] - ww * wd[r] for r in range(nr)] if ww else list(fr)
                pp = _fit_count(fr2, tc, pd, _BIG_COUNT)
                while pp > 0 and any(pp * pd[r] + ww * wd[r] > fr[r] + tc[r] for r in range(nr)):
                    pp -= 1
                got = h_memo[(b, ww)] = pp
            return got

        lw, lp = j.workers, j.ps
        out: list[tuple[int, int, int, int]] = []
        for k in keys:
            if lw == 0 and lp == 0:
                break
            bs = classes[k]
            if len(bs) == 1:
                b = bs[0]
                left = len(b_nodes[b])
                while left and (lw or lp):
                    fw = f_w(b)
                    ww = min(lw, fw)
                    hp = h_p(b, ww) if lp else 0
                    pp = min(lp, hp)
                    if not (pp or ww):
                        break
                    # consecutive servers of the bucket take the same while both last
                    m = left
                    if ww:
                        m = min(m, lw // fw if ww == fw else 1)
                    if pp:
                        m = min(m, lp // hp if pp == hp else 1)
                    out.append((b, m, pp, ww))
                    lw -= m * ww
                    lp -= m * pp
                    left -= m
            else:
                # a bucket that takes nothing now takes nothing later (less is left), so
                # only the others are merged by index
                pos = dict.fromkeys(bs, 0)
                while lw or lp:
                    best = -1
                    bb = -1
                    for b in list(pos):
                        ww = min(lw, f_w(b))
                        if not (ww or (lp and h_p(b, ww))) or pos[b] >= len(b_nodes[b]):
                            del pos[b]
                            continue
                        nd = b_nodes[b][pos[b]]
                        if best < 0 or nd < best:
                            best, bb = nd, b
                    if bb < 0:
                        break
                    ww = min(lw, f_w(bb))
                    pp = min(lp, h_p(bb, ww)) if lp else 0
                    pos[bb] += 1
                    if out and out[-1][0] == bb and out[-1][2:] == (pp, ww):
                        out[-1] = (bb, out[-1][1] + 1, pp, ww)
                    else:
                        out.append((bb, 1, pp, ww))
                    lw -= ww
                    lp -= pp
        return out, lw == 0 and lp == 0

    def commit(
        dm: dict[tuple[int, int, int], int],
        j: PlacementRequest,
        pieces: list[tuple[int, int, int, int]],
    ) -> list[int]:
        """Move the servers of ``pieces`` to their new buckets; their indices in order."""
        off: dict[int, int] = {}
        got: list[list[int]] = []
        for b, c, _p, _w in pieces:
            o = off.get(b, 0)
            got.append(b_nodes[b][o : o + c])
            off[b] = o + c
        for b, o in off.items():
            lst = b_nodes[b]
            del lst[:o]
            if not lst:
                cl = classes[b_key[b]]
                cl.remove(b)
                if not cl:
                    del classes[b_key[b]]
                    del keys[bisect.bisect_left(keys, b_key[b])]
        pd, wd = j.ps_demand, j.worker_demand
        for (b, _c, p, w), nds in zip(pieces, got, strict=True):
            dest = dm.get((b, p, w))
            if dest is None:
                fr = b_free[b]
                nf = tuple(fr[r] - (p * pd[r] + w * wd[r]) for r in range(nr))
                ck = (b_cap[b], nf)
                dest = bid_of.get(ck)
                if dest is None:
                    dest = len(b_free)
                    bid_of[ck] = dest
                    tc = b_tc[b]
                    ssum = 0.0
                    for r in range(nr):
                        ssum = ssum + nf[r] / norm_l[r]
                    b_free.append(nf)
                    b_tc.append(tc)
                    b_ftol.append(tuple(nf[r] + tc[r] for r in range(nr)))
                    b_key.append(top - math.floor(ssum * scale))
                    b_nodes.append([])
                    b_cap.append(b_cap[b])
                dm[(b, p, w)] = dest
            lst = b_nodes[dest]
            if not lst:
                lst.extend(nds)
                kd = b_key[dest]
                cl = classes.get(kd)
                if cl is None:
                    classes[kd] = [dest]
                    insort(keys, kd)
                else:
                    cl.append(dest)
            elif len(nds) <= 4:
                for nd in nds:
                    insort(lst, nd)
            else:
                lst.extend(nds)
                lst.sort()
        return [nd for nds in got for nd in nds]

    for i in order:
        if i in kept:
            continue
        j = jobs[i]
        if j.ps + j.workers == 0:
            continue
        fm, dm = fitter(j.ps_demand, j.worker_demand)
        cur: PlacementRequest | None = j
        pieces = search(fm, j)
        if pieces is None and fill:
            got = fill_pieces(fm, j)
            if got is None or not (
                got[1]
                or (
                    shrink
                    and _fill_ok(
                        j,
                        [p for _b, c, p, _w in got[0] for _ in range(c)],
                        [w for _b, c, _p, w in got[0] for _ in range(c)],
                        got[1],
                    )
                )
            ):
                unplaced.append(j.job_id)
                continue
            pcs, complete = got
            nodes = commit(dm, j, pcs)
            pss = tuple(p for _b, c, p, _w in pcs for _ in range(c))
            wss = tuple(w for _b, c, _p, w in pcs for _ in range(c))
            placements[j.job_id] = JobPlacement(
                job_id=j.job_id, nodes=tuple(nodes), ps_per_node=pss, workers_per_node=wss
            )
            if not complete:
                shrunk[j.job_id] = (sum(pss), sum(wss))
            continue
        while pieces is None and shrink and not fill:
            cur = _shrink(cur)  # type: ignore[arg-type]
            if cur is None:
                break
            pieces = search(fm, cur)
        if pieces is None or cur is None:
            unplaced.append(j.job_id)
            continue
        if cur is not j:
            shrunk[j.job_id] = (cur.ps, cur.workers)
        nodes = commit(dm, cur, pieces)
        chosen = len(nodes)
        sk = (cur.ps, cur.workers, chosen)
        spl = splits.get(sk)
        if spl is None:
            spl = (tuple(ps_split(cur.ps, chosen)), tuple(even_split(cur.workers, chosen)))
            splits[sk] = spl
        placements[j.job_id] = JobPlacement(
            job_id=j.job_id, nodes=tuple(nodes), ps_per_node=spl[0], workers_per_node=spl[1]
        )
    out_free = np.empty((n_nodes, nr), dtype=np.float64)
    for b, lst in enumerate(b_nodes):
        if lst:
            out_free[lst] = b_free[b]
    return _result(jobs, placements, unplaced, kept, out_free, shrunk)

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

:func:`place` is the one implementation: servers with the same capacity and free vector
are bucketed, the buckets kept in key order, and spreads and fills are checked and
committed per run of equal servers (:class:`_Servers`).  The straightforward version that
re-sorts every server for every job is the test oracle
:func:`dynsched_optimus.testing.place_reference`; both return the same placement
(property tests).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from dynsched_optimus._errors import OptimusError
from dynsched_optimus._types import FloatArray

__all__ = [
    "STRATEGIES",
    "JobPlacement",
    "PlacementRequest",
    "PlacementResult",
    "even_split",
    "place",
]

_TOL = 1e-9
_IDX_BITS = 22  # up to ~4 million nodes

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
                dem = j.ps * j.ps_demand[r] + j.workers * j.worker_demand[r]
                share = max(share, dem / float(total[r]))
        keyed.append((share, j.job_id, i))
    keyed.sort()
    return [i for _s, _id, i in keyed]


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


def _k_lower(j: PlacementRequest, norm: Sequence[float]) -> int:
    """No spread over fewer servers fits: each holds at most the largest node capacity."""
    k = 1
    for r, c in enumerate(norm):
        d = j.ps * j.ps_demand[r] + j.workers * j.worker_demand[r]
        if d > 0:
            k = max(k, math.ceil(d / (c * (1 + 4 * _TOL))))
    return k


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
    """Place jobs on the fewest servers with an even PS/worker spread.

    Servers are bucketed by (capacity, free vector) and the buckets kept in key order
    (:class:`_Servers`): a job inspects only the runs of equal servers its spread or fill
    covers and moves the servers it uses to the buckets of their new shape, so a job
    costs about ``O(runs log N)`` instead of a sort of all ``N`` servers.  Fit checks and
    destination buckets are cached per demand shape across jobs.

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
        The placement result; equal to the test oracle
        :func:`dynsched_optimus.testing.place_reference`.

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
    fewest = _Fewest(cap, norm, free, placements, shrink=shrink, fill=fill)
    for i in job_order:
        j = jobs[i]
        if i not in kept and j.ps + j.workers > 0:
            fewest.place(j)
    free_after = fewest.servers.free_matrix()
    return _result(jobs, placements, fewest.unplaced, kept, free_after, fewest.shrunk)


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


_BIG_COUNT = 1 << 62

#: a run of equal servers in a spread or a fill: ``(bucket, servers, ps, workers)``
_Piece = tuple[int, int, int, int]
_Memo = dict[tuple[int, int, int], bool]
_Dest = dict[tuple[int, int, int], int]


def _group_rows(rows: FloatArray) -> list[list[int]]:
    """Indices of equal rows, each group ascending, groups by first index."""
    if bool((rows == rows[0]).all()):
        return [list(range(rows.shape[0]))]
    groups: dict[tuple[float, ...], list[int]] = {}
    for n, row in enumerate(rows.tolist()):
        groups.setdefault(tuple(row), []).append(n)
    return list(groups.values())


class _Servers:
    """The servers in placement order, bucketed by (capacity, free vector).

    Servers with the same capacity and free vector are interchangeable except for their
    index, so they form one bucket (its node indices kept sorted); a bucket's shape never
    changes, a server that takes load moves to the bucket of its new shape.  Buckets with
    the same key (free capacity, see the module docstring) form a key class; the keys of
    the non-empty classes are kept in a sorted list.  The server order (key, then index) is
    the key classes in order, the nodes of a class merged by index; a job takes a prefix
    of each bucket it uses, so spreads and fills are checked and committed per run of
    equal servers.  A numpy mirror of the buckets' free vectors (plus tolerance) lets a
    fill visit only the buckets that hold at least one of the job's tasks.
    """

    def __init__(self, cap: FloatArray, free: FloatArray, norm: FloatArray) -> None:
        self.n_nodes, self.nr = cap.shape
        self.norm = norm.tolist()
        self.scale = _key_scale(self.nr)
        self.top = math.floor(float(self.nr) * self.scale) + 1
        self.free: list[tuple[float, ...]] = []
        self.ftol: list[tuple[float, ...]] = []
        self.tc: list[tuple[float, ...]] = []
        self.key: list[int] = []
        self.nodes: list[list[int]] = []
        self.cap_id: list[int] = []
        self.bid_of: dict[tuple[int, tuple[float, ...]], int] = {}
        self.classes: dict[int, list[int]] = {}
        self.keys: list[int] = []
        self._ftol_np = np.empty((self.nr, 16), dtype=np.float64)  # column per bucket
        self._alive = np.zeros(16, dtype=bool)
        self._key_np = np.zeros(16, dtype=np.int64)
        self.fits_memo: dict[tuple[tuple[float, ...], tuple[float, ...]], tuple[_Memo, _Dest]] = {}
        self.klb_memo: dict[tuple[object, ...], int] = {}
        tolcap = _TOL * cap
        keys0 = (self.top - _np_node_key(free, norm, self.scale)).tolist()
        cap_ids: dict[tuple[float, ...], int] = {}
        for nds in _group_rows(np.hstack([cap, free])):
            n0 = nds[0]
            ci = cap_ids.setdefault(tuple(cap[n0].tolist()), len(cap_ids))
            fr = tuple(free[n0].tolist())
            b = self._new_bucket(ci, fr, tuple(tolcap[n0].tolist()), int(keys0[n0]))
            self._put(b, nds)

    def _new_bucket(self, ci: int, fr: tuple[float, ...], tc: tuple[float, ...], key: int) -> int:
        b = len(self.free)
        self.bid_of[(ci, fr)] = b
        self.free.append(fr)
        self.tc.append(tc)
        ft = tuple(fr[r] + tc[r] for r in range(self.nr))
        self.ftol.append(ft)
        self.key.append(key)
        self.nodes.append([])
        self.cap_id.append(ci)
        if b >= self._alive.size:
            grow = self._alive.size
            self._ftol_np = np.hstack([self._ftol_np, np.empty((self.nr, grow))])
            self._alive = np.concatenate([self._alive, np.zeros(grow, dtype=bool)])
            self._key_np = np.concatenate([self._key_np, np.zeros(grow, dtype=np.int64)])
        self._ftol_np[:, b] = ft
        self._key_np[b] = key
        return b

    def memos(self, j: PlacementRequest) -> tuple[_Memo, _Dest]:
        """Per demand shape: which ``(bucket, ps, workers)`` fit, and where they lead."""
        dk = (j.ps_demand, j.worker_demand)
        got = self.fits_memo.get(dk)
        if got is None:
            got = self.fits_memo[dk] = ({}, {})
        return got

    def fits(self, fm: _Memo, j: PlacementRequest, b: int, p: int, w: int) -> bool:
        """Whether ``p`` PS and ``w`` workers of ``j`` fit on a server of bucket ``b``."""
        ok = fm.get((b, p, w))
        if ok is None:
            ft = self.ftol[b]
            pd, wd = j.ps_demand, j.worker_demand
            ok = all(p * pd[r] + w * wd[r] <= ft[r] for r in range(self.nr))
            fm[(b, p, w)] = ok
        return ok

    # -- the even spread (Theorem 1)
    def walk(self, limit: int) -> list[tuple[int, int]]:
        """Runs ``(bucket, count)`` of the first ``limit`` servers in order (or all)."""
        runs: list[tuple[int, int]] = []
        need = limit
        for k in self.keys:
            bs = self.classes[k]
            if len(bs) == 1:
                b = bs[0]
                c = min(len(self.nodes[b]), need)
                runs.append((b, c))
                need -= c
            else:
                merged = sorted((nd, b) for b in bs for nd in self.nodes[b][:need])[:need]
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
        self, fm: _Memo, j: PlacementRequest, runs: list[tuple[int, int]], k: int
    ) -> list[_Piece] | None:
        """Pieces of the even spread of ``j`` over the first ``k`` servers, if it fits."""
        bw, ew = divmod(j.workers, k)
        bp, ep = divmod(j.ps, k)
        cut_p = k - ep
        out: list[_Piece] = []
        pos = 0
        for b, c in runs:
            end = min(pos + c, k)
            s = pos
            while s < end:
                # split the run where the worker or the PS count per server changes
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
                if not self.fits(fm, j, b, p, w):
                    return None
                out.append((b, e - s, p, w))
                s = e
            pos = end
            if pos >= k:
                break
        return out

    def search(self, fm: _Memo, j: PlacementRequest) -> list[_Piece] | None:
        """The even spread over the fewest leading servers that holds ``j``, if any."""
        shape = (j.ps, j.workers, j.ps_demand, j.worker_demand)
        k_lb = self.klb_memo.get(shape)
        if k_lb is None:
            k_lb = self.klb_memo[shape] = _k_lower(j, self.norm)
        kmax = min(self.n_nodes, j.ps + j.workers)
        if k_lb > kmax:
            return None
        runs = self.walk(kmax)
        for k in range(k_lb, kmax + 1):
            got = self.spread_pieces(fm, j, runs, k)
            if got is not None:
                return got
        return None

    # -- the fill fallback
    def fill_candidates(self, j: PlacementRequest) -> Iterator[list[int]] | None:
        """The buckets that hold at least one task of ``j``, grouped by key in order
        (``None`` when not even one task of some kind fits anywhere)."""
        n = len(self.free)
        ftol = self._ftol_np[:, :n]
        ok = np.zeros(n, dtype=bool)
        for d, cnt in ((j.worker_demand, j.workers), (j.ps_demand, j.ps)):
            if cnt > 0:
                holds = self._alive[:n].copy()
                for r, x in enumerate(d):
                    holds &= ftol[r] >= x
                if not holds.any():
                    return None
                ok |= holds
        cand = np.flatnonzero(ok)
        return self._key_groups(cand[np.argsort(self._key_np[cand], kind="stable")].tolist())

    def _key_groups(self, cand: list[int]) -> Iterator[list[int]]:
        """Runs of equal key of ``cand`` (sorted by key), lazily: a fill stops early."""
        key = self.key
        i, n = 0, len(cand)
        while i < n:
            k = key[cand[i]]
            e = i + 1
            while e < n and key[cand[e]] == k:
                e += 1
            yield cand[i:e]
            i = e

    def fill_pieces(self, j: PlacementRequest) -> tuple[list[_Piece], bool] | None:
        """The fill fallback: servers in order, each takes as many of the remaining
        workers as fit, then as many of the remaining PS; pieces and whether complete."""
        groups = self.fill_candidates(j)
        if groups is None:
            return None
        counts = _FillCounts(self, j)
        left = [j.workers, j.ps]
        out: list[_Piece] = []
        for bs in groups:
            if left == [0, 0]:
                break
            if len(bs) == 1:
                self._fill_bucket(bs[0], counts, left, out)
            else:
                self._fill_class(bs, counts, left, out)
        return out, left == [0, 0]

    def _fill_bucket(self, b: int, counts: _FillCounts, left: list[int], out: list[_Piece]) -> None:
        """Fill the servers of one bucket (a key class of its own) in index order."""
        lw, lp = left
        avail = len(self.nodes[b])
        while avail and (lw or lp):
            fw = counts.workers(b)
            ww = min(lw, fw)
            hp = counts.ps(b, ww) if lp else 0
            pp = min(lp, hp)
            if not (pp or ww):
                break
            # consecutive servers of the bucket take the same while both last
            m = avail
            if ww:
                m = min(m, lw // fw if ww == fw else 1)
            if pp:
                m = min(m, lp // hp if pp == hp else 1)
            out.append((b, m, pp, ww))
            lw -= m * ww
            lp -= m * pp
            avail -= m
        left[:] = [lw, lp]

    def _fill_class(
        self, bs: list[int], counts: _FillCounts, left: list[int], out: list[_Piece]
    ) -> None:
        """Fill the servers of several buckets with one key, merged by node index (a
        bucket that takes nothing now takes nothing later: less is left)."""
        lw, lp = left
        pos = dict.fromkeys(bs, 0)
        while lw or lp:
            best = bb = -1
            for b in list(pos):
                ww = min(lw, counts.workers(b))
                if not (ww or (lp and counts.ps(b, ww))) or pos[b] >= len(self.nodes[b]):
                    del pos[b]
                    continue
                nd = self.nodes[b][pos[b]]
                if best < 0 or nd < best:
                    best, bb = nd, b
            if bb < 0:
                break
            ww = min(lw, counts.workers(bb))
            pp = min(lp, counts.ps(bb, ww)) if lp else 0
            pos[bb] += 1
            if out and out[-1][0] == bb and out[-1][2:] == (pp, ww):
                out[-1] = (bb, out[-1][1] + 1, pp, ww)
            else:
                out.append((bb, 1, pp, ww))
            lw -= ww
            lp -= pp
        left[:] = [lw, lp]

    # -- committing
    def commit(self, dm: _Dest, j: PlacementRequest, pieces: list[_Piece]) -> list[int]:
        """Move the servers of ``pieces`` to their new buckets; their indices in order."""
        got = self._take(pieces)
        for (b, _c, p, w), nds in zip(pieces, got, strict=True):
            dest = dm.get((b, p, w))
            if dest is None:
                dest = dm[(b, p, w)] = self._dest(j, b, p, w)
            self._put(dest, nds)
        return [nd for nds in got for nd in nds]

    def _take(self, pieces: list[_Piece]) -> list[list[int]]:
        """Remove the servers of ``pieces`` (a prefix of each bucket) from their buckets."""
        off: dict[int, int] = {}
        got: list[list[int]] = []
        for b, c, _p, _w in pieces:
            o = off.get(b, 0)
            got.append(self.nodes[b][o : o + c])
            off[b] = o + c
        for b, o in off.items():
            lst = self.nodes[b]
            del lst[:o]
            if not lst:
                self._alive[b] = False
                cl = self.classes[self.key[b]]
                cl.remove(b)
                if not cl:
                    del self.classes[self.key[b]]
                    del self.keys[bisect.bisect_left(self.keys, self.key[b])]
        return got

    def _dest(self, j: PlacementRequest, b: int, p: int, w: int) -> int:
        """The bucket a server of bucket ``b`` moves to when it takes ``p`` PS, ``w`` workers."""
        pd, wd, nr = j.ps_demand, j.worker_demand, self.nr
        fr = self.free[b]
        nf = tuple(fr[r] - (p * pd[r] + w * wd[r]) for r in range(nr))
        dest = self.bid_of.get((self.cap_id[b], nf))
        if dest is None:
            ssum = 0.0
            for r in range(nr):
                ssum = ssum + nf[r] / self.norm[r]
            key = self.top - math.floor(ssum * self.scale)
            dest = self._new_bucket(self.cap_id[b], nf, self.tc[b], key)
        return dest

    def _put(self, dest: int, nds: list[int]) -> None:
        """Add servers (ascending indices) to bucket ``dest``."""
        lst = self.nodes[dest]
        if not lst:
            lst.extend(nds)
            self._alive[dest] = True
            kd = self.key[dest]
            cl = self.classes.get(kd)
            if cl is None:
                self.classes[kd] = [dest]
                bisect.insort(self.keys, kd)
            else:
                cl.append(dest)
        elif len(nds) <= 4:
            for nd in nds:
                bisect.insort(lst, nd)
        else:
            lst.extend(nds)
            lst.sort()

    def free_matrix(self) -> FloatArray:
        """Free resources per node, shape ``(nodes, resources)``."""
        out = np.empty((self.n_nodes, self.nr), dtype=np.float64)
        for b, lst in enumerate(self.nodes):
            if lst:
                out[lst] = self.free[b]
        return out


class _FillCounts:
    """Per job: how many workers a server of a bucket holds, and how many PS beside them."""

    __slots__ = ("_fw", "_hp", "j", "servers")

    def __init__(self, servers: _Servers, j: PlacementRequest) -> None:
        self.servers = servers
        self.j = j
        self._fw: dict[int, int] = {}
        self._hp: dict[tuple[int, int], int] = {}

    def workers(self, b: int) -> int:
        """Workers one server of bucket ``b`` holds (uncapped :func:`_fit_count`)."""
        got = self._fw.get(b)
        if got is None:
            s = self.servers
            got = self._fw[b] = _fit_count(s.free[b], s.tc[b], self.j.worker_demand, _BIG_COUNT)
        return got

    def ps(self, b: int, ww: int) -> int:
        """PS it holds next to ``ww`` workers (with the commit-arithmetic recheck)."""
        got = self._hp.get((b, ww))
        if got is None:
            s = self.servers
            fr, tc, nr = s.free[b], s.tc[b], s.nr
            pd, wd = self.j.ps_demand, self.j.worker_demand
            fr2 = [fr[r] - ww * wd[r] for r in range(nr)] if ww else list(fr)
            pp = _fit_count(fr2, tc, pd, _BIG_COUNT)
            while pp > 0 and any(pp * pd[r] + ww * wd[r] > fr[r] + tc[r] for r in range(nr)):
                pp -= 1
            got = self._hp[(b, ww)] = pp
        return got


def _expand(pieces: list[_Piece]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """PS and workers per server of ``pieces``."""
    pss = tuple(p for _b, c, p, _w in pieces for _ in range(c))
    wss = tuple(w for _b, c, _p, w in pieces for _ in range(c))
    return pss, wss


class _Fewest:
    """Theorem 1 placement (with the fill and shrink fallbacks) of one :func:`place` call."""

    def __init__(
        self,
        cap: FloatArray,
        norm: FloatArray,
        free: FloatArray,
        placements: dict[str, JobPlacement],
        *,
        shrink: bool,
        fill: bool,
    ) -> None:
        self.servers = _Servers(cap, free, norm)
        self.placements = placements
        self.shrink = shrink
        self.fill = fill
        self.unplaced: list[str] = []
        self.shrunk: dict[str, tuple[int, int]] = {}
        self._splits: dict[tuple[int, int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def place(self, j: PlacementRequest) -> None:
        """Place one job (or record it unplaced)."""
        fm, dm = self.servers.memos(j)
        pieces = self.servers.search(fm, j)
        if pieces is None and self.fill:
            if not self._place_fill(dm, j):
                self.unplaced.append(j.job_id)
            return
        cur: PlacementRequest | None = j
        while pieces is None and self.shrink:
            cur = _shrink(cur)  # type: ignore[arg-type]
            if cur is None:
                break
            pieces = self.servers.search(fm, cur)
        if pieces is None or cur is None:
            self.unplaced.append(j.job_id)
            return
        if cur is not j:
            self.shrunk[j.job_id] = (cur.ps, cur.workers)
        nodes = self.servers.commit(dm, cur, pieces)
        sk = (cur.ps, cur.workers, len(nodes))
        spl = self._splits.get(sk)
        if spl is None:
            spl = (tuple(ps_split(cur.ps, len(nodes))), tuple(even_split(cur.workers, len(nodes))))
            self._splits[sk] = spl
        self.placements[j.job_id] = JobPlacement(
            job_id=j.job_id, nodes=tuple(nodes), ps_per_node=spl[0], workers_per_node=spl[1]
        )

    def _place_fill(self, dm: _Dest, j: PlacementRequest) -> bool:
        """The fill fallback for ``j``; whether it was placed."""
        got = self.servers.fill_pieces(j)
        if got is None:
            return False
        pieces, complete = got
        pss, wss = _expand(pieces)
        if not (complete or (self.shrink and _fill_ok(j, list(pss), list(wss), complete))):
            return False
        nodes = self.servers.commit(dm, j, pieces)
        self.placements[j.job_id] = JobPlacement(
            job_id=j.job_id, nodes=tuple(nodes), ps_per_node=pss, workers_per_node=wss
        )
        if not complete:
            self.shrunk[j.job_id] = (sum(pss), sum(wss))
        return True

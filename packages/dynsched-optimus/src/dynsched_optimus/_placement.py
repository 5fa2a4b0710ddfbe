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
``k`` with one numpy comparison.  :func:`place_reference` is the straightforward version
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


def _key_scale(nr: int) -> float:
    # keys stay below 2**38 so that (key << _IDX_BITS) | index fits in an int64
    return float(1 << (38 - max(0, (nr - 1).bit_length())))


def _vec(value: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(x) for x in value)


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
        if any(x < 0 or not math.isfinite(x) for x in self.ps_demand + self.worker_demand):
            raise OptimusError(f"job {self.job_id!r}: demands must be finite and >= 0")


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
) -> tuple[FloatArray, FloatArray, FloatArray, list[int], list[int], dict[str, int]]:
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

    Returns:
        The placement result.
    """
    cap, norm_a, _total, kept_ids, order, _seen = _prepare(jobs, node_capacity, previous)
    n_nodes, nr = cap.shape
    free_a = cap.copy()
    placements, kept = _reserve_kept(jobs, previous or {}, kept_ids, free_a, cap)
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
    return PlacementResult(
        placements=placements,
        unplaced=tuple(unplaced),
        kept=tuple(jobs[i].job_id for i in sorted(kept, key=lambda x: jobs[x].job_id)),
        free=np.array(free, dtype=np.float64).reshape(n_nodes, nr),
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

    Returns:
        The placement result; equal to :func:`place_reference`.
    """
    cap, norm, _total, kept_ids, order, _seen = _prepare(jobs, node_capacity, previous)
    n_nodes, nr = cap.shape
    free = cap.copy()
    placements, kept = _reserve_kept(jobs, previous or {}, kept_ids, free, cap)
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
    return PlacementResult(
        placements=placements,
        unplaced=tuple(unplaced),
        kept=tuple(jobs[i].job_id for i in sorted(kept, key=lambda x: jobs[x].job_id)),
        free=np.array(free_l, dtype=np.float64).reshape(n_nodes, nr),
        shrunk=shrunk,
    )

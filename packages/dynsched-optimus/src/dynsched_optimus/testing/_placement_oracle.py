"""The straightforward placement: the executable specification of :func:`place`.

Every job re-sorts all servers by free capacity and tries the even spreads over the
first ``k`` of them, ``k = 1, 2, ...`` (``O(J N log N)``); no caches, no buckets.  The
property tests check :func:`dynsched_optimus.place` against it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from dynsched_optimus._placement import (
    _TOL,
    JobPlacement,
    PlacementRequest,
    PlacementResult,
    _fill_ok,
    _fit_count,
    _k_lower,
    _key_scale,
    _place_greedy,
    _prepare,
    _reserve_kept,
    _result,
    _shrink,
    even_split,
    ps_split,
)

__all__ = ["place_reference"]

_Rows = list[list[float]]


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
    sizes.  The arguments and the result are those of :func:`place`.
    """
    cap, norm_a, _total, kept_ids, job_order, _seen = _prepare(
        jobs, node_capacity, previous, order, strategy
    )
    n_nodes, nr = cap.shape
    free_a = cap.copy()
    placements, kept = _reserve_kept(jobs, previous or {}, kept_ids, free_a, cap)
    if strategy != "fewest":
        return _place_greedy(jobs, cap, job_order, free_a, placements, kept, shrink, strategy)
    free = free_a.tolist()
    capl = cap.tolist()
    norm = norm_a.tolist()
    scale = _key_scale(nr)
    unplaced: list[str] = []
    shrunk: dict[str, tuple[int, int]] = {}
    for i in job_order:
        j = jobs[i]
        if i in kept or j.ps + j.workers == 0:
            continue
        # servers by descending free capacity (ties: lower index first), re-sorted per job
        by_free = sorted(range(n_nodes), key=lambda n: (-_node_key(free[n], norm, scale), n))
        if fill and not _first_spread(j, by_free, free, capl, norm):
            got = _fill(j, by_free, free, capl, shrink)
        else:
            got = _spread(j, by_free, free, capl, norm, shrink)
        if got is None:
            unplaced.append(j.job_id)
            continue
        placements[j.job_id] = got
        if (got.ps, got.workers) != (j.ps, j.workers):
            shrunk[j.job_id] = (got.ps, got.workers)
    free_after = np.array(free, dtype=np.float64).reshape(n_nodes, nr)
    return _result(jobs, placements, unplaced, kept, free_after, shrunk)


def _node_key(free_row: Sequence[float], norm: Sequence[float], scale: float) -> int:
    s = 0.0
    for f, c in zip(free_row, norm, strict=True):
        s = s + f / c
    return math.floor(s * scale)


def _first_spread(
    j: PlacementRequest, by_free: Sequence[int], free: _Rows, capl: _Rows, norm: Sequence[float]
) -> int:
    """The fewest leading servers of ``by_free`` an even spread of ``j`` fits on (0: none)."""
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
            return k
    return 0


def _spread(
    j: PlacementRequest,
    by_free: Sequence[int],
    free: _Rows,
    capl: _Rows,
    norm: Sequence[float],
    shrink: bool,
) -> JobPlacement | None:
    """Theorem 1: the even spread over the fewest leading servers (with ``shrink``, of
    the largest job one task at a time smaller that fits), committed to ``free``."""
    cur: PlacementRequest | None = j
    chosen = 0
    while cur is not None:
        chosen = _first_spread(cur, by_free, free, capl, norm)
        if chosen or not shrink:
            break
        cur = _shrink(cur)
    if chosen == 0 or cur is None:
        return None
    ps_s = ps_split(cur.ps, chosen)
    w_s = even_split(cur.workers, chosen)
    nodes = list(by_free[:chosen])
    _commit(cur, nodes, ps_s, w_s, free)
    return JobPlacement(
        job_id=j.job_id, nodes=tuple(nodes), ps_per_node=tuple(ps_s), workers_per_node=tuple(w_s)
    )


def _fill(
    j: PlacementRequest, by_free: Sequence[int], free: _Rows, capl: _Rows, shrink: bool
) -> JobPlacement | None:
    """The fill fallback over ``by_free``, committed to ``free`` when it is kept."""
    tolc = [[_TOL * c for c in row] for row in capl]
    nodes, pss, wss, complete = _fill_nodes(j, by_free, free, tolc)
    if not (complete or (shrink and _fill_ok(j, pss, wss, complete))):
        return None
    _commit(j, nodes, pss, wss, free)
    return JobPlacement(
        job_id=j.job_id, nodes=tuple(nodes), ps_per_node=tuple(pss), workers_per_node=tuple(wss)
    )


def _commit(
    j: PlacementRequest, nodes: list[int], pss: list[int], wss: list[int], free: _Rows
) -> None:
    for n, pp, ww in zip(nodes, pss, wss, strict=True):
        row = free[n]
        for r in range(len(row)):
            row[r] = row[r] - (pp * j.ps_demand[r] + ww * j.worker_demand[r])


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

"""Placement helpers shared by the simulated schedulers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._jobs import SimJob
from ._spec import Placement

__all__ = ["place_fewest", "place_requests", "place_spread"]


def _fits(free: np.ndarray, use: np.ndarray) -> bool:
    return bool(np.all(use <= free + 1e-9))


def _node_order(free: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    cap = np.where(capacity > 0, capacity, 1.0)
    share = free / cap
    score = share.min(axis=1) * 10.0 + share.mean(axis=1)
    return np.lexsort((np.arange(len(free)), -score))


def _split(total: int, k: int) -> np.ndarray:
    out = np.full(k, total // k, dtype=int)
    out[: total % k] += 1
    return out


def place_fewest(
    w: int,
    p: int,
    wd: np.ndarray,
    pd: np.ndarray,
    free: np.ndarray,
    capacity: np.ndarray,
    *,
    compact: bool = False,
) -> Placement | None:
    """Fewest-servers placement with an even spread, and a fill fallback.

    ``optimus`` and ``optimus-oracle`` place their PS jobs with dynsched-optimus' own
    ``place`` (Theorem 1); this variant stays for the all-reduce (GPU) jobs, ``optimus+``
    and the baselines: it also accepts an in-order fill of ``k`` servers when the even
    spread does not fit (fragmented GPUs), and the ``compact`` rule below, which the
    package's placement does not have.

    Servers by descending free capacity; for ``k = 1..N`` the ``k`` first servers get an
    even share of workers and of PS; if the even spread does not fit, a fill of those
    ``k`` servers in order is tried before adding a server.

    Args:
        compact: only accept the fewest servers an empty cluster would need (no
            fragmented placement; ``None`` instead).

    Returns:
        The placement, or ``None`` when the tasks do not fit anywhere.
    """
    n = free.shape[0]
    order = _node_order(free, capacity)
    k_max = n
    if compact:
        empty = _fill_count(w, p, wd, pd, capacity[order])
        k_max = empty if empty is not None else n
    for k in range(1, k_max + 1):
        nodes = order[:k]
        ws = _split(w, k)
        ps = _split(p, k)[::-1] if p else np.zeros(k, dtype=int)
        use = ws[:, None] * wd[None, :] + ps[:, None] * pd[None, :]
        if _fits(free[nodes], use):
            return _mk(n, nodes, ws, ps)
        filled = _fill(w, p, wd, pd, free[nodes])
        if filled is not None:
            return _mk(n, nodes, filled[0], filled[1])
    return None


def _fill_count(w: int, p: int, wd: np.ndarray, pd: np.ndarray, capacity: np.ndarray) -> int | None:
    """Servers the tasks need on an empty cluster (largest servers first)."""
    order = np.argsort(-capacity.sum(axis=1), kind="stable")
    for k in range(1, len(capacity) + 1):
        if _fill(w, p, wd, pd, capacity[order[:k]]) is not None:
            return k
    return None


def _fill(
    w: int, p: int, wd: np.ndarray, pd: np.ndarray, free: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    free = free.copy()
    k = free.shape[0]
    ws = np.zeros(k, dtype=int)
    ps = np.zeros(k, dtype=int)
    for count, d, out in ((w, wd, ws), (p, pd, ps)):
        left = count
        for i in range(k):
            if left == 0:
                break
            pos = d > 0
            can = int(np.min(np.floor((free[i, pos] + 1e-9) / d[pos]))) if pos.any() else left
            take = min(can, left)
            out[i] += take
            free[i] -= take * d
            left -= take
        if left:
            return None
    return ws, ps


def place_spread(
    w: int,
    p: int,
    wd: np.ndarray,
    pd: np.ndarray,
    free: np.ndarray,
    capacity: np.ndarray,
) -> Placement | None:
    """Load-balancing placement: each task on the server with the most free capacity."""
    n = free.shape[0]
    free = free.copy()
    cap = np.where(capacity > 0, capacity, 1.0)
    ws = np.zeros(n, dtype=int)
    ps = np.zeros(n, dtype=int)
    tasks = [(wd, ws)] * w + [(pd, ps)] * p
    # interleave PS and workers
    tasks = sorted(tasks, key=lambda t: 0)  # stable
    for d, out in tasks:
        ok = np.all(free >= d[None, :] - 1e-9, axis=1)
        if not ok.any():
            return None
        score = np.where(ok, (free / cap).min(axis=1), -np.inf)
        i = int(np.argmax(score))
        out[i] += 1
        free[i] -= d
    return Placement(ws, ps)


def _mk(n: int, nodes: np.ndarray, ws: np.ndarray, ps: np.ndarray) -> Placement:
    w = np.zeros(n, dtype=int)
    p = np.zeros(n, dtype=int)
    w[nodes] = ws
    p[nodes] = ps
    return Placement(w, p)


def place_requests(
    requests: dict[str, tuple[int, int]],
    jobs: Sequence[SimJob],
    capacity: np.ndarray,
    *,
    mode: str = "fewest",
    keep: bool = True,
    order: Sequence[str] | None = None,
    free: np.ndarray | None = None,
) -> dict[str, Placement]:
    """Place every requested ``(workers, ps)``; jobs with unchanged counts keep their placement.

    Args:
        requests: desired task counts per job name (zero counts are skipped).
        jobs: the active jobs (for demands and current placements).
        capacity: ``(num_nodes, 4)`` capacity matrix.
        mode: ``"fewest"`` (Optimus), ``"compact"`` (fewest, never more servers than an
            empty cluster needs) or ``"spread"`` (load balancing).
        keep: keep the current placement of jobs whose counts did not change.
        order: order in which new placements are made (default: ascending demand).
        free: ``(num_nodes, 4)`` capacity still free (default: all of ``capacity``), for
            placing after other jobs.

    Returns:
        Placements of the jobs that could be placed.
    """
    by_name = {j.name: j for j in jobs}
    free = (capacity if free is None else free).astype(float).copy()
    out: dict[str, Placement] = {}
    todo = []
    for name, (w, p) in requests.items():
        if w + p <= 0:
            continue
        job = by_name[name]
        cur = job.placement
        if keep and cur is not None and cur.num_workers == w and cur.num_ps == p:
            use = cur.usage(job.worker_demand, job.ps_demand)
            if _fits(free, use):
                free -= use
                out[name] = cur
                continue
        todo.append(name)
    if order is not None:
        rank = {n: i for i, n in enumerate(order)}
        todo.sort(key=lambda n: rank.get(n, len(rank)))
    else:
        todo.sort(key=lambda n: (sum(requests[n]), n))
    for name in todo:
        job = by_name[name]
        w, p = requests[name]
        if mode == "spread":
            pl = place_spread(w, p, job.worker_demand, job.ps_demand, free, capacity)
        else:
            pl = place_fewest(
                w, p, job.worker_demand, job.ps_demand, free, capacity, compact=mode == "compact"
            )
        if pl is None:
            continue
        free -= pl.usage(job.worker_demand, job.ps_demand)
        out[name] = pl
    return out

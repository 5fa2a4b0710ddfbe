"""Test oracle: the one-task-at-a-time incremental allocator as first written (a scan of
every running job for each task taken), kept to check the fast engines of
``dynsched_optimus._incremental`` against.  Not used by the package."""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

import numpy as np
from dynsched_optimus._allocation import Allocation, AllocationJob, _check, _ranks, _time_fn
from dynsched_optimus._incremental import (
    RESTART_LOOKAHEAD,
    _max_ps,
    _max_workers,
    _mins,
    _utility,
)
from dynsched_optimus._types import FloatArray


def _fits_room(need: FloatArray, room: FloatArray) -> bool:
    """The fit test as first written (numpy; the engines use ``_fits_floats``)."""
    return bool((need <= room + 1e-9).all())


def oracle_allocate_incremental(
    jobs: Sequence[AllocationJob],
    capacity: Sequence[float],
    *,
    current: Mapping[str, tuple[int, int]],
    restart_penalty: float | Mapping[str, float] = 0.0,
    min_gain: float = 0.0,
    utility_exponent: float = 1.0,
    jct_gains: bool = False,
) -> Allocation:
    """`allocate_incremental` one task at a time (the specification of the fast engines)."""
    cap = _check(jobs, capacity)
    inc = _Incremental(
        jobs, cap, current, restart_penalty, min_gain, float(utility_exponent), jct_gains
    )
    inc.admit_waiting()
    inc.grow()
    return inc.result()


class _Incremental:
    """The state of one :func:`allocate_incremental` call: counts ``job_id -> [workers,
    ps]``, free capacity and the jobs whose tasks changed."""

    def __init__(
        self,
        jobs: Sequence[AllocationJob],
        cap: tuple[float, ...],
        current: Mapping[str, tuple[int, int]],
        restart_penalty: float | Mapping[str, float],
        min_gain: float,
        a: float,
        jct_gains: bool,
    ) -> None:
        self.jobs = jobs
        self.cap = cap
        capa = np.array(cap, dtype=np.float64)
        self.tot_safe = np.where(capa > 0, capa, np.inf)
        self.free = capa.copy()
        self.by_id = {j.job_id: j for j in jobs}
        self.rank = dict(zip((j.job_id for j in jobs), _ranks(jobs), strict=True))
        self.tfns = {j.job_id: _time_fn(j) for j in jobs}
        self.wd = {j.job_id: np.array(j.worker_demand) for j in jobs}
        self.pd = {j.job_id: np.array(j.ps_demand) for j in jobs}
        self.a = a
        self.restart_penalty = restart_penalty
        self.min_gain = min_gain
        self.jct_gains = jct_gains
        self.counts: dict[str, list[int]] = {}
        self.running: set[str] = set()
        self.changed: set[str] = set()
        for j in jobs:
            p, w = current.get(j.job_id, (0, 0))
            if w > 0 and j.remaining_steps > 0:
                self.counts[j.job_id] = [w, p]
                self.running.add(j.job_id)
                self.free -= self.demand(j.job_id, w, p)

    def demand(self, jid: str, dw: int, dp: int) -> FloatArray:
        return np.asarray(dw * self.wd[jid] + dp * self.pd[jid], dtype=np.float64)

    def t_of(self, jid: str, w: int, p: int) -> float:
        if w <= 0 or (self.by_id[jid].kind == "ps" and p <= 0):
            return math.inf
        return self.tfns[jid](p, w)

    def fu(self, jid: str, w: int, p: int, extra: float = 0.0) -> float:
        return _utility(self.t_of(jid, w, p) + extra, self.a)

    def share(self, jid: str, dw: int, dp: int) -> float:
        return max(float(np.max(self.demand(jid, dw, dp) / self.tot_safe)), 1e-12)

    def penalty(self, jid: str) -> float:
        """The restart penalty a change of ``jid``'s tasks still costs."""
        if jid in self.running and jid not in self.changed:
            if isinstance(self.restart_penalty, Mapping):  # per job; 0 for one not named
                return float(self.restart_penalty.get(jid, 0.0))
            return self.restart_penalty
        return 0.0

    def loss_of(self, jid: str, dw: int, dp: int) -> float:
        w, p = self.counts[jid]
        mw, mp = _mins(self.by_id[jid])
        if w - dw < mw or p - dp < mp:
            return math.inf
        drop = self.fu(jid, w - dw, p - dp, self.penalty(jid)) - self.fu(jid, w, p)
        return drop / self.share(jid, dw, dp)

    def _cheapest(
        self, need: FloatArray, trial: FloatArray, exclude: str, taker_rate: float
    ) -> tuple[float, int, str, int, int] | None:
        """The task (of another job) whose removal loses least and frees some of what
        is short: ``(loss, rank, job_id, workers, ps)``; a victim's restart penalty is
        charged at ``taker_rate`` (``F'(T)`` of the job taking tasks; 0 unless jct_gains)."""
        best: tuple[float, int, str, int, int] | None = None
        short = np.maximum(need - trial, 0.0)
        for jid, (w, p) in self.counts.items():
            if jid == exclude:
                continue
            mw, mp = _mins(self.by_id[jid])
            for dw, dp in ((1, 0), (0, 1)):
                if (dw and w <= mw) or (dp and p <= mp):
                    continue
                if not np.any(np.minimum(self.demand(jid, dw, dp), short) > 0):
                    continue
                loss = self.loss_of(jid, dw, dp) * self.share(jid, dw, dp)
                loss += self.penalty(jid) * taker_rate
                if best is None or (loss, self.rank[jid]) < (best[0], best[1]):
                    best = (loss, self.rank[jid], jid, dw, dp)
        return best

    def take(self, need: FloatArray, exclude: str, budget: float) -> bool:
        """Free ``need`` by removing tasks of jobs losing less than ``budget`` in total."""
        plan: list[str] = []
        taker_rate = 0.0
        if self.jct_gains:
            w, p = self.counts.get(exclude) or _mins(self.by_id[exclude])
            taker_rate = max(self.t_of(exclude, w, p), 1e-9) ** (-self.a)
        trial = self.free.copy()
        spent = 0.0
        saved = {k: list(v) for k, v in self.counts.items()}
        while not _fits_room(need, trial):
            best = self._cheapest(need, trial, exclude, taker_rate)
            if best is None or spent + best[0] >= budget:
                for k, v in saved.items():
                    self.counts[k] = v
                return False
            loss, _r, jid, dw, dp = best
            spent += loss
            self.counts[jid][0] -= dw
            self.counts[jid][1] -= dp
            trial += self.demand(jid, dw, dp)
            plan.append(jid)
        self.free = trial
        self.changed.update(plan)
        return True

    def admit_waiting(self) -> None:
        """Waiting jobs, shortest at their minimum first, get their minimum tasks."""
        waiting = [j for j in self.jobs if j.job_id not in self.counts and j.remaining_steps > 0]
        waiting.sort(key=lambda j: (self.t_of(j.job_id, *_mins(j)), self.rank[j.job_id]))
        for j in waiting:
            w0, p0 = _mins(j)
            need = self.demand(j.job_id, w0, p0)
            budget = math.inf
            if self.jct_gains and self.a > 1.0:  # F(inf) = 0: a start gains -F(T(min))
                budget = -self.fu(j.job_id, w0, p0)
            if not _fits_room(need, self.free) and not self.take(need, j.job_id, budget):
                continue
            self.free -= need
            self.counts[j.job_id] = [w0, p0]
            self.changed.add(j.job_id)

    def best_gain(self, jid: str) -> tuple[float, int, int] | None:
        """The best next task of ``jid``: ``(gain per dominant share, workers, ps)``."""
        j = self.by_id[jid]
        w, p = self.counts[jid]
        t_now = self.t_of(jid, w, p)
        base = _utility(t_now, self.a)
        pj = self.penalty(jid)
        out = None
        for dw, dp in ((1, 0), (0, 1)):
            if w + dw > _max_workers(j) or p + dp > _max_ps(j):
                continue
            t_new = self.t_of(jid, w + dw, p + dp) + pj
            g = base - _utility(t_new, self.a)
            if pj > 0:
                # a restart is paid once: credit the best of up to RESTART_LOOKAHEAD tasks
                for m in range(2, RESTART_LOOKAHEAD + 1):
                    if w + m * dw > _max_workers(j) or p + m * dp > _max_ps(j):
                        break
                    t_m = self.t_of(jid, w + m * dw, p + m * dp) + pj
                    gm = (base - _utility(t_m, self.a)) / m
                    if gm > g:
                        g, t_new = gm, t_m
            if self._below_min(g, t_now, t_new):
                continue  # not worth a task that another job may need later
            g /= self.share(jid, dw, dp)
            if out is None or g > out[0]:
                out = (g, dw, dp)
        return out

    def _below_min(self, g: float, t_now: float, t_new: float) -> bool:
        """Whether a gain ``g`` (in ``F``; time ``t_now`` to ``t_new``, restart included)
        is below ``min_gain``."""
        if not self.jct_gains:
            return g < self.min_gain
        if not math.isfinite(t_now):
            return not math.isfinite(t_new)  # a job without tasks: any start is a gain
        return (t_now - t_new) / max(t_now, 1e-9) < self.min_gain

    def _push(self, heap: list[tuple[float, int, str, int, int]], jid: str) -> None:
        bg = self.best_gain(jid)
        if bg is not None and bg[0] > 0:
            heapq.heappush(heap, (-bg[0], self.rank[jid], jid, bg[1], bg[2]))

    def grow(self) -> None:
        """One task at a time to the largest gain per dominant share (lazy heap)."""
        heap: list[tuple[float, int, str, int, int]] = []
        for jid in self.counts:
            bg = self.best_gain(jid)
            if bg is not None and bg[0] > 0:
                heap.append((-bg[0], self.rank[jid], jid, bg[1], bg[2]))
        heapq.heapify(heap)
        moves = 0
        # safety bound on the loop (each move adds one task; tasks can be taken back)
        tot = self.tot_safe
        limit = 4 * int(max(tot[np.isfinite(tot)].max(initial=1.0), 1.0)) + 4 * len(self.jobs)
        while heap and moves < limit:
            neg, _r, jid, dw, dp = heapq.heappop(heap)
            bg = self.best_gain(jid)
            if bg is None or bg[0] <= 0:
                continue
            if abs(-neg - bg[0]) > 1e-12 * max(1.0, abs(bg[0])):
                heapq.heappush(heap, (-bg[0], self.rank[jid], jid, bg[1], bg[2]))
                continue
            moves += 1
            need = self.demand(jid, dw, dp)
            if not _fits_room(need, self.free) and not self.take(
                need, jid, bg[0] * self.share(jid, dw, dp)
            ):
                continue
            self.free -= need
            self.counts[jid][0] += dw
            self.counts[jid][1] += dp
            self.changed.add(jid)
            self._push(heap, jid)

    def result(self) -> Allocation:
        tasks = {j.job_id: (0, 0) for j in self.jobs}
        used = np.zeros(len(self.cap))
        for jid, (w, p) in self.counts.items():
            tasks[jid] = (p, w)
            used += self.demand(jid, w, p)
        return Allocation(
            tasks=tasks, used=tuple(float(x) for x in used), capacity=self.cap, method="incremental"
        )

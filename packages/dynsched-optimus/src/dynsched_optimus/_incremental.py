"""Incremental, restart-aware allocation (``optimus+``, ``optimus+rw``).

:func:`allocate_incremental` is a greedy: one task at a time to the largest gain per
dominant share, from the tasks jobs hold now.  It is computed in two engines that give the
same allocation, bit for bit:

* the scalar engine (:class:`_Incremental`): a lazy max-heap of each job's next task and,
  when a task does not fit, victims found in lazy min-heaps of every running job's
  cheapest removable task, grouped by which resources the task frees and which restart
  penalty removing it still costs (one for every job, or a few with per-job penalties).
  A take costs ``O(victims log n)``, not a scan of every job;
* the vectorised fast path (:class:`_FastGrow`), used when every job has a
  :class:`~dynsched_optimus.PSSpeedModel`: a job's sequence of next tasks depends only on
  its own state while every task fits, so the chains of all jobs are computed in numpy
  rounds, merged in the order the heap would pop them (key: the running minimum of the
  chain's gains, then rank, then position) and granted in blocks whose cumulative demand
  fits, with the same float operations in the same order (utilities through the same
  libm calls as the scalar engine, free capacity by sequential subtraction).  A task that
  does not fit is handled by the scalar take; a take that succeeds changes other jobs'
  states, and the rest of the call then runs on the scalar engine from the heap the
  one-task-at-a-time greedy would hold at that point.

Both are checked against the plain one-at-a-time greedy (kept as a test oracle) on random
instances, with and without restarts, in ``tests/test_incremental_fast.py``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from dynsched_optimus._allocation import Allocation, AllocationJob, _check, _ranks, _time_fn
from dynsched_optimus._speed import PSSpeedModel
from dynsched_optimus._types import FloatArray

__all__ = ["RESTART_LOOKAHEAD", "allocate_incremental"]

#: tasks a job with a pending restart may add at once when its restart cost is credited
RESTART_LOOKAHEAD = 4

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: ``(-gain per share, rank, job_id, workers, ps, version)``: an entry of the growth heap;
#: ``version``: the job's state version the gain was computed at (-1: an older state)
HeapEntry = tuple[float, int, str, int, int, int]
#: ``(loss, rank, task kind 0 worker / 1 PS, version, job_id)``: an entry of a victim heap
VictimEntry = tuple[float, int, int, int, str]
_TASKS = ((1, 0), (0, 1))
#: how far ahead in the merge the fast path makes sure no ungenerated task comes first
_LOOKAHEAD_TASKS = 8192


def _utility(t: float, a: float) -> float:
    """``F(T)``: ``log T`` for ``a = 1``, else ``T**(1 - a) / (1 - a)`` (``a = 0``: ``T``)."""
    if not math.isfinite(t):
        return 1e18
    t = max(t, 1e-9)
    return math.log(t) if a == 1.0 else t ** (1.0 - a) / (1.0 - a)


def _utilities(t: FloatArray, a: float) -> FloatArray:
    """:func:`_utility` of every element, bit for bit: the same libm ``log``/``pow`` calls
    (numpy's own vectorised ``log`` may differ in the last bit)."""
    fin = np.isfinite(t)
    vals = np.maximum(np.where(fin, t, 1.0), 1e-9).tolist()
    if a == 1.0:
        u = np.fromiter(map(math.log, vals), dtype=np.float64, count=len(vals))
    else:
        e = 1.0 - a
        u = np.fromiter(map(pow, vals, itertools.repeat(e)), dtype=np.float64, count=len(vals))
        u = u / e
    return np.where(fin, u, 1e18)


def allocate_incremental(
    jobs: Sequence[AllocationJob],
    capacity: Sequence[float],
    *,
    current: Mapping[str, tuple[int, int]],
    restart_penalty: float | Mapping[str, float] = 0.0,
    min_gain: float = 0.0,
    utility_exponent: float = 1.0,
    jct_gains: bool = False,
) -> Allocation:
    """Restart-aware allocation from the current tasks, on ``sum F(T_j)`` (``optimus+``).

    Start from ``current`` (``job_id -> (ps, workers)``); waiting jobs (shortest
    estimated time at their minimum first: 1 PS + 1 worker, or 1 worker for an all-reduce
    job) get their minimum from free capacity or from the running jobs that lose least;
    then one task at a time goes to the largest gain ``F(T(now)) - F(T(new) + pen)`` per
    dominant share, ``F = log`` (``utility_exponent = 1``: time saved relative to the
    job's remaining time) or ``T**(1 - a) / (1 - a)``.  ``pen = restart_penalty`` (in
    seconds; a mapping ``job_id -> seconds`` gives each running job its own, 0 for a
    job it does not name) is charged once per running job whose tasks change and
    credited against the best of up to :data:`RESTART_LOOKAHEAD` more tasks; a task is
    added only when it improves ``F`` by at least ``min_gain``; a task is taken from
    another job only when the gain exceeds that job's loss (with its own restart
    penalty).  Ties: earlier
    ``arrival``, then ``job_id``.  With ``jct_gains`` (``optimus+rw``, where ``F`` has
    no natural unit of gain) the ``min_gain`` test is on the relative time saved,
    ``(T(now) - T(new) - pen) / T(now)``; the restart penalty of a job that loses a task
    is charged as seconds of the taker's time (``pen * F'(T_taker)``: a second of delay
    costs the same whoever pays it); and with ``a > 1`` a waiting job takes tasks from
    running jobs only when its start gain ``F(inf) - F(T(min))`` exceeds their losses
    (else it waits).

    With every job on a :class:`~dynsched_optimus.PSSpeedModel` the growth runs
    vectorised (see the module docstring); the allocation is the same.

    Returns:
        The allocation (``method="incremental"``).
    """
    cap = _check(jobs, capacity)
    inc = _Incremental(
        jobs, cap, current, restart_penalty, min_gain, float(utility_exponent), jct_gains
    )
    inc.admit_waiting()
    inc.grow()
    return inc.result()


def _mins(j: AllocationJob) -> tuple[int, int]:
    """``(workers, ps)`` a job needs to run."""
    return (1, 1) if j.kind == "ps" else (1, 0)


def _max_workers(j: AllocationJob) -> int:
    return j.max_workers if j.max_workers is not None else 1 << 30


def _max_ps(j: AllocationJob) -> int:
    if j.kind != "ps":
        return 0
    return j.max_ps if j.max_ps is not None else 1 << 30


def _fits_floats(need: Sequence[float], room: Sequence[float]) -> bool:
    """Whether ``need <= room + 1e-9`` in every resource (Python floats: a take's few
    resources are cheaper so than as numpy arrays; an absolute tolerance, unlike the
    aggregate allocator's relative one in ``_allocation._fits``)."""
    for n, r in zip(need, room, strict=True):  # noqa: SIM110 (a loop: no generator per call)
        if not n <= r + 1e-9:
            return False
    return True


def _fitting_run(free: FloatArray, needs: FloatArray) -> tuple[int, FloatArray]:
    """How many leading rows of ``needs`` fit one after another in ``free`` (each checked
    as :func:`_fits_floats` against what the earlier ones left), and the free capacity after
    them, computed by the same sequential subtractions as one task at a time."""
    acc = np.cumsum(np.vstack([free[None, :], -needs]), axis=0)
    ok = np.all(needs <= acc[:-1] + 1e-9, axis=1)
    bad = np.flatnonzero(~ok)
    k = int(bad[0]) if bad.size else len(needs)
    return k, acc[k].copy()


def _short_bits(need: Sequence[float], room: Sequence[float]) -> int:
    """The resources of which ``room`` holds less than ``need``, as bits."""
    return sum(1 << d for d, (n, r) in enumerate(zip(need, room, strict=True)) if n - r > 0.0)


class _Incremental:
    """The state of one :func:`allocate_incremental` call: counts ``job_id -> [workers,
    ps]``, free capacity, the jobs whose tasks changed, and the victim heaps."""

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
        n, nr = len(jobs), len(cap)
        capa = np.array(cap, dtype=np.float64)
        self.tot_safe = np.where(capa > 0, capa, np.inf)
        self.free = capa.copy()
        self.index = {j.job_id: i for i, j in enumerate(jobs)}
        self.by_id = {j.job_id: j for j in jobs}
        self.rank = dict(zip((j.job_id for j in jobs), _ranks(jobs), strict=True))
        self.wd = np.array([j.worker_demand for j in jobs], dtype=np.float64).reshape(n, nr)
        self.pd = np.array([j.ps_demand for j in jobs], dtype=np.float64).reshape(n, nr)
        # the same demands as Python floats, for the scalar engine's few-resource arithmetic
        self.wd_l: list[list[float]] = self.wd.tolist()
        self.pd_l: list[list[float]] = self.pd.tolist()
        # one task's dominant share (the only shares the greedy uses), and which
        # resources a task of each kind holds
        self.shares: tuple[list[float], list[float]] = (
            np.maximum(np.max(self.wd / self.tot_safe, axis=1, initial=0.0), 1e-12).tolist(),
            np.maximum(np.max(self.pd / self.tot_safe, axis=1, initial=0.0), 1e-12).tolist(),
        )
        bit = 1 << np.arange(nr, dtype=np.int64)
        self.masks = (((self.wd > 0) @ bit).tolist(), ((self.pd > 0) @ bit).tolist())
        self._tfns: dict[str, Callable[[int, int], float]] = {}
        self._model: tuple[tuple[int, ...], _Model] | None = None
        self.a = a
        # one penalty for every running job, or one per job (0 for a job not named)
        self.penalties: Mapping[str, float] = {}
        self.default_penalty = 0.0
        if isinstance(restart_penalty, Mapping):
            self.penalties = restart_penalty
        else:
            self.default_penalty = float(restart_penalty)
        self.min_gain = min_gain
        self.jct_gains = jct_gains
        self.counts: dict[str, list[int]] = {}
        self.running: set[str] = set()
        self.changed: set[str] = set()
        self.version: dict[str, int] = {}
        self.victims: dict[tuple[float, int], list[VictimEntry]] | None = None
        held = []
        for i, j in enumerate(jobs):
            p, w = current.get(j.job_id, (0, 0))
            if w > 0 and j.remaining_steps > 0:
                self.counts[j.job_id] = [w, p]
                self.running.add(j.job_id)
                self.version[j.job_id] = 0
                held.append((i, w, p))
        if held:  # free minus each running job's tasks, one subtraction at a time
            idx = [i for i, _w, _p in held]
            wp = np.array([(w, p) for _i, w, p in held], dtype=np.float64)
            rows = wp[:, :1] * self.wd[idx] + wp[:, 1:] * self.pd[idx]
            self.free = np.cumsum(np.vstack([self.free[None, :], -rows]), axis=0)[-1]

    # ---- job arithmetic
    def demand(self, jid: str, dw: int, dp: int) -> list[float]:
        """What one task holds (``(dw, dp)`` is ``(1, 0)`` or ``(0, 1)``), as floats."""
        i = self.index[jid]
        return self.wd_l[i] if dw else self.pd_l[i]

    def t_of(self, jid: str, w: int, p: int) -> float:
        if w <= 0 or (p <= 0 and self.by_id[jid].kind == "ps"):
            return math.inf
        fn = self._tfns.get(jid)
        if fn is None:
            fn = self._tfns[jid] = _time_fn(self.by_id[jid])
        return fn(p, w)

    def fu(self, jid: str, w: int, p: int, extra: float = 0.0) -> float:
        return _utility(self.t_of(jid, w, p) + extra, self.a)

    def share(self, jid: str, dw: int, dp: int) -> float:
        """The dominant share of one task (``(dw, dp)`` is ``(1, 0)`` or ``(0, 1)``)."""
        return self.shares[0 if dw else 1][self.index[jid]]

    def penalty(self, jid: str) -> float:
        """The restart penalty a change of ``jid``'s tasks still costs."""
        if jid in self.running and jid not in self.changed:
            return self.penalties.get(jid, self.default_penalty)
        return 0.0

    def loss_of(self, jid: str, dw: int, dp: int, f_now: float | None = None) -> float:
        """What removing one task of ``jid`` loses in ``F``, per dominant share
        (``f_now``: ``F`` at its current tasks, where already known)."""
        w, p = self.counts[jid]
        mw, mp = _mins(self.by_id[jid])
        if w - dw < mw or p - dp < mp:
            return math.inf
        if f_now is None:
            f_now = self.fu(jid, w, p)
        drop = self.fu(jid, w - dw, p - dp, self.penalty(jid)) - f_now
        return drop / self.share(jid, dw, dp)

    def model(self, rows: Sequence[int]) -> _Model:
        """The numpy step-time model of the jobs ``rows`` (kept for the next call with
        the same jobs: the victim heaps and the fast growth use the same)."""
        key = tuple(rows)
        if self._model is None or self._model[0] != key:
            self._model = (key, _Model(self, rows))
        return self._model[1]

    # ---- victim heaps
    def touch(self, jid: str) -> None:
        """``jid``'s tasks or restart status changed: its old victim entries are stale."""
        v = self.version[jid] = self.version.get(jid, 0) + 1
        if self.victims is not None:
            self._push_victim(jid, v)

    def _push_victim(self, jid: str, v: int) -> None:
        w, p = self.counts[jid]
        mw, mp = _mins(self.by_id[jid])
        group = self.penalty(jid)
        i = self.index[jid]
        f_now = self.fu(jid, w, p)
        for k, (dw, dp) in enumerate(_TASKS):
            if (dw and w <= mw) or (dp and p <= mp):
                continue
            loss = self.loss_of(jid, dw, dp, f_now) * self.shares[k][i]
            heap = self.victims.setdefault((group, self.masks[k][i]), [])  # type: ignore[union-attr]
            heapq.heappush(heap, (loss, self.rank[jid], k, v, jid))

    def _build_victims(self) -> None:
        self.victims = {}
        ids = list(self.counts)
        if not _vectorisable([self.by_id[jid] for jid in ids]):
            for jid in ids:
                self._push_victim(jid, self.version.setdefault(jid, 0))
            return
        # the same entries as _push_victim, computed in numpy with its float operations
        rows = [self.index[jid] for jid in ids]
        model = self.model(rows)
        s = np.arange(len(ids))
        cnt = np.array([self.counts[jid] for jid in ids], dtype=np.float64).reshape(-1, 2)
        w, p = cnt[:, 0], cnt[:, 1]
        pen = np.array([self.penalty(jid) for jid in ids], dtype=np.float64)
        f_now = _utilities(model.time(s, p, w), self.a)
        groups: dict[tuple[float, int], list[VictimEntry]] = {}
        for k, (dw, dp) in enumerate(_TASKS):
            ok = np.flatnonzero(w > 1 if dw else p > 1)
            drop = _utilities(model.time(ok, p[ok] - dp, w[ok] - dw) + pen[ok], self.a) - f_now[ok]
            sh = model.share[k][ok]
            loss = np.where((w[ok] - dw < 1) | (p[ok] - dp < 1), np.inf, (drop / sh) * sh)
            for o, x in zip(ok.tolist(), loss.tolist(), strict=True):
                jid = ids[o]
                key = (float(pen[o]), self.masks[k][rows[o]])
                groups.setdefault(key, []).append(
                    (x, self.rank[jid], k, self.version.setdefault(jid, 0), jid)
                )
        for heap in groups.values():
            heapq.heapify(heap)
        self.victims = groups

    def _top(self, heap: list[VictimEntry], skip: set[str]) -> VictimEntry | None:
        """The heap's cheapest current entry of a job not in ``skip``."""
        version = self.version
        while heap:
            e = heap[0]
            if e[3] != version[e[4]]:
                heapq.heappop(heap)  # stale: gone for good
                continue
            if e[4] not in skip:
                return e
            # the top is skipped (the taker, or a job this take already took from): the
            # smaller of its children is the cheapest of the rest; when that one counts,
            # it is the answer, and the heap need not be popped and rebuilt
            n = len(heap)
            if n > 1:
                c = heap[1] if n == 2 or heap[1] < heap[2] else heap[2]
                if c[3] == version[c[4]] and c[4] not in skip:
                    return c
            break
        held: list[VictimEntry] = []
        top = None
        while heap:
            e = heap[0]
            if e[3] != self.version[e[4]]:
                heapq.heappop(heap)
            elif e[4] in skip:
                held.append(heapq.heappop(heap))
            else:
                top = e
                break
        for e in held:
            heapq.heappush(heap, e)
        return top

    def _cheapest(
        self,
        need: Sequence[float],
        trial: Sequence[float],
        skip: set[str],
        tentative: set[str],
        rate: float,
    ) -> tuple[float, int, str, int, int] | None:
        """The task (of a job other than the taker) whose removal loses least and frees
        some of what is short: ``(loss, rank, job_id, workers, ps)``.  A victim's restart
        penalty is charged at ``rate`` (``F'(T)`` of the job taking tasks; 0 unless
        jct_gains).  ``skip``: the taker and ``tentative``, the jobs this take has already
        taken from, whose heap entries are outdated and which are evaluated here."""
        short = _short_bits(need, trial)
        best: tuple[float, int, int, str] | None = None
        for (group, mask), heap in self.victims.items():  # type: ignore[union-attr]
            if not mask & short:
                continue
            e = self._top(heap, skip)
            if e is None:
                continue
            loss = e[0] + group * rate
            if best is None or (loss, e[1], e[2]) < best[:3]:
                best = (loss, e[1], e[2], e[4])
        for jid in tentative:
            w, p = self.counts[jid]
            mw, mp = _mins(self.by_id[jid])
            i = self.index[jid]
            f_now: float | None = None
            for k, (dw, dp) in enumerate(_TASKS):
                if (dw and w <= mw) or (dp and p <= mp) or not self.masks[k][i] & short:
                    continue
                if f_now is None:
                    f_now = self.fu(jid, w, p)
                loss = self.loss_of(jid, dw, dp, f_now) * self.share(jid, dw, dp)
                loss += self.penalty(jid) * rate
                if best is None or (loss, self.rank[jid], k) < best[:3]:
                    best = (loss, self.rank[jid], k, jid)
        if best is None:
            return None
        dw, dp = _TASKS[best[2]]
        return best[0], best[1], best[3], dw, dp

    def take(
        self, need: FloatArray | Sequence[float], exclude: str, budget: float
    ) -> list[tuple[str, int, int]] | None:
        """Free ``need`` by removing tasks of jobs losing less than ``budget`` in total;
        the tasks taken ``(job_id, workers, ps)``, or None (nothing changed).  The free
        capacity is worked on as Python floats: the same additions as numpy's, faster
        for a few resources."""
        if self.victims is None:
            self._build_victims()
        victims = self.victims
        assert victims is not None
        if min((h[0][0] for h in victims.values() if h), default=math.inf) >= budget:
            # no task, stale entries included, loses less than the whole budget (a victim
            # loses its base loss plus a non-negative restart charge): nothing to take
            return None
        plan: list[tuple[str, int, int]] = []
        tentative: set[str] = set()
        skip = {exclude}
        rate = 0.0
        if self.jct_gains:
            w, p = self.counts.get(exclude) or _mins(self.by_id[exclude])
            rate = max(self.t_of(exclude, w, p), 1e-9) ** (-self.a)
        want: Sequence[float] = need.tolist() if isinstance(need, np.ndarray) else need
        trial: list[float] = self.free.tolist()
        spent = 0.0
        while not _fits_floats(want, trial):
            best = self._cheapest(want, trial, skip, tentative, rate)
            if best is None or spent + best[0] >= budget:
                for jid, dw, dp in plan:  # the heaps were not touched: nothing to redo
                    self.counts[jid][0] += dw
                    self.counts[jid][1] += dp
                return None
            loss, _r, jid, dw, dp = best
            spent += loss
            self.counts[jid][0] -= dw
            self.counts[jid][1] -= dp
            trial = [t + d for t, d in zip(trial, self.demand(jid, dw, dp), strict=True)]
            plan.append((jid, dw, dp))
            tentative.add(jid)
            skip.add(jid)
        self.free = np.array(trial, dtype=np.float64)
        losers = list(dict.fromkeys(jid for jid, _w, _p in plan))
        self.changed.update(losers)
        for jid in losers:
            self.touch(jid)
        return plan

    # ---- admission
    def admit_waiting(self) -> None:
        """Waiting jobs, shortest at their minimum first, get their minimum tasks."""
        waiting = [j for j in self.jobs if j.job_id not in self.counts and j.remaining_steps > 0]
        if not waiting:
            return
        t_min = [self.t_of(j.job_id, *_mins(j)) for j in waiting]
        order = sorted(range(len(waiting)), key=lambda i: (t_min[i], self.rank[waiting[i].job_id]))
        ids = [waiting[i].job_id for i in order]
        mins = [_mins(waiting[i]) for i in order]
        rows = [self.index[jid] for jid in ids]
        mw = np.array([m[0] for m in mins], dtype=np.float64)[:, None]
        mp = np.array([m[1] for m in mins], dtype=np.float64)[:, None]
        needs = mw * self.wd[rows] + mp * self.pd[rows]
        start = 0
        while start < len(ids):
            k, free = _fitting_run(self.free, needs[start:])
            self.free = free
            for jid, (w0, p0) in zip(ids[start : start + k], mins[start : start + k], strict=True):
                self._admit(jid, w0, p0)
            start += k
            if start == len(ids):
                break
            jid, (w0, p0) = ids[start], mins[start]
            budget = math.inf
            if self.jct_gains and self.a > 1.0:  # F(inf) = 0: a start gains -F(T(min))
                budget = -self.fu(jid, w0, p0)
            if self.take(needs[start], jid, budget) is not None:
                self.free -= needs[start]
                self._admit(jid, w0, p0)
            start += 1

    def _admit(self, jid: str, w0: int, p0: int) -> None:
        self.counts[jid] = [w0, p0]
        self.changed.add(jid)
        self.touch(jid)

    # ---- growth
    def best_gain(self, jid: str) -> tuple[float, int, int] | None:
        """The best next task of ``jid``: ``(gain per dominant share, workers, ps)``."""
        w, p = self.counts[jid]
        return self.gain_at(jid, w, p, self.penalty(jid))

    def gain_at(self, jid: str, w: int, p: int, pj: float) -> tuple[float, int, int] | None:
        """:meth:`best_gain` of ``jid`` holding ``w`` workers and ``p`` PS, with a restart
        penalty ``pj`` still to pay."""
        j = self.by_id[jid]
        t_now = self.t_of(jid, w, p)
        base = _utility(t_now, self.a)
        out = None
        for dw, dp in _TASKS:
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

    def entry(self, jid: str) -> HeapEntry | None:
        """``jid``'s entry in the growth heap (None: no task worth adding)."""
        bg = self.best_gain(jid)
        if bg is None or bg[0] <= 0:
            return None
        return (-bg[0], self.rank[jid], jid, bg[1], bg[2], self.version[jid])

    def grant(self, jid: str, dw: int, dp: int, need: FloatArray | Sequence[float]) -> None:
        self.free -= need
        self.counts[jid][0] += dw
        self.counts[jid][1] += dp
        self.changed.add(jid)
        self.touch(jid)

    def move_limit(self) -> int:
        """Safety bound on the growth loop (each move adds one task; tasks can be taken
        back)."""
        tot = self.tot_safe
        return 4 * int(max(tot[np.isfinite(tot)].max(initial=1.0), 1.0)) + 4 * len(self.jobs)

    def grow(self) -> None:
        """One task at a time to the largest gain per dominant share (lazy heap)."""
        limit = self.move_limit()
        moves = 0
        heap: list[HeapEntry]
        if _vectorisable([self.by_id[jid] for jid in self.counts]):
            heap, moves = _FastGrow(self).run(limit)
        else:
            heap = [e for e in map(self.entry, self.counts) if e is not None]
        heapq.heapify(heap)
        while heap and moves < limit:
            neg, _r, jid, dw, dp, ver = heapq.heappop(heap)
            if ver == self.version[jid]:
                bg: tuple[float, int, int] | None = (-neg, dw, dp)  # state unchanged since
            else:
                bg = self.best_gain(jid)
            if bg is None or bg[0] <= 0:
                continue
            if abs(-neg - bg[0]) > 1e-12 * max(1.0, abs(bg[0])):
                v = self.version[jid]
                heapq.heappush(heap, (-bg[0], self.rank[jid], jid, bg[1], bg[2], v))
                continue
            moves += 1
            need = self.demand(jid, dw, dp)
            if not _fits_floats(need, self.free.tolist()) and (
                self.take(need, jid, bg[0] * self.share(jid, dw, dp)) is None
            ):
                continue
            self.grant(jid, dw, dp, need)
            e = self.entry(jid)
            if e is not None:
                heapq.heappush(heap, e)

    def result(self) -> Allocation:
        tasks = {j.job_id: (0, 0) for j in self.jobs}
        used = np.zeros(len(self.cap))
        if self.counts:
            rows = [self.index[jid] for jid in self.counts]
            cnt = np.array(list(self.counts.values()), dtype=np.float64).reshape(-1, 2)
            held = cnt[:, :1] * self.wd[rows] + cnt[:, 1:] * self.pd[rows]
            used = np.cumsum(np.vstack([used[None, :], held]), axis=0)[-1]
            for jid, (w, p) in self.counts.items():
                tasks[jid] = (p, w)
        return Allocation(
            tasks=tasks, used=tuple(float(x) for x in used), capacity=self.cap, method="incremental"
        )


def _vectorisable(jobs: Sequence[AllocationJob]) -> bool:
    return bool(jobs) and all(j.kind == "ps" and isinstance(j.speed, PSSpeedModel) for j in jobs)


class _Model:
    """The step-time coefficients of the jobs ``rows`` (all on a PSSpeedModel), for
    numpy evaluation with the scalar engine's float operations."""

    def __init__(self, inc: _Incremental, rows: Sequence[int]) -> None:
        cvs = [inc.jobs[i].speed.coefficient_vector() for i in rows]  # type: ignore[union-attr]
        self.c = np.array([c for c, _a in cvs], dtype=np.float64).reshape(len(rows), 5)
        self.asyn = np.array([a for _c, a in cvs], dtype=bool)
        self.q = np.array([inc.jobs[i].remaining_steps for i in rows], dtype=np.float64)
        self.maxw = np.array([_max_workers(inc.jobs[i]) for i in rows], dtype=np.float64)
        self.maxp = np.array([_max_ps(inc.jobs[i]) for i in rows], dtype=np.float64)
        self.share = (
            np.array([inc.shares[0][i] for i in rows], dtype=np.float64),
            np.array([inc.shares[1][i] for i in rows], dtype=np.float64),
        )

    def time(self, s: IntArray, p: FloatArray, w: FloatArray) -> FloatArray:
        """``T(p, w)`` of jobs ``s`` (inf without a worker or a PS)."""
        c = self.c[s]
        ok = (w > 0) & (p > 0)
        ws = np.where(ok, w, 1.0)
        ps = np.where(ok, p, 1.0)
        r = c[:, 0] / ws + c[:, 1] + c[:, 2] * ws / ps + c[:, 3] * ws + c[:, 4] * ps
        t = self.q[s] * r
        t = np.where(self.asyn[s], t / ws, t)
        return np.where(ok, t, np.inf)

    def gains(
        self,
        inc: _Incremental,
        s: IntArray,
        w: FloatArray,
        p: FloatArray,
        pen: FloatArray,
        base: FloatArray,
        t_base: FloatArray,
    ) -> tuple[FloatArray, IntArray, FloatArray, FloatArray]:
        """:meth:`_Incremental.gain_at` of jobs ``s``: gain per share, task kind (0
        worker, 1 PS; -1: none), and ``F`` and ``T`` after the chosen task (NaN unless
        ``pen`` is 0).  ``base`` / ``t_base``: ``F`` / ``T`` now where known (NaN:
        computed here; the same operations as computing them anew)."""
        a = inc.a
        t_now = t_base.copy()
        t_unknown = np.isnan(t_base)
        if t_unknown.any():
            t_now[t_unknown] = self.time(s[t_unknown], p[t_unknown], w[t_unknown])
        unknown = np.isnan(base)
        if unknown.any():
            base = base.copy()
            base[unknown] = _utilities(t_now[unknown], a)
        best_g = np.full(len(s), -np.inf)
        best_k = np.full(len(s), -1, dtype=np.int64)
        f_next = np.full(len(s), np.nan)
        t_next = np.full(len(s), np.nan)
        for k, (dw, dp) in enumerate(_TASKS):
            allowed = (w + dw <= self.maxw[s]) & (p + dp <= self.maxp[s])
            t_new = self.time(s, p + dp, w + dw) + pen
            f_new = _utilities(t_new, a)
            g = base - f_new
            look = allowed & (pen > 0)
            for m in range(2, RESTART_LOOKAHEAD + 1):
                look &= (w + m * dw <= self.maxw[s]) & (p + m * dp <= self.maxp[s])
                if not look.any():
                    break
                t_m = self.time(s, p + m * dp, w + m * dw) + pen
                gm = (base - _utilities(t_m, a)) / m
                better = look & (gm > g)
                g = np.where(better, gm, g)
                t_new = np.where(better, t_m, t_new)
            if inc.jct_gains:
                fin = np.isfinite(t_now)
                with np.errstate(invalid="ignore"):
                    rel = (t_now - t_new) / np.maximum(t_now, 1e-9)
                below = np.where(fin, rel < inc.min_gain, ~np.isfinite(t_new))
            else:
                below = g < inc.min_gain
            gs = g / self.share[k][s]
            pick = allowed & ~below & ((best_k < 0) | (gs > best_g))
            best_g = np.where(pick, gs, best_g)
            best_k = np.where(pick, k, best_k)
            f_next = np.where(pick & (pen == 0), f_new, f_next)
            t_next = np.where(pick & (pen == 0), t_new, t_next)
        return best_g, best_k, f_next, t_next


class _FastGrow:
    """The growth of :meth:`_Incremental.grow` for jobs on PSSpeedModels, vectorised.

    Chains of next tasks are generated in rounds (``rounds`` per batch) ahead of the
    merge; an element is merged only once no job's ungenerated tasks can come before it
    (the frontier: an ungenerated task's key is at least its job's last running minimum).
    """

    def __init__(self, inc: _Incremental, rounds: int = 8) -> None:
        self.inc = inc
        self.ids = list(inc.counts)
        n = len(self.ids)
        self.rounds = np.full(n, rounds, dtype=np.int64)  # per job, per extension
        self.rows = [inc.index[j] for j in self.ids]
        self.model = inc.model(self.rows)
        self.rank = np.array([inc.rank[j] for j in self.ids], dtype=np.int64)
        cnt = np.array([inc.counts[j] for j in self.ids], dtype=np.float64).reshape(n, 2)
        # the generated state (ahead of the merge) and the merged state
        self.gw, self.gp = cnt[:, 0].copy(), cnt[:, 1].copy()
        self.gpen = np.array([inc.penalty(j) for j in self.ids], dtype=np.float64)
        self.mw = cnt[:, 0].copy()
        self.mp = cnt[:, 1].copy()
        self.synced_w, self.synced_p = self.mw.copy(), self.mp.copy()
        self.run_min = np.full(n, np.inf)
        self.f_now = np.full(n, np.nan)  # F at the generated state, where known
        self.t_now = np.full(n, np.nan)  # T at the generated state, where known
        self.pos = np.zeros(n, dtype=np.int64)
        self.active = np.ones(n, dtype=bool)  # chain still being generated
        self.dropped = np.zeros(n, dtype=bool)  # a task did not fit and was not taken
        self.wd = inc.wd[self.rows]
        self.pd = inc.pd[self.rows]
        # pending elements: owner, gain per share, kind, key (-run min, rank, pos)
        self.p_own = np.zeros(0, dtype=np.int64)
        self.p_g = np.zeros(0)
        self.p_k = np.zeros(0, dtype=np.int64)
        self.p_key = np.zeros(0)
        self.p_pos = np.zeros(0, dtype=np.int64)
        self.n_sorted = 0  # leading pending elements already in merge order

    def _generate(self, which: IntArray) -> None:
        """Extend the active chains among ``which``, each by up to its ``rounds``."""
        own, gs, ks, keys, poss = [], [], [], [], []
        s = which[self.active[which]]
        for r in itertools.count():
            s = s[self.rounds[s] > r]
            if not s.size:
                break
            g, k, f_next, t_next = self.model.gains(
                self.inc, s, self.gw[s], self.gp[s], self.gpen[s], self.f_now[s], self.t_now[s]
            )
            ok = (k >= 0) & (g > 0)
            self.active[s[~ok]] = False
            s, g, k = s[ok], g[ok], k[ok]
            self.f_now[s] = f_next[ok]
            self.t_now[s] = t_next[ok]
            rm = np.minimum(self.run_min[s], g)
            self.run_min[s] = rm
            own.append(s)
            gs.append(g)
            ks.append(k)
            keys.append(-rm)
            poss.append(self.pos[s].copy())
            self.pos[s] += 1
            self.gw[s] += k == 0
            self.gp[s] += k == 1
            self.gpen[s] = 0.0
        if own:
            self.p_own = np.concatenate([self.p_own, *own])
            self.p_g = np.concatenate([self.p_g, *gs])
            self.p_k = np.concatenate([self.p_k, *ks])
            self.p_key = np.concatenate([self.p_key, *keys])
            self.p_pos = np.concatenate([self.p_pos, *poss])

    def _order(self) -> IntArray:
        """The merge order of the pending elements: by key, rank, position.  The first
        ``n_sorted`` are in order already: the new ones are sorted and merged in (a full
        sort where two keys are equal)."""
        m = self.n_sorted
        new = m + np.lexsort((self.p_pos[m:], self.rank[self.p_own[m:]], self.p_key[m:]))
        a_key, b_key = self.p_key[:m], self.p_key[new]
        at = np.searchsorted(a_key, b_key, side="right") + np.arange(len(new))
        order = np.empty(len(self.p_key), dtype=np.int64)
        from_b = np.zeros(len(order), dtype=bool)
        from_b[at] = True
        order[from_b] = new
        order[~from_b] = np.arange(m)
        # equal keys of one job keep their positions (new ones come later in a chain);
        # equal keys of two jobs: rank decides, by a full sort
        key, own = self.p_key[order], self.p_own[order]
        if np.any((key[1:] == key[:-1]) & (own[1:] != own[:-1])):
            return np.lexsort((self.p_pos, self.rank[self.p_own], self.p_key))
        return order

    def _safe_count(self) -> int:
        """Sort the pending elements; how many lead every ungenerated one."""
        order = self._order()
        self.n_sorted = len(order)
        for name in ("p_own", "p_g", "p_k", "p_key", "p_pos"):
            setattr(self, name, getattr(self, name)[order])
        live = np.flatnonzero(self.active & ~self.dropped)
        if not live.size:
            return len(self.p_own)
        f_key = float(np.min(-self.run_min[live]))
        f_rank = int(np.min(self.rank[live[-self.run_min[live] == f_key]]))
        safe = (self.p_key < f_key) | ((self.p_key == f_key) & (self.rank[self.p_own] <= f_rank))
        bad = np.flatnonzero(~safe)
        return int(bad[0]) if bad.size else len(self.p_own)

    def _sync(self) -> None:
        """Write the merged counts of jobs that changed into the scalar engine."""
        inc = self.inc
        for i in np.flatnonzero((self.mw != self.synced_w) | (self.mp != self.synced_p)):
            jid = self.ids[i]
            inc.counts[jid] = [int(self.mw[i]), int(self.mp[i])]
            inc.changed.add(jid)
            inc.touch(jid)
        self.synced_w = self.mw.copy()
        self.synced_p = self.mp.copy()

    def run(self, limit: int) -> tuple[list[HeapEntry], int]:
        """Grow; returns the growth heap to go on with (empty: done) and the moves made."""
        moves = 0
        self._generate(np.arange(len(self.ids)))
        while True:
            n_safe = self._safe_count()
            start, window = 0, 64
            while start < n_safe:
                own = self.p_own[start:n_safe]
                keep = ~self.dropped[own]
                idx = np.flatnonzero(keep)[:window] + start
                if not idx.size:
                    start = n_safe
                    break
                if moves >= limit:
                    self._sync()
                    return [], moves
                idx = idx[: limit - moves]
                o, k = self.p_own[idx], self.p_k[idx]
                needs = np.where((k == 0)[:, None], self.wd[o], self.pd[o])
                fit, free = _fitting_run(self.inc.free, needs)
                self.inc.free = free
                np.add.at(self.mw, o[:fit][k[:fit] == 0], 1.0)
                np.add.at(self.mp, o[:fit][k[:fit] == 1], 1.0)
                moves += fit
                if fit == len(idx):
                    start = int(idx[-1]) + 1
                    window = min(window * 2, 4096)
                    continue
                moves += 1
                at = int(idx[fit])
                heap = self._miss(at, needs[fit])
                if heap is not None:
                    return heap, moves
                start, window = at + 1, 16
            self.p_own, self.p_g, self.p_k = (
                self.p_own[n_safe:],
                self.p_g[n_safe:],
                self.p_k[n_safe:],
            )
            self.p_key, self.p_pos = self.p_key[n_safe:], self.p_pos[n_safe:]
            self.n_sorted = len(self.p_key)
            live = np.flatnonzero(self.active & ~self.dropped)
            if not live.size and not len(self.p_own):
                self._sync()
                return [], moves
            if len(self.p_own):
                # the chains that may still come before a waiting task some way ahead,
                # each extended twice as far as the last time it held the merge back
                t = min(len(self.p_own) - 1, _LOOKAHEAD_TASKS)
                k0, r0 = float(self.p_key[t]), int(self.rank[self.p_own[t]])
                fk = -self.run_min[live]
                live = live[(fk < k0) | ((fk == k0) & (self.rank[live] < r0))]
            self.rounds[live] = np.minimum(2 * self.rounds[live], 1024)
            self._generate(live)

    def _miss(self, at: int, need: FloatArray) -> list[HeapEntry] | None:
        """The merged task ``at`` does not fit: try to take room for it.  None: the job
        drops out (as the heap would drop it); else the heap to go on with on the scalar
        engine."""
        inc = self.inc
        i = int(self.p_own[at])
        jid = self.ids[i]
        dw, dp = _TASKS[int(self.p_k[at])]
        self._sync()
        plan = inc.take(need, jid, float(self.p_g[at]) * inc.share(jid, dw, dp))
        if plan is None:
            self.dropped[i] = True
            self.active[i] = False
            return None
        inc.grant(jid, dw, dp, need)
        return self._heap_after_take(at, i, plan)

    def _heap_after_take(
        self, at: int, taker: int, plan: list[tuple[str, int, int]]
    ) -> list[HeapEntry]:
        """The heap the one-at-a-time greedy holds after a successful take: each job's
        next task as it was pushed (a victim's entry is from before it lost tasks; the
        scalar loop re-checks it when popped)."""
        inc = self.inc
        heap: list[HeapEntry] = []
        victims = {v for v, _w, _p in plan}
        e = inc.entry(self.ids[taker])
        if e is not None:
            heap.append(e)
        later = self.p_own[at + 1 :]
        owners, where = np.unique(later, return_index=True)
        keep = (owners != taker) & ~self.dropped[owners]
        first = dict(zip(owners[keep].tolist(), (where[keep] + at + 1).tolist(), strict=True))
        for o, j in first.items():
            dw, dp = _TASKS[int(self.p_k[j])]
            jid = self.ids[o]
            ver = -1 if jid in victims else inc.version[jid]
            heap.append((-float(self.p_g[j]), int(self.rank[o]), jid, dw, dp, ver))
        # the rest: chains generated no further than merged; their entries are the gains
        # at the generated state, which is the state before the take (victims included)
        rest = np.array(
            [
                o
                for o in np.flatnonzero(self.active & ~self.dropped).tolist()
                if o != taker and o not in first
            ],
            dtype=np.int64,
        )
        if rest.size:
            g, k, _f, _t = self.model.gains(
                inc,
                rest,
                self.gw[rest],
                self.gp[rest],
                self.gpen[rest],
                self.f_now[rest],
                self.t_now[rest],
            )
            for o, gi, ki in zip(rest.tolist(), g.tolist(), k.tolist(), strict=True):
                if ki >= 0 and gi > 0:
                    dw, dp = _TASKS[ki]
                    jid = self.ids[o]
                    ver = -1 if jid in victims else inc.version[jid]
                    heap.append((-gi, int(self.rank[o]), jid, dw, dp, ver))
        return heap

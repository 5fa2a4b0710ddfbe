"""Small online models with prediction intervals, refitted as observations arrive.

Used by the ``predictive`` policy; pure Python, state as plain data (checkpointable).
Each estimate says what it was fitted on (``n``) and its spread, as Optimus's speed and
convergence fits do.

- `LinearTrend`: ``y = a + b * x`` by least squares over a sliding window (the trainer's
  step time against the step index: responses grow, steps get slower), with the
  residual standard deviation as prediction interval.
- `MeanEstimate`: mean and standard deviation of a window (switch costs).
- `RateModel`: sample throughput of the rollout pool as ``X(h) = a + b * h`` for ``h``
  lent hybrid replicas, fitted from completion counts over the time the rollouter was
  saturated (every replica at its concurrency cap), Poisson intervals.
- `LoadRateModel`: the pool's completion rate as a function of the samples running,
  ``X(N, R) = N / W(N / R)`` with ``R`` routable replicas, from the mean latency
  ``W(n) = alpha + beta * n`` of a replica running ``n`` samples (Little's law; a decode
  iteration takes ``base + per_seq * running``), fitted by weighted non-negative least
  squares over every interval (saturated or not), with a residual-scaled Poisson interval.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Estimate", "LatencyFit", "LinearTrend", "LoadRateModel", "MeanEstimate", "RateModel"]


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its standard deviation and how many observations made it.

    Attributes:
        value: The estimate.
        sd: Standard deviation of the prediction (0 with fewer than 2 observations).
        n: Observations fitted.
    """

    value: float
    sd: float
    n: int

    def upper(self, z: float) -> float:
        """``value + z * sd``."""
        return self.value + z * self.sd

    def lower(self, z: float) -> float:
        """``max(0, value - z * sd)``."""
        return max(0.0, self.value - z * self.sd)


class MeanEstimate:
    """Mean and spread of the last ``window`` observations."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._xs: deque[float] = deque(maxlen=window)

    def add(self, x: float) -> None:
        """Record one observation (non-finite values are ignored)."""
        if math.isfinite(x):
            self._xs.append(float(x))

    def estimate(self) -> Estimate | None:
        """The mean with the sample standard deviation; None without data."""
        n = len(self._xs)
        if n == 0:
            return None
        mean = sum(self._xs) / n
        var = sum((x - mean) ** 2 for x in self._xs) / (n - 1) if n > 1 else 0.0
        return Estimate(mean, math.sqrt(var), n)

    def state(self) -> list[float]:
        """The window, oldest first."""
        return list(self._xs)

    def load(self, xs: Iterable[float]) -> None:
        """Restore `state`."""
        self._xs = deque((float(x) for x in xs), maxlen=self.window)


class LinearTrend:
    """``y = a + b * x`` by least squares over the last ``window`` points."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._pts: deque[tuple[float, float]] = deque(maxlen=window)

    def add(self, x: float, y: float) -> None:
        """Record one point (non-finite values are ignored)."""
        if math.isfinite(x) and math.isfinite(y):
            self._pts.append((float(x), float(y)))

    def coefficients(self) -> tuple[float, float] | None:
        """``(a, b)``; a flat line through the mean with fewer than 3 distinct ``x``."""
        n = len(self._pts)
        if n == 0:
            return None
        mx = sum(p[0] for p in self._pts) / n
        my = sum(p[1] for p in self._pts) / n
        sxx = sum((p[0] - mx) ** 2 for p in self._pts)
        if n < 3 or sxx <= 0:
            return my, 0.0
        b = sum((p[0] - mx) * (p[1] - my) for p in self._pts) / sxx
        return my - b * mx, b

    def predict(self, x: float) -> Estimate | None:
        """The fitted line at ``x`` with the residual standard deviation; None without data.

        The prediction is clamped to the range of the window's ``y`` (a trend fitted on
        a noisy window is not extrapolated beyond what was seen).
        """
        coef = self.coefficients()
        if coef is None:
            return None
        a, b = coef
        n = len(self._pts)
        ys = [p[1] for p in self._pts]
        value = min(max(a + b * x, min(ys)), max(ys))
        dof = n - 2 if n >= 3 else n - 1
        if dof <= 0:
            return Estimate(value, 0.0, n)
        rss = sum((y - (a + b * xx)) ** 2 for xx, y in self._pts)
        return Estimate(value, math.sqrt(rss / dof), n)

    def state(self) -> list[list[float]]:
        """The window's points, oldest first."""
        return [list(p) for p in self._pts]

    def load(self, pts: Iterable[Sequence[float]]) -> None:
        """Restore `state`."""
        self._pts = deque(((float(p[0]), float(p[1])) for p in pts), maxlen=self.window)


class RateModel:
    """Sample throughput ``X(h) = a + b * h`` of the rollout pool with ``h`` lent hybrids.

    Observations are per cycle: ``s``, the seconds the rollouter was saturated (every
    routable replica at its concurrency cap, so completions measure capacity, not
    demand); ``g``, the hybrid-replica-seconds lent within that time (``sum h dt``); and
    ``n``, the samples that completed in it. Work a lent replica does on requests that
    are migrated at deactivation completes later elsewhere, so the fit is per cycle, not
    per lend: ``n = a * s + b * g`` by least squares over the last ``window`` cycles
    (response lengths drift, so older cycles are dropped), with one pseudo-cycle pulling
    ``b`` towards the prior ``prior * a / standalone_replicas`` (so ``b`` is defined
    before any lend and while every cycle lends the same share). Intervals are Poisson
    (``sqrt(n) / seconds``). ``fit(..., free=False)`` instead fits one rate per replica
    with the hybrid's share fixed at the prior.
    """

    #: Saturated seconds below which no rate is estimated.
    MIN_SECONDS = 30.0

    def __init__(self, window: int) -> None:
        self.window = window
        self._cycles: deque[list[float]] = deque(maxlen=window)
        self._current: list[float] = [0.0, 0.0, 0.0]

    def add(self, h: int, seconds: float, completions: int = 0) -> None:
        """Add ``seconds`` of saturated time with ``h`` hybrid replicas lent, and completions."""
        if seconds < 0 or not math.isfinite(seconds):
            return
        self._current[0] += seconds
        self._current[1] += h * seconds
        self._current[2] += completions

    def end_cycle(self) -> None:
        """Close the current cycle (the oldest cycle beyond ``window`` is dropped)."""
        self._cycles.append(self._current)
        self._current = [0.0, 0.0, 0.0]

    def _rows(self) -> list[list[float]]:
        return [*self._cycles, self._current]

    def fit(
        self, standalone_replicas: int, prior: float, *, free: bool = True
    ) -> tuple[Estimate, Estimate] | None:
        """``(a, b)`` in samples/s; None before `MIN_SECONDS` of saturated time.

        ``free=False`` fits one parameter instead: the rate ``r`` of one replica, with
        ``a = r * standalone_replicas`` and ``b = r * prior`` (``n = r (s + prior g /
        standalone_replicas)``, every saturated second informs it). Use it when the lent
        time is rarely saturated or confounded (ramp-up after an activation, requests
        migrated at deactivation), so that ``b`` is not identified by the data.
        """
        rows = self._rows()
        s_tot = sum(r[0] for r in rows)
        g_tot = sum(r[1] for r in rows)
        n_tot = sum(r[2] for r in rows)
        if s_tot < self.MIN_SECONDS:
            return None
        rel = prior / max(1, standalone_replicas)  # b / a before data
        u = n_tot / (s_tot + rel * g_tot)  # a under the prior
        if not free:  # one rate per replica, the hybrid's at the prior's share of it
            sd_u = math.sqrt(max(n_tot, 1.0)) / (s_tot + rel * g_tot)
            return Estimate(u, sd_u, int(n_tot)), Estimate(u * rel, sd_u * rel, int(n_tot))
        # one pseudo-cycle of the mean lent time at the prior's rate
        g_p = g_tot / len(rows) if g_tot > 0 else s_tot / len(rows)
        pts = [*rows, [0.0, g_p, u * rel * g_p]]
        sss = sum(r[0] * r[0] for r in pts)
        sgg = sum(r[1] * r[1] for r in pts)
        ssg = sum(r[0] * r[1] for r in pts)
        ssn = sum(r[0] * r[2] for r in pts)
        sgn = sum(r[1] * r[2] for r in pts)
        det = sss * sgg - ssg * ssg
        if det <= 1e-12 * max(1.0, sss * sgg):
            a, b = u, u * rel
        else:
            a = (ssn * sgg - sgn * ssg) / det
            b = (sgn * sss - ssn * ssg) / det
            if a <= 0 or b < 0:  # non-negative least squares: refit on the free one
                if b < 0:
                    a, b = n_tot / s_tot, 0.0
                else:
                    a, b = u, u * rel
        sd_a = math.sqrt(max(n_tot, 1.0)) / s_tot
        sd_b = math.sqrt(max(n_tot, 1.0)) / (g_tot + g_p)
        return Estimate(a, sd_a, int(n_tot)), Estimate(b, sd_b, int(n_tot))

    def state(self) -> dict[str, Any]:
        """Cycles and the open one, as plain data."""
        return {"cycles": [list(c) for c in self._cycles], "current": list(self._current)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore `state`."""
        self._cycles = deque(([float(x) for x in c] for c in state["cycles"]), maxlen=self.window)
        cur = [float(x) for x in state["current"]]
        if len(cur) != 3 or any(len(c) != 3 for c in self._cycles):
            raise ValueError("rate cycles must be [seconds, hybrid seconds, completions]")
        self._current = cur


@dataclass(frozen=True)
class LatencyFit:
    """``W(n) = alpha + beta * n``: mean seconds a sample takes on a replica running ``n``.

    Attributes:
        alpha: Seconds at no load (``>= 0``).
        beta: Seconds added per sample running on the replica (``>= 0``).
        cov: Covariance of ``(alpha, beta)``, row-major ``[vaa, vab, vbb]`` (already
            scaled by the residual dispersion).
        n_max: Highest per-replica load fitted on (predictions are not extrapolated
            beyond it: a replica's rate is held at its rate there).
        n: Completions fitted.
    """

    alpha: float
    beta: float
    cov: tuple[float, float, float]
    n_max: float
    n: int

    def latency(self, n: float) -> Estimate:
        """``W(n)`` with its standard deviation (``n`` clamped to ``[0, n_max]``)."""
        x = min(max(n, 0.0), self.n_max)
        vaa, vab, vbb = self.cov
        var = vaa + 2.0 * x * vab + x * x * vbb
        return Estimate(self.alpha + self.beta * x, math.sqrt(max(var, 0.0)), self.n)

    def rate(self, active: float, replicas: float, share: float = 1.0) -> Estimate:
        """Samples/s of ``replicas`` replicas running ``active`` samples in all.

        ``share``: mean speed of the replicas relative to the fitted ones (hybrids at the
        prior's share). The load is spread evenly (``n = active / replicas``); above
        ``n_max`` a replica is held at its rate at ``n_max`` (never extrapolated).
        """
        if active <= 0 or replicas <= 0:
            return Estimate(0.0, 0.0, self.n)
        n = active / replicas
        w = self.latency(n)
        if w.value <= 0:
            return Estimate(math.inf, 0.0, self.n)
        per = min(n, self.n_max) / w.value  # one replica's completions/s
        value = replicas * share * per
        return Estimate(value, value * w.sd / w.value, self.n)


class LoadRateModel:
    """The rollout pool's completion rate as a function of the samples it runs.

    A replica running ``n`` samples completes them at ``n / W(n)`` per second (Little's
    law), ``W(n) = alpha + beta * n`` its mean latency: one decode iteration takes
    ``base + per_seq * running`` seconds, so a response of ``L`` tokens takes
    ``L * (base + per_seq * n)``. With ``N`` samples in flight over ``R`` routable
    replicas (even routing, ``n = N / R``) the pool completes ``X(N, R) = N / W(N / R)``
    samples per second: more in flight is faster until the decode step's per-sequence
    part dominates (``X -> R / beta``), and lending replicas to a pool whose concurrency
    is bound (by the staleness window) only helps through the smaller ``n``.

    Observations are the intervals between events: ``N`` samples in flight for ``dt``
    seconds on ``R`` routable replicas of which ``h`` are hybrids, and whether a sample
    completed at its end. They are summed per time window: a window is a contiguous
    stretch of one membership (`new_window` at every change of the routable set, and a
    new one per cycle), holding ``sum N dt`` (sample-seconds), ``sum N^2 dt`` and the
    completions ``c``. Little's law holds over a window (not per in-flight level: the
    completion hazard depends on the samples' ages, so the levels a pool passes through
    right after a window reset or during a drain are biased), and gives its mean latency
    ``W_b = E_b / c`` (``E_b`` its sample-seconds at the replicas' speed share, hybrids
    at ``prior`` of a standalone) at its sample-weighted mean load ``n_b``, and
    ``(alpha, beta)`` are fitted by weighted least squares with the Poisson weights
    ``c / W^2`` (iterated once at the fitted ``W``), constrained to be non-negative, over
    the last ``window`` cycles (response lengths drift). One pseudo-completion at ``n = 0``
    with half the mean latency regularises a fit that saw a single load level. The
    interval is the fit's covariance scaled by the residual dispersion (at least the
    Poisson one).
    """

    #: Completions below which no rate is estimated.
    MIN_COMPLETIONS = 8

    def __init__(self, window: int) -> None:
        self.window = window
        self._cycles: deque[dict[tuple[int, int, int], list[float]]] = deque(maxlen=window)
        self._current: dict[tuple[int, int, int], list[float]] = {}
        self._window_index = 0

    def new_window(self) -> None:
        """Start a new time window (the routable set changed)."""
        self._window_index += 1

    def add(
        self, active: float, replicas: int, hybrids: int, seconds: float, completions: int = 0
    ) -> None:
        """``active`` samples in flight for ``seconds`` on ``replicas`` (``hybrids`` of them)."""
        if not (active > 0 and replicas > 0 and math.isfinite(seconds) and seconds >= 0):
            return
        hybrids = min(max(0, int(hybrids)), int(replicas))
        key = (int(replicas), hybrids, self._window_index)
        row = self._current.setdefault(key, [0.0, 0.0, 0.0])
        row[0] += active * seconds
        row[1] += active * active * seconds
        row[2] += completions

    def end_cycle(self) -> None:
        """Close the current cycle (the oldest cycle beyond ``window`` is dropped)."""
        self._cycles.append(self._current)
        self._current = {}
        self._window_index = 0

    def _bins(self, prior: float) -> list[tuple[float, float, float]]:
        """``(n_b, W_b, c_b)`` of the bins with completions."""
        out = []
        for (r, h, _), (e, q, c) in (
            kv for cyc in [*self._cycles, self._current] for kv in cyc.items()
        ):
            if c <= 0 or e <= 0:
                continue
            share = (r - h + prior * h) / r
            if share <= 0:
                continue
            out.append(((q / e) / r, e * share / c, c))
        return out

    def fit(self, prior: float = 1.0) -> LatencyFit | None:
        """``W(n)`` fitted on the window; None before `MIN_COMPLETIONS` completions.

        ``prior``: speed of a hybrid replica relative to a standalone one.
        """
        bins = self._bins(prior)
        total = sum(b[2] for b in bins)
        if total < self.MIN_COMPLETIONS:
            return None
        w_mean = sum(b[1] * b[2] for b in bins) / total
        pts = [*bins, (0.0, 0.5 * w_mean, 1.0)]  # the regularising pseudo-completion
        n_max = max(b[0] for b in bins)
        alpha, beta = w_mean, 0.0
        weights = [c / (w * w) for _, w, c in pts]
        for _ in range(2):  # Poisson weights at the observed, then at the fitted, W
            alpha, beta = _nnls_line(pts, weights)
            weights = [c / max(alpha + beta * n, 1e-9 * w_mean) ** 2 for n, _, c in pts]
        s0 = sum(weights)
        s1 = sum(wt * p[0] for wt, p in zip(weights, pts, strict=True))
        s2 = sum(wt * p[0] * p[0] for wt, p in zip(weights, pts, strict=True))
        rss = sum(
            wt * (p[1] - alpha - beta * p[0]) ** 2 for wt, p in zip(weights, pts, strict=True)
        )
        dof = len(pts) - 2
        disp = max(1.0, rss / dof) if dof > 0 else 1.0
        det = s0 * s2 - s1 * s1
        if det <= 1e-12 * max(1.0, s0 * s2):  # one load level: beta is the prior's
            cov = (disp / s0, 0.0, 0.0)
        else:
            cov = (disp * s2 / det, -disp * s1 / det, disp * s0 / det)
        return LatencyFit(alpha, beta, cov, n_max, int(total))

    def state(self) -> dict[str, Any]:
        """Cycles and the open one as ``[replicas, hybrids, window, sample_s, sample2_s, c]``."""

        def rows(cyc: dict[tuple[int, int, int], list[float]]) -> list[list[float]]:
            return [[*map(float, k), *v] for k, v in sorted(cyc.items())]

        return {
            "cycles": [rows(c) for c in self._cycles],
            "current": rows(self._current),
            "window": self._window_index,
        }

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore `state`."""

        def cyc(rows: Iterable[Sequence[float]]) -> dict[tuple[int, int, int], list[float]]:
            out: dict[tuple[int, int, int], list[float]] = {}
            for r in rows:
                if len(r) != 6:
                    raise ValueError("load-rate rows must have 6 entries")
                out[(int(r[0]), int(r[1]), int(r[2]))] = [float(r[3]), float(r[4]), float(r[5])]
            return out

        cycles = deque((cyc(c) for c in state["cycles"]), maxlen=self.window)
        current = cyc(state["current"])
        self._cycles, self._current = cycles, current
        self._window_index = int(state["window"])


def _nnls_line(
    pts: Sequence[tuple[float, float, float]], weights: Sequence[float]
) -> tuple[float, float]:
    """``(alpha, beta) >= 0`` minimising ``sum w (y - alpha - beta x)^2`` over ``(x, y, _)``."""
    s0 = sum(weights)
    sx = sum(w * p[0] for w, p in zip(weights, pts, strict=True))
    sy = sum(w * p[1] for w, p in zip(weights, pts, strict=True))
    sxx = sum(w * p[0] * p[0] for w, p in zip(weights, pts, strict=True))
    sxy = sum(w * p[0] * p[1] for w, p in zip(weights, pts, strict=True))
    det = s0 * sxx - sx * sx
    if det > 1e-12 * max(1.0, s0 * sxx):
        beta = (s0 * sxy - sx * sy) / det
        alpha = (sy - beta * sx) / s0
        if alpha >= 0 and beta >= 0:
            return alpha, beta
    # a bound is active: the better of the two one-parameter fits
    cands = [(max(sy / s0, 0.0), 0.0)]
    if sxx > 0:
        cands.append((0.0, max(sxy / sxx, 0.0)))

    def loss(ab: tuple[float, float]) -> float:
        return sum(
            w * (p[1] - ab[0] - ab[1] * p[0]) ** 2 for w, p in zip(weights, pts, strict=True)
        )

    return min(cands, key=loss)

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
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Estimate", "LinearTrend", "MeanEstimate", "RateModel"]


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

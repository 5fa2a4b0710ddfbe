"""Online convergence model of Optimus: ``l(k) = 1 / (b0*k + b1) + b2``.

``k`` is the cumulative training step and ``l`` the training loss normalised by the
largest loss seen so far (so ``l`` lies in ``(0, 1]``).  For a fixed ``b2``,
``1 / (l - b2) = b0*k + b1`` is linear in ``(b0, b1)``; the fit solves that by a
(weighted) non-negative least squares for a grid of ``b2`` in ``[0, min l)``, refines
the grid around the best value and keeps the ``b2`` whose curve has the smallest
weighted squared error *in loss space*.  Rows of the linear system are weighted by
``(l - b2)^4`` so that its residuals approximate loss-space residuals.

Pipeline of :func:`fit_convergence`: outlier filter (the paper's band test over the
previous / following 5 epochs), optional averaging per epoch, down-sampling to at most
``max_points``, detection of a step learning-rate decay (the fit restarts from the last
drop), the fit, and optionally a bootstrap prediction interval for the remaining steps.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from dynsched_optimus._errors import InsufficientDataError, OptimusError
from dynsched_optimus._types import FloatArray
from dynsched_optimus._validators import int_at_least, optional_positive, positive

__all__ = [
    "ConvergenceConfig",
    "ConvergenceEstimator",
    "ConvergenceFit",
    "RemainingStepsInterval",
    "detect_lr_decay",
    "filter_outliers",
    "fit_convergence",
    "remaining_steps_interval",
]

logger = logging.getLogger(__name__)


MIN_FIT_POINTS = 3


@attrs.frozen
class ConvergenceConfig:
    """Settings of the convergence fit.

    Attributes:
        delta: convergence threshold: the job has converged at the first step ``k`` where
            the fitted normalised loss improves by less than ``delta`` over the next
            ``interval`` steps.
        interval: the step window of the ``delta`` test (e.g. the steps of one epoch).
        outlier_window: epochs before / after a point used by the outlier band (paper: 5).
        filter_outliers: apply the outlier band.
        average_per_epoch: replace the points of each epoch by their mean (needs epochs).
        sample_every: keep every n-th point (after filtering / averaging; the last point is
            always kept).
        max_points: down-sample (evenly, keeping the last point) to bound the solver input.
        recency_half_life: if set, a point ``h`` steps older than the newest weighs half as
            much (``None``: all points weigh the same, as in the paper).
        detect_lr_decay: look for a step learning-rate decay and restart the fit after it.
        decay_drop: relative drop below the 1/k prediction that counts as a decay.
        decay_window: points compared before / after a candidate drop.
        min_points_after_decay: points needed after a drop to restart the fit from it.
        b2_grid: number of ``b2`` values per search pass (two passes: coarse, refined).
    """

    delta: float = attrs.field(default=1e-3, validator=positive)
    interval: float = attrs.field(default=100.0, validator=positive)
    outlier_window: int = attrs.field(default=5, validator=int_at_least(1))
    filter_outliers: bool = True
    average_per_epoch: bool = False
    sample_every: int = attrs.field(default=1, validator=int_at_least(1))
    max_points: int = attrs.field(default=200, validator=int_at_least(MIN_FIT_POINTS))
    recency_half_life: float | None = attrs.field(default=None, validator=optional_positive)
    detect_lr_decay: bool = True
    decay_drop: float = attrs.field(default=0.2, validator=positive)
    decay_window: int = attrs.field(default=4, validator=int_at_least(2))
    min_points_after_decay: int = attrs.field(default=5, validator=int_at_least(MIN_FIT_POINTS))
    b2_grid: int = attrs.field(default=48, validator=int_at_least(4))


@attrs.frozen
class ConvergenceFit:
    """A fitted convergence curve and what it was fitted on.

    The curve is ``l(k) = 1 / (b0*(k - origin_step) + b1) + b2`` in normalised loss; the
    raw loss is ``loss_scale * l(k)``.

    Attributes:
        b0: slope coefficient (>= 0).
        b1: intercept coefficient (>= 0).
        b2: asymptotic normalised loss (>= 0).
        loss_scale: the largest loss among the fitted points (normaliser).
        origin_step: step the curve counts from (> 0 after a learning-rate decay restart).
        fit_error: root-mean-square error of the normalised loss on the fitted points.
        n_points: points given to the solver (after filtering / averaging / sampling).
        n_observed: points observed in total.
        n_outliers: points dropped by the outlier band.
        first_step: first step among the fitted points.
        last_step: last step among the fitted points.
        lr_decay_step: step of the detected learning-rate drop the fit restarted from.
    """

    b0: float
    b1: float
    b2: float
    loss_scale: float = 1.0
    origin_step: float = 0.0
    fit_error: float = 0.0
    n_points: int = 0
    n_observed: int = 0
    n_outliers: int = 0
    first_step: float = 0.0
    last_step: float = 0.0
    lr_decay_step: float | None = None

    def predict(self, step: float | npt.ArrayLike) -> FloatArray:
        """Fitted normalised loss at cumulative step(s) ``step``."""
        k = np.asarray(step, dtype=np.float64) - self.origin_step
        with np.errstate(divide="ignore"):
            return np.asarray(1.0 / (self.b0 * k + self.b1) + self.b2, dtype=np.float64)

    def predict_loss(self, step: float | npt.ArrayLike) -> FloatArray:
        """Fitted raw loss at ``step``."""
        return self.loss_scale * self.predict(step)

    def convergence_step(self, delta: float = 1e-3, interval: float = 100.0) -> float:
        """First step where the improvement over ``interval`` steps drops below ``delta``."""
        return float(_convergence_step(self.b0, self.b1, delta, interval)) + self.origin_step

    def remaining_steps(
        self, current_step: float, delta: float = 1e-3, interval: float = 100.0
    ) -> float:
        """Steps left to convergence from ``current_step`` (0 when already converged)."""
        return max(0.0, self.convergence_step(delta, interval) - current_step)


@attrs.frozen
class RemainingStepsInterval:
    """Point estimate and bootstrap interval of the remaining steps.

    Attributes:
        estimate: remaining steps of the fit on the observed points.
        low: lower quantile of the bootstrapped remaining steps.
        high: upper quantile.
        confidence: the central probability of ``[low, high]``.
        samples: number of bootstrap fits.
        fit: the fit on the observed points.
    """

    estimate: float
    low: float
    high: float
    confidence: float
    samples: int
    fit: ConvergenceFit


def _convergence_step(
    b0: FloatArray | float, b1: FloatArray | float, delta: float, interval: float
) -> FloatArray:
    b0a = np.asarray(b0, dtype=np.float64)
    b1a = np.asarray(b1, dtype=np.float64)
    a = b0a * interval
    # improvement l(k) - l(k + I) = a / (x (x + a)) with x = b0 k + b1; solve = delta
    x = 0.5 * (-a + np.sqrt(a * a + 4.0 * a / delta))
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(b0a > 0, (x - b1a) / np.where(b0a > 0, b0a, 1.0), 0.0)
    return np.asarray(np.maximum(k, 0.0), dtype=np.float64)


# ---------------------------------------------------------------------------------------
# Pre-processing
# ---------------------------------------------------------------------------------------


def filter_outliers(
    losses: npt.ArrayLike, epochs: npt.ArrayLike | None = None, window: int = 5
) -> npt.NDArray[np.bool_]:
    """The paper's outlier band: keep-mask of the points.

    A point of epoch ``e`` is dropped when its loss is above the maximum loss of epochs
    ``e-window .. e-1`` or below the minimum loss of epochs ``e+1 .. e+window`` (a bound
    that has no epochs on its side is not applied).  Without ``epochs`` every point is its
    own epoch.

    Args:
        losses: observed losses, in step order.
        epochs: epoch index of each point (non-decreasing), or ``None``.
        window: epochs on each side (paper: 5).

    Returns:
        Boolean mask, ``True`` for kept points.
    """
    loss = np.asarray(losses, dtype=np.float64).ravel()
    if loss.size == 0:
        return np.zeros(0, dtype=bool)
    if epochs is None:
        ep_idx = np.arange(loss.size)
    else:
        ep = np.asarray(epochs).ravel()
        if ep.shape != loss.shape:
            raise OptimusError("epochs must have one value per loss")
        _, ep_idx = np.unique(ep, return_inverse=True)
    n_ep = int(ep_idx.max()) + 1
    ep_max = np.full(n_ep, -np.inf)
    ep_min = np.full(n_ep, np.inf)
    np.maximum.at(ep_max, ep_idx, loss)
    np.minimum.at(ep_min, ep_idx, loss)
    pad_max = np.concatenate([np.full(window, -np.inf), ep_max])
    prev_max = sliding_window_view(pad_max, window).max(axis=1)[:n_ep]  # epochs e-w..e-1
    pad_min = np.concatenate([ep_min, np.full(window, np.inf)])
    next_min = sliding_window_view(pad_min[1:], window).min(axis=1)[:n_ep]  # e+1..e+w
    has_prev = np.isfinite(prev_max)
    has_next = np.isfinite(next_min)
    upper = np.where(has_prev, prev_max, np.inf)[ep_idx]
    lower = np.where(has_next, next_min, -np.inf)[ep_idx]
    return np.asarray((loss <= upper) & (loss >= lower), dtype=bool)


def _reduce(
    steps: FloatArray,
    loss: FloatArray,
    epochs: npt.NDArray[np.int64] | None,
    average: bool,
    max_points: int,
    every: int = 1,
) -> tuple[FloatArray, FloatArray]:
    if average and epochs is not None and steps.size:
        uniq, inv = np.unique(epochs, return_inverse=True)
        cnt = np.bincount(inv).astype(np.float64)
        steps = np.bincount(inv, weights=steps) / cnt
        loss = np.bincount(inv, weights=loss) / cnt
        del uniq
    if every > 1 and steps.size > 1:
        idx = np.unique(np.append(np.arange(0, steps.size, every), steps.size - 1))
        steps, loss = steps[idx], loss[idx]
    if steps.size > max_points:
        idx = np.unique(np.round(np.linspace(0, steps.size - 1, max_points)).astype(np.int64))
        steps, loss = steps[idx], loss[idx]
    return steps, loss


# ---------------------------------------------------------------------------------------
# Core solver, vectorised over a batch of loss vectors (bootstrap) and the b2 grid
# ---------------------------------------------------------------------------------------


def _nnls2(k: FloatArray, y: FloatArray, wt: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Exact weighted NNLS of ``b0*k + b1 ~ y`` over the last axis, batched.

    ``k`` has shape ``(n,)``; ``y`` and ``wt`` broadcast to ``(..., n)``.
    """
    s1 = wt.sum(-1)
    sk = (wt * k).sum(-1)
    skk = (wt * k * k).sum(-1)
    sy = (wt * y).sum(-1)
    sky = (wt * k * y).sum(-1)
    syy = (wt * y * y).sum(-1)
    det = skk * s1 - sk * sk
    with np.errstate(divide="ignore", invalid="ignore"):
        u0 = (sky * s1 - sk * sy) / det
        u1 = (skk * sy - sk * sky) / det
        a0 = np.maximum(sky / skk, 0.0)
        c1 = np.maximum(sy / s1, 0.0)

    def obj(b0: FloatArray, b1: FloatArray) -> FloatArray:
        return np.asarray(
            b0 * b0 * skk + 2 * b0 * b1 * sk + b1 * b1 * s1 - 2 * b0 * sky - 2 * b1 * sy + syy
        )

    ok = (u0 >= 0) & (u1 >= 0) & np.isfinite(u0) & np.isfinite(u1) & (det > 0)
    oa = obj(a0, np.zeros_like(a0))
    oc = obj(np.zeros_like(c1), c1)
    use_a = oa <= oc
    b0 = np.where(ok, u0, np.where(use_a, a0, 0.0))
    b1 = np.where(ok, u1, np.where(use_a, 0.0, c1))
    return np.nan_to_num(b0), np.nan_to_num(b1)


def _solve(
    k: FloatArray, loss: FloatArray, rec: FloatArray, grid: int
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Fit normalised losses ``loss`` (shape ``(B, n)``) at steps ``k`` (``(n,)``).

    Returns ``(b0, b1, b2, sse)`` arrays of shape ``(B,)``; ``b0`` is in units of ``k``.
    """
    kscale = float(k.max()) if k.size and k.max() > 0 else 1.0
    kn = k / kscale
    lmin = loss.min(axis=-1, keepdims=True)  # (B,1)
    best_b0 = best_b1 = best_b2 = best_sse = None
    lo = np.zeros(loss.shape[0])
    hi = np.ones(loss.shape[0])
    for _pass in range(2):
        frac = lo[:, None] + (hi - lo)[:, None] * (np.arange(grid) / grid)[None, :]  # (B,G)
        b2 = lmin * frac  # (B,G)
        gap = loss[:, None, :] - b2[:, :, None]  # (B,G,n)
        gap = np.maximum(gap, 1e-12)
        y = 1.0 / gap
        wt = rec[None, None, :] * gap**4
        b0, b1 = _nnls2(kn, y, wt)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            pred = 1.0 / (b0[..., None] * kn + b1[..., None]) + b2[..., None]
        sse = np.where(np.isfinite(pred), rec * (pred - loss[:, None, :]) ** 2, np.inf).sum(
            -1
        )  # (B,G)
        j = np.argmin(sse, axis=1)
        rows = np.arange(loss.shape[0])
        best_b0, best_b1, best_b2, best_sse = b0[rows, j], b1[rows, j], b2[rows, j], sse[rows, j]
        step = (hi - lo) / grid
        center = frac[rows, j]
        lo = np.maximum(center - step, 0.0)
        hi = np.minimum(center + step, 1.0 - 1e-9)
    assert best_b0 is not None and best_b1 is not None and best_b2 is not None
    assert best_sse is not None
    return best_b0 / kscale, best_b1, best_b2, best_sse


# ---------------------------------------------------------------------------------------
# Learning-rate decay detection
# ---------------------------------------------------------------------------------------


def detect_lr_decay(
    steps: npt.ArrayLike,
    losses: npt.ArrayLike,
    *,
    drop: float = 0.2,
    window: int = 4,
    min_prefix: int = 8,
) -> int | None:
    """Index of the latest step learning-rate decay in a loss series, or ``None``.

    A candidate index ``i`` is a point where the median loss of the ``window`` points from
    ``i`` is more than ``drop`` (relative) below the median of the ``window`` points
    before it.  Early in training a ``1/k`` curve drops that fast too, so a candidate is
    confirmed only if the post-drop median is also more than ``drop`` below what a
    ``1/k`` fit on the (at least ``min_prefix``) points before ``i`` predicts.

    Args:
        steps: cumulative steps, increasing.
        losses: losses (raw or normalised).
        drop: relative drop threshold (0.2 = 20 %).
        window: points compared on each side.
        min_prefix: points needed before a candidate to test it against the 1/k shape.

    Returns:
        The index of the first point after the latest confirmed drop, or ``None``.
    """
    k = np.asarray(steps, dtype=np.float64).ravel()
    loss = np.asarray(losses, dtype=np.float64).ravel()
    n = loss.size
    if n < min_prefix + window:
        return None
    win = sliding_window_view(loss, window)  # win[j] = loss[j:j+window]
    med = np.median(win, axis=1)  # med[j] median of loss[j:j+window]
    idx = np.arange(max(window, min_prefix), n - window + 1)
    pre = med[idx - window]
    post = med[idx]
    is_cand = post < (1.0 - drop) * pre
    cand = idx[is_cand]
    sharp = np.zeros(n)
    sharp[idx] = np.where(post > 0, pre / np.maximum(post, 1e-300), np.inf)
    flag = np.zeros(n, dtype=bool)
    flag[cand] = True
    for i in cand[::-1]:
        lo = max(0, int(i) - 4 * min_prefix)
        kk, ll = k[lo:i], loss[lo:i]
        scale = float(ll.max())
        b0, b1, b2, _ = _solve(kk, (ll / scale)[None, :], np.ones(kk.size), 24)
        with np.errstate(divide="ignore"):
            pred = scale * (1.0 / (b0[0] * k[i : i + window] + b1[0]) + b2[0])
        if np.median(loss[i : i + window]) < (1.0 - drop) * float(np.median(pred)):
            # the windows straddling a drop are all candidates: take the sharpest of the run
            lo_run = int(i)
            while lo_run - 1 >= 0 and flag[lo_run - 1]:
                lo_run -= 1
            run = np.arange(lo_run, int(i) + 1)
            return int(run[np.argmax(sharp[run])])
    return None


# ---------------------------------------------------------------------------------------
# Public fit
# ---------------------------------------------------------------------------------------


def _prepare(
    steps: npt.ArrayLike,
    losses: npt.ArrayLike,
    epochs: npt.ArrayLike | None,
    config: ConvergenceConfig,
) -> tuple[FloatArray, FloatArray, float, float | None, int, int, float]:
    k = np.asarray(steps, dtype=np.float64).ravel()
    loss = np.asarray(losses, dtype=np.float64).ravel()
    if k.shape != loss.shape:
        raise OptimusError(f"steps and losses must have the same length, got {k.size}, {loss.size}")
    if np.any(~np.isfinite(loss)) or np.any(loss <= 0):
        raise OptimusError("losses must be finite and > 0")
    if np.any(~np.isfinite(k)) or np.any(k < 0):
        raise OptimusError("steps must be finite and >= 0")
    n_obs = int(k.size)
    order = np.argsort(k, kind="stable")
    k, loss = k[order], loss[order]
    ep: npt.NDArray[np.int64] | None = None
    if epochs is not None:
        ep = np.asarray(epochs).ravel()[order].astype(np.int64)
        if ep.shape != k.shape:
            raise OptimusError("epochs must have one value per loss")
    n_out = 0
    if config.filter_outliers and k.size > 2:
        keep = filter_outliers(loss, ep, config.outlier_window)
        if keep.sum() >= MIN_FIT_POINTS:
            n_out = int((~keep).sum())
            k, loss = k[keep], loss[keep]
            ep = ep[keep] if ep is not None else None
    k, loss = _reduce(k, loss, ep, config.average_per_epoch, config.max_points, config.sample_every)
    if k.size < MIN_FIT_POINTS:
        raise InsufficientDataError(
            f"the convergence model needs at least {MIN_FIT_POINTS} points, got {k.size}"
        )
    origin = 0.0
    decay_step: float | None = None
    if config.detect_lr_decay:
        i = detect_lr_decay(k, loss, drop=config.decay_drop, window=config.decay_window)
        if i is not None:
            decay_step = float(k[i])
            if k.size - i >= config.min_points_after_decay:
                origin = float(k[i - 1])
                k, loss = k[i:], loss[i:]
            else:
                logger.info(
                    "learning-rate drop at step %s has only %d points after it; "
                    "fitting on all points until %d are seen",
                    decay_step,
                    k.size - i,
                    config.min_points_after_decay,
                )
                decay_step = None
    scale = float(loss.max())
    return k - origin, loss / scale, origin, decay_step, n_obs, n_out, scale


def _recency(k: FloatArray, half_life: float | None) -> FloatArray:
    if half_life is None:
        return np.ones_like(k)
    return np.asarray(np.exp2(-(k.max() - k) / half_life), dtype=np.float64)


def fit_convergence(
    steps: npt.ArrayLike,
    losses: npt.ArrayLike,
    *,
    epochs: npt.ArrayLike | None = None,
    config: ConvergenceConfig | None = None,
) -> ConvergenceFit:
    """Fit ``l(k) = 1/(b0*k + b1) + b2`` to observed (step, loss) points.

    Args:
        steps: cumulative training steps of the observations.
        losses: observed training losses (> 0).
        epochs: optional epoch index of each observation (outlier band, averaging).
        config: fit settings (defaults: :class:`ConvergenceConfig`).

    Returns:
        The fit, with its error and what it was fitted on.

    Raises:
        InsufficientDataError: fewer than 3 usable points.
        OptimusError: malformed input.
    """
    cfg = config or ConvergenceConfig()
    k, loss, origin, decay, n_obs, n_out, scale = _prepare(steps, losses, epochs, cfg)
    rec = _recency(k, cfg.recency_half_life)
    b0, b1, b2, _ = _solve(k, loss[None, :], rec, cfg.b2_grid)
    fit = ConvergenceFit(b0=float(b0[0]), b1=float(b1[0]), b2=float(b2[0]))
    with np.errstate(divide="ignore"):
        pred = 1.0 / (fit.b0 * k + fit.b1) + fit.b2
    err = float(np.sqrt(np.mean((pred - loss) ** 2)))
    return ConvergenceFit(
        b0=fit.b0,
        b1=fit.b1,
        b2=fit.b2,
        loss_scale=scale,
        origin_step=origin,
        fit_error=err,
        n_points=int(k.size),
        n_observed=n_obs,
        n_outliers=n_out,
        first_step=float(k[0] + origin),
        last_step=float(k[-1] + origin),
        lr_decay_step=decay,
    )


def remaining_steps_interval(
    steps: npt.ArrayLike,
    losses: npt.ArrayLike,
    current_step: float | None = None,
    *,
    epochs: npt.ArrayLike | None = None,
    config: ConvergenceConfig | None = None,
    confidence: float = 0.8,
    n_boot: int = 64,
    seed: int | None = 0,
) -> RemainingStepsInterval:
    """Remaining steps with a residual-bootstrap prediction interval.

    The observed points are fitted; ``n_boot`` synthetic series (fitted curve plus
    residuals resampled with replacement) are refitted in one vectorised solve, and the
    ``(1 - confidence)/2`` and ``(1 + confidence)/2`` quantiles of their remaining steps
    form the interval.  A scheduler can hedge with ``high`` (pessimistic) or ``low``.

    Args:
        steps: cumulative steps.
        losses: losses.
        current_step: the step to count from (default: the last observed step).
        epochs: optional epoch of each point.
        config: fit settings.
        confidence: central probability of the interval, in ``(0, 1)``.
        n_boot: bootstrap fits.
        seed: random seed of the resampling.
    """
    if not 0 < confidence < 1:
        raise OptimusError(f"confidence must be in (0, 1), got {confidence}")
    if n_boot < 2:
        raise OptimusError(f"n_boot must be >= 2, got {n_boot}")
    cfg = config or ConvergenceConfig()
    fit = fit_convergence(steps, losses, epochs=epochs, config=cfg)
    k, loss, origin, _decay, _n, _o, _scale = _prepare(steps, losses, epochs, cfg)
    rec = _recency(k, cfg.recency_half_life)
    with np.errstate(divide="ignore"):
        pred = 1.0 / (fit.b0 * k + fit.b1) + fit.b2
    resid = loss - pred
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, k.size, size=(n_boot, k.size))
    boot = np.maximum(pred[None, :] + resid[draws], 1e-9)
    b0, b1, _b2, _ = _solve(k, boot, rec, max(8, cfg.b2_grid // 2))
    cur = (
        float(np.max(np.asarray(steps, dtype=np.float64))) if current_step is None else current_step
    )
    conv = _convergence_step(b0, b1, cfg.delta, cfg.interval) + origin
    rem = np.maximum(conv - cur, 0.0)
    q = (1.0 - confidence) / 2.0
    return RemainingStepsInterval(
        estimate=fit.remaining_steps(cur, cfg.delta, cfg.interval),
        low=float(np.quantile(rem, q)),
        high=float(np.quantile(rem, 1.0 - q)),
        confidence=confidence,
        samples=n_boot,
        fit=fit,
    )


class ConvergenceEstimator:
    """Online convergence model of one job: observe losses, ask for remaining steps.

    Example:
        >>> est = ConvergenceEstimator()
        >>> for k in range(1, 50):
        ...     est.observe(k * 100, 2.0 / (0.01 * k + 1.0) + 0.1)
        >>> est.remaining_steps() > 0
        True
    """

    def __init__(self, config: ConvergenceConfig | None = None) -> None:
        self.config = config or ConvergenceConfig()
        self._steps: list[float] = []
        self._losses: list[float] = []
        self._epochs: list[int] = []
        self._has_epochs = True
        self._fit: ConvergenceFit | None = None

    def observe(self, step: float, loss: float, epoch: int | None = None) -> None:
        """Record the loss at cumulative step ``step`` (optionally its epoch)."""
        if not (math.isfinite(loss) and loss > 0):
            raise OptimusError(f"loss must be finite and > 0, got {loss!r}")
        self._steps.append(float(step))
        self._losses.append(float(loss))
        if epoch is None:
            self._has_epochs = False
        else:
            self._epochs.append(int(epoch))
        self._fit = None

    def observe_many(
        self, steps: Sequence[float], losses: Sequence[float], epochs: Sequence[int] | None = None
    ) -> None:
        """Record several observations."""
        for i, (s, v) in enumerate(zip(steps, losses, strict=True)):
            self.observe(s, v, None if epochs is None else epochs[i])

    @property
    def num_observations(self) -> int:
        """Observations recorded so far."""
        return len(self._steps)

    @property
    def last_step(self) -> float:
        """Largest observed step (0 before any observation)."""
        return max(self._steps) if self._steps else 0.0

    def _ep(self) -> list[int] | None:
        return self._epochs if self._has_epochs and self._epochs else None

    def fit(self) -> ConvergenceFit:
        """The (cached) fit on everything observed so far."""
        if self._fit is None:
            self._fit = fit_convergence(
                self._steps, self._losses, epochs=self._ep(), config=self.config
            )
        return self._fit

    def remaining_steps(self, current_step: float | None = None) -> float:
        """Point estimate of the steps left to convergence."""
        cur = self.last_step if current_step is None else current_step
        return self.fit().remaining_steps(cur, self.config.delta, self.config.interval)

    def remaining_steps_interval(
        self,
        current_step: float | None = None,
        *,
        confidence: float = 0.8,
        n_boot: int = 64,
        seed: int | None = 0,
    ) -> RemainingStepsInterval:
        """Bootstrap interval of the remaining steps (see :func:`remaining_steps_interval`)."""
        return remaining_steps_interval(
            self._steps,
            self._losses,
            current_step,
            epochs=self._ep(),
            config=self.config,
            confidence=confidence,
            n_boot=n_boot,
            seed=seed,
        )

"""Convergence model: recovery, remaining steps, outliers, learning-rate decay, intervals."""

from __future__ import annotations

import numpy as np
import pytest
from dynsched_optimus import (
    ConvergenceConfig,
    ConvergenceEstimator,
    ConvergenceFit,
    InsufficientDataError,
    OptimusError,
    detect_lr_decay,
    filter_outliers,
    fit_convergence,
    remaining_steps_interval,
)
from dynsched_optimus._convergence import _nnls2
from hypothesis import given, settings
from hypothesis import strategies as st

DELTA, INTERVAL = 1e-3, 100.0


def _curve(seed: int, frac: float, noise: float = 0.03):
    rng = np.random.default_rng(seed)
    b0 = 10 ** rng.uniform(-4, -2.5)
    b1 = rng.uniform(0.5, 2.0)
    b2 = rng.uniform(0.05, 0.5)
    s0 = 1 / (b0 + b1) + b2
    k_conv = ConvergenceFit(b0=s0 * b0, b1=s0 * b1, b2=b2 / s0).convergence_step(DELTA, INTERVAL)
    ks = np.arange(1, int(k_conv * frac) + 1, max(1, int(k_conv / 400)))
    loss = (1 / (b0 * ks + b1) + b2) * (1 + noise * rng.standard_normal(ks.size))
    return (b0, b1, b2), ks, loss


def _true_conv_step(params, scale: float) -> float:
    b0, b1, b2 = params
    return ConvergenceFit(b0=scale * b0, b1=scale * b1, b2=b2 / scale).convergence_step(
        DELTA, INTERVAL
    )


def test_exact_recovery_without_noise() -> None:
    ks = np.arange(1, 5001, 25, dtype=float)
    loss = 1 / (2e-3 * ks + 1.0) + 0.1
    fit = fit_convergence(ks, loss, config=ConvergenceConfig(filter_outliers=False))
    s = fit.loss_scale
    assert s == pytest.approx(loss.max())
    # normalised coefficients: b0*s, b1*s, b2/s
    assert fit.b0 == pytest.approx(2e-3 * s, rel=0.02)
    assert fit.b1 == pytest.approx(1.0 * s, rel=0.02)
    assert fit.b2 == pytest.approx(0.1 / s, rel=0.05)
    assert fit.fit_error < 1e-3
    assert np.allclose(fit.predict_loss(ks), loss, rtol=5e-3)


@pytest.mark.parametrize("seed", range(6))
def test_parameter_recovery_with_noise(seed: int) -> None:
    params, ks, loss = _curve(seed, 0.8, noise=0.02)
    fit = fit_convergence(ks, loss)
    true = 1 / (params[0] * ks + params[1]) + params[2]
    # the fitted curve follows the noiseless one far better than the noise level
    assert np.median(np.abs(fit.predict_loss(ks) / true - 1)) < 0.01
    assert fit.n_observed == ks.size
    assert fit.first_step >= ks[0] and fit.last_step <= ks[-1]


def test_remaining_step_error_shrinks_with_more_of_the_curve() -> None:
    med = []
    for frac in (0.1, 0.3, 0.6):
        errs = []
        for seed in range(24):
            params, ks, loss = _curve(seed, frac)
            fit = fit_convergence(
                ks, loss, config=ConvergenceConfig(delta=DELTA, interval=INTERVAL)
            )
            k_true = _true_conv_step(params, fit.loss_scale)
            est = fit.remaining_steps(ks[-1], DELTA, INTERVAL)
            errs.append(abs(est - (k_true - ks[-1])) / k_true)
        med.append(float(np.median(errs)))
    assert med[0] > med[1] > med[2]
    assert med[2] < 0.05


def test_remaining_steps_zero_after_convergence_and_flat_curve() -> None:
    fit = ConvergenceFit(b0=1e-2, b1=1.0, b2=0.1)
    k = fit.convergence_step(DELTA, INTERVAL)
    assert fit.remaining_steps(k + 10, DELTA, INTERVAL) == 0.0
    # improvement at the convergence step is delta
    assert fit.predict(k) - fit.predict(k + INTERVAL) == pytest.approx(DELTA, rel=1e-6)
    flat = ConvergenceFit(b0=0.0, b1=2.0, b2=0.1)
    assert flat.remaining_steps(100.0) == 0.0


def test_outlier_band_of_the_paper() -> None:
    # one point per epoch, decreasing; epoch 6 spikes above the previous 5 epochs' max and
    # epoch 12 dips below the next 5 epochs' min
    loss = np.linspace(2.0, 1.0, 20)
    loss[6] = 3.0
    loss[12] = 0.5
    keep = filter_outliers(loss, np.arange(20), window=5)
    assert not keep[6] and not keep[12]
    assert keep.sum() == 18
    # grouped epochs: the band uses epoch-level max / min
    ep = np.repeat(np.arange(10), 3)
    l2 = np.repeat(np.linspace(2, 1, 10), 3) + np.tile([0.0, 0.01, -0.01], 10)
    assert filter_outliers(l2, ep).all()


def test_fit_reports_dropped_outliers_and_sampling() -> None:
    ks = np.arange(1, 2001, dtype=float)
    loss = 1 / (1e-3 * ks + 1) + 0.2
    loss[500] = 10.0
    fit = fit_convergence(ks, loss, config=ConvergenceConfig(max_points=100))
    assert fit.n_outliers >= 1
    assert fit.n_points <= 100
    assert fit.loss_scale < 10.0  # the spike did not set the normaliser
    # per-epoch averaging bounds the solver's input too
    ep = (ks // 100).astype(int)
    fit2 = fit_convergence(ks, loss, epochs=ep, config=ConvergenceConfig(average_per_epoch=True))
    assert fit2.n_points == len(np.unique(ep))
    fit3 = fit_convergence(ks, loss, config=ConvergenceConfig(sample_every=10, max_points=1000))
    assert fit3.n_points <= (ks.size - fit3.n_outliers) // 10 + 2
    assert fit3.last_step == ks[-1]


def _decay_curve(seed: int):
    rng = np.random.default_rng(seed)
    ks = np.arange(1, 6001, 30, dtype=float)
    kd = 3000.0
    pre = 1 / (1e-3 * ks + 1) + 0.3
    post_start = 1 / (1e-3 * kd + 1) + 0.3
    post = 0.5 * post_start * (1 / (2e-3 * (ks - kd) + 1) * 0.4 + 0.6)
    loss = np.where(ks < kd, pre, post) * (1 + 0.01 * rng.standard_normal(ks.size))
    return ks, loss, kd


def test_lr_decay_detected_and_fit_restarts() -> None:
    ks, loss, kd = _decay_curve(0)
    i = detect_lr_decay(ks, loss)
    assert i is not None and abs(ks[i] - kd) <= 60
    fit = fit_convergence(ks, loss)
    assert fit.lr_decay_step is not None and abs(fit.lr_decay_step - kd) <= 60
    assert fit.origin_step < fit.lr_decay_step
    assert fit.first_step >= kd - 60
    after = ks > kd
    no_restart = fit_convergence(ks, loss, config=ConvergenceConfig(detect_lr_decay=False))
    err_restart = np.median(np.abs(fit.predict_loss(ks[after]) / loss[after] - 1))
    err_plain = np.median(np.abs(no_restart.predict_loss(ks[after]) / loss[after] - 1))
    assert err_restart < err_plain / 2


def test_no_decay_reported_on_a_plain_curve() -> None:
    for seed in range(5):
        _params, ks, loss = _curve(seed, 0.7)
        assert detect_lr_decay(ks, loss) is None
        assert fit_convergence(ks, loss).lr_decay_step is None


def test_recency_weighting_follows_recent_points() -> None:
    ks = np.arange(1, 4001, 20, dtype=float)
    # the curve's asymptote shifts late: recent points should dominate with a half-life
    loss = 1 / (1e-3 * ks + 1) + np.where(ks > 3000, 0.35, 0.3)
    cfg_r = ConvergenceConfig(recency_half_life=300.0, detect_lr_decay=False)
    cfg_u = ConvergenceConfig(detect_lr_decay=False)
    fr = fit_convergence(ks, loss, config=cfg_r)
    fu = fit_convergence(ks, loss, config=cfg_u)
    late = ks > 3500
    er = np.mean(np.abs(fr.predict_loss(ks[late]) - loss[late]))
    eu = np.mean(np.abs(fu.predict_loss(ks[late]) - loss[late]))
    assert er < eu


def test_bootstrap_interval_brackets_the_estimate_and_narrows() -> None:
    widths = []
    for frac in (0.15, 0.6):
        _params, ks, loss = _curve(3, frac)
        iv = remaining_steps_interval(ks, loss, confidence=0.8, n_boot=48, seed=1)
        assert iv.low <= iv.high
        assert iv.low <= iv.estimate * 1.05 + 1 and iv.estimate <= iv.high * 1.05 + 1
        widths.append((iv.high - iv.low) / (iv.fit.convergence_step(DELTA, INTERVAL)))
    assert widths[1] < widths[0]


def test_interval_covers_truth_most_of_the_time() -> None:
    hits = 0
    n = 16
    for seed in range(n):
        params, ks, loss = _curve(seed, 0.4)
        iv = remaining_steps_interval(ks, loss, confidence=0.9, n_boot=48, seed=seed)
        true = _true_conv_step(params, iv.fit.loss_scale) - ks[-1]
        lo, hi = iv.low * 0.9, iv.high * 1.1
        hits += lo <= true <= hi
    assert hits >= n // 2


def test_estimator_online_use() -> None:
    est = ConvergenceEstimator(ConvergenceConfig(delta=DELTA, interval=INTERVAL))
    _params, ks, loss = _curve(1, 0.5)
    est.observe_many(ks.tolist(), loss.tolist())
    assert est.num_observations == ks.size
    first = est.fit()
    assert est.fit() is first  # cached until a new observation
    rem = est.remaining_steps()
    assert rem > 0
    iv = est.remaining_steps_interval(n_boot=16)
    assert iv.low <= iv.high
    est.observe(ks[-1] + 10, loss[-1])
    assert est.fit() is not first


def test_errors_are_clear() -> None:
    with pytest.raises(InsufficientDataError, match="at least 3"):
        fit_convergence([1, 2], [1.0, 0.9])
    with pytest.raises(OptimusError, match="same length"):
        fit_convergence([1, 2, 3], [1.0, 0.9])
    with pytest.raises(OptimusError, match="losses must be finite and > 0"):
        fit_convergence([1, 2, 3], [1.0, -0.9, 0.5])
    with pytest.raises(OptimusError, match="delta"):
        ConvergenceConfig(delta=0)
    with pytest.raises(OptimusError, match="confidence"):
        remaining_steps_interval([1, 2, 3, 4], [1, 0.9, 0.8, 0.7], confidence=1.5)


@settings(deadline=None)
@given(
    k=st.lists(st.floats(0, 1e4, allow_nan=False), min_size=2, max_size=12),
    y=st.lists(st.floats(-10, 10, allow_nan=False), min_size=12, max_size=12),
    w=st.lists(st.floats(0.01, 10), min_size=12, max_size=12),
)
def test_two_variable_nnls_matches_scipy(k, y, w) -> None:
    from scipy.optimize import nnls

    n = len(k)
    ka = np.array(k)
    ya = np.array(y[:n])
    wa = np.array(w[:n])
    if np.ptp(ka) < 1e-6:
        return
    b0, b1 = _nnls2(ka / ka.max() if ka.max() > 0 else ka, ya, wa)
    kn = ka / ka.max()
    a = np.stack([kn, np.ones(n)], axis=1) * np.sqrt(wa)[:, None]
    ref, _ = nnls(a, ya * np.sqrt(wa))
    obj = lambda x0, x1: float(np.sum(wa * (x0 * kn + x1 - ya) ** 2))  # noqa: E731
    assert obj(float(b0), float(b1)) <= obj(*ref) + 1e-7 * (1 + obj(*ref))
    assert b0 >= 0 and b1 >= 0

"""Speed models: exact and noisy recovery, sampling planner, accuracy figures, all-reduce."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from dynsched_optimus import (
    AllReduceSpeedModel,
    InsufficientDataError,
    OptimusError,
    PSSpeedModel,
    StepTimeModel,
    fit_speed,
    placement_shape,
    plan_sampling,
)
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from _pollux import pollux_traces

GRID = 16
P, W = (
    a.ravel() for a in np.meshgrid(np.arange(1, GRID + 1), np.arange(1, GRID + 1), indexing="ij")
)


def _job_strategy(mode: str):
    lu = st.floats(min_value=-3.0, max_value=0.0)
    return st.builds(
        lambda b, tf, tb, s, tu, d, dp: StepTimeModel(
            mode=mode,
            batch=b,
            t_forward=10**tf / 100,
            t_back=10**tb,
            model_size=s,
            bandwidth=1250.0,
            t_update=10**tu / 10,
            delta=10**d / 100,
            delta_ps=10**dp / 100,
        ),
        st.floats(16, 1024),
        lu,
        lu,
        st.floats(1, 1000),
        lu,
        lu,
        lu,
    )


@pytest.mark.parametrize("mode", ["async", "sync"])
@settings(deadline=None, max_examples=25)
@given(data=st.data())
def test_exact_forms_match_the_step_time_model(mode: str, data) -> None:
    job = data.draw(_job_strategy(mode))
    exact = job.as_speed_model()
    assert np.allclose(exact.predict(P, W), job.speed(P, W), rtol=1e-10)
    cfgs = plan_sampling(8, max_ps=8, max_workers=8, mode=mode)
    p = np.array([c[0] for c in cfgs])
    w = np.array([c[1] for c in cfgs])
    fit = fit_speed(mode, p, w, job.speed(p, w), global_batch=exact.global_batch)
    assert np.allclose(fit.predict(P, W), job.speed(P, W), rtol=1e-4)
    assert fit.fit_error < 1e-6


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_parameter_recovery_with_noise(mode: str) -> None:
    rng = np.random.default_rng(7)
    job = StepTimeModel.random(rng, mode)
    p, w = P[::3], W[::3]
    speeds = job.sample(p, w, noise=0.02, rng=rng)
    fit = fit_speed(mode, p, w, speeds, global_batch=job.batch if mode == "sync" else None)
    true = np.array(job.theta())
    # dominant coefficients recovered within a few percent (small ones are noise-limited)
    big = true > 0.2 * true.max()
    assert np.allclose(np.array(fit.theta)[big], true[big], rtol=0.15)
    assert 0.005 < fit.fit_error < 0.05
    assert fit.n_points == p.size and len(fit.configs) == p.size


def _median_grid_error(mode: str, seed: int, planner: str = "plan") -> float:
    rng = np.random.default_rng(seed)
    job = StepTimeModel.random(rng, mode)
    if planner == "plan":
        cfgs = plan_sampling(10, max_ps=GRID, max_workers=GRID, mode=mode, global_batch=job.batch)
    else:
        cfgs = [(i, i) for i in range(1, 11)]
    p = np.array([c[0] for c in cfgs])
    w = np.array([c[1] for c in cfgs])
    f = job.sample(p, w, noise=0.05, rng=rng)
    fit = fit_speed(mode, p, w, f, global_batch=job.batch if mode == "sync" else None)
    return float(np.median(np.abs(fit.predict(P, W) / job.speed(P, W) - 1)))


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_ten_sampled_configs_give_under_ten_percent_median_error(mode: str) -> None:
    errs = [_median_grid_error(mode, s) for s in range(20)]
    assert np.median(errs) < 0.10
    assert max(errs) < 0.10
    # the diagonal alone identifies the model much worse
    diag = [_median_grid_error(mode, s, "diag") for s in range(20)]
    assert np.median(diag) > 2 * np.median(errs)


def test_planner_goes_off_the_diagonal() -> None:
    for mode in ("async", "sync"):
        cfgs = plan_sampling(10, max_ps=12, max_workers=12, mode=mode)
        assert len(cfgs) == len(set(cfgs)) == 10
        assert cfgs[0] == (1, 1)
        assert any(p < w for p, w in cfgs) and any(p > w for p, w in cfgs)
        ratios = {w / p for p, w in cfgs}
        assert len(ratios) >= 5
    capped = plan_sampling(6, max_ps=10, max_workers=10, max_tasks=8)
    assert all(p + w <= 8 for p, w in capped)
    with pytest.raises(OptimusError, match="n_configs must be >= 5"):
        plan_sampling(4, mode="sync")


def test_minimum_points_and_bad_input() -> None:
    with pytest.raises(InsufficientDataError, match="at least 4"):
        fit_speed("async", [1, 2, 3], [1, 2, 3], [1.0, 2.0, 3.0])
    with pytest.raises(InsufficientDataError, match="at least 5"):
        fit_speed("sync", [1, 2, 3, 4], [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0], global_batch=64)
    with pytest.raises(OptimusError, match="global_batch"):
        fit_speed("sync", [1] * 5, [1, 2, 3, 4, 5], [1.0] * 5)
    with pytest.raises(OptimusError, match="mode must be one of"):
        fit_speed("fast", [1] * 5, [1] * 5, [1.0] * 5)
    with pytest.raises(OptimusError, match="speed must be finite and > 0"):
        fit_speed("async", [1, 2, 3, 4], [1, 2, 3, 4], [1.0, 0.0, 1.0, 1.0])
    with pytest.raises(OptimusError, match="theta must have 5"):
        PSSpeedModel(mode="sync", theta=(1, 2, 3, 4), global_batch=32)


def test_step_time_model_validates_fields() -> None:
    with pytest.raises(OptimusError, match="bandwidth"):
        StepTimeModel(bandwidth=0)
    with pytest.raises(OptimusError, match="mode"):
        StepTimeModel(mode="semi")
    job = StepTimeModel(mode="sync", batch=128)
    # forward term shrinks with workers, transfer term with servers
    assert job.step_time(1, 4) < job.step_time(1, 1) or job.step_time(4, 4) < job.step_time(1, 4)
    assert job.sample(2, 2, noise=0.0, rng=0) == pytest.approx(job.speed(2, 2))


def test_placement_shape() -> None:
    assert placement_shape("1234") == (10, 4)
    assert placement_shape("4") == (4, 1)
    assert placement_shape([2, 0, 2]) == (4, 2)


def test_allreduce_recovers_its_own_form() -> None:
    rng = np.random.default_rng(0)
    truth = AllReduceSpeedModel(
        coefficients=(0.05, 0.004, 0.01, 0.002, 0.08, 0.004, 0.01), gamma=2.0
    )
    g = rng.integers(1, 33, 200).astype(float)
    n = np.minimum(g, rng.integers(1, 9, 200)).astype(float)
    b = rng.choice([16.0, 32.0, 64.0, 128.0], 200)
    t = truth.step_time(g, n, b) * (1 + 0.01 * rng.standard_normal(200))
    fit = AllReduceSpeedModel.fit(g, n, b, t)
    assert fit.fit_error < 0.02
    assert np.median(np.abs(fit.throughput(g, n, b) / truth.throughput(g, n, b) - 1)) < 0.02
    with pytest.raises(InsufficientDataError):
        AllReduceSpeedModel.fit([1, 2], [1, 1], [8, 8], [0.1, 0.2])
    with pytest.raises(OptimusError, match="gpus >= nodes"):
        AllReduceSpeedModel.fit([1] * 7, [2] * 7, [8] * 7, [0.1] * 7)


@pytest.mark.skipif(pollux_traces() is None, reason="vendored Pollux data not found")
def test_allreduce_error_on_pollux_profiles() -> None:
    from dynsched_optimus._io import read_allreduce_file

    traces = pollux_traces()
    assert traces is not None
    rng = np.random.default_rng(0)
    for model_dir in sorted(p for p in traces.iterdir() if p.is_dir()):
        parts = [read_allreduce_file(model_dir / f) for f in ("placements.csv", "scalability.csv")]
        g, n, b, t = (np.concatenate([x[i] for x in parts]) for i in range(4))
        fit = AllReduceSpeedModel.fit(g, n, b, t)
        assert fit.fit_error < 0.10, model_dir.name
        # held-out: fit on half, evaluate on the other half
        idx = rng.permutation(g.size)
        tr, te = idx[: g.size // 2], idx[g.size // 2 :]
        half = AllReduceSpeedModel.fit(g[tr], n[tr], b[tr], t[tr])
        err = np.median(np.abs(half.step_time(g[te], n[te], b[te]) / t[te] - 1))
        assert err < 0.12, model_dir.name

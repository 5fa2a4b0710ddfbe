"""``predictive``'s running-sequences rate model (Little's law): it converges on known rates."""

from __future__ import annotations

import random

import pytest
from dynsched_core import DynamicScheduleContext
from dynsched_core.events import MembershipEvent, RolloutEvent
from dynsched_policies import PredictiveDynamicSchedulePolicy
from dynsched_policies._estimators import LoadRateModel
from hypothesis import given, settings
from hypothesis import strategies as st


def stream(
    policy: PredictiveDynamicSchedulePolicy,
    *,
    alpha: float,
    beta: float,
    replicas: int,
    loads: list[int],
    completions: int,
    seed: int,
) -> None:
    """Each cycle holds ``N = load * replicas`` samples in flight (a completion is replaced
    at once) with Poisson completions at ``N / (alpha + beta * load)`` until
    ``completions`` completed."""
    rng = random.Random(seed)
    ids = tuple(f"standalone-{i}" for i in range(replicas))
    policy.observe(MembershipEvent(0.0, "routed", ids, ids, True))
    t = 0.0
    cap = max(loads) * replicas
    for load in loads:
        active = load * replicas
        policy.observe(RolloutEvent(t, active, cap, "submit"))
        rate = active / (alpha + beta * load)
        for _ in range(completions):
            t += rng.expovariate(rate)
            policy.observe(RolloutEvent(t, active - 1, cap, "complete"))
            policy.observe(RolloutEvent(t, active, cap, "submit"))
        policy.load_rates.end_cycle()
        policy.rates.end_cycle()


@settings(max_examples=25, deadline=None)
@given(
    alpha=st.floats(5.0, 300.0),
    beta=st.floats(0.5, 20.0),
    replicas=st.integers(1, 4),
    loads=st.lists(st.sampled_from([2, 4, 8, 16, 32]), min_size=2, max_size=5, unique=True),
    seed=st.integers(0, 2**16),
)
def test_little_rate_model_converges_on_known_latencies(
    alpha: float, beta: float, replicas: int, loads: list[int], seed: int
) -> None:
    policy = PredictiveDynamicSchedulePolicy(rate_model="little", rate_window=len(loads))
    stream(
        policy, alpha=alpha, beta=beta, replicas=replicas, loads=loads, completions=400, seed=seed
    )
    fit = policy.load_rates.fit(1.0)
    assert fit is not None
    assert fit.n == 400 * len(loads)
    # the rate at every running-sequences level seen, within 4 sigma of its interval
    # (plus 3 %: the regularising pseudo-completion)
    for load in sorted({*loads, (min(loads) + max(loads)) // 2}):
        n = load * replicas
        est = fit.rate(n, replicas)
        truth = n / (alpha + beta * load)
        assert 0 < est.sd <= 0.2 * truth  # converged: a tight interval
        assert abs(est.value - truth) <= 4 * est.sd + 0.03 * truth, (load, est, truth)
    # the latency line itself, at both ends of the loads seen
    for load in (min(loads), max(loads)):
        w = fit.latency(load)
        truth_w = alpha + beta * load
        assert abs(w.value - truth_w) <= 4 * w.sd + 0.03 * truth_w
    # and the round trip keeps every window
    clone = PredictiveDynamicSchedulePolicy(rate_model="little", rate_window=len(loads))
    clone.load_state_dict(policy.state_dict())
    assert clone.state_dict() == policy.state_dict()
    assert clone.load_rates.fit(1.0) == fit


def test_little_rate_model_is_load_dependent_and_non_negative() -> None:
    model = LoadRateModel(4)
    # a latency that falls with load is not physical: beta is held at 0
    for n, w in ((4.0, 200.0), (16.0, 100.0)):
        model.add(n, 1, 0, w * 100.0 / n, 100)  # W = n * seconds / completions = w
        model.end_cycle()
    fit = model.fit()
    assert fit is not None and fit.beta == 0.0 and fit.alpha > 0
    assert LoadRateModel(4).fit() is None  # no data, no rate


def test_little_pool_runs_at_the_concurrency_the_window_admits() -> None:
    # 2 standalone replicas at 32 samples each; latency 100 + 10 n: the pool's rate with a
    # window that admits only 8 more samples is well below its saturated rate
    policy = PredictiveDynamicSchedulePolicy(rate_model="little")
    stream(policy, alpha=100.0, beta=10.0, replicas=2, loads=[4, 32], completions=300, seed=0)
    policy._cap_per_replica = 32.0
    ctx = DynamicScheduleContext(
        required_samples=16, num_standalone_replicas=2, num_hybrid_replicas=2, hybrid_gpus=16
    )
    pools = policy._pools(ctx, [2])
    assert pools is not None
    base, lends = pools
    full = base.produce(1000.0, 100.0)
    assert full == pytest.approx(100.0 * 64 / (100 + 10 * 32), rel=0.15)
    assert base.produce(8.0, 100.0) < 8.0 * 100.0 / 100.0  # drains, never above 8 / alpha
    # lending 2 replicas to a full window doubles the cap: faster, not above 4 / beta
    assert full < lends[2].produce(1000.0, 100.0) <= 100.0 * 4 / 10.0 + 1e-9


def test_rate_model_option_is_checked() -> None:
    from dynsched_core import ConfigError

    with pytest.raises(ConfigError):
        PredictiveDynamicSchedulePolicy(rate_model="nope")
    with pytest.raises(TypeError):
        PredictiveDynamicSchedulePolicy(rate_model=3)  # type: ignore[arg-type]

"""The ``predictive`` policy: conformance, convergence of its estimates, its decisions."""

from __future__ import annotations

import random
from typing import Any

import pytest
from dynsched_core import ConfigError, DynamicScheduleContext, build_policy
from dynsched_core.events import RolloutEvent, SwitchEvent, TrainStepEvent, TransitionEvent
from dynsched_core.testing import check_policy
from dynsched_policies import PredictiveDynamicSchedulePolicy, PredictiveOptions
from dynsched_policies._estimators import LinearTrend, MeanEstimate, RateModel
from dynsched_policies._predictive import _expected_shortfall
from hypothesis import given
from hypothesis import strategies as st

CAP = 32  # rollouter capacity in the synthetic streams


def feed(
    policy: PredictiveDynamicSchedulePolicy,
    *,
    a: float,
    b: float,
    k: int,
    tau: float,
    slope: float,
    act_s: float,
    deact_s: float,
    cycles: int,
    seed: int,
    steps_per_cycle: int = 4,
    lend_s: float = 200.0,
) -> None:
    """A synthetic event stream with known rates.

    Each cycle: a lend of ``k`` hybrid replicas for ``lend_s`` (completions at ``a + k b``),
    then ``steps_per_cycle`` training steps of ``tau + slope * step`` seconds (completions
    at ``a``); the rollouter is saturated throughout (``active == capacity``).
    """
    rng = random.Random(seed)
    t = 0.0

    def completions(until: float, rate: float) -> None:
        nonlocal t
        while True:
            gap = rng.expovariate(rate)
            if t + gap > until:
                t = until
                return
            t += gap
            policy.observe(RolloutEvent(t, CAP - 1, CAP, "complete"))
            policy.observe(RolloutEvent(t, CAP, CAP, "submit"))

    policy.observe(RolloutEvent(t, CAP, CAP, "seed"))
    for _ in range(cycles):
        policy._lend_k = k  # what the policy's own activation decision records
        policy.observe(SwitchEvent("activate", t, t + act_s))
        policy.observe(TransitionEvent(t, "ACTIVATING", "HYBRID_ACTIVE"))
        completions(t + lend_s, a + k * b)
        policy.observe(TransitionEvent(t, "HYBRID_ACTIVE", "DEACTIVATING"))
        policy.observe(TransitionEvent(t, "DEACTIVATING", "STANDALONE_ONLY"))
        policy.observe(SwitchEvent("deactivate", t, t + deact_s))
        for _ in range(steps_per_cycle):
            step = policy._steps_seen + 1
            dur = tau + slope * step
            completions(t + dur, a)
            policy.observe(
                TrainStepEvent(
                    step=step,
                    time=t,
                    timings={"update_actor": dur},
                    allocated_s=dur,
                    mq_size=0,
                    is_sync_step=False,
                )
            )
        policy.rates.end_cycle()
        policy.load_rates.end_cycle()


def ctx(**kw: Any) -> DynamicScheduleContext:
    base: dict[str, Any] = {
        "required_samples": 16,
        "trigger_parameter_sync_step": 4,
        "buffer_samples": 32,
        "num_standalone_replicas": 2,
        "num_hybrid_replicas": 2,
        "hybrid_gpus": 16,
        "standalone_gpus": 16,
    }
    base.update(kw)
    return DynamicScheduleContext(**base)


@given(
    a=st.floats(0.02, 0.5),
    rel=st.floats(0.2, 1.5),
    k=st.integers(1, 4),
    tau=st.floats(20.0, 200.0),
    slope=st.floats(0.0, 2.0),
    act_s=st.floats(1.0, 30.0),
    deact_s=st.floats(1.0, 20.0),
    seed=st.integers(0, 2**16),
)
def test_estimates_converge_on_synthetic_streams_with_known_rates(
    a: float,
    rel: float,
    k: int,
    tau: float,
    slope: float,
    act_s: float,
    deact_s: float,
    seed: int,
) -> None:
    b = rel * a / 2  # one hybrid replica relative to one of two standalone replicas
    policy = PredictiveDynamicSchedulePolicy(rate_window=6, step_window=16, fit_hybrid_rate=True)
    # lend shares vary between cycles so the two rates are identifiable
    for i in range(6):
        feed(
            policy,
            a=a,
            b=b,
            k=k,
            tau=tau,
            slope=slope,
            act_s=act_s,
            deact_s=deact_s,
            cycles=1,
            seed=seed + i,
            lend_s=100.0 + 150.0 * (i % 3),
        )
    fit = policy.rates_of(ctx(num_hybrid_replicas=k))
    assert fit is not None
    a_hat, b_hat = fit
    # within 4 standard deviations (Poisson counts) and 30 %
    assert abs(a_hat.value - a) <= 4 * a_hat.sd + 0.3 * a
    assert abs(b_hat.value - b) <= 4 * b_hat.sd + 0.3 * b + 0.3 * a / 2
    # the step-time trend: next step predicted within the window's range and the truth
    step = policy._steps_seen
    pred = policy.predicted_step_s(1)
    assert pred is not None
    truth = tau + slope * (step + 1)
    assert abs(pred.value - truth) <= max(1e-6, slope * 1.0 + 1e-6 * truth)
    cost = policy.switch_cost_s()
    assert cost is not None
    assert cost[0] == pytest.approx(act_s) and cost[1] == pytest.approx(deact_s)


@given(st.lists(st.floats(1.0, 100.0), min_size=2, max_size=30))
def test_mean_estimate_is_the_window_mean(xs: list[float]) -> None:
    est = MeanEstimate(window=10)
    for x in xs:
        est.add(x)
    got = est.estimate()
    assert got is not None
    window = xs[-10:]
    assert got.value == pytest.approx(sum(window) / len(window))
    assert got.upper(1.0) >= got.value >= got.lower(1.0)


@given(
    st.floats(-5.0, 5.0),
    st.floats(0.0, 100.0),
    st.integers(3, 20),
)
def test_linear_trend_recovers_a_noiseless_line(slope: float, icept: float, n: int) -> None:
    trend = LinearTrend(window=n)
    for x in range(n):
        trend.add(float(x), icept + slope * x)
    a, b = trend.coefficients()  # type: ignore[misc]
    assert b == pytest.approx(slope, abs=1e-6) and a == pytest.approx(icept, abs=1e-6)
    est = trend.predict(float(n - 1))
    assert est is not None and est.value == pytest.approx(icept + slope * (n - 1), abs=1e-6)


def test_rate_model_needs_saturated_time() -> None:
    model = RateModel(window=3)
    model.add(0, 10.0, 5)
    assert model.fit(2, 1.0) is None
    model.add(0, 100.0, 50)
    fit = model.fit(2, 1.0)
    assert fit is not None and fit[0].value == pytest.approx(55 / 110)


def test_rate_model_shared_fit_keeps_the_prior_share() -> None:
    model = RateModel(window=3)
    model.add(0, 100.0, 40)  # 2 standalone replicas: 0.2 samples/s each
    model.end_cycle()
    model.add(2, 50.0, 20)  # lent time that showed no gain (ramp-up, migrations)
    shared = model.fit(2, 1.0, free=False)
    assert shared is not None
    a, b = shared
    assert b.value == pytest.approx(a.value / 2)  # a hybrid as fast as a standalone one
    assert a.value == pytest.approx(60 / (150 + 0.5 * 100))  # every saturated second counts
    assert b.lower(1.0) > 0
    free = model.fit(2, 1.0)
    assert free is not None and free[1].value < b.value  # the free fit follows the confound


def test_lends_when_lent_time_shows_no_saturated_gain() -> None:
    # rollout-bound (0.1 samples/s against 16 samples per 60 s step), but the saturated
    # lent seconds completed no faster (b = 0 in the stream, as after ramp-up): the
    # default shared rate still lends every replica; the free fit predicts less gain
    kw: dict[str, Any] = {
        "a": 0.1, "b": 0.0, "k": 2, "tau": 60.0, "slope": 0.0, "act_s": 11.0,
        "deact_s": 5.0, "cycles": 3, "seed": 4, "lend_s": 100.0,
    }  # fmt: skip
    c = ctx(queue_size=4, cycle_step=4)
    policy = PredictiveDynamicSchedulePolicy()
    feed(policy, **kw)
    assert policy.should_activate_after_step(12, False, c)
    assert policy.hybrid_replicas_to_activate(12, c) == 2
    free = PredictiveDynamicSchedulePolicy(fit_hybrid_rate=True)
    feed(free, **kw)
    gain = policy._plan(c, active=False, after_sync=True)[2]
    assert gain > 2 * 16.0  # wins back more than two switches
    assert free._plan(c, active=False, after_sync=True)[2] < gain
    clone = PredictiveDynamicSchedulePolicy()
    clone.load_state_dict(policy.state_dict())
    assert clone._plan(c, active=False, after_sync=True) == policy._plan(
        c, active=False, after_sync=True
    )


@given(st.floats(-50.0, 50.0), st.floats(0.0, 400.0))
def test_expected_shortfall_is_the_mean_of_the_positive_part(gap: float, var: float) -> None:
    short = _expected_shortfall(gap, var)
    assert short >= max(0.0, gap) - 1e-9  # Jensen: never below the deterministic wait
    # E[(g + X)^+] - E[(-g - X)^+] = g for symmetric X
    assert short - _expected_shortfall(-gap, var) == pytest.approx(gap, abs=1e-6)
    assert _expected_shortfall(gap, 0.0) == max(0.0, gap)


def test_fluid_waits_when_production_only_just_covers_the_demand() -> None:
    # 0.16 samples/s for 100 s steps of 16 samples: the mean exactly covers every step, so
    # a deterministic fluid predicts no wait; Poisson completions make half the steps wait
    policy = PredictiveDynamicSchedulePolicy()
    c = ctx()
    t = policy._fluid(16.0, 1000.0, [100.0] * 4, 0.16, c)
    assert t > 400.0 + 10.0
    # a buffer well above the demand still predicts (almost) no wait
    assert policy._fluid(200.0, 1000.0, [100.0] * 4, 0.16, c) == pytest.approx(400.0, abs=1e-3)


def warmed(**kw: Any) -> PredictiveDynamicSchedulePolicy:
    policy = PredictiveDynamicSchedulePolicy(**kw)
    feed(
        policy, a=0.1, b=0.05, k=2, tau=100.0, slope=0.0, act_s=11.0, deact_s=5.0, cycles=3, seed=1
    )
    return policy


def test_predictive_passes_check_policy() -> None:
    check_policy(
        PredictiveDynamicSchedulePolicy,
        colocated_factory=lambda: PredictiveDynamicSchedulePolicy(only_hybrid=True),
    )


def test_predictive_with_fitted_estimates_passes_check_policy() -> None:
    check_policy(warmed, max_examples=20, name="predictive (after a synthetic stream)")


def test_predictive_is_registered_by_entry_point() -> None:
    policy = build_policy("predictive", deactivate_ratio=0.6)
    assert isinstance(policy, PredictiveDynamicSchedulePolicy)
    assert policy.deactivate_ratio == 0.6


def test_state_round_trip_keeps_the_estimates() -> None:
    policy = warmed()
    clone = PredictiveDynamicSchedulePolicy()
    clone.load_state_dict(policy.state_dict())
    assert clone.state_dict() == policy.state_dict()
    c = ctx(queue_size=5, cycle_step=4)
    assert clone._plan(c, active=False, after_sync=True) == policy._plan(
        c, active=False, after_sync=True
    )
    with pytest.raises(ValueError, match="expected keys"):
        clone.load_state_dict({"rates": {}})


def test_never_lends_when_the_trainer_is_the_bottleneck() -> None:
    # standalone replicas produce 1 sample/s, a step consumes 16 in 100 s: nothing is waited for
    policy = PredictiveDynamicSchedulePolicy()
    feed(policy, a=1.0, b=0.5, k=2, tau=100.0, slope=0.0, act_s=11.0, deact_s=5.0, cycles=3, seed=2)
    c = ctx(queue_size=48, cycle_step=4)
    assert not policy.should_activate_after_step(12, False, c)
    assert not policy.should_activate_mid_cycle(13, False, ctx(queue_size=40, cycle_step=2))


def test_lends_everything_when_rollout_is_the_bottleneck() -> None:
    # 0.05 samples/s against 16 samples per 60 s step: the trainer would mostly wait
    policy = PredictiveDynamicSchedulePolicy()
    feed(
        policy, a=0.05, b=0.025, k=2, tau=60.0, slope=0.0, act_s=11.0, deact_s=5.0, cycles=3, seed=3
    )
    c = ctx(queue_size=4, cycle_step=4)
    assert policy.should_activate_after_step(12, False, c)
    assert policy.hybrid_replicas_to_activate(12, c) == 2
    # and waits for a real share of the cycle before giving the GPUs back
    policy._lent_after_sync = False
    assert (
        policy.deactivate_wait_samples(
            ctx(queue_size=4, cycle_step=1, num_active_hybrid_replicas=2)
        )
        >= 16
    )


def test_keyword_knobs_and_the_options_record_build_the_same_policy() -> None:
    by_keyword = build_policy("predictive", z=2.0, rate_window=5, rate_model="little")
    by_record = PredictiveDynamicSchedulePolicy(
        options=PredictiveOptions(z=2.0, rate_window=5, rate_model="little")
    )
    assert isinstance(by_keyword, PredictiveDynamicSchedulePolicy)
    assert by_keyword.options == by_record.options
    assert by_keyword.options.rate_window == 5
    assert by_keyword.state_dict() == by_record.state_dict()
    # keywords replace the record's fields, the others stay
    merged = PredictiveDynamicSchedulePolicy(options=PredictiveOptions(z=3.0), mid_cycle=True)
    assert merged.options == PredictiveOptions(z=3.0, mid_cycle=True)
    assert PredictiveDynamicSchedulePolicy().options == PredictiveOptions()


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("z", -0.5, ConfigError),
        ("z", "1", TypeError),
        ("hybrid_rate_prior", 11.0, ConfigError),
        ("rate_window", 0, ConfigError),
        ("step_window", 1, ConfigError),
        ("cost_window", 1001, ConfigError),
        ("mid_cycle", 1, TypeError),
        ("mid_cycle_margin", float("nan"), ConfigError),
        ("fit_hybrid_rate", "yes", TypeError),
        ("rate_model", "fluid", ConfigError),
    ],
)
def test_a_bad_knob_names_its_field(field: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=rf"PredictiveOptions\.{field} must be") as info:
        PredictiveDynamicSchedulePolicy(**{field: value})
    assert getattr(info.value, "key", None) == field


def test_an_unknown_knob_is_refused_with_the_known_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['zz'\].*'rate_model'"):
        PredictiveDynamicSchedulePolicy(zz=1.0)
    with pytest.raises(TypeError, match="options must be a PredictiveOptions"):
        PredictiveDynamicSchedulePolicy(options={"z": 1.0})  # type: ignore[arg-type]

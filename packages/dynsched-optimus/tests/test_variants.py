"""Optimus variants as registered compositions; the estimator's behaviours as strategies."""

from __future__ import annotations

import dynsched_optimus._scheduler as _S
import pytest
from dynsched_optimus import OptimusError
from dynsched_optimus.scheduler import (
    FewestServersPlacement,
    FittedEstimator,
    FixedBatch,
    GoodputBatch,
    GoodputUnits,
    GreedyAllocation,
    HedgedFit,
    IncrementalAllocation,
    IterationUnits,
    LinearPrior,
    NoPreruns,
    OptimusVariant,
    OracleEstimator,
    PointFit,
    RequestedPrior,
    SampledPreruns,
    SpeedAwarePlacement,
    SpreadPlacement,
    VariantOptions,
    make_optimus,
    optimus_variants,
    register_variant,
)


def test_builtin_compositions() -> None:
    assert optimus_variants()[:3] == ("optimus", "optimus-oracle", "optimus+")
    plain = make_optimus("optimus", prerun_limit=4, damping=0.5)
    assert plain.name == "optimus"
    assert plain.estimator == FittedEstimator()
    assert isinstance(plain.allocation, GreedyAllocation) and plain.allocation.damping == 0.5
    assert isinstance(plain.placement, FewestServersPlacement)
    assert isinstance(plain.preruns, SampledPreruns) and plain.preruns.limit == 4
    assert isinstance(plain.batch, FixedBatch)
    plus = make_optimus("optimus+", hysteresis=3.0)
    assert plus.estimator == FittedEstimator(
        remaining_fit=HedgedFit(),
        scaling=RequestedPrior(),
        units=GoodputUnits(),
        extrapolation=2.0,
    )
    assert isinstance(plus.allocation, IncrementalAllocation)
    assert isinstance(plus.placement, SpeedAwarePlacement)
    assert plus.restarts.hysteresis == 3.0 and isinstance(plus.batch, GoodputBatch)
    assert isinstance(make_optimus("optimus+", compact=False).placement, FewestServersPlacement)
    assert isinstance(make_optimus("optimus+", spread=True).placement, SpreadPlacement)
    assert make_optimus("optimus+", batch="fixed").estimator.units == IterationUnits()


def test_oracle_needs_truth_and_unknown_names_list_the_allowed_values() -> None:
    with pytest.raises(OptimusError, match="needs truth"):
        make_optimus("optimus-oracle")

    class _Truth:
        def remaining_steps(self, job_id: str) -> float:
            return 1.0

        def speed(self, job_id: str, ps: int, workers: int, nodes: int) -> float:
            return 1.0

    assert isinstance(make_optimus("optimus-oracle", truth=_Truth()).estimator, OracleEstimator)
    with pytest.raises(
        OptimusError, match=r"variant='optimus\+\+': allowed values are .*'optimus\+'"
    ):
        make_optimus("optimus++")
    with pytest.raises(
        OptimusError, match=r"batch='huge': allowed values are \['goodput', 'fixed'\]"
    ):
        make_optimus("optimus", batch="huge")
    with pytest.raises(TypeError):
        make_optimus("optimus", bogus=1)


def test_registered_composition_is_built_by_name() -> None:
    variant = OptimusVariant(
        "test-spread-greedy",
        estimator=lambda o: FittedEstimator(prior_s=o.prior_s),
        allocation=lambda o: GreedyAllocation(o.damping),
        placement=lambda o: SpreadPlacement(),
    )
    register_variant(variant)
    try:
        policy = make_optimus("test-spread-greedy", prior_s=10.0)
        assert policy.name == "test-spread-greedy"
        assert policy.estimator.prior_s == 10.0
        assert isinstance(policy.placement, SpreadPlacement)
        assert isinstance(policy.preruns, NoPreruns) and isinstance(policy.batch, FixedBatch)
        assert "test-spread-greedy" in optimus_variants()
        with pytest.raises(OptimusError, match="already registered"):
            register_variant(variant)
    finally:
        del _S._VARIANTS["test-spread-greedy"]
    assert variant.build(VariantOptions()).name == "test-spread-greedy"


def test_estimator_flags_select_strategies() -> None:
    assert FittedEstimator().remaining_fit == PointFit()
    assert FittedEstimator().scaling == LinearPrior()
    assert FittedEstimator().units == IterationUnits()
    est = FittedEstimator(hedged=True, prior="requested", goodput=True)
    assert est.remaining_fit == HedgedFit() and est.scaling == RequestedPrior()
    assert est.units == GoodputUnits()
    assert est == FittedEstimator(
        remaining_fit=HedgedFit(), scaling=RequestedPrior(), units=GoodputUnits()
    )
    with pytest.raises(
        OptimusError, match=r"prior='cubic': allowed values are \['linear', 'requested'\]"
    ):
        FittedEstimator(prior="cubic")
    with pytest.raises(OptimusError, match="hedged= or its strategy"):
        FittedEstimator(hedged=True, remaining_fit=PointFit())


def test_requested_prior_is_flat_beyond_the_request() -> None:
    class _Obs:
        requested_workers = 4

    prior = RequestedPrior(exponent=1.0)
    assert [prior.shape(_Obs(), n) for n in (1, 4, 8)] == [1.0, 4.0, 4.0]  # type: ignore[arg-type]
    assert LinearPrior().shape(_Obs(), 8) == 8.0  # type: ignore[arg-type]

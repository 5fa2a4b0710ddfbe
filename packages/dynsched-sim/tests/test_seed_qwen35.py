"""The published experiment at full length over its 5 workload seeds.

* The calibration test checks the fit of the two static runs only (their wall-clock is what
  the two fitted rates were fitted to).
* The dynamic run is a prediction: nothing here asserts its wall-clock or its ratios (the
  README reports them with their residual against the publication).
* The statements tests check the document's own qualitative statements about the three
  runs (section 5), which nothing was fitted to.
"""

from __future__ import annotations

import statistics

import pytest
from dynsched_sim import Aggregate, load_scenario
from dynsched_sim._report import step_times
from dynsched_sim._sim import RunResult

SC = load_scenario("seed-qwen35")
U_TRAIN = "dynamic_resource/train_resource_utilization"
U_ROLLOUT = "dynamic_resource/rollout_resource_utilization"
U_CLUSTER = "dynamic_resource/resource_utilization"


def test_the_scenario_runs_five_seeds_and_fits_only_two_rates() -> None:
    assert SC.seeds >= 5
    assert sorted(SC.fitted()) == [
        "engine.decode_base_s",
        "engine.decode_per_seq_s",
        "trainer.gpu_s_per_token",
    ]
    assert SC.unlabelled() == []


def test_calibration_fits_the_two_static_runs(seed_aggregate: dict[str, Aggregate]) -> None:
    for name in ("static-16-16", "static-8-24"):
        mean = seed_aggregate[name].wall_clock_s.mean
        assert mean == pytest.approx(SC.published[name], rel=0.005), name
    assert seed_aggregate["static-16-16"].wall_clock_s.n == SC.seeds


def test_conservation_and_bound_on_every_run(seed_comparison: list[RunResult]) -> None:
    assert len(seed_comparison) == 3 * SC.seeds
    for r in seed_comparison:
        assert all(r.conservation.values()), (r.configuration, r.seed, r.conservation)
        assert 0.0 < r.efficiency <= 1.0


def test_dynamic_switches_and_static_never_does(seed_runs: dict[str, RunResult]) -> None:
    assert seed_runs["dynamic-16-16"].summary["activations"] > 0
    assert seed_runs["dynamic-16-16"].summary["aborted_requests"] > 0
    for name in ("static-16-16", "static-8-24"):
        assert seed_runs[name].summary["switches"] == 0
        assert seed_runs[name].policy == "static_fully_async"


# ------------------------------------------------------------- the document's statements
def test_16_16_queue_drains_and_its_rollout_is_pinned_near_capacity(
    seed_aggregate: dict[str, Aggregate],
) -> None:
    a = seed_aggregate["static-16-16"]
    cap = SC.schedule_config(SC.configuration("static-16-16")).max_queue_size
    assert a.summary["mq_size_mean"] <= 0.1 * cap  # "hugs zero"
    assert a.proxy[U_ROLLOUT] >= 0.9  # "keeps its 16 rollout GPUs pinned near capacity"


def test_8_24_queue_sits_at_its_ceiling_and_its_rollout_is_largely_idle(
    seed_aggregate: dict[str, Aggregate],
) -> None:
    """Under verl's staleness rule queued + in flight never exceeds max_required_samples
    minus what the trainer consumed since the last weight sync, so the queue alone cannot
    reach its capacity (96); "sits at its capacity limit" is checked as: the backlog sits at
    the ceiling the rule allows and production is held back by it most of the time. (That
    8+24's queue is also fuller than dynamic's does *not* hold in the model; see the README.)
    """
    a = {k: seed_aggregate[k] for k in ("static-16-16", "static-8-24", "dynamic-16-16")}
    assert a["static-8-24"].summary["backlog_fill_mean"] >= 0.9
    assert a["static-8-24"].summary["staleness_bound_fraction"] >= 0.5
    assert (
        a["static-8-24"].summary["staleness_bound_fraction"]
        > 2 * a["static-16-16"].summary["staleness_bound_fraction"]
    )
    assert a["static-8-24"].summary["mq_size_mean"] > 2 * a["static-16-16"].summary["mq_size_mean"]
    # "leaves much of its 24-GPU rollout capacity idle"
    assert a["static-8-24"].proxy[U_ROLLOUT] <= 0.75
    assert a["static-8-24"].proxy[U_ROLLOUT] < a["static-16-16"].proxy[U_ROLLOUT] - 0.2


def test_8_24_has_the_highest_train_utilization(seed_aggregate: dict[str, Aggregate]) -> None:
    train = {k: a.proxy[U_TRAIN] for k, a in seed_aggregate.items()}
    assert max(train, key=lambda k: train[k]) == "static-8-24"
    true = {k: a.true_utilization["train"] for k, a in seed_aggregate.items()}
    assert max(true, key=lambda k: true[k] or 0.0) == "static-8-24"


def test_dynamic_has_the_highest_cluster_utilization(seed_aggregate: dict[str, Aggregate]) -> None:
    cluster = {k: a.proxy[U_CLUSTER] for k, a in seed_aggregate.items()}
    assert max(cluster, key=lambda k: cluster[k]) == "dynamic-16-16"


def test_the_per_step_gap_widens_over_training(seed_comparison: list[RunResult]) -> None:
    """Per seed, static step time minus dynamic step time, averaged over the last third of
    the run, exceeds the same over the first third (against both static splits)."""
    by = {(r.configuration, r.seed): step_times(r) for r in seed_comparison}
    seeds = sorted({r.seed for r in seed_comparison})
    for static in ("static-16-16", "static-8-24"):
        first, last = [], []
        for s in seeds:
            gap = [a - b for a, b in zip(by[(static, s)], by[("dynamic-16-16", s)], strict=True)]
            third = len(gap) // 3
            first.append(statistics.fmean(gap[:third]))
            last.append(statistics.fmean(gap[-third:]))
        assert statistics.fmean(last) > statistics.fmean(first), static
        assert sum(b > a for a, b in zip(first, last, strict=True)) >= len(seeds) - 1, static

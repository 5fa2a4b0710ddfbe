"""Workload draws and trajectories, ground-truth accounting."""

from __future__ import annotations

import numpy as np
import pytest
from dynsched_core import EventBus
from dynsched_core.events import ReplicaModeEvent
from dynsched_sim import GroupAccountant, LengthDistribution, WorkloadModel
from hypothesis import given
from hypothesis import strategies as st


@given(st.integers(0, 2**32 - 1))
def test_workload_is_seeded_and_capped(seed: int) -> None:
    wm = WorkloadModel(
        n=4, response_len=LengthDistribution(median=500, sigma=2.0), max_response_len=2000
    )
    a, b = wm.generate(50, seed), wm.generate(50, seed)
    assert np.array_equal(a.response_lens, b.response_lens) and np.array_equal(
        a.prompt_lens, b.prompt_lens
    )
    assert a.response_lens.shape == (50, 4)
    assert a.response_lens.min() >= 1 and a.response_lens.max() <= 2000
    g = a.group(3)
    assert g.tokens == 4 * g.prompt_len + sum(g.response_lens) == a.group_tokens()[3]


def test_empirical_distribution_draws_from_values() -> None:
    wm = WorkloadModel(
        n=2,
        response_len=LengthDistribution(kind="empirical", values=(10, 20, 90000)),
        max_response_len=1000,
    )
    w = wm.generate(200, 1)
    assert set(np.unique(w.response_lens)) <= {10, 20, 1000}


def test_stationary_workload_is_unchanged_by_empty_trajectories() -> None:
    base = WorkloadModel(n=4, response_len=LengthDistribution(median=500, sigma=0.7))
    same = WorkloadModel(
        n=4,
        response_len=LengthDistribution(median=500, sigma=0.7),
        length_trajectory=[],
        difficulty_trajectory=[],
    )
    assert base.stationary and same.stationary
    a, b = base.generate(40, 3), same.generate(40, 3, run_samples=40)
    assert np.array_equal(a.response_lens, b.response_lens)


@given(seed=st.integers(0, 1000), growth=st.floats(1.2, 3.0))
def test_length_trajectory_scales_responses_with_training_progress(
    seed: int, growth: float
) -> None:
    kw = {
        "n": 8,
        "response_len": LengthDistribution(median=1000, sigma=0.5),
        "max_response_len": 10**7,
    }
    flat = WorkloadModel(**kw).generate(200, seed)
    grown = WorkloadModel(**kw, length_trajectory=[[0.0, 1.0], [1.0, growth]]).generate(
        200, seed, run_samples=200
    )
    ratio = grown.response_lens.sum(axis=1) / flat.response_lens.sum(axis=1)
    # prompt i sits at progress i / 199: its lengths are multiplied by 1 + (growth - 1) i / 199
    expect = 1 + (growth - 1) * np.arange(200) / 199
    assert np.allclose(ratio, expect, rtol=0.01)
    # the progress is over the run's consumed samples: prompts beyond it keep the end value
    longer = WorkloadModel(**kw, length_trajectory=[[0.0, 1.0], [1.0, growth]]).generate(
        300, seed, run_samples=200
    )
    tail = longer.response_lens[200:].sum(axis=1) / WorkloadModel(**kw).generate(
        300, seed
    ).response_lens[200:].sum(axis=1)
    assert np.allclose(tail, growth, rtol=0.01)


def test_difficulty_trajectory_widens_the_spread_between_prompts() -> None:
    wm = WorkloadModel(
        n=8,
        response_len=LengthDistribution(median=1000, sigma=0.1),
        difficulty_trajectory=[[0.0, 0.0], [1.0, 1.0]],
        max_response_len=10**7,
    )
    w = wm.generate(2000, 5)
    per_prompt = np.log(w.response_lens.mean(axis=1))
    assert per_prompt[:300].std() < 0.15 < per_prompt[-300:].std()


def test_bad_trajectories_are_refused() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        WorkloadModel(length_trajectory=[[0.5, 1.0], [0.2, 2.0]])
    with pytest.raises(ValueError, match="must be > 0"):
        WorkloadModel(length_trajectory=[[0.0, 0.0]])
    with pytest.raises(ValueError, match=r"\[progress, value\] pairs"):
        WorkloadModel(length_trajectory=[[0.0]])


def test_accountant_mode_priority_and_fractions() -> None:
    now = [0.0]
    bus = EventBus()
    seen: list[ReplicaModeEvent] = []
    bus.subscribe(seen.append)
    acc = GroupAccountant(lambda: now[0], bus)
    acc.add_group("t", 8, "trainer")
    acc.add_group("s", 8, "standalone")
    acc.set_engine("s", "rollout")
    acc.set_engine("t", "rollout")
    now[0] = 10.0
    acc.set_trainer("t", "train")  # train wins over an awake engine
    now[0] = 30.0
    acc.set_trainer("t", "")
    acc.set_engine("t", "switching")
    now[0] = 40.0
    acc.set_engine("t", "idle")
    now[0] = 50.0
    use = {u.name: u for u in acc.usage()}
    assert use["t"].seconds == {
        "train": 20.0,
        "rollout": 10.0,
        "weight_sync": 0.0,
        "switching": 10.0,
        "idle": 10.0,
    }
    assert use["s"].seconds["rollout"] == 50.0
    fr = acc.pool_fractions()
    assert fr["cluster"]["rollout"] == pytest.approx(60 / 100)
    for pool in fr.values():
        assert sum(pool.values()) == pytest.approx(1.0)
    modes = [e.mode for e in seen if e.group == "t"]
    assert modes == ["idle", "rollout", "train", "rollout", "switching", "idle"]
